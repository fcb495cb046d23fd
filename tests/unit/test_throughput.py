"""Throughput and MFU: what a step's inputs count, the FLOPs of one step, the peak table, and
the report's figures from a trace recorded in this process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import dtprof
from dtprof.analysis import analyze
from dtprof.analysis.peaks import peak_tflops
from dtprof.analysis.render import markdown, text
from dtprof.cli import main
from dtprof.record.throughput import batch_counts
from dtprof.record.writer import DtprofWarning


def test_a_forward_pass_counts_its_samples_and_tokens() -> None:
    ids = torch.zeros(4, 32, dtype=torch.long)
    assert batch_counts((), {"input_ids": ids, "labels": ids}) == (4, 128)
    assert batch_counts((), {"inputs_embeds": torch.zeros(4, 32, 8)}) == (4, 128)
    assert batch_counts((ids,), {}) == (4, 128)  # token ids by position
    assert batch_counts((torch.zeros(16, 32),), {}) == (16, None)  # features: no tokens
    assert batch_counts(([torch.zeros(16, 3, 8, 8), torch.zeros(16)], 7), {}) == (16, None)
    assert batch_counts(({"x": torch.zeros(5, 2)},), {}) == (5, None)
    assert batch_counts((torch.zeros(6, 3, dtype=torch.bool),), {}) == (6, None)  # a mask
    assert batch_counts((), {}) is None
    assert batch_counts((torch.tensor(3.0),), {}) is None


def test_the_peak_of_a_device_is_found_by_its_name() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == (989.0, "NVIDIA H100 SXM, bf16")
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == (756.0, "NVIDIA H100 PCIe, bf16")
    assert peak_tflops("NVIDIA H100 NVL", "fp16") == (835.0, "NVIDIA H100 NVL, fp16")
    assert peak_tflops("NVIDIA GH200 480GB", "bf16") == (989.0, "NVIDIA GH200, bf16")
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == (156.0, "NVIDIA A100, tf32")
    assert peak_tflops("NVIDIA L40S", "bf16") == (362.0, "NVIDIA L40S, bf16")
    assert peak_tflops("NVIDIA L4", "bf16") == (121.0, "NVIDIA L4, bf16")
    assert peak_tflops("Tesla V100-PCIE-32GB", "fp16") == (112.0, "NVIDIA V100 PCIe, fp16")
    assert peak_tflops("Tesla V100-SXM2-16GB", "fp16") == (125.0, "NVIDIA V100 SXM2, fp16")
    assert peak_tflops("AMD Instinct MI300X", "bf16")[0] == 1307.0  # type: ignore[index]
    assert peak_tflops("AMD Instinct MI250X/MI250", "bf16")[0] == 383.0  # type: ignore[index]
    assert peak_tflops("NVIDIA A10G", "bf16") is None  # not the A10
    assert peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 on a V100
    assert peak_tflops("cpu", "fp32") is None
    assert peak_tflops(None, "bf16") is None


WIDTH, HIDDEN, OUT, BATCH = 8, 16, 4, 5


def _record(trace: Path, steps: int, *, log_samples: bool = False) -> None:
    model = nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with dtprof.profile(trace, model=model, optimizer=opt, clock_sync=False) as prof:
        for step in range(steps):
            for _ in range(2):  # two micro-batches per step
                model(torch.randn(BATCH, WIDTH)).pow(2).mean().backward()
            with torch.no_grad():
                model(torch.randn(3, WIDTH))  # an evaluation pass: not counted
            opt.step()
            opt.zero_grad()
            if log_samples:
                prof.log(samples=100 + step)
            prof.step()


class _AnyInput(nn.Module):
    """A model that takes its batch as a tensor, by position or as input_ids, or in a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: object = None, input_ids: object = None) -> torch.Tensor:
        batch = x if x is not None else input_ids
        if isinstance(batch, dict):
            batch = batch["x"]
        assert isinstance(batch, torch.Tensor)
        return self.linear(torch.ones(len(batch) if batch.dim() else 1, 4)).sum()


def test_a_steps_counts_are_the_same_whoever_counts_them(tmp_path: Path, kernel: str) -> None:
    """From the second step the native kernel counts the passes whose input is a plain tensor
    and hands the others to Python: the scalars are those batch_counts gives, either way."""
    ids = torch.zeros(3, 7, dtype=torch.long)
    steps: list[list[tuple[tuple[object, ...], dict[str, object]]]] = [
        [((torch.zeros(5, 4),), {})],  # the FLOPs' step
        [((torch.zeros(5, 4),), {})],
        [((ids,), {})],  # token ids by position
        [((), {"input_ids": torch.zeros(2, 6, dtype=torch.long)})],
        [(({"x": torch.zeros(6, 4)},), {})],
        [((torch.zeros(5, 4),), {}), ((ids,), {})],  # two micro-batches
        [((torch.tensor(1.0),), {})],  # nothing to count
    ]
    model = _AnyInput()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with dtprof.profile(tmp_path, model=model, optimizer=opt, clock_sync=False) as prof:
        for passes in steps:
            for args, kwargs in passes:
                model(*args, **kwargs).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    trace = dtprof.load_trace(tmp_path)
    assert trace.meta[0].phase_timing.startswith(kernel)
    scalars = trace.scalars.sort_values(["step", "name"])
    counted = {(int(r.step), r.name): r.value for r in scalars.itertuples()}
    assert counted == {
        (0, "samples"): 5,
        (1, "samples"): 5,
        (2, "samples"): 3,
        (2, "tokens"): 21,
        (3, "samples"): 2,
        (3, "tokens"): 12,
        (4, "samples"): 6,
        (5, "samples"): 8,
        (5, "tokens"): 21,
    }


FORWARD_FLOPS = 2 * 2 * BATCH * (WIDTH * HIDDEN + HIDDEN * OUT)  # two passes, 2 per multiply-add


def test_a_step_logs_the_samples_of_its_training_passes_and_one_count_of_its_flops(
    tmp_path: Path,
) -> None:
    _record(tmp_path, steps=4)
    scalars = dtprof.load_trace(tmp_path).scalars
    samples = scalars[scalars["name"] == "samples"]
    assert samples["step"].tolist() == [0, 1, 2, 3] and (samples["value"] == 2 * BATCH).all()
    assert "tokens" not in set(scalars["name"])  # features, not token ids
    meta = json.loads((tmp_path / "rank=00000" / "meta.json").read_text())
    assert meta["model_flops"] == {
        "per_step": 3 * FORWARD_FLOPS,
        "forward": FORWARD_FLOPS,
        "samples": 2 * BATCH,
        "parameters": WIDTH * HIDDEN + HIDDEN + HIDDEN * OUT + OUT,
        "dtype": "fp32",
        "method": "FlopCounterMode on one step's forward passes, x3",
    }


def test_samples_the_script_logs_replace_the_count(tmp_path: Path) -> None:
    _record(tmp_path, steps=3, log_samples=True)
    scalars = dtprof.load_trace(tmp_path).scalars
    assert scalars[scalars["name"] == "samples"]["value"].tolist() == [100, 101, 102]


def test_the_report_gives_throughput_and_mfu_against_a_stated_peak(tmp_path: Path) -> None:
    _record(tmp_path, steps=24)
    trace = dtprof.load_trace(tmp_path)
    steps = trace.steps[trace.steps["step"] >= 2]  # the warm-up the checks skip too
    seconds = (steps["end_ns"] - steps["start_ns"]).sum() / 1e9
    report = analyze(tmp_path, peak_tflops=1e-3)
    rate = report.summary["throughput"]
    assert rate["samples_per_s"] == pytest.approx(len(steps) * 2 * BATCH / seconds, rel=1e-3)
    assert rate["tokens_per_s"] is None
    assert rate["tflop_per_step"] == pytest.approx(3 * FORWARD_FLOPS / 1e12, rel=1e-3)
    tflops = len(steps) * 3 * FORWARD_FLOPS / seconds / 1e12
    assert rate["tflops_per_rank"] == pytest.approx(tflops, rel=1e-3)
    assert rate["mfu_pct"] == pytest.approx(tflops / 1e-3 * 100, rel=1e-3)
    assert rate["peak_of"] == "--peak-tflops"
    assert rate["ranks"][0]["samples_per_s"] == pytest.approx(rate["samples_per_s"], rel=1e-3)
    shown = text(report).splitlines()
    assert shown[2].startswith("throughput: ") and shown[2].endswith(
        " samples/s (the sum over 1 ranks)"
    )
    assert shown[3].startswith("model FLOPs: 11.5 kFLOP per step, ")
    assert shown[3].endswith("; MFU " + f"{rate['mfu_pct']:.1f}% of 0.001 TFLOP/s (--peak-tflops)")
    assert "\n\nmodel FLOPs: " in markdown(report)
    on_cpu = analyze(tmp_path).summary["throughput"]  # no peak known for a CPU: no MFU
    assert on_cpu["mfu_pct"] is None and on_cpu["peak_of"] is None
    assert np.isclose(on_cpu["tflops_per_rank"], rate["tflops_per_rank"])


SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_a_trace_without_counts_has_no_throughput() -> None:
    assert "throughput" not in analyze(SAMPLES / "healthy-ddp").summary


@pytest.mark.parametrize("bad", ["0", "-3", "fast", "inf", "nan"])
def test_a_peak_that_is_not_a_positive_number_is_refused(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["analyze", str(SAMPLES / "healthy-ddp"), "--peak-tflops", bad])
    assert exited.value.code == 2
    assert f"--peak-tflops: wants a number above 0, not '{bad}'" in capsys.readouterr().err


def test_the_dashboard_overview_shows_the_throughput(tmp_path: Path) -> None:
    from dashboard.pages import overview
    from dashboard.source import LiveSource

    _record(tmp_path, steps=12)
    source = LiveSource(tmp_path)
    source.refresh()
    source.refresh()
    snap = source.snapshot()
    rate = analyze(tmp_path).summary["throughput"]
    cards = dict(overview._rate_cards(overview.rates(snap.data)))
    assert set(cards) == {"samples/s", "TFLOP/s per rank"}  # no MFU on CPU
    shown = float(cards["samples/s"].replace(",", ""))
    assert shown == pytest.approx(rate["samples_per_s"], rel=0.01)
    assert "samples/s" in str(overview.update(snap)[0])
    assert overview._rate_cards(None) == []


def test_a_flop_count_that_fails_is_given_up_and_the_rest_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(module: nn.Module) -> str:
        raise TypeError("is_autocast_enabled() takes no arguments")  # as an older torch says

    monkeypatch.setattr("dtprof.record.throughput.compute_dtype", broken)
    with pytest.warns(DtprofWarning, match="the flops hook raised TypeError"):
        _record(tmp_path, steps=3)
    trace = dtprof.load_trace(tmp_path)
    assert trace.meta[0].disabled_hooks == ("flops",) and trace.meta[0].model_flops is None
    assert (trace.scalars[trace.scalars["name"] == "samples"]["value"] == 2 * BATCH).all()
    assert set(trace.spans["name"]) >= {"forward", "backward", "optimizer"}
