"""Whole jobs launched as users launch them, for benchmarks/overhead.py: a DDP training script
bare and under ``dtprof run``, and a Hugging Face Trainer job bare and with ``DtprofCallback``.

Each is a fresh ``torchrun`` launch, the bare and the recorded one of a kind in turn, so that the
machine's drift falls on both. Every rank times its own steps (wall, and the CPU of its whole
process: dtprof's writer thread included) and writes them to a file; the launcher reads them.
A launch's figure is the median over its steps (after the first ``SKIP``: warm-up, and the
step whose model FLOPs are counted) of the mean over ranks.

    python benchmarks/launched_jobs.py --rounds 3 --ranks 4   # alone, or through overhead.py --jobs
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
# (mode, kind of job, how it is recorded): each recorded mode is compared with its kind's bare
MODES = (
    ("script", "script", None),
    ("script under dtprof run", "script", "run"),
    ("trainer", "trainer", None),
    ("trainer with DtprofCallback", "trainer", "callback"),
)
SKIP = 5  # first steps of a launch left out
WIDTH, DEPTH, BATCH, CLASSES = 512, 4, 64, 16  # the script: overhead.py's MLP


# ------------------------------------------------------------------------------ a rank


def rank_main(args: argparse.Namespace) -> None:
    """One rank of a launched job: train, time each step, write the times."""
    import torch

    torch.set_num_threads(1)
    times: list[tuple[int, int]] = []
    if args.rank_job == "script":
        _script(args.steps, times)
    else:
        _trainer(args.steps, args.callback, Path(args.out), times)
    wall = [b[0] - a[0] for a, b in itertools.pairwise(times)]
    cpu = [b[1] - a[1] for a, b in itertools.pairwise(times)]
    rank = int(os.environ.get("RANK", "0"))
    (Path(args.out) / f"rank-{rank}.json").write_text(json.dumps({"wall": wall, "cpu": cpu}))


def _now() -> tuple[int, int]:
    return time.perf_counter_ns(), time.process_time_ns()


def _script(steps: int, times: list[tuple[int, int]]) -> None:
    """A plain DDP loop, written without dtprof."""
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(dist.get_rank())
    times.append(_now())
    for _ in range(steps):
        x = torch.randn(BATCH, WIDTH, generator=gen)
        y = torch.randint(0, CLASSES, (BATCH,), generator=gen)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(_now())
    dist.barrier()
    dist.destroy_process_group()


def _trainer(steps: int, callback: str | None, out: Path, times: list[tuple[int, int]]) -> None:
    """The tiny GPT-2 of examples/hf_trainer.py, trained by the Hugging Face Trainer."""
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 1 << 16

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    class Times(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            times.append(_now())

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    callbacks: list[Any] = [Times()]
    if callback:
        from dtprof.integrations.hf import DtprofCallback

        callbacks.insert(0, DtprofCallback(callback))
    training = TrainingArguments(
        output_dir=str(out / "hf-output"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=steps,
        logging_steps=1_000_000,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    trainer = Trainer(model=GPT2LMHeadModel(config), args=training, train_dataset=Tokens(),
                      callbacks=callbacks)  # fmt: skip
    trainer.train()


# ------------------------------------------------------------------------------ the launcher


def launch(kind: str, how: str | None, ranks: int, steps: int, root: Path) -> dict[str, float]:
    """One launch: its median step (ms, mean over ranks) and mean CPU per step (ms)."""
    out = Path(tempfile.mkdtemp(dir=root))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    job = [str(HERE), "--rank-job", kind, "--steps", str(steps), "--out", str(out)]
    if how == "callback":
        job += ["--callback", str(out / "trace")]
    command = [*torchrun, *job]
    if how == "run":
        command = [sys.executable, "-m", "dtprof", "run", "--trace", str(out / "trace"), "--"]
        command += [*torchrun, *job]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DTPROF_DISABLE": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    figures = [out / f"rank-{r}.json" for r in range(ranks)]
    if done.returncode != 0 and not all(f.exists() for f in figures):
        raise RuntimeError(f"{kind} ({how or 'bare'}) failed:\n{done.stderr[-3000:]}")
    if done.returncode != 0:  # every rank trained and wrote its times: it failed on its way out
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        print(
            f"{kind} ({how or 'bare'}) exited {done.returncode} after every rank wrote its "
            f"times, which are kept: {last}",
            file=sys.stderr,
        )
    if how is not None and not list((out / "trace").glob("rank=*")):
        raise RuntimeError(f"{kind} ({how}) wrote no trace:\n{done.stderr[-3000:]}")
    per_rank = [json.loads(f.read_text()) for f in figures]
    wall = [sum(s) / ranks for s in zip(*(p["wall"] for p in per_rank), strict=True)][SKIP:]
    cpu = [sum(s) / ranks for s in zip(*(p["cpu"] for p in per_rank), strict=True)][SKIP:]
    return {"wall_ms": statistics.median(wall) / 1e6, "cpu_ms": statistics.fmean(cpu) / 1e6}


def run_jobs(rounds: int, ranks: int, steps: dict[str, int], log: Any) -> dict[str, list[Any]]:
    """Every mode launched once per round, a kind's bare and recorded launches in turn (their
    order alternating from round to round): per mode, its launches' figures."""
    results: dict[str, list[Any]] = {mode: [] for mode, _, _ in MODES}
    with tempfile.TemporaryDirectory(prefix="dtprof-jobs-") as tmp:
        for r in range(rounds):
            for kind in ("script", "trainer"):
                pair = [m for m in MODES if m[1] == kind]
                for mode, _, how in pair if r % 2 == 0 else pair[::-1]:
                    results[mode].append(launch(kind, how, ranks, steps[kind], Path(tmp)))
                    got = results[mode][-1]
                    log(f"round {r + 1}/{rounds}: {mode}: median step {got['wall_ms']:.2f} ms")
    return results


def table(results: dict[str, list[Any]], ranks: int, steps: dict[str, int]) -> list[str]:
    """Per recorded mode: the per-round ratio to its bare launch (median over rounds), wall
    and CPU."""
    lines = [
        f"whole jobs, {ranks} ranks, each a fresh torchrun launch ({len(results['script'])}"
        f" rounds; the script {steps['script']} steps, the trainer {steps['trainer']}):",
        f"  {'mode':<30}{'median step ms':>16}{'per-round ratio':>17}{'CPU ratio':>11}",
    ]
    for mode, kind, how in MODES:
        runs, bare = results[mode], results[kind]
        walls = [r["wall_ms"] for r in runs]
        ratio = cpu = ""
        if how is not None:
            ratio = f"{statistics.median(r['wall_ms'] / b['wall_ms'] for r, b in zip(runs, bare, strict=True)):.3f}"  # noqa: E501
            cpu = f"{statistics.median(r['cpu_ms'] / b['cpu_ms'] for r, b in zip(runs, bare, strict=True)):.3f}"  # noqa: E501
        lines.append(f"  {mode:<30}{statistics.median(walls):>16.2f}{ratio:>17}{cpu:>11}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--script-steps", type=int, default=200)
    p.add_argument("--trainer-steps", type=int, default=60)
    p.add_argument("--rank-job", choices=("script", "trainer"), help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--callback", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_job:
        rank_main(args)
        return 0
    steps = {"script": args.script_steps, "trainer": args.trainer_steps}
    results = run_jobs(args.rounds, args.ranks, steps, lambda m: print(m, file=sys.stderr))
    print("\n".join(table(results, args.ranks, steps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
