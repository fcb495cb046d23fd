"""The native (C++) kernel: built once per torch build, then loaded.

``buckets.cpp`` does what :mod:`dtprof.record.ddp_buckets` does with no Python on a bucket's
path (see there); ``phases.cpp`` times the phases as :mod:`dtprof.record.phases` does, with no
Python on the step's path in the common case (see there); where the kernel is loaded for a
model, ``regions.cpp`` is ``prof.region()``'s native form (``profiler_region``) and
``scalars.cpp`` ``prof.log()``'s (``profiler_log``), which reads a logged CPU tensor's value
without torch's dispatcher (``read_scalar``, which Profiler.log uses too); ``frames.cpp`` makes
the writer's frames of the kernel's rows (``frame_of``, dtprof.trace.live's plans). It is compiled
against the torch in use, as torch extensions are, so it is built on the machine, once per
torch build, into dtprof's cache (a C++ compiler and ninja needed, about 10-30 s): by the first
``profile()`` of a model that needs it, which says so once on stderr (the first process of a
node; the others wait for its build), or ahead by ``dtprof build-native``. A build that fails
is remembered, and not tried again at each run until ``dtprof build-native`` tries it;
``profile()`` then records in Python, saying why in the trace's metadata. ``DTPROF_NATIVE=0``
keeps it unloaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dtprof.cache import native_off, native_root
from dtprof.errors import DtprofError

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("buckets.cpp", "phases.cpp", "scalars.cpp", "regions.cpp", "frames.cpp")
)
HEADERS = tuple(Path(__file__).with_name(name) for name in ("attrs.h", "clock.h", "failure.h"))
NAME = "dtprof_native"
SLOTS = 64  # watched groups at most (kSlots in buckets.cpp)
FIELDS = 13  # a record's columns (kFields, Record in buckets.cpp)
# the numbers phases.cpp shares with Python (Field there): dtprof.record.phases reads them
(
    STEP,
    DATA_FROM,
    OPTIMIZER_FROM,
    SAMPLES,
    TOKENS,
    SEEN,
    WORK_IN_PYTHON,
    EXTRAS_DUE,
    RSS_DUE,
    RSS_EVERY,
) = range(10)
PHASE_FIELDS = 10

_loaded: Native | None = None
_lock = threading.Lock()


def build_dir() -> Path:
    """This torch build's folder for the library: the sources, torch and Python in its name."""
    import torch

    key = hashlib.sha1(b"".join(source.read_bytes() for source in SOURCES + HEADERS))
    for part in (
        torch.__version__,
        str(getattr(torch.version, "git_version", "")),
        str(torch.version.cuda),
        sys.version,
        platform.machine(),
        str(Path(torch.__file__).resolve().parent),
    ):
        key.update(part.encode() + b"\0")
    return native_root() / f"torch-{torch.__version__}-{key.hexdigest()[:16]}"


def library_path() -> Path:
    return build_dir() / f"{NAME}.so"


def build(verbose: bool = False) -> Path:
    """Compile the kernel's sources against this torch (once; again only if they changed); a
    failure remembered from an earlier try is forgotten first."""
    try:
        from torch.utils.cpp_extension import load, verify_ninja_availability
    except ImportError as exc:
        raise DtprofError(f"cannot build the native kernel without torch ({exc})") from None
    try:
        verify_ninja_availability()
    except RuntimeError as exc:
        raise DtprofError(f"cannot build the native kernel: {exc} (pip install ninja)") from None
    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    failure_path().unlink(missing_ok=True)
    try:
        load(
            name=NAME,
            sources=[str(source) for source in SOURCES],
            build_directory=str(folder),
            extra_cflags=["-O2"],
            is_python_module=False,
            verbose=verbose,
        )
    except Exception as exc:
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise DtprofError(
            f"{' + '.join(map(str, SOURCES))}: building the native kernel failed ({last}); "
            "`dtprof build-native --verbose` shows the compiler's output"
        ) from None
    path = library_path()
    if not path.is_file():
        raise DtprofError(f"{path}: the build left no library")
    return path


def load() -> tuple[Native | None, str]:
    """(the loaded kernel, "") or (None, why not): never raises."""
    global _loaded
    if native_off():
        return None, "off (DTPROF_NATIVE=0)"
    with _lock:
        if _loaded is not None:
            return _loaded, ""
        try:
            import torch

            path = library_path()
            if not hasattr(torch.ops, NAME) or not _has_ops(torch):
                if not path.is_file():
                    why = _build_once()
                    if why:
                        return None, why
                torch.ops.load_library(str(path))
            native = Native(torch.ops.dtprof_native, path)
        except Exception as exc:
            return None, f"cannot load it: {str(exc).splitlines()[0] if str(exc) else exc!r}"
        skew = abs(native.now() - time.perf_counter_ns())
        if skew > 5_000_000:
            return None, f"its clock differs from time.perf_counter_ns() by {skew / 1e6:.0f} ms"
        _loaded = native
        return native, ""


def loaded() -> Native | None:
    """The kernel where this process has loaded it and it is not switched off (never builds or
    loads it)."""
    return None if native_off() else _loaded


def failure_path() -> Path:
    """Where a failed build of this torch build's kernel is remembered."""
    return build_dir() / "build.failed"


def _build_once() -> str:
    """Build the kernel at its first use, announced once: "" when built, else why not (a
    failure is remembered and not tried again until ``dtprof build-native``). Ranks of one node
    build it once: the others wait on torch's lock in the build folder."""
    failed = failure_path()
    if failed.is_file():
        why = failed.read_text().strip() or "its build failed"
        return f"{why} (before; `dtprof build-native` tries again)"
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(
            f"dtprof: building the native recording kernel for this torch (once, 10-30 s) into "
            f"{build_dir()}; `dtprof build-native` builds it ahead",
            file=sys.stderr,
            flush=True,
        )
    try:
        build()
    except DtprofError as exc:
        why = str(exc).splitlines()[0]
        try:
            failed.parent.mkdir(parents=True, exist_ok=True)
            failed.write_text(why + "\n")
        except OSError:
            pass  # not remembered: the next run tries again
        return why
    return ""


def int64s(address: int, count: int) -> memoryview:
    """``count`` 64-bit integers of the library's memory at ``address``, to read and write from
    Python: a memoryview, whose indexing runs far less code than a ctypes array's (it runs once
    or twice a step, cold)."""
    return memoryview((ctypes.c_int64 * count).from_address(address)).cast("B").cast("q")


def _has_ops(torch: Any) -> bool:
    try:
        torch.ops.dtprof_native.now  # noqa: B018 -- raises where the library is not loaded
    except (AttributeError, RuntimeError):
        return False
    return True


class Native:
    """The loaded library's operators, its plain C functions (``lib``, through ctypes, holding
    the GIL: cheaper to call than an operator) and the memory it shares with Python."""

    def __init__(self, ops: Any, path: Path) -> None:
        self.ops = ops
        self.lib = ctypes.PyDLL(str(path))
        self.now = ops.now
        self.lib.dtprof_bucket_taker.restype = ctypes.py_object
        # take_buckets() -> (failure, completed records, records in flight): buckets.cpp
        self.take_buckets = self.lib.dtprof_bucket_taker()
        self.lib.dtprof_scalar_reader.restype = ctypes.py_object
        # read_scalar(tensor): tensor.item(), read from memory where it is a plain CPU scalar
        self.read_scalar = self.lib.dtprof_scalar_reader()
        self.lib.dtprof_frame_maker.restype = ctypes.py_object
        # frame_of(rows, plan): a live segment's frame of int64 rows (live.frame_of, natively)
        self.frame_of = self.lib.dtprof_frame_maker()
        self.lib.dtprof_profiler_logger.restype = ctypes.py_object
        self.lib.dtprof_profiler_logger.argtypes = [ctypes.py_object]
        self.lib.dtprof_profiler_regioner.restype = ctypes.py_object
        self.lib.dtprof_profiler_regioner.argtypes = [ctypes.py_object]
        self.shared = int64s(int(ops.shared_address()), 1 + SLOTS)
        self._tls = threading.local()
        self._dtypes: dict[int, str] = {}

    def profiler_log(self, prof: Any, python_log: Any, work_names: tuple[str, ...]) -> Any:
        """Profiler.log done natively for ``prof``, which sets it as its own ``log``: floats,
        ints and plain CPU scalar tensors read here (``read_scalar``'s way) into its scalars
        table, its ``active``, ``step_index`` and ``_switched_off`` read as Profiler.log reads
        them; any other call, and any logging one of ``work_names`` (WORK_NAMES), goes,
        untouched, to ``python_log`` (Profiler.log bound to it)."""
        failed = functools.partial(prof.hook_failed, "log")
        context = (
            vars(prof),
            prof._switched_off,
            prof.scalars.append,
            python_log,
            failed,
            work_names,
        )
        return self.lib.dtprof_profiler_logger(context)

    def profiler_region(self, prof: Any, python_region: Any) -> Any:
        """Profiler.region done natively for ``prof``, which sets it as its own ``region``:
        a region whose entry and exit are C (regions.cpp), its depth and step read and written
        in ``prof``'s __dict__ as _Region does; a profiler not recording, one timing regions on
        the GPU, and one whose native region failed get ``python_region`` (Profiler.region
        bound to it)."""
        failed = functools.partial(prof.hook_failed, "region")
        context = (vars(prof), prof._switched_off, prof.spans.append, python_region, failed)
        return self.lib.dtprof_profiler_regioner(context)

    def depth_flag(self) -> ctypes.c_int64:
        """This thread's "inside the wrapped Python API" flag (fetched once per thread)."""
        flag = getattr(self._tls, "flag", None)
        if flag is None:
            flag = self._tls.flag = ctypes.c_int64.from_address(int(self.ops.depth_address()))
        return flag

    def dtype_name(self, code: int) -> str:
        name = self._dtypes.get(code)
        if name is None:
            name = str(self.ops.dtype_probe(code).dtype).removeprefix("torch.")
            self._dtypes[code] = name
        return name
