"""Decode a PyTorch profiler (Kineto) trace file into small typed records, a chunk at a time.

msgspec reads the file once to find the header and each event's extent (``traceEvents`` as raw
JSON, pointing into the text), then decodes the events CHUNK_EVENTS at a time into
:class:`Event` records holding only what the importer maps: ``ph``, ``cat``, ``name``, ``pid``,
``tid``, ``ts``, ``dur`` and the ``args`` keys of :class:`Args`. Every other key is skipped
without building it, operators' input shapes and types stay raw JSON until a collective needs
them, and the records are not tracked by the cyclic garbage collector. A file that is not
valid JSON, not a trace, or holds an event of the wrong shape fails as one line naming it (and
the event's place: ``$.traceEvents[N]``).
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
    """The ``args`` keys the mapping reads (UNSET where absent); the decoder skips the rest."""

    correlation: Any = UNSET
    stream: Any = UNSET
    bytes: Any = UNSET
    collective_name: Any = field(default=UNSET, name="Collective name")
    in_msg_nelems: Any = field(default=UNSET, name="In msg nelems")
    dtype: Any = UNSET
    input_dims: Raw | UnsetType = field(default=UNSET, name="Input Dims")
    input_type: Raw | UnsetType = field(default=UNSET, name="Input type")
    seq_: Any = field(default=UNSET, name="Seq")
    seq: Any = UNSET
    process_group_name: Any = field(default=UNSET, name="Process Group Name")
    pg_name: Any = UNSET
    device_type: Any = field(default=UNSET, name="Device Type")
    total_allocated: Any = field(default=UNSET, name="Total Allocated")
    total_reserved: Any = field(default=UNSET, name="Total Reserved")


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
_TRACE = msgspec.json.Decoder(_Trace)
_EVENTS = msgspec.json.Decoder(list[Event])
_ARG_KEYS = tuple((f.name, f.encode_name) for f in msgspec.structs.fields(Args))
_CHUNK_INDEX = re.compile(r"`\$\[(\d+)\]")


def args_dict(args: Any) -> dict[str, Any]:
    """The keys an event's args has, by their JSON names, raw values decoded."""
    out: dict[str, Any] = {}
    if not isinstance(args, Args):
        return out
    for attr, key in _ARG_KEYS:
        value = getattr(args, attr)
        if value is not UNSET:
            out[key] = msgspec.json.decode(value) if isinstance(value, Raw) else value
    return out


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
    header = {k: getattr(doc, k) for k in HEADER_KEYS if getattr(doc, k) is not UNSET}
    return header, text, doc.traceEvents


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
