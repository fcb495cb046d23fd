"""meta.json and inflight.json, declared once: what every producer writes (the recorder, the
profiler-trace and Flight Recorder imports) and every reader reads.

Each is a frozen msgspec Struct: written with ``encode``, read and checked with ``decode``
(a field of the wrong type is a one-line error naming the field; a key this dtprof does not
know is ignored, as the format asks of readers). They are immutable: change a copy with
``replace``. Objects whose optional fields are absent when they have no value (meta.json itself,
nvml and imported) omit them; the others write every field, null where empty.
``docs/trace-format.md`` lists the same fields, and a test holds the two together.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple, TypeVar

import msgspec

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Ranks = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]  # as written; absent reads as 0
Nanoseconds = Int64 | Annotated[float, msgspec.Meta(gt=-(2**62), lt=2**62)]


class ClockEstimate(msgspec.Struct, frozen=True):
    """One estimate of this rank's clock against rank 0's."""

    mono_ns: Nanoseconds = 0  # this rank's monotonic time in the round the estimate comes from
    offset_ns: Nanoseconds = 0  # this rank's wall clock minus rank 0's (0 on rank 0)
    error_ns: Nanoseconds = 0  # bound on the estimate's error: half the best round trip


class Clock(msgspec.Struct, frozen=True):
    """What aligns a rank's monotonic times to rank 0's clock."""

    mono_to_wall_ns: Int64 = 0  # wall clock minus monotonic clock, sampled once at start
    start: ClockEstimate = msgspec.field(default_factory=ClockEstimate)
    method: str = "none"  # ping-pong with rank 0 over gloo, none, or failed: <error>
    end: ClockEstimate | None = None  # the same at a clean exit
    end_error: str | None = None  # why the exit estimate failed


UNALIGNED = Clock(0, ClockEstimate(0, 0))  # a rank that says nothing of its clock


class ClockParams(NamedTuple):
    """How one rank's monotonic ns map onto rank 0's clock: wall = mono + base_ns, then minus
    offset_ns + drift x (mono - t0_ns)."""

    base_ns: int  # mono_to_wall_ns
    offset_ns: float  # offset to rank 0 at t0_ns
    t0_ns: float
    drift: float  # ns of offset per ns, 0 unless the exit estimate shows drift


class Config(msgspec.Struct, frozen=True):
    """The profile() arguments that shape what was recorded (a field an older recorder did not
    write reads as None)."""

    fingerprint_every: Count | None = None
    hang_timeout_s: float | None = None
    ddp_buckets: bool | str | None = None
    gpu_sample_interval_s: float | None = None
    gpu_timing: bool | None = None
    flush_interval_s: float | None = None
    seal_interval_s: float | None = None


class Pipeline(msgspec.Struct, frozen=True):
    """The pipeline schedule a rank ran, from profile(pipeline=schedule)."""

    schedule: str
    stages: Count
    microbatches: Count
    stage_indices: tuple[Count, ...] = ()
    virtual_stages_per_rank: Count = 1
    actions: tuple[str | None, ...] | None = None


class ExceptionDetail(msgspec.Struct, frozen=True):
    """The exception training left profile() with, and the innermost frame of the user's code
    it passed through."""

    type: str = ""
    message: str = ""
    step: Int64 | None = None
    file: str | None = None
    line: Int64 | None = None
    function: str | None = None
    code: str | None = None


class Nvml(msgspec.Struct, frozen=True, omit_defaults=True):
    """Whether NVML samples this rank's device, and which, or why not."""

    available: bool
    device_index: Int64 | None = None
    name: str | None = None
    reason: str | None = None


class Gpm(msgspec.Struct, frozen=True, omit_defaults=True):
    """Whether NVML's GPU performance metrics (Hopper and later) are sampled, or why not."""

    available: bool
    reason: str | None = None


class GpuTiming(msgspec.Struct, frozen=True, omit_defaults=True):
    """Whether phases, regions and collectives are timed with CUDA events, or why not, and how
    it went (dtprof.record.gpu_timing)."""

    available: bool
    reason: str | None = None
    timed: Count = 0  # pairs of events read back into gpu_spans
    dropped: Count = 0  # pairs not timed because too many were waiting for the GPU
    captured: Count = 0  # intervals not timed because they ran inside a CUDA graph's capture
    anchor_error_ns: Int64 = 0  # the largest error bound of the host time of an anchor


class Imported(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where an imported rank came from (a PyTorch profiler trace or a Flight Recorder dump)."""

    format: str = ""  # kineto or flight-recorder
    file: str = ""
    rank_from: str = ""  # how the rank was told: distributedInfo, file name, file order
    seq_from: str | None = None  # kineto: where collectives' seq came from
    events: Count | None = None  # kineto: events in the file
    kineto_schema_version: Any = None
    reader: str | None = None  # kineto: which reader read the file
    flight_recorder_version: str | None = None
    entries: Count | None = None  # flight recorder: entries in the dump


class ModelFlops(msgspec.Struct, frozen=True, omit_defaults=True):
    """The model FLOPs of one training step, counted once (dtprof.record.throughput)."""

    per_step: float  # FLOPs of forward and backward
    forward: float | None = None  # of the forward passes alone, as counted
    samples: Count | None = None  # the samples of the step counted
    tokens: Count | None = None  # its tokens, where its inputs were token ids
    parameters: Count | None = None  # the model's parameters
    dtype: str | None = None  # what its matrix products ran in: bf16, fp16, tf32, fp32...
    method: str = ""


class RankMeta(msgspec.Struct, frozen=True, omit_defaults=True):
    """One rank's meta.json."""

    schema_version: int
    rank: Count
    world_size: Ranks = 0  # 0: not known (an imported file that does not say)
    dtprof_version: str | None = None
    local_rank: Int64 | None = None
    host: str | None = None
    pid: Int64 | None = None
    backend: str | None = None
    device: str | None = None
    device_name: str | None = None  # the accelerator's name (torch.cuda.get_device_name)
    torch_version: str | None = None
    python_version: str | None = None
    started_at: str | None = None
    status: str = ""
    exception: ExceptionDetail | None = None
    model_kind: str | None = None
    config: Config | None = None
    disabled_hooks: tuple[str, ...] = ()
    clock: Clock = msgspec.field(default_factory=lambda: UNALIGNED)
    nvml: Nvml | None = None
    gpm: Gpm | None = None
    gpu_timing: GpuTiming | None = None
    pipeline: Pipeline | None = None
    ddp_buckets_via: str | None = None
    ddp_buckets_kernel: str | None = None
    ddp_buckets_native: str | None = None
    ddp_buckets_dispatcher: str | None = None
    ddp_buckets: str | None = None
    phase_timing: str | None = None
    ended_at: str | None = None
    steps: Count | None = None
    model_flops: ModelFlops | None = None
    imported: Imported | None = None


class InflightOp(msgspec.Struct, frozen=True):
    """An operation a rank had entered and not seen complete: a collectives row without end_ns
    (inflight.json holds a list of them, oldest first)."""

    step: Int64 = 0
    group: str | None = None
    seq: Int64 = 0
    op: str | None = None
    bytes: Int64 = 0
    dtype: str | None = None
    peer: Int64 | None = None
    start_ns: Int64 = 0
    async_op: bool = False
    label: str | None = None


R = TypeVar("R")


def decode(data: Any, kind: type[R]) -> R:
    """A JSON value read from a trace as ``kind``; ValueError naming the field that is wrong."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        problem, _, where = str(exc).partition(" - at `$")
        field = where.rstrip("`").lstrip(".")
        problem = problem.replace("`", "")
        message = f"{field}: {problem[0].lower()}{problem[1:]}" if field else problem
        raise ValueError(message) from None


def encode(record: Any) -> Any:
    """A record (or a list of them) as JSON-ready Python values, optional fields left out (a
    value of another type, such as torch's version string, as its str())."""
    return msgspec.to_builtins(record, enc_hook=str)


def as_dict(record: msgspec.Struct) -> dict[str, Any]:
    """Every field of a record, optional ones included, nested records as dicts."""
    return {
        name: as_dict(value) if isinstance(value, msgspec.Struct) else value
        for name, value in msgspec.structs.asdict(record).items()
    }


replace = msgspec.structs.replace
