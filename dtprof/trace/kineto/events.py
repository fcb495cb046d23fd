"""Decode a PyTorch profiler (Kineto) trace file into small typed records, a chunk at a time.

Records hold only what the importer maps: ``ph``, ``cat``, ``name``, ``pid``, ``tid``, ``ts``,
``dur`` and the ``args`` keys of :class:`Args`. Every other key is skipped without building it,
operators' input shapes and types stay raw JSON until a collective needs them, and the records
are not tracked by the cyclic garbage collector.

Two ways to a file's chunks, the same records either way:

- :func:`stream`, for files whose events are objects separated by commas (as the profiler
  writes them, one after another, or all on one line): the file is read a buffer at a time
  (gunzipped on the fly) and the events up to the last ``}`` ``,`` ``{`` in the buffer are
  decoded straight from it. Decoding starts where an event starts, so a cut anywhere but
  between two events leaves an unterminated string or an unclosed object: invalid JSON, and the
  file is then read the other way. The whole text is never held, nor a list of every event.
- :func:`decode` + :func:`chunks`, for any other layout: msgspec reads the whole text once to
  find the header and each event's extent (``traceEvents`` as raw JSON, pointing into the
  text), then decodes the events CHUNK_EVENTS at a time. This way also gives the precise
  errors: a file that is not valid JSON, not a trace, or holds an event of the wrong shape
  fails as one line naming it (and the event's place: ``$.traceEvents[N]``).
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET, Raw, UnsetType, field

from dtprof.errors import DtprofError


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys the mapping reads (None or UNSET where absent); the rest are skipped."""

    correlation: Any = None
    stream: Any = None
    bytes: Any = None
    collective_name: Any = field(default=None, name="Collective name")
    in_msg_nelems: Any = field(default=None, name="In msg nelems")
    dtype: Any = None
    input_dims: Raw | UnsetType = field(default=UNSET, name="Input Dims")  # decoded if needed
    input_type: Raw | UnsetType = field(default=UNSET, name="Input type")
    seq_: Any = field(default=None, name="Seq")
    seq: Any = None
    process_group_name: Any = field(default=None, name="Process Group Name")
    pg_name: Any = None
    device_type: Any = field(default=None, name="Device Type")
    total_allocated: Any = field(default=None, name="Total Allocated")
    total_reserved: Any = field(default=None, name="Total Reserved")


class Event(msgspec.Struct, gc=False):
    """One trace event, reduced to the keys the importer reads (not tracked by the collector)."""

    ph: str | None = None
    cat: str | None = None
    name: Any = None  # a string; anything else is taken as its str(), a missing one as ""
    pid: Any = None  # int, or a string ("Spans", "Traces") in some builds
    tid: Any = None
    ts: Any = None  # µs: int, float or numeric string
    dur: Any = None
    args: Args | list[Any] | str | int | float | bool | None = None  # an object, as a rule


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[Raw]  # each event's JSON text, decoded a chunk at a time
    schemaVersion: Any = UNSET
    distributedInfo: Any = UNSET
    baseTimeNanoseconds: Any = UNSET


HEADER_KEYS = ("schemaVersion", "distributedInfo", "baseTimeNanoseconds")
CHUNK_EVENTS = 8192  # records decoded at a time: a file never holds more than these at once
BUFFER_BYTES = 1 << 20  # what stream() reads at a time: its records come this many bytes a chunk
_TRACE = msgspec.json.Decoder(_Trace)
_EVENTS = msgspec.json.Decoder(list[Event])
_CHUNK_INDEX = re.compile(r"`\$\[(\d+)\]")
_EVENTS_KEY = re.compile(rb'[{,]\s*"traceEvents"\s*:\s*\[')  # where a key of the document can be
_BETWEEN = re.compile(rb"\}\s*,\s*\{")  # between two events, or somewhere else: see stream()


NO_ARGS = Args()  # an event without args, or whose args are no object


def raw_value(value: Any) -> Any:
    """An ``Args`` field's value: a Raw one (``Input Dims``, ``Input type``) decoded, UNSET as
    None."""
    if isinstance(value, Raw):
        return msgspec.json.decode(value)
    return None if value is UNSET else value


def owned(args: Any) -> Args | None:
    """An event's args record, kept past its chunk: its Raw fields point into the read buffer,
    which the next chunk overwrites, so they are copied out. None for args that are no object."""
    if not isinstance(args, Args):
        return None
    dims, types = args.input_dims, args.input_type
    if not isinstance(dims, Raw) and not isinstance(types, Raw):
        return args
    return msgspec.structs.replace(
        args,
        input_dims=Raw(bytes(dims)) if isinstance(dims, Raw) else dims,
        input_type=Raw(bytes(types)) if isinstance(types, Raw) else types,
    )


def read_bytes(path: Path) -> bytes:
    """The file's JSON text, gunzipped when it is gzip (by its magic bytes, not its name)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DtprofError(f"{path}: cannot read ({exc.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DtprofError(f"{path}: corrupted gzip ({exc})") from None
    return raw


def decode(path: Path) -> tuple[dict[str, Any], bytes, list[Raw]]:
    """(header, JSON text, each event's part of it); a file that is not a trace fails naming it."""
    text = read_bytes(path)
    try:
        doc = _TRACE.decode(text)
    except msgspec.ValidationError:  # not an object, or no traceEvents list in it
        raise DtprofError(f"{path}: not a PyTorch profiler trace (no traceEvents list)") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DtprofError(f"{path}: not valid JSON ({exc})") from None
    return _header(doc), text, doc.traceEvents


def _header(doc: _Trace) -> dict[str, Any]:
    return {k: getattr(doc, k) for k in HEADER_KEYS if getattr(doc, k) is not UNSET}


def _address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, np.uint8).__array_interface__["data"][0])


def _span(text: bytes, events: list[Raw]) -> bytes:
    """A JSON array of these consecutive events: one slice of the text they point into."""
    if not events:
        return b"[]"
    lo = _address(events[0]) - _address(text)
    hi = _address(events[-1]) - _address(text) + len(events[-1])
    if not 0 <= lo < hi <= len(text):  # msgspec copied them: join instead
        return b"[" + b",".join(events) + b"]"
    return b"".join((b"[", memoryview(text)[lo:hi], b"]"))


def chunks(path: Path, text: bytes, events: list[Raw]) -> Iterator[list[Event]]:
    """The events as records, CHUNK_EVENTS at a time (at least one chunk, maybe empty)."""
    for start in range(0, max(len(events), 1), CHUNK_EVENTS):
        try:
            yield _EVENTS.decode(_span(text, events[start : start + CHUNK_EVENTS]))
        except msgspec.ValidationError as exc:
            at, found = str(exc), _CHUNK_INDEX.search(str(exc))  # `$[i]`: i within the chunk
            if found:
                at = at.replace(found[0], f"`$.traceEvents[{start + int(found[1])}]", 1)
            raise DtprofError(
                f"{path}: traceEvents holds something other than profiler events ({at})"
            ) from None


class Unstreamable(Exception):
    """stream() cannot cut this file into chunks of events: read it whole instead."""


def stream(path: Path, header: dict[str, Any]) -> Iterator[list[Event]]:
    """The events as records, a buffer of the file at a time; fills ``header`` on the way.

    Raises Unstreamable (maybe after some chunks) where a cut fell inside an event, an event
    outgrows the buffer, or the file is not valid or cannot be read: :func:`decode` then reads
    it whole and says what is wrong, if anything.
    """
    try:
        with open(path, "rb") as raw:
            gzipped = raw.peek(2)[:2] == b"\x1f\x8b"
            with gzip.GzipFile(fileobj=raw) if gzipped else raw as source:
                yield from _stream(source, header)
    except (OSError, EOFError, zlib.error, msgspec.MsgspecError, UnicodeDecodeError) as exc:
        raise Unstreamable(str(exc)) from None


def _stream(source: Any, header: dict[str, Any]) -> Iterator[list[Event]]:
    buf = bytearray(BUFFER_BYTES)
    filled = _fill(source, buf, 0)
    found = _EVENTS_KEY.search(buf, 0, filled)
    if found is None:
        raise Unstreamable("no traceEvents list in the first buffer")
    prefix = bytes(buf[: found.start() + 1])  # up to the "{" or "," before the key
    header.update(_header(_TRACE.decode(prefix + b'"traceEvents": []}')))
    lo = found.end() - 1  # buf[lo] is the "[" that opens the chunk's array
    while filled == len(buf):  # until the end of the file is in the buffer
        cut = _last_between(buf, lo + 1, filled)
        if cut is None:
            raise Unstreamable("no event ends in a buffer")
        end, following = cut
        buf[end] = ord("]")  # the chunk's events as one JSON array, decoded in place
        yield _EVENTS.decode(memoryview(buf)[lo : end + 1])
        rest = filled - following
        buf[1 : 1 + rest] = buf[following:filled]  # the events not decoded yet, behind a "["
        buf[0], lo = ord("["), 0
        filled = _fill(source, buf, 1 + rest)
    # the last events and whatever follows the list: the rest of the document, reopened
    text = b'{"traceEvents": ' + bytes(buf[lo:filled])
    del buf
    doc = _TRACE.decode(text)
    header.update(_header(doc))
    try:
        yield from chunks(Path("-"), text, doc.traceEvents)
    except DtprofError as exc:
        raise Unstreamable(str(exc)) from None


def _fill(source: Any, buf: bytearray, at: int) -> int:
    """Read into buf from ``at`` until it is full or the file ends; how far buf is filled."""
    view = memoryview(buf)
    while at < len(buf):
        got = source.readinto(view[at:])
        if not got:
            break
        at += got
    return at


def _last_between(buf: bytearray, lo: int, hi: int) -> tuple[int, int] | None:
    """(just past the "}", at the "{") of the last separator between events in buf[lo:hi]."""
    window = 1 << 16
    while True:
        start = max(lo, hi - window)
        last = None
        for last in _BETWEEN.finditer(buf, start, hi):  # noqa: B007 -- the last one is wanted
            pass
        if last is not None:
            return last.start() + 1, last.end() - 1
        if start == lo:
            return None
        window *= 16
