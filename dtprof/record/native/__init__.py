"""The native (C++) kernel that sees DDP's buckets: built once per torch build, loaded when built.

``buckets.cpp`` does what :mod:`dtprof.record.ddp_buckets` does with no Python on a bucket's
path (see there). It is compiled against the torch in use, so it is built on the machine, once
per torch build, into dtprof's cache: ``dtprof build-native`` (a C++ compiler and ninja needed,
about 10-30 s). ``profile()`` loads it when it is there and falls back to the Python kernel when
it is not, saying which in the trace's metadata. ``DTPROF_NATIVE=0`` keeps it unloaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dtprof.cache import native_root
from dtprof.errors import DtprofError

SOURCE = Path(__file__).with_name("buckets.cpp")
NAME = "dtprof_native"
SLOTS = 64  # watched groups at most (kSlots in buckets.cpp)
FIELDS = 11  # a record's columns (kFields, Record in buckets.cpp)
OFF_VALUES = {"0", "off", "no", "false"}

_loaded: Native | None = None
_lock = threading.Lock()


def build_dir() -> Path:
    """This torch build's folder for the library: the source, torch and Python in its name."""
    import torch

    key = hashlib.sha1(SOURCE.read_bytes())
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
    """Compile buckets.cpp against this torch (once; again only if the source changed)."""
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
    try:
        load(
            name=NAME,
            sources=[str(SOURCE)],
            build_directory=str(folder),
            extra_cflags=["-O2"],
            is_python_module=False,
            verbose=verbose,
        )
    except Exception as exc:
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise DtprofError(
            f"{SOURCE}: building the native kernel failed ({last}); "
            "`dtprof build-native --verbose` shows the compiler's output"
        ) from None
    path = library_path()
    if not path.is_file():
        raise DtprofError(f"{path}: the build left no library")
    return path


def load() -> tuple[Native | None, str]:
    """(the loaded kernel, "") or (None, why not): never raises."""
    global _loaded
    if os.environ.get("DTPROF_NATIVE", "").strip().lower() in OFF_VALUES:
        return None, "off (DTPROF_NATIVE=0)"
    with _lock:
        if _loaded is not None:
            return _loaded, ""
        try:
            import torch

            if not hasattr(torch.ops, NAME) or not _has_ops(torch):
                path = library_path()
                if not path.is_file():
                    return None, "not built (`dtprof build-native` builds it)"
                torch.ops.load_library(str(path))
            native = Native(torch.ops.dtprof_native)
        except Exception as exc:
            return None, f"cannot load it: {str(exc).splitlines()[0] if str(exc) else exc!r}"
        skew = abs(native.now() - time.perf_counter_ns())
        if skew > 5_000_000:
            return None, f"its clock differs from time.perf_counter_ns() by {skew / 1e6:.0f} ms"
        _loaded = native
        return native, ""


def _has_ops(torch: Any) -> bool:
    try:
        torch.ops.dtprof_native.now  # noqa: B018 -- raises where the library is not loaded
    except (AttributeError, RuntimeError):
        return False
    return True


class Native:
    """The loaded library's operators and the memory it shares with Python."""

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.now = ops.now
        self.shared = (ctypes.c_int64 * (1 + SLOTS)).from_address(int(ops.shared_address()))
        self._tls = threading.local()
        self._dtypes: dict[int, str] = {}

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
