"""A gloo job in which one rank skips an all-reduce, dumped by PyTorch's Flight Recorder.

Usage (one process per rank, torchrun-style environment): fr_dump.py OUT [SKIP_RANK]

Every rank all-reduces at steps 0, 1 and 2, except SKIP_RANK (default 1), which skips step 2
and waits elsewhere; the others hang in it. Two seconds after step 1 a timer on every rank saves
``torch._C._distributed_c10d._dump_fr_trace()`` as ``OUT/fr_rank_<rank>`` (a pickle, named as
TORCH_FR_DUMP_TEMP_FILE names its files) and ``_dump_fr_trace_json()`` as
``OUT/json/fr_rank_<rank>.json``, waits until every rank has saved its own, and ends the process.
gloo writes no dump on a timeout by itself, so the job asks for one.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json


def dump(out: Path, rank: int, world: int) -> None:
    pickled = _dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False)
    as_json = _dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    (out / "json").mkdir(parents=True, exist_ok=True)
    saved = out / f"fr_rank_{rank}", out / "json" / f"fr_rank_{rank}.json"
    for path, data in zip(saved, (pickled, as_json), strict=True):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # a rank that left early would complete the others' op
        if all((out / f"fr_rank_{r}").exists() for r in range(world)):
            break
        time.sleep(0.05)
    time.sleep(0.2)
    os._exit(0)


def wait_for_input() -> None:
    """Stands for a rank busy elsewhere (a data loader, a rank-dependent branch)."""
    time.sleep(60)


def main() -> None:
    out, skip = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(3):
        if step == 2:
            threading.Timer(2.0, dump, (out, rank, world)).start()
        if step == 2 and rank == skip:
            wait_for_input()
        else:
            try:
                dist.all_reduce(torch.ones(4 + step))
            except RuntimeError:  # a peer ended after the dump: the dump thread ends us too
                time.sleep(30)


if __name__ == "__main__":
    main()
