"""Start a local gloo world of N processes running one situation of dtprof.jobs.worker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    situation: str,
    world_size: int,
    args: Sequence[str] = (),
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start one process per rank; stdout and stderr go to ``log_dir/rank-N.log`` if given."""
    cmd = [sys.executable, "-m", "dtprof.jobs.worker", situation, *args]
    return start_command(cmd, world_size, log_dir, env)


def start_command(
    cmd: Sequence[str],
    world_size: int,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start ``cmd`` once per rank with the torchrun-style environment of a local world."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        rank_env = dict(os.environ, **(env or {}))
        rank_env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        out = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            out = open(log_dir / f"rank-{rank}.log", "wb")  # noqa: SIM115 (kept by the child)
        procs.append(
            subprocess.Popen(
                cmd, env=rank_env, stdout=out, stderr=subprocess.STDOUT if out else None
            )
        )
        if out is not None:
            out.close()
    return procs


def wait(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Wait for every rank; on timeout or a failed rank, kill the rest. Returns exit codes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return [int(c) for c in codes if c is not None]
        if any(c not in (None, 0) for c in codes):
            time.sleep(5)  # let the others fail or finish on their own first
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
    return [int(p.wait()) for p in procs]


def run(
    situation: str,
    world_size: int,
    args: Sequence[str] = (),
    timeout_s: float = 300,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> list[int]:
    """Run a situation to the end; returns each rank's exit code."""
    return wait(start(situation, world_size, args, log_dir, env), timeout_s)
