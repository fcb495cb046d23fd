"""docs/trace-format.md against the code: tables, columns, types, meta fields and snippets.

The column tables of the doc are parsed and compared with dtprof/trace/schema.py; the meta.json
and inflight.json fields with their declaration in dtprof/trace/meta.py; and the doc's Python
and SQL snippets are run on a small trace written by the real TraceWriter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dtprof
from dtprof.record.writer import TraceWriter, write_json_atomic
from dtprof.trace import live
from dtprof.trace.meta import InflightOp, RankMeta, decode, encode
from dtprof.trace.reader import read_table
from dtprof.trace.schema import (
    COLLECTIVES,
    INFLIGHT_FILE,
    META_FILE,
    SCHEMA_VERSION,
    STEPS,
    TABLES,
    rank_dir_name,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "trace-format.md").read_text()

# numpy rounds halves to even, DuckDB away from zero
ALIGN_TOLERANCE_NS = 1


# ------------------------------------------------------------------ reading the doc


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section, up to the next ``##`` heading."""
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert found, f"docs/trace-format.md has no '## {title}' section"
    return found.group(1)


def markdown_table(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table in ``text`` whose first header cell is given."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = _cells(line)
        if cells and cells[0] == first_header:
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(cells, _cells(row), strict=True)))
            return rows
    raise AssertionError(f"no table with a '{first_header}' column in:\n{text[:200]}")


def _cells(line: str) -> list[str]:
    if not line.startswith("|"):
        return []
    return [c.strip() for c in line.strip().strip("|").split("|")]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)


def unquote(cell: str) -> str:
    return cell.strip("`")


def arrow_type(cell: str) -> pa.DataType:
    """``int64``, ``float64``, ``string``, ``bool``, ``list<int32>`` ... as a pyarrow type."""
    name = unquote(cell)
    inner = re.fullmatch(r"list<(\w+)>", name)
    if inner:
        return pa.list_(pa.type_for_alias(inner.group(1)))
    return pa.type_for_alias(name)


def doc_tables() -> dict[str, list[dict[str, str]]]:
    parts = re.split(r"^### `(\w+)`\n", section(DOC, "Tables"), flags=re.M)
    return {
        name: markdown_table(body, "column")
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def doc_meta_fields() -> set[str]:
    return {unquote(r["field"]) for r in markdown_table(section(DOC, "meta.json"), "field")}


# ------------------------------------------------------------------ reading the code


def declared_fields(struct: type = RankMeta) -> set[str]:
    """Every field of a record of dtprof/trace/meta.py, nested ones dotted; each kind of
    record's fields once, under the first field that holds it (clock.start, not clock.end)."""
    seen: set[type] = set()

    def fields(info: Any, prefix: str) -> set[str]:
        names: set[str] = set()
        for field in info.fields:
            name = prefix + field.encode_name
            names.add(name)
            for inner in _structs(field.type):
                if inner.cls not in seen:
                    seen.add(inner.cls)
                    names |= fields(inner, name + ".")
        return names

    seen.add(struct)
    return fields(msgspec.inspect.type_info(struct), "")


def _structs(t: Any) -> list[Any]:
    if isinstance(t, msgspec.inspect.StructType):
        return [t]
    return [s for inner in getattr(t, "types", ()) for s in _structs(inner)]


# ------------------------------------------------------------------ schema and layout


def test_schema_version_is_the_documented_one() -> None:
    stated = re.search(r"current schema version is `(\d+)`", DOC)
    assert stated, "the doc must say 'The current schema version is `N`.'"
    assert int(stated.group(1)) == SCHEMA_VERSION
    example = json.loads(code_blocks(section(DOC, "meta.json"))[0][1])
    assert example["schema_version"] == SCHEMA_VERSION


def test_every_table_is_documented_and_no_other() -> None:
    assert sorted(doc_tables()) == sorted(TABLES)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_columns_names_types_and_units(name: str) -> None:
    table = TABLES[name]
    rows = doc_tables()[name]
    assert [unquote(r["column"]) for r in rows] == table.column_names, (
        f"docs/trace-format.md lists the columns of {name} differently from schema.py"
    )
    for row, column in zip(rows, table.columns, strict=True):
        assert arrow_type(row["Arrow type"]) == column.type, f"{name}.{column.name}"
        assert row["meaning"], f"{name}.{column.name} has no meaning in the doc"
        marked = "monotonic" in row["unit"]
        assert marked == column.time, (
            f"{name}.{column.name}: the unit must say 'ns, monotonic' exactly for the columns "
            "load_trace aligns"
        )


def test_meta_fields_are_the_declared_ones() -> None:
    documented = doc_meta_fields()
    assert documented == declared_fields(), (
        "meta.json fields: docs/trace-format.md vs RankMeta in dtprof/trace/meta.py"
    )
    example = json.loads(code_blocks(section(DOC, "meta.json"))[0][1])
    assert decode(example, RankMeta) == decode(encode(decode(example, RankMeta)), RankMeta)
    assert set(example) <= documented


def test_the_declaration_sees_nested_records() -> None:
    fields = declared_fields()
    assert {"clock.start.offset_ns", "config.ddp_buckets", "pipeline.actions"} <= fields
    assert "clock.end" in fields and "clock.end.offset_ns" not in fields  # listed once


def test_inflight_fields_are_a_collectives_row_without_end() -> None:
    fields = [f.encode_name for f in msgspec.inspect.type_info(InflightOp).fields]
    assert fields == [c for c in COLLECTIVES.column_names if c != "end_ns"]
    example = json.loads(code_blocks(section(DOC, "inflight.json"))[0][1])
    assert list(example[0]) == fields


def test_layout_names_are_the_ones_written(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path)
    writer.buffers["steps"].append((0, 1, 2))
    writer.flush()
    live = sorted(p.name for p in (tmp_path / "steps").iterdir())
    writer.flush(seal=True)
    sealed = sorted(p.name for p in (tmp_path / "steps").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(TABLES)
    layout = section(DOC, "Directory layout")
    for name in (*live, *sealed, rank_dir_name(0), META_FILE, INFLIGHT_FILE):
        shape = re.escape(name).replace("0", "[0-9]")  # any segment or rank number
        assert re.search(shape, layout), f"the directory layout shows no file like {name}"


# ------------------------------------------------------------------ a small trace

T0 = 1_000_000_000_000  # monotonic ns at the first step
BASES = {0: 1_795_263_476_545_071_861, 1: 1_795_263_476_547_004_187, 2: 1_795_263_476_546_000_001}
# (offset, error) at start and at end. Rank 1 drifts 16 ppm, far beyond its error bounds;
# rank 2's change is within them, so its end estimate (the smaller error) holds throughout.
OFFSETS = {
    0: ((0, 0), (0, 0)),
    1: ((5_000_000, 40_000), (6_000_000, 40_000)),
    2: ((2_000_000, 900_000), (2_500_000, 300_000)),
}
RANKS = sorted(OFFSETS)
SEALED_STEPS = 3  # steps 0..2 sealed; step 3 only in the live segment


def _rows(rank: int, step: int) -> dict[str, list[tuple[Any, ...]]]:
    t = T0 + step * 10_000_000 + rank * 1_000
    all_reduce = (step, "0", step, "all_reduce", 4096, "float32", None)
    p2p = (step, "0", step, "send" if rank == 0 else "recv", 64, "float32", (rank + 1) % 3)
    return {
        "steps": [(step, t, t + 10_000_000)],
        "spans": [
            (step, "data", "phase", t, t + 1_000_000, 0, None, None),
            (step, "forward", "phase", t + 1_000_000, t + 4_000_000, 0, None, None),
            (step, "backward", "phase", t + 4_000_000, t + 8_000_000, 0, None, None),
            (step, "loader", "region", t + 100, t + 900_000, 0, None, None),
            (step, "forward", "pipeline", t + 1_000_000, t + 2_000_000, 0, rank, 0),
        ],
        "collectives": [
            (*all_reduce, t + 5_000_000, t + 7_000_000, True, "ddp.bucket0"),
            (*p2p, t + 8_000_000, t + 8_100_000, False, None),
        ],
        "scalars": [(step, "loss", 2.5 - step / 10)],
        "samples": [(step, t + 10_000_000, "rss_bytes", 1e8)],
        "fingerprints": [(step, "module.0.weight", 1.5, 80.0)],
        "groups": [("0", "gloo", RANKS)] if step == 0 else [],
        "events": [(step, t, "hook-error", "log hook raised", "{}")] if step == 1 else [],
    }


def write_trace(root: Path) -> None:
    """Three ranks: steps 0..2 sealed, step 3 in the live segments; meta from the doc's example."""
    meta_example = json.loads(code_blocks(section(DOC, "meta.json"))[0][1])
    for rank in RANKS:
        folder = root / rank_dir_name(rank)
        writer = TraceWriter(folder)
        for step in range(SEALED_STEPS + 1):
            if step == SEALED_STEPS:
                writer.flush(seal=True)
            for table, rows in _rows(rank, step).items():
                writer.buffers[table].extend(rows)
        writer.flush()
        (start, start_err), (end, end_err) = OFFSETS[rank]
        meta = dict(meta_example, rank=rank, world_size=len(RANKS))
        meta["clock"] = {
            "mono_to_wall_ns": BASES[rank],
            "method": "ping-pong with rank 0 over gloo",
            "start": {"mono_ns": T0 - 1_000_000_000, "offset_ns": start, "error_ns": start_err},
            "end": {"mono_ns": T0 + 60_000_000_000, "offset_ns": end, "error_ns": end_err},
        }
        write_json_atomic(folder / META_FILE, meta)
        write_json_atomic(folder / INFLIGHT_FILE, [])


# ------------------------------------------------------------------ the doc's snippets


def _imports(code: str) -> set[str]:
    return set(re.findall(r"^(?:import|from) (\w+)", code, re.M))


def _snippets() -> list[tuple[str, str, set[str]]]:
    """(language, code, modules it needs: those imported so far in its ### subsection)."""
    out = []
    for subsection in re.split(r"^### ", section(DOC, "Reading a trace"), flags=re.M):
        needs: set[str] = set()
        for lang, code in code_blocks(subsection):
            if lang in ("python", "sql"):
                needs |= {"duckdb"} if lang == "sql" else _imports(code)
                out.append((lang, code, set(needs)))
    return out


SNIPPETS = _snippets()


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every snippet run in order, in a folder holding ``trace/``: (status, error) each."""
    here = tmp_path_factory.mktemp("doc")
    write_trace(here / "trace")
    namespace: dict[str, Any] = {"__name__": "doc_snippets"}
    con = None
    results: list[tuple[str, BaseException | None]] = []
    cwd = os.getcwd()
    os.chdir(here)
    try:
        for lang, code, needs in SNIPPETS:
            if any(importlib.util.find_spec(m) is None for m in needs):
                results.append(("skipped", None))
                continue
            try:
                if lang == "sql":
                    import duckdb

                    con = con or duckdb.connect()
                    con.execute(code).fetchall()  # as the doc says
                else:
                    exec(compile(code, "docs/trace-format.md", "exec"), namespace)
            except Exception as exc:
                results.append(("failed", exc))
            else:
                results.append(("ran", None))
    finally:
        os.chdir(cwd)
    return {"trace": here / "trace", "results": results, "ns": namespace, "duckdb": con}


def test_the_doc_has_snippets_for_each_reader() -> None:
    code = "\n".join(c for _, c, _ in SNIPPETS)
    for needle in (
        "dtprof.load_trace",
        "pd.read_parquet",
        "pyarrow.dataset",
        "read_parquet(",
        "dask.dataframe",
        "hive_partitioning",
    ):
        assert needle in code, f"no snippet uses {needle}"


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(ran: dict[str, Any], index: int) -> None:
    lang, code, needs = SNIPPETS[index]
    status, error = ran["results"][index]
    if status == "skipped":
        pytest.skip(f"needs {', '.join(sorted(needs))}, not all installed")
    assert error is None, f"this {lang} snippet of the doc raised {error!r}:\n{code}"


def _loaded_sealed(trace: Path, table: str) -> Any:
    frame = getattr(dtprof.load_trace(trace), table)
    return frame[frame["step"] < SEALED_STEPS]


def test_pandas_alignment_recipe_matches_load_trace(ran: dict[str, Any]) -> None:
    steps = ran["ns"].get("all_steps")
    assert steps is not None, "the pyarrow/pandas snippets no longer define all_steps"
    keys = ["rank", "step"]
    ours = steps.sort_values(keys).reset_index(drop=True)
    theirs = _loaded_sealed(ran["trace"], "steps").sort_values(keys).reset_index(drop=True)
    assert len(ours) == len(theirs) == len(RANKS) * SEALED_STEPS
    for column in ("start_ns", "end_ns"):
        gap = (ours[column].astype("int64") - theirs[column].astype("int64")).abs().max()
        assert gap <= ALIGN_TOLERANCE_NS, f"{column} differs from load_trace by {gap} ns"


def test_duckdb_alignment_recipe_matches_load_trace(
    ran: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    if ran["duckdb"] is None:
        pytest.skip("duckdb not installed")
    keys = ["rank", "op", "seq"]
    monkeypatch.chdir(ran["trace"].parent)  # the views read relative paths when queried
    ours = ran["duckdb"].sql("SELECT * FROM collectives").df()
    ours = ours.sort_values(keys).reset_index(drop=True)
    theirs = _loaded_sealed(ran["trace"], "collectives").sort_values(keys).reset_index(drop=True)
    assert len(ours) == len(theirs) == len(RANKS) * SEALED_STEPS * 2
    for column in ("start_ns", "end_ns"):
        gap = (ours[column].astype("int64") - theirs[column].astype("int64")).abs().max()
        assert gap <= ALIGN_TOLERANCE_NS, f"{column} differs from load_trace by {gap} ns"


def test_external_readers_see_sealed_parts_and_load_trace_the_live_stream(
    ran: dict[str, Any],
) -> None:
    folder = ran["trace"] / rank_dir_name(1) / "steps"
    assert pq.read_table(folder).num_rows == SEALED_STEPS
    loaded = dtprof.load_trace(ran["trace"]).steps
    assert (loaded["rank"] == 1).sum() == SEALED_STEPS + 1


# ------------------------------------------------------------------ crash leftovers


def test_crash_leftovers_read_as_documented(tmp_path: Path) -> None:
    """A torn last batch is dropped, a part wins over its own stream, hidden files are skipped."""
    folder = tmp_path / "trace" / rank_dir_name(0)
    writer = TraceWriter(folder)
    writer.buffers["steps"].extend([(0, 1, 2), (1, 2, 3)])
    writer.flush(seal=True)  # part-000000: steps 0, 1
    stale = live.header(STEPS) + live.rows_frame([(9, 9, 9)], STEPS)
    (folder / "steps" / "_live-000000.msgpack").write_bytes(stale)  # left by a crash mid-seal
    writer.buffers["steps"].append((2, 3, 4))
    writer.flush()
    writer.buffers["steps"].append((3, 4, 5))
    writer.flush()
    segment = folder / "steps" / "_live-000001.msgpack"
    segment.write_bytes(segment.read_bytes()[:-3])  # the second frame torn by a kill
    (folder / "steps" / ".part-000001.parquet.tmp").write_bytes(b"half a parquet file")
    meta = json.loads(code_blocks(section(DOC, "meta.json"))[0][1])
    write_json_atomic(folder / META_FILE, dict(meta, rank=0, world_size=1))

    assert read_table(folder, STEPS).column("step").to_pylist() == [0, 1, 2]
    assert dtprof.load_trace(tmp_path / "trace").steps["step"].tolist() == [0, 1, 2]
