"""Import a folder of profiler traces in a process that holds a dead process group as garbage.

A process group left in a reference cycle (a finished DDP job in a notebook, say) is garbage
that the import's forked workers (dtprof.parallel's pool) inherit. Collected in a worker, its
destructor waits for threads the worker does not have. Each worker here collects after its
file, as its collector may at any allocation; the garbage is kept uncollected here until the
workers have forked.

Usage: import_with_garbage.py FOLDER  (prints the ranks it read)
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import torch.distributed as dist

import dtprof
from dtprof.jobs.launch import free_port
from dtprof.trace.kineto import convert as kineto_convert


def main() -> None:
    os.cpu_count = lambda: 4  # type: ignore[assignment]  # a pool of workers, not this process
    convert = kineto_convert._convert_one

    def convert_then_collect(*args: Any) -> Any:
        out = convert(*args)
        gc.collect()
        return out

    # submitted by reference: the worker, a fork of this process, finds this function there
    convert_then_collect.__module__ = convert.__module__
    convert_then_collect.__qualname__ = convert.__qualname__
    kineto_convert._convert_one = convert_then_collect  # type: ignore[assignment]
    gc.disable()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    cycle: list[Any] = [dist.group.WORLD]
    cycle.append(cycle)
    dist.destroy_process_group()
    del cycle
    trace = dtprof.load_trace(sys.argv[1])
    gc.enable()
    gc.collect()  # here, where the group's threads are: its destructor returns
    print(sorted(trace.ranks["rank"].tolist()))


if __name__ == "__main__":
    main()
