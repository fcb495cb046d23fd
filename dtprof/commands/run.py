"""``dtprof run -- COMMAND``: record a training command whose script was written without dtprof.

The command runs with two more environment variables, and nothing else changes (no file is
written but the trace): PYTHONPATH starts with ``dtprof/record/startup``, whose
``sitecustomize`` every Python process of the command runs at start-up, and DTPROF_RUN holds the
trace folder and the options. What a process does with them: ``dtprof.record.auto``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from dtprof.errors import DtprofError
from dtprof.trace.layout import RANK_DIR_PREFIX

STARTUP = Path(__file__).resolve().parents[1] / "record" / "startup"


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--trace",
        help="trace folder to write (default: dtprof-trace-DATE-TIME in this folder)",
    )
    cmd.add_argument(
        "--fingerprint-every",
        type=int,
        default=0,
        metavar="N",
        help="parameter fingerprints every N steps (default: 0, none)",
    )
    cmd.add_argument(
        "--hang-timeout",
        type=float,
        metavar="S",
        help="record a collective in flight for longer than S seconds, with every stack",
    )
    cmd.add_argument(
        "--ddp-buckets",
        choices=("dispatcher", "comm_hook", "off"),
        default="dispatcher",
        help="how DDP's gradient buckets are recorded (default: dispatcher; see profile())",
    )
    cmd.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")


def run(args: argparse.Namespace) -> int:
    """Run a training command and record every process of it that trains, without a change
    to its script: dtprof run [--trace DIR] -- torchrun --nproc-per-node 4 train.py"""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise DtprofError("no command to run: dtprof run [options] -- COMMAND ...")
    if shutil.which(command[0]) is None:
        raise DtprofError(f"{command[0]}: no such command")
    trace = Path(args.trace or f"dtprof-trace-{datetime.now():%Y%m%d-%H%M%S}").resolve()
    if trace.is_dir() and any(p.name.startswith(RANK_DIR_PREFIX) for p in trace.iterdir()):
        raise DtprofError(f"{trace}: already holds a trace; give another --trace")
    if trace.exists() and not trace.is_dir():
        raise DtprofError(f"{trace}: is a file, not a folder")
    options: dict[str, Any] = {"fingerprint_every": args.fingerprint_every}
    if args.hang_timeout is not None:
        options["hang_timeout_s"] = args.hang_timeout
    options["ddp_buckets"] = {"dispatcher": True, "comm_hook": "comm_hook", "off": False}[
        args.ddp_buckets
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(STARTUP)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["DTPROF_RUN"] = json.dumps({"trace": str(trace), "options": options})
    code = _run(command, env)
    ranks = sorted(trace.glob(f"{RANK_DIR_PREFIX}*")) if trace.is_dir() else []
    if ranks:
        print(
            f"dtprof: {len(ranks)} rank(s) recorded in {trace}\n"
            f"dtprof: analyze them with: dtprof analyze {_shell_path(trace)}",
            file=sys.stderr,
        )
    elif os.environ.get("DTPROF_DISABLE", "") not in ("", "0"):
        print("dtprof: nothing recorded (DTPROF_DISABLE is set)", file=sys.stderr)
    else:
        print(
            "dtprof: nothing recorded: no process of the command initialized "
            "torch.distributed or made an optimizer",
            file=sys.stderr,
        )
    return code


def _run(command: list[str], env: dict[str, str]) -> int:
    """Run the command; Ctrl-C and SIGTERM go to it, and its exit code is returned."""
    child = subprocess.Popen(command, env=env)

    def forward(signum: int, frame: Any) -> None:
        child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code if code >= 0 else 128 - code


def _shell_path(path: Path) -> str:
    """The path as a shell word, relative to here where it is below here."""
    try:
        shown = path.relative_to(Path.cwd())
    except ValueError:
        shown = path
    return shlex.quote(str(shown))
