"""Hostile and broken input for every reader, through the real CLI: one line and exit 2, or an
analysis of what is sound; never a traceback, a hang, or a changed file (docs/reliability.md)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dtprof.cli import main
from dtprof.trace import live
from dtprof.trace.schema import STEPS
from tests import kinetobuild
from tests.tracebuild import fr_entry

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "healthy-ddp"
R1 = "rank=00001"


def digest(root: Path) -> dict[str, str]:
    """Every file under root (links not followed) with the sha256 of its bytes or link target."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = "-> " + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ---------------------------------------------------------------- dtprof format


def _dtprof(t: Path) -> Path:
    shutil.copytree(SAMPLE, t)
    return t


def _part(t: Path, table: str = "collectives", rank: str = R1) -> Path:
    return t / rank / table / "part-000000.parquet"


def _meta_edit(t: Path, folder: str = R1, **changes: object) -> None:
    file = t / folder / "meta.json"
    meta = json.loads(file.read_text())
    meta.update(changes)
    file.write_text(json.dumps(meta))


def _rewrite(t: Path, table: str, edit: Callable[[dict], dict], rank: str = R1) -> None:
    data = pq.read_table(_part(t, table, rank)).to_pydict()
    pq.write_table(
        pa.table(edit(data), schema=pq.read_schema(_part(t, table, rank))), _part(t, table, rank)
    )


def empty_folder(t: Path) -> Path:
    t.mkdir()
    return t


def random_bytes_file(t: Path) -> Path:
    t.mkdir()
    (t / "trace.bin").write_bytes(os.urandom(4096))
    return t / "trace.bin"


def random_bytes_part(t: Path) -> Path:
    _part(_dtprof(t)).write_bytes(os.urandom(3000))
    return t


def truncated_part(t: Path) -> Path:
    part = _part(_dtprof(t))
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    return t


def truncated_live_stream(t: Path) -> Path:
    part = _part(_dtprof(t), "steps")
    data = pq.read_table(part)
    segment = part.with_name(live.segment_name(1))
    rows = list(zip(*data.to_pydict().values(), strict=True))
    frames = (
        live.header(STEPS) + live.rows_frame(rows[:5], STEPS) + live.rows_frame(rows[5:], STEPS)
    )
    segment.write_bytes(frames[:-10])  # torn last frame, as a kill leaves it
    return t


def truncated_meta(t: Path) -> Path:
    meta = _dtprof(t) / R1 / "meta.json"
    meta.write_text(meta.read_text()[:100])
    return t


def future_schema(t: Path) -> Path:
    _meta_edit(_dtprof(t), schema_version=99)
    return t


def wrong_schema_type(t: Path) -> Path:
    _meta_edit(_dtprof(t), schema_version="one")
    return t


def meta_not_an_object(t: Path) -> Path:
    (_dtprof(t) / R1 / "meta.json").write_text("[1, 2, 3]")
    return t


def meta_wrong_field_types(t: Path) -> Path:
    _meta_edit(_dtprof(t), world_size="four", clock="fast")
    return t


def mixed_world_sizes(t: Path) -> Path:
    _meta_edit(_dtprof(t), world_size=8)
    return t


def duplicate_ranks(t: Path) -> Path:
    shutil.copytree(_dtprof(t) / R1, t / "rank=1")
    return t


def rank_folder_says_other_rank(t: Path) -> Path:
    _meta_edit(_dtprof(t), rank=2)
    return t


def missing_rank_folder(t: Path) -> Path:
    shutil.rmtree(_dtprof(t) / "rank=00002")
    return t


def missing_meta(t: Path) -> Path:
    (_dtprof(t) / R1 / "meta.json").unlink()
    return t


def wrong_column_types(t: Path) -> Path:
    _dtprof(t)
    pq.write_table(pa.table({"step": ["a"], "start_ns": ["b"], "end_ns": [1.5]}), _part(t, "steps"))
    return t


def non_monotonic_times(t: Path) -> Path:
    def shuffle(d: dict) -> dict:
        d["start_ns"], d["end_ns"] = d["end_ns"][::-1], d["start_ns"][::-1]
        return d

    _rewrite(_dtprof(t), "steps", shuffle)
    _rewrite(t, "collectives", shuffle)
    return t


def absurd_values(t: Path) -> Path:
    def absurd(d: dict) -> dict:
        d["bytes"] = [10**18] * len(d["bytes"])
        d["seq"] = [s * 10**15 for s in d["seq"]]
        d["end_ns"] = [s - 10**12 for s in d["start_ns"]]  # negative durations
        return d

    _rewrite(_dtprof(t), "collectives", absurd)
    _rewrite(t, "steps", lambda d: {**d, "step": [-s for s in d["step"]]})
    return t


def absurd_clock(t: Path) -> Path:
    _meta_edit(_dtprof(t), clock={"mono_to_wall_ns": 10**30, "start": {"offset_ns": -(10**30)}})
    return t


def deeply_nested_meta(t: Path) -> Path:
    (_dtprof(t) / R1 / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    return t


def deeply_nested_inflight(t: Path) -> Path:
    (_dtprof(t) / R1 / "inflight.json").write_text("[" * 100_000 + "]" * 100_000)
    return t


def huge_inflight(t: Path) -> Path:
    row = {
        "step": 1,
        "group": "0",
        "seq": 7,
        "op": "all_reduce",
        "bytes": 4,
        "dtype": "float32",
        "peer": None,
        "start_ns": 1,
        "async_op": False,
        "label": None,
    }
    (_dtprof(t) / R1 / "inflight.json").write_text(json.dumps([row] * 200_000))
    return t


def inflight_wrong_types(t: Path) -> Path:
    (_dtprof(t) / R1 / "inflight.json").write_text(json.dumps([{"seq": "x", "step": []}]))
    return t


def symlinked_rank_outside(t: Path) -> Path:
    outside = t.parent / "elsewhere"
    shutil.copytree(_dtprof(t) / R1, outside)
    shutil.rmtree(t / R1)
    (t / R1).symlink_to(outside)
    return t


def symlinked_part_to_device(t: Path) -> Path:
    part = _part(_dtprof(t))
    part.unlink()
    part.symlink_to("/dev/zero")
    return t


def symlinked_meta_to_device(t: Path) -> Path:
    meta = _dtprof(t) / R1 / "meta.json"
    meta.unlink()
    meta.symlink_to("/dev/zero")
    return t


def symlinked_part_outside(t: Path) -> Path:
    part = _part(_dtprof(t))
    part.unlink()
    part.symlink_to("/etc/passwd")
    return t


def stray_file_names(t: Path) -> Path:
    (_dtprof(t) / R1 / "steps" / "part-abc.parquet").write_bytes(b"x")
    return t


# ---------------------------------------------------------------- PyTorch profiler (Kineto)


def _kineto(t: Path, ranks: int = 2) -> Path:
    for r in range(ranks):
        kinetobuild.write(t, f"rank{r}.json", kinetobuild.trace(r))
    return t


def kineto_empty_file(t: Path) -> Path:
    _kineto(t)
    (t / "rank1.json").write_bytes(b"")
    return t


def kineto_random_bytes(t: Path) -> Path:
    _kineto(t)
    (t / "rank1.json.gz").write_bytes(os.urandom(5000))
    (t / "rank1.json").unlink()
    return t


def kineto_truncated(t: Path) -> Path:
    f = _kineto(t) / "rank1.json"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return t


def kineto_gzip_corrupted(t: Path) -> Path:
    _kineto(t)
    raw = bytearray(gzip.compress((t / "rank1.json").read_bytes()))
    raw[len(raw) // 2 : len(raw) // 2 + 64] = os.urandom(64)
    (t / "rank1.json.gz").write_bytes(bytes(raw))
    (t / "rank1.json").unlink()
    return t


def kineto_gzip_truncated(t: Path) -> Path:
    _kineto(t)
    raw = gzip.compress((t / "rank1.json").read_bytes())
    (t / "rank1.json.gz").write_bytes(raw[: len(raw) // 2])
    (t / "rank1.json").unlink()
    return t


def kineto_future_schema(t: Path) -> Path:
    doc = kinetobuild.trace(1)
    doc["schemaVersion"] = 99
    kinetobuild.write(_kineto(t), "rank1.json", doc)
    return t


def kineto_not_an_object(t: Path) -> Path:
    (_kineto(t) / "rank1.json").write_text("[1, 2, 3]")
    return t


def kineto_wrong_types(t: Path) -> Path:
    doc = kinetobuild.trace(1)
    doc["traceEvents"] = [{"ph": "X", "ts": "soon", "dur": [], "name": 7}, 5, None]
    kinetobuild.write(_kineto(t), "rank1.json", doc)
    return t


def kineto_mixed_world_sizes(t: Path) -> Path:
    kinetobuild.write(_kineto(t), "rank1.json", kinetobuild.trace(1, world=8))
    return t


def kineto_duplicate_ranks(t: Path) -> Path:
    kinetobuild.write(_kineto(t), "again.json", kinetobuild.trace(1))
    return t


def kineto_missing_rank(t: Path) -> Path:
    kinetobuild.write(t, "rank0.json", kinetobuild.trace(0, world=4))
    kinetobuild.write(t, "rank2.json", kinetobuild.trace(2, world=4))
    return t


def kineto_absurd_values(t: Path) -> Path:
    doc = kinetobuild.trace(1)
    for e in doc["traceEvents"]:
        if "dur" in e:
            e["dur"] = -e["dur"]
        if "ts" in e:
            e["ts"] = 10**18 - e["ts"]  # backwards in time
        e.setdefault("args", {})["In msg nelems"] = 10**18
    kinetobuild.write(_kineto(t), "rank1.json", doc)
    return t


def kineto_deeply_nested(t: Path) -> Path:
    (_kineto(t) / "rank1.json").write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return t


def kineto_huge(t: Path) -> Path:
    doc = kinetobuild.trace(1, steps=3000)
    kinetobuild.write(_kineto(t), "rank1.json", doc)
    return t


def kineto_symlink_to_device(t: Path) -> Path:
    (_kineto(t) / "rank1.json").unlink()
    (t / "rank1.json").symlink_to("/dev/zero")
    return t


# ---------------------------------------------------------------- Flight Recorder


def _fr_dump(entries: list, ranks: str = "[0, 1]", last: int = 2) -> dict:
    return {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": ranks}},
        "pg_status": {"0": {"last_completed_collective": last}},
        "entries": entries,
    }


def _fr(t: Path, rank1: object = None) -> Path:
    t.mkdir()
    (t / "fr_rank_0").write_bytes(pickle.dumps(_fr_dump([fr_entry(s) for s in (1, 2, 3)])))
    one = _fr_dump([fr_entry(s) for s in (1, 2)]) if rank1 is None else rank1
    (t / "fr_rank_1").write_bytes(one if isinstance(one, bytes) else pickle.dumps(one))
    return t


def fr_random_bytes(t: Path) -> Path:
    return _fr(t, b"\x80\x04" + random.Random(2000).randbytes(2000))


def fr_truncated_pickle(t: Path) -> Path:
    return _fr(t, pickle.dumps(_fr_dump([fr_entry(s) for s in (1, 2)]))[:-30])


def fr_pickle_with_code(t: Path) -> Path:
    return _fr(t, b"\x80\x04cos\nsystem\n(S'touch /tmp/dtprof-pwned'\ntR.")


def fr_truncated_json(t: Path) -> Path:
    _fr(t)
    (t / "fr_rank_1").write_text(json.dumps(_fr_dump([fr_entry(s) for s in (1, 2)]))[:-20])
    return t


def fr_not_a_dump(t: Path) -> Path:
    return _fr(t, {"entries": "many"})


def fr_wrong_types(t: Path) -> Path:
    return _fr(t, _fr_dump([fr_entry(1, collective_seq_id="x"), "entry", 5]))


def fr_mixed_world_sizes(t: Path) -> Path:
    return _fr(t, _fr_dump([fr_entry(s) for s in (1, 2)], ranks="[0, 1, 2, 3]"))


def fr_duplicate_ranks(t: Path) -> Path:
    shutil.copy(_fr(t) / "fr_rank_1", t / "fr_rank_01")
    return t


def fr_missing_rank(t: Path) -> Path:
    (_fr(t) / "fr_rank_1").rename(t / "fr_rank_2")
    return t


def fr_absurd_values(t: Path) -> Path:
    return _fr(t, _fr_dump([fr_entry(1, input_sizes=[[10**30]]), fr_entry(2)]))


def fr_huge_but_sound(t: Path) -> Path:
    entries = [fr_entry(s, input_sizes=[[10**17]], time_created_ns=-s) for s in range(1, 3)]
    return _fr(t, _fr_dump(entries * 5000))


def fr_deeply_nested(t: Path) -> Path:
    depth = 100_000  # lists in lists, written by hand: pickle.dumps itself would recurse
    return _fr(t, b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".")


def fr_deeply_nested_json(t: Path) -> Path:
    _fr(t)
    (t / "fr_rank_1").write_text('{"entries": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return t


def fr_symlink_to_device(t: Path) -> Path:
    (_fr(t) / "fr_rank_1").unlink()
    (t / "fr_rank_1").symlink_to("/dev/zero")
    return t


# ---------------------------------------------------------------- the table

ERROR, SOUND = "error", "sound"  # exit 2 naming the file, or an analysis (exit 0 or 1)
CASES: list[tuple[Callable[[Path], Path], str, str]] = [
    # (make the input, outcome, what the one line of an error names)
    (empty_folder, ERROR, "not a dtprof trace"),
    (random_bytes_file, ERROR, "trace.bin: not a directory"),
    (random_bytes_part, ERROR, "part-000000.parquet: not a readable Parquet file"),
    (truncated_part, ERROR, "part-000000.parquet: not a readable Parquet file"),
    (truncated_live_stream, SOUND, ""),
    (truncated_meta, ERROR, "meta.json: not readable JSON"),
    (future_schema, ERROR, "trace schema version 99, this dtprof reads 1 and 2; upgrade dtprof"),
    (wrong_schema_type, ERROR, "trace schema version 'one'"),
    (meta_not_an_object, ERROR, "meta.json: not a dtprof rank metadata file"),
    (meta_wrong_field_types, ERROR, "meta.json: "),
    (mixed_world_sizes, ERROR, "disagree on the world size"),
    (duplicate_ranks, ERROR, "rank 1 twice"),
    (rank_folder_says_other_rank, ERROR, "says rank 2 but the folder is rank 1"),
    (missing_rank_folder, SOUND, ""),
    (missing_meta, ERROR, "meta.json: missing"),
    (wrong_column_types, ERROR, "column types do not match table steps"),
    (non_monotonic_times, SOUND, ""),
    (absurd_values, SOUND, ""),
    (absurd_clock, ERROR, "meta.json: clock.mono_to_wall_ns: expected int <= 9223372036854775807"),
    (deeply_nested_meta, ERROR, "meta.json: nested too deeply"),
    (deeply_nested_inflight, ERROR, "inflight.json: nested too deeply"),
    (huge_inflight, SOUND, ""),
    (inflight_wrong_types, ERROR, "inflight.json: "),
    (symlinked_rank_outside, SOUND, ""),
    (symlinked_part_to_device, ERROR, "part-000000.parquet: not a regular file"),
    (symlinked_meta_to_device, ERROR, "meta.json: not a regular file"),
    (symlinked_part_outside, ERROR, "part-000000.parquet: not a readable Parquet file"),
    (stray_file_names, ERROR, "part-abc.parquet: unexpected file name"),
    (kineto_empty_file, ERROR, "rank1.json: "),
    (kineto_random_bytes, ERROR, "rank1.json.gz: "),
    (kineto_truncated, ERROR, "rank1.json: "),
    (kineto_gzip_corrupted, ERROR, "rank1.json.gz: "),
    (kineto_gzip_truncated, ERROR, "rank1.json.gz: "),
    (kineto_future_schema, SOUND, ""),
    (kineto_not_an_object, ERROR, "rank1.json: "),
    (kineto_wrong_types, ERROR, "rank1.json: "),
    (kineto_mixed_world_sizes, SOUND, ""),
    (kineto_duplicate_ranks, ERROR, "rank 1 again"),
    (kineto_missing_rank, SOUND, ""),
    (kineto_absurd_values, ERROR, "rank1.json: not a readable PyTorch profiler trace"),
    (kineto_deeply_nested, ERROR, "rank1.json: "),
    (kineto_huge, SOUND, ""),
    (kineto_symlink_to_device, SOUND, ""),
    (fr_random_bytes, ERROR, "fr_rank_1: not a readable Flight Recorder dump"),
    (fr_truncated_pickle, ERROR, "fr_rank_1: not a readable Flight Recorder dump"),
    (fr_pickle_with_code, ERROR, "fr_rank_1: not a readable Flight Recorder dump (refused"),
    (fr_truncated_json, ERROR, "fr_rank_1: not a readable Flight Recorder dump"),
    (fr_not_a_dump, ERROR, "fr_rank_1: not a Flight Recorder dump"),
    (fr_wrong_types, ERROR, "fr_rank_1: not a readable Flight Recorder dump"),
    (fr_mixed_world_sizes, SOUND, ""),
    (fr_duplicate_ranks, ERROR, "rank 1 again"),
    (fr_missing_rank, SOUND, ""),
    (fr_absurd_values, ERROR, "fr_rank_1: not a readable Flight Recorder dump"),
    (fr_huge_but_sound, SOUND, ""),
    (fr_deeply_nested, ERROR, "fr_rank_1: not a Flight Recorder dump"),
    (fr_deeply_nested_json, ERROR, "fr_rank_1: nested too deeply"),
    (fr_symlink_to_device, SOUND, ""),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("make", "outcome", "names"), CASES, ids=[c[0].__name__ for c in CASES])
def test_hostile_input(
    make: Callable[[Path], Path],
    outcome: str,
    names: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = make(tmp_path / "input")
    before = digest(tmp_path / "input")
    for command in (["analyze", "--format", "json"], ["info"]):
        if command == ["info"] and outcome == SOUND:
            continue  # info reads the same way; the analysis is the case
        code = main([*command, str(target)])
        out, err = capsys.readouterr()
        if outcome == ERROR:
            assert code == 2, (out, err)
            (line,) = err.splitlines()
            assert line.startswith("dtprof: error: ") and names in line, line
            if names.endswith(": ") or ": not" in names:  # the line names the file
                assert str(tmp_path) in line, line
        else:
            assert code in (0, 1), err
            report = json.loads(out)
            assert report["trace"]["ranks_analysed"], report
            assert "Traceback" not in err
    assert digest(tmp_path / "input") == before
    assert not Path("/tmp/dtprof-pwned").exists()


@pytest.mark.timeout(60)
def test_the_command_itself_answers_in_one_line(tmp_path: Path) -> None:
    """The installed entry point, in a fresh process: exit 2, one line, no traceback."""
    cases = [truncated_part(tmp_path / "a"), kineto_gzip_corrupted(tmp_path / "b")]
    cases.append(fr_pickle_with_code(tmp_path / "c"))
    env = dict(os.environ, DTPROF_CACHE_DIR=str(tmp_path / "cache"))
    for case in cases:
        done = subprocess.run(
            [sys.executable, "-m", "dtprof", "analyze", str(case)],
            capture_output=True,
            text=True,
            timeout=50,
            env=env,
        )
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"dtprof: error: {case}"), done.stderr
