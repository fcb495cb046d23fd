"""The native profiler-trace reader reads exactly what the Python reader reads, or gives it back."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest

from dtprof.errors import DtprofError
from dtprof.trace.kineto import native as native_module
from dtprof.trace.kineto.mapping import gpu_launches, kernel_category, rank_tables
from dtprof.trace.kineto.read import Cols, KinetoFile, read_kineto
from dtprof.trace.kineto.scan_ahead import native_reader
from tests import kinetobuild as kb
from tests.conftest import native_reader_or_skip

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference_traces"
if not REFERENCE.is_dir():
    REFERENCE = Path("/work/shared/reference_traces")


@pytest.fixture(autouse=True)
def reader() -> None:
    native_reader_or_skip()


def assert_same(native: KinetoFile, python: KinetoFile) -> None:
    """Every field equal, arrays of the same type (NaN equal to NaN): the mapping, one for
    both readers, then makes the same tables of them."""
    assert native.reader == "native" and python.reader == "python"
    for field in dataclasses.fields(KinetoFile):
        if field.name != "reader":
            _same(getattr(native, field.name), getattr(python, field.name), field.name)


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, Cols):
        for field in dataclasses.fields(Cols):
            _same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, where
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
    elif isinstance(a, pa.Array):
        assert a.type == b.type and a.equals(b), (where, a, b)
    else:
        assert a == b, where


def both(path: Path) -> tuple[KinetoFile | str, KinetoFile | str]:
    """(native read, or why it gave the file back, or what it raised; Python read, or what it
    raised): where the native reader raises, the Python reader raises the same."""
    try:
        native = native_module.read(path)
    except ValueError as exc:  # out of range: the importer names the file
        native = f"raised: {exc!r}"
    try:
        python: KinetoFile | str = read_kineto(path, native=False)
    except DtprofError as exc:
        python = f"error: {exc}"
    except ValueError as exc:
        python = f"raised: {exc!r}"
    if isinstance(native, str) and native.startswith("raised: "):
        assert python == native
    return native, python


def _odd(doc: dict[str, Any]) -> dict[str, Any]:
    """Valid, unusual events the native reader reads itself."""
    events = doc["traceEvents"]
    events[2]["name"] = 'void k<"q">(\\) é \u2603 \U0001f600 \t'  # escapes, UTF-8, a surrogate pair
    events[2]["args"]["stream"] = None  # a null stream: the thread's
    del events[4]["dur"]  # no dur: ends where it starts
    events[5]["cat"] = None  # a null category
    events[6]["args"] = [1, 2]  # args that are no object: no args
    events[7] = {"args": {"x": {"y": [1, {"z": None}]}}, **events[7], "ph": "X"}  # order, nesting
    events.insert(0, {"ph": "X", "cat": "kernel", "ts": -1.5e-3, "dur": 2.5e2, "pid": -1})
    events.insert(0, {"name": "no ph", "ts": 1})
    events.insert(0, {})
    return doc


@pytest.mark.parametrize(
    ("name", "layout", "options"),
    [
        ("rank0.json", "profiler", {}),
        ("rank0.json.gz", "compact", {"relative": True, "seq": True}),
        ("rank0.json", "compact", {"float_offset_us": 0.125, "nccl": kb.NCCL_NEW}),
        ("odd.json", "profiler", {"relative": True}),
    ],
)
def test_reads_what_the_python_reader_reads(
    tmp_path: Path, name: str, layout: str, options: dict[str, Any]
) -> None:
    doc = kb.trace(0, steps=4, **options)
    if name == "odd.json":
        doc = _odd(doc)
    native, python = both(kb.write(tmp_path, name, doc, layout=layout))
    assert isinstance(native, KinetoFile) and isinstance(python, KinetoFile), (native, python)
    assert_same(native, python)
    assert len(native.gpu) and len(native.cpu) and len(native.memory_ts_ns)


def test_kernel_categories_and_launches(tmp_path: Path) -> None:
    from dtprof.trace.kineto.mapping import COMMUNICATION, COMPUTE, MEMORY, OTHER

    kernels = [  # (category, name, expected): every rule, and which one wins
        ("kernel", "ncclDevKernel_AllReduce_Sum_f32", COMMUNICATION),
        ("kernel", "ncclKernel_Memcpy_Sync", COMMUNICATION),  # the last rule wins
        ("kernel", "nccl\nKernel", COMPUTE),  # ".*" stops at a line break
        ("kernel", "nccl: Kernel\n", COMMUNICATION),
        ("kernel", "xncclKernel", COMPUTE),  # not at the start
        ("kernel", "cudaStreamSync_wait", OTHER),
        ("kernel", "void copy<Memcpy>()", OTHER),
        ("kernel", "Memcpy HtoD", MEMORY),
        ("kernel", "dma_copy", MEMORY),
        ("kernel", "Memset é \u2603", MEMORY),
        ("gpu_memcpy", "void gemm()", MEMORY),  # a memory category, whatever the name
        ("gpu_memset", "ncclKernel_x", COMMUNICATION),  # but communication stays so
        ("Memcpy", "Sync", MEMORY),
        ("kernel", None, COMPUTE),  # no name
    ]
    events: list[dict[str, Any]] = []
    for i, (cat, name, _) in enumerate(kernels):
        event = kb._gpu(cat, name or "", kb.COMPUTE_STREAM, 100 + i, 1, 50 - 3 * i)
        if name is None:
            del event["name"]
        events.append(event)
    events.append(kb._gpu("kernel", "k", 7, 5, 1, 10_000))  # past every launch's correlation
    events.append(kb._gpu("kernel", "k", 7, 5, 1, -3))  # before every one
    events.append(kb._launch(1, 50, tid=1))
    events.append(kb._launch(2, 47, tid=2))
    events.append(kb._launch(3, 47, tid=3))  # the same correlation again: the first one counts
    events.append(kb._launch(4, 44, tid=4))
    events.append(kb._launch(5, 9_000, tid=5))  # the highest: the nearest of the one past it
    launch = kb._launch(6, 0, tid=6)
    del launch["args"]["correlation"]  # none: matches nothing
    events.append(launch)
    native, python = both(kb.write(tmp_path, "k.json", {"traceEvents": events}))
    assert isinstance(native, KinetoFile) and isinstance(python, KinetoFile), (native, python)
    assert_same(native, python)
    category = kernel_category(native.gpu.name, native.gpu_cat)
    assert category[: len(kernels)].tolist() == [want for *_, want in kernels]
    found, ts_ns, tid = gpu_launches(native)
    # correlations 50, 47, 44, 41, ...: launched at 1, 2 (and again at 3) and 4 µs
    assert found.tolist()[:4] == [True, True, True, False] and not found[len(kernels) :].any()
    assert ts_ns[:4].tolist() == [1000, 2000, 4000, 0] and tid[1] == 2  # file order on a tie
    assert tid[len(kernels)] == 5  # past every correlation: the last launch's thread


def _collectives_doc(calls: list[tuple[dict[str, Any] | None, str | None]]) -> dict[str, Any]:
    """A trace of record_param_comms (with these args, or none) each holding an annotation of
    that name, or none, and on a thread of their own some annotations alone."""
    events: list[dict[str, Any]] = []
    for i, (args, inside) in enumerate(calls):
        t = 100.0 + 10 * i
        rpc = kb._x("cpu_op", "record_param_comms", kb.PID, kb.COMM_TID, t, 5, args or {})
        if args is None:
            del rpc["args"]
        events.append(rpc)
        if inside is not None:
            events.append(kb._x("user_annotation", inside, kb.PID, kb.COMM_TID, t + 1, 2))
        if i % 3 == 0:  # a communication kernel launched inside it
            events.append(kb._launch(t + 2, 5000 + i, tid=kb.COMM_TID))
            events.append(kb._gpu("kernel", kb.NCCL_NEW, kb.NCCL_STREAM, t + 3, 4, 5000 + i))
    for i, name in enumerate(["gloo:all_reduce", "nccl:broadcast", "gloo:send"]):
        events.append(kb._x("user_annotation", name, kb.PID, 999, 50.0 + i, 1))  # alone
    return {"traceEvents": events}


NAMED = {"Collective name": "allgather"}  # kept whatever it launched


def test_collectives_of_both_readers(tmp_path: Path) -> None:
    from dtprof.trace.kineto.mapping import DTYPE_BYTES, OP_NAMES, P2P_OPS

    calls: list[tuple[dict[str, Any] | None, str | None]] = [
        ({"Collective name": "allreduce", "In msg nelems": 10, "dtype": "Float"}, "nccl:x"),
        ({"Collective name": "", "Seq": 4, "Process Group Name": "pg:1"}, "nccl: _allgather_base "),
        ({"seq": 7, "pg_name": "tp", "In msg nelems": None}, "gloo:isend"),
        ({"Input Dims": [[3, 4], []], "Input type": ["c10::Half", "Scalar"]}, None),
        ({**NAMED, "Input Dims": [[3, 2.5]], "Input type": ["float"]}, None),  # no whole count
        ({**NAMED, "Input Dims": [[3]], "Input type": []}, None),  # no type: no dtype, 0 bytes
        ({**NAMED, "Input Dims": [], "Input type": ["int"]}, None),  # no first input: no size
        ({**NAMED, "Input Dims": [[2, 5]], "Input type": ["double"]}, None),
        ({"External id": 3}, None),  # bookkeeping, unless it launched a kernel
        ({"External id": 4}, None),
        (None, "nccl:recv"),
        ({"Seq": 2.0, "seq": 97, "dtype": 7, "In msg nelems": 3}, "nccl:reduce_scatter"),
        ({"seq": 98}, "nccl:\x1f broadcast\x1c"),  # what str.strip() strips
    ]
    calls += [({"Collective name": op}, None) for op in [*OP_NAMES, *P2P_OPS.to_pylist()]]
    calls += [({"In msg nelems": 2, "dtype": dtype.upper()}, "nccl:x") for dtype in DTYPE_BYTES]
    native, python = both(kb.write(tmp_path, "c.json", _collectives_doc(calls)))
    assert isinstance(native, KinetoFile) and isinstance(python, KinetoFile), (native, python)
    assert_same(native, python)
    found = rank_tables(native)["collectives"].to_pydict()
    # the thread of annotations alone comes first (they start earliest), then the calls
    assert found["op"][:4] == ["all_reduce", "broadcast", "send", "all_reduce"]
    assert found["bytes"][3] == 40 and found["dtype"][3] == "float"
    sizes = list(zip(found["bytes"], found["dtype"], strict=True))
    assert sizes[6:11] == [(24, "c10::half"), (0, "float"), (0, None), (0, None), (80, "double")]

    odd = [
        ({"Seq": True}, "nccl:x"),  # a bool
        ({"Process Group Name": 0}, "nccl:x"),  # a number
        ({"Collective name": "allréduce"}, None),  # not ASCII
        ({"In msg nelems": 1 << 62, "dtype": "double"}, None),  # bytes past int64
    ]
    for k, call in enumerate(odd):
        native, python = both(kb.write(tmp_path, f"odd{k}.json", _collectives_doc([call])))
        assert isinstance(native, KinetoFile) and isinstance(python, KinetoFile)
        assert_same(native, python)
        assert native.cpu.args, call


def test_steps_and_memory_readings_of_both_readers(tmp_path: Path) -> None:
    """Random readings (ties, missing values, CPU and CUDA, before the first step) and steps
    (on two threads, sometimes numbered against their order): both readers read them alike."""
    rng = np.random.default_rng(11)
    for k in range(60):
        events: list[dict[str, Any]] = []
        starts = np.sort(rng.integers(0, 40_000, int(rng.integers(0, 5))))
        numbers = np.arange(len(starts))[:: -1 if k % 7 == 6 else 1]
        for number, start in zip(numbers.tolist(), starts.tolist(), strict=True):
            for _ in range(int(rng.integers(1, 3))):  # a step's annotation on two threads
                ts = start + float(rng.integers(0, 3))
                event = kb._x("user_annotation", f"ProfilerStep#{number}", kb.PID, 1, ts, 900)
                events.append(event)
        for _ in range(int(rng.integers(0, 60))):
            args: dict[str, Any] = {"Device Type": int(rng.choice([0, 1, 1, 2]))}
            for key in ("Total Allocated", "Total Reserved"):
                if rng.random() < 0.7:
                    args[key] = int(rng.integers(0, 1 << 40))
            ts_us = float(rng.integers(0, 40)) * 1000 + (0.5 if rng.random() < 0.2 else 0)
            events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                           "pid": kb.PID, "tid": 1, "ts": ts_us, "args": args})  # fmt: skip
        rng.shuffle(events)  # type: ignore[arg-type]
        native, python = both(kb.write(tmp_path, f"m{k}.json", {"traceEvents": events}))
        assert isinstance(native, KinetoFile) and isinstance(python, KinetoFile)
        assert_same(native, python)


@pytest.mark.parametrize(
    ("change", "gives_back"),
    [
        (lambda e: e[2].update(pid="Spans"), "a non-integer where an integer is read"),
        (lambda e: e[2].update(name=5), "a string field holds something else"),
        (lambda e: e[2].update(ts="100.5"), "a non-number where a number is read"),
        (lambda e: e[2]["args"].update(stream=7.0), "a non-integer where an integer is read"),
        (lambda e: e[2].update(tid=True), "a non-integer where an integer is read"),
    ],
)
def test_what_it_gives_back_the_python_reader_reads(
    tmp_path: Path, change: Any, gives_back: str
) -> None:
    doc = kb.trace(0)
    change(doc["traceEvents"])
    native, python = both(kb.write(tmp_path, "rank0.json", doc))
    assert isinstance(native, str) and native.startswith(gives_back), native
    assert isinstance(python, KinetoFile), python
    read = read_kineto(tmp_path / "rank0.json")
    assert read.reader == "python" and len(read.gpu) == len(python.gpu)


@pytest.mark.parametrize(
    ("text", "gives_back", "python_reads"),
    [
        (b'{"traceEvents": [{"ph": "X", "name": "\xff"}]}', "invalid UTF-8", False),
        (b'{"traceEvents": [{"ph": "X", "x": "\xff"}]}', "invalid UTF-8", True),
        (b'{"traceEvents": [{"ph": "X", "x": "\\ud800"}]}', "lone surrogate", False),
        (b'{"traceEvents": [{"ph": "X", "ts": 01}]}', "invalid JSON", False),
        (b'{"traceEvents": [{"ph": "X",}]}', "invalid JSON", False),
        (b'{"traceEvents": [7]}', "an event that is not an object", False),
        (b'{"traceEvents": []} []', "something after the trace object", False),
        (b'{"traceEvents": [], "traceEvents": [{}]}', "traceEvents twice", True),
        (b'{"hello": 1}', "no traceEvents list", False),
        (b"[1, 2]", "invalid JSON", False),
    ],
)
def test_bad_or_doubtful_text_is_left_to_the_python_reader(
    tmp_path: Path, text: bytes, gives_back: str, python_reads: bool
) -> None:
    path = tmp_path / "rank0.json"
    path.write_bytes(text)
    native, python = both(path)
    assert isinstance(native, str) and native.startswith(gives_back), native
    if python_reads:
        assert isinstance(python, KinetoFile), python
    else:
        assert isinstance(python, str) and str(path) in python, python  # its one-line error


def test_a_kind_field_repeated_after_the_args_is_read_as_the_python_reader_reads(
    tmp_path: Path,
) -> None:
    """Args are read where they stand when the event's kind is known by then; a ph, cat or
    name repeated after them (the last counts) can change the kind, and so what is read."""
    base = '"name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7'
    args = '"args": {"stream": 3, "correlation": 9, "bytes": 64}'
    events = [
        f'{{"ph": "X", "cat": "cpu_op", {base}, {args}, "cat": "kernel"}}',  # becomes a kernel
        f'{{"ph": "X", "cat": "kernel", {base}, {args}, "cat": "cpu_op"}}',  # is one no more
        f'{{"ph": "i", "cat": "kernel", {base}, {args}, "ph": "X"}}',  # an instant, then X
        f'{{"ph": "X", "cat": "kernel", {base}, {args}}}',  # the usual order
        f'{{"ph": "X", "cat": "kernel", {base}, {args}, "args": {{"stream": 5}}}}',  # args twice
        # read as a kernel's, then args passed over as a CPU op's, then a kernel again
        f'{{"ph": "X", "cat": "kernel", {base}, {args}, "cat": "cpu_op", "args": {{"stream": 6}}, '
        '"cat": "kernel"}',
        f'{{"ph": "X", "cat": "kernel", {base}, {args}, "args": [1]}}',  # last args: no object
    ]
    path = tmp_path / "rank0.json"
    path.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
    native, python = both(path)
    assert isinstance(native, KinetoFile) and isinstance(python, KinetoFile), (native, python)
    assert_same(native, python)
    assert native.gpu_stream.tolist() == [3, 3, 3, 5, 6, 7]  # 7: no stream, the tid


NUMBERS = [
    "12345678", "99999999", "100000000", "-12345678", "1234567a", "00000000", "0", "-0",
    "1669783687389324", "12345678.5", "1234567812345678e2", "1e400",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
    "12345678901234567890", "123456789012345678901234567890",
]  # fmt: skip


@pytest.mark.parametrize("number", NUMBERS)
def test_numbers_of_every_length_are_read_as_the_python_reader_reads_them(
    tmp_path: Path, number: str
) -> None:
    """Digits go eight at a time where they can: runs of 8, 16, 19 and 20 digits, at and past
    the int64 limits, with a fraction, an exponent or a stray letter, as a kernel's ts, dur and
    stream and as a skipped arg, each read exactly as the Python reader reads it (or, past
    what it reads exactly, given back to it)."""
    doc = kb.trace(0, steps=1)
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    for field in ("ts", "dur", "stream", "skipped"):
        event = dict(kernel, args=dict(kernel["args"]))
        (event["args"] if field in ("stream", "skipped") else event)[field] = "@@"
        doc["traceEvents"].append(event)
    path = tmp_path / "rank0.json"
    path.write_bytes(
        orjson.dumps(doc, option=orjson.OPT_INDENT_2).replace(b'"@@"', number.encode())
    )
    try:
        native, python = both(path)
    except OverflowError:  # the Python reader's int64 columns take no bigger integer
        native, python = native_module.read(path), None
        assert isinstance(native, str), native
        return
    if isinstance(native, KinetoFile):
        assert isinstance(python, KinetoFile), python
        assert_same(native, python)
    else:  # given back (the Python reader decides), or refused by both alike (both() checks)
        assert number not in READ_HERE, native


# integers in int64 that make no timestamp out of range: read here, never given back
READ_HERE = {"12345678", "99999999", "100000000", "-12345678", "0", "-0", "1669783687389324"}


def test_gzipped_files_are_inflated_here_or_given_back_as_the_python_reader_reads_them(
    tmp_path: Path,
) -> None:
    module, _ = native_reader()
    if module is None or not module.inflates:
        pytest.skip("the native reader was built without zlib: Python inflates")
    text = json.dumps(kb.trace(0, steps=2)).encode()
    packed = gzip.compress(text)
    half = len(text) // 2
    cases = {
        "whole": (packed, None),
        "two members": (gzip.compress(text[:half]) + gzip.compress(text[half:]), None),
        "cut short": (packed[:-20], "gzip: cut short"),
        "corrupted": (packed[:40] + bytes(b ^ 0xFF for b in packed[40:60]) + packed[60:], "gzip:"),
        "bad length": (packed[:-4] + b"\0\0\0\0", "gzip: corrupted"),
        "garbage after": (packed + b"junk", "gzip: something after its last member"),
    }
    for name, (data, gives_back) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.json.gz"
        path.write_bytes(data)
        native, python = both(path)
        if gives_back is None:
            assert isinstance(native, KinetoFile) and isinstance(python, KinetoFile), name
            assert_same(native, python)
        else:
            assert isinstance(native, str) and native.startswith(gives_back), (name, native)
            assert isinstance(python, str) and str(path) in python, (name, python)


def test_random_damage_never_makes_it_read_otherwise_than_the_python_reader(
    tmp_path: Path,
) -> None:
    text = json.dumps(_odd(kb.trace(0, steps=2, seq=True)), ensure_ascii=False).encode()
    rng = random.Random(20261122)
    alphabet = b'{}[]:,"\\ 0123456789.-eE+tfnul\xc3\xa9\xff\x01'
    path = tmp_path / "rank0.json"
    outcomes = {"same": 0, "native gave back": 0, "both refuse": 0}
    for _ in range(300):
        damaged = bytearray(text)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(damaged))
            what = rng.random()
            if what < 0.4:
                damaged[at] = rng.choice(alphabet)
            elif what < 0.7:
                del damaged[at : at + rng.randint(1, 4)]
            else:
                damaged[at:at] = bytes([rng.choice(alphabet)])
        path.write_bytes(bytes(damaged))
        native, python = both(path)
        if isinstance(native, KinetoFile):
            assert isinstance(python, KinetoFile), (bytes(damaged), python)
            assert_same(native, python)
            outcomes["same"] += 1
        elif native.startswith("raised: "):
            outcomes["both refuse"] += 1
        else:
            outcomes["native gave back" if isinstance(python, KinetoFile) else "both refuse"] += 1
    assert all(outcomes.values()), outcomes  # each kind of outcome was met


@pytest.mark.parametrize("name", ["hta_v100_allreduce_1rank", "hta_sampled_2rank", "hta_unstepped"])
def test_reads_the_reference_traces_as_the_python_reader_does(name: str) -> None:
    folder = REFERENCE / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is not here")
    for path in sorted(folder.glob("*.json*")):
        if path.name == "figures.json":  # HTA's figures beside the traces
            continue
        native, python = both(path)
        assert isinstance(native, KinetoFile) and isinstance(python, KinetoFile)
        assert_same(native, python)


def test_off_switch_and_a_reader_not_built_fall_back_to_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = kb.write(tmp_path, "rank0.json", kb.trace(0))
    with monkeypatch.context() as m:
        m.setenv("DTPROF_NATIVE", "0")
        assert native_module.read(path) == "off (DTPROF_NATIVE=0)"
        assert read_kineto(path).reader == "python"
    monkeypatch.setitem(sys.modules, "dtprof.trace.kineto._scan", None)  # as if not built
    why = native_module.read(path)
    assert isinstance(why, str) and why.startswith("not built at install")
    assert read_kineto(path).reader == "python"


def test_built_without_zlib_it_scans_what_python_inflates(tmp_path: Path) -> None:
    """The reader as the install builds it where zlib is missing (setup.py's second try)."""
    import sysconfig

    pybind11 = pytest.importorskip("pybind11")
    sources = sorted((Path(native_module.__file__).parent / "cpp").glob("*.cpp"))
    target = tmp_path / f"_scan{sysconfig.get_config_var('EXT_SUFFIX')}"
    includes = [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    flags = ["-O1", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-DDTPROF_NO_ZLIB"]
    subprocess.run(["c++", *flags, *includes, *map(str, sources), "-o", str(target)], check=True)
    path = kb.write(tmp_path, "rank0.json.gz", kb.trace(0, steps=2))
    # in a process of its own: this one has the installed module loaded under the same name
    script = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("dtprof.trace.kineto._scan", {str(target)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["dtprof.trace.kineto._scan"] = module
from pathlib import Path
from dtprof.trace.kineto import native
from tests.unit.test_kineto_native import assert_same, both
path = Path({str(path)!r})
assert not module.inflates and module.scan_file(str(path)).status == native.GZIPPED
native_read, python_read = both(path)
assert_same(native_read, python_read)
print("same")
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=False
    )
    assert done.stdout.strip() == "same", done.stderr[-2000:]


def test_imported_meta_says_which_reader_read_the_file(tmp_path: Path) -> None:
    kb.write(tmp_path / "k", "rank0.json", kb.trace(0))
    out = tmp_path / "out"
    for native, reader in (("1", "native"), ("0", "python")):
        subprocess.run(
            [sys.executable, "-m", "dtprof", "convert", str(tmp_path / "k"), "-o", str(out)],
            env=dict(os.environ, DTPROF_NATIVE=native),
            check=True,
            capture_output=True,
        )
        meta = json.loads((out / "rank=00000" / "meta.json").read_text())
        assert meta["imported"]["reader"] == reader
        subprocess.run(["rm", "-rf", str(out)], check=True)


def test_columns_hold_the_scan_until_the_last_of_them_goes(tmp_path: Path) -> None:
    """The columns view the scan's memory, with no copy: each holds the scan, which is freed
    only when no array still views it."""
    module, _ = native_reader()
    assert module is not None
    scan = module.scan_file(str(kb.write(tmp_path, "rank0.json", kb.trace(0))))
    before = sys.getrefcount(scan)
    columns = scan.columns()
    viewing = [a for a in columns.values() if a.size]
    assert all(a.base is scan for a in viewing) and sys.getrefcount(scan) == before + len(viewing)
    ts, copied = columns["gpu_ts"], columns["gpu_ts"].copy()
    del columns, viewing
    assert sys.getrefcount(scan) == before + 1
    del scan
    assert np.array_equal(ts, copied)
