"""The committed sample traces load and still show the situation each one is named after."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dtprof.trace.reader import load_trace

SAMPLES_DIR = Path(__file__).resolve().parents[2] / "sample_traces"
sys.path.insert(0, str(SAMPLES_DIR))
import generate  # noqa: E402  (sample_traces/ is a folder of scripts, not a package)

MAX_BYTES = 2 * 1024 * 1024


@pytest.mark.parametrize("sample", generate.SAMPLES, ids=lambda s: s.name)
def test_sample_trace_shows_its_situation(sample: generate.Sample) -> None:
    folder = SAMPLES_DIR / sample.name
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < MAX_BYTES, f"{sample.name} is {size} bytes"
    trace = load_trace(folder)
    assert trace.world_size == sample.world_size == len(trace.ranks)
    if sample.crashes:
        assert all(s.startswith("raised") for s in trace.ranks["status"])
    else:
        assert set(trace.ranks["status"]) == {"finished"}
    assert not list(folder.rglob("_live-*")), "a sample must be sealed Parquet only"
    print(sample.name, sample.evidence(trace))  # raises evidence.Missing when it does not


def test_every_folder_is_a_listed_sample() -> None:
    folders = {
        p.name for p in SAMPLES_DIR.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
    }
    assert folders == {s.name for s in generate.SAMPLES}
