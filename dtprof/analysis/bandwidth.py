"""How fast each collective moved its data: algorithm and bus bandwidth, as nccl-tests defines
them, per process group, op and message size, against a link's peak where one is known.

- **Which calls**: the collectives every member of their group recorded, with members that
  agree on op and bytes (dtprof.analysis.matching); barriers and other calls that move no data,
  and the calls of groups of one rank, are left out. Point-to-point transfers too: a send
  matched with its receive (the same group and pair, the pair's sequence number), one row per
  direction of each pair (``0->1``).
- **Time** ``t``: from the last member's arrival to the last member's completion (of a send and
  its receive: the later start to the earlier end, since each side's end is when its wait()
  returned, which a rank busy elsewhere calls late). Waiting for a late rank is the straggler's
  cost (the straggler check), not the network's.
- **Size** ``S``, as nccl-tests counts it: the input of all-reduce, reduce-scatter, all-to-all,
  broadcast and reduce (the bytes dtprof records); the gathered output of all-gather and gather
  (the input times the group's size).
- ``algbw = S / t``; ``busbw = algbw x factor``, the factor nccl-tests gives each op for a group
  of n: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all, gather and scatter
  (n-1)/n; broadcast, reduce and point-to-point 1. Bus bandwidth is what compares with a
  link's speed.
- **Rows**: per group, op and message-size band (from 64 KiB, a band per factor of 16), the
  calls' count, median size, median time, and the median and 10th percentile of algbw and busbw,
  in GB/s (10^9 bytes/s); with a link peak, the median busbw's share of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import codes, in_steps, is_null, rows, steps_between, values
from dtprof.analysis.matching import GroupMatrix

# the peaks of common links, a direction: the figure a bus bandwidth approaches at best
# (name: what it is, Gb/s); docs/report-format.md lists them
LINKS: dict[str, tuple[str, float]] = {
    "nvlink5": ("NVLink 5 (B200, GB200): 900 GB/s a direction", 7200),
    "nvlink4": ("NVLink 4 (H100, H200 SXM): 450 GB/s a direction", 3600),
    "nvlink3": ("NVLink 3 (A100 SXM): 300 GB/s a direction", 2400),
    "pcie5": ("PCIe 5.0 x16: about 63 GB/s a direction", 504),
    "pcie4": ("PCIe 4.0 x16: about 31.5 GB/s a direction", 252),
    "ib-xdr": ("InfiniBand XDR, one port: 800 Gb/s", 800),
    "ib-ndr": ("InfiniBand NDR, one port: 400 Gb/s", 400),
    "ib-hdr": ("InfiniBand HDR, one port: 200 Gb/s", 200),
    "eth400": ("400 Gb/s Ethernet (RoCE)", 400),
    "eth200": ("200 Gb/s Ethernet (RoCE)", 200),
    "eth100": ("100 Gb/s Ethernet (RoCE)", 100),
}
SPREAD = ("all_gather", "allgather", "reduce_scatter", "all_to_all", "alltoall")  # (n-1)/n
BAND_FROM = 64 * 1024  # the first band's upper edge; each band after is 16 times wider
NOTE = (
    "bandwidth from the last member's arrival to completion; busbw = algbw x nccl-tests' factor"
    " (all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast,"
    " point-to-point 1); GB/s"
    " is 10^9 bytes/s"
)


def bus_factor(op: str, n: int) -> float | None:
    """nccl-tests' bus bandwidth factor of an op on a group of n; None: it moves no data."""
    if "all_reduce" in op or "allreduce" in op:
        return 2 * (n - 1) / n
    if any(k in op for k in SPREAD):
        return (n - 1) / n
    if op.startswith(("gather", "scatter")):
        return (n - 1) / n
    if op.startswith(("broadcast", "reduce")):
        return 1.0
    return None


def _gathered(op: str) -> bool:
    """Ops whose size nccl-tests counts as the gathered output: the input times the group."""
    return "all_gather" in op or "allgather" in op or op.startswith("gather")


def band_of(size: np.ndarray) -> np.ndarray:
    """Each size's band: 0 below 64 KiB, then one a factor of 16."""
    ratio = np.maximum(size, 1) / BAND_FROM
    return np.where(size < BAND_FROM, 0, np.floor(np.log(ratio) / np.log(16)).astype(np.int64) + 1)


def band_label(band: int) -> str:
    if band == 0:
        return f"< {_size(BAND_FROM)}"
    low = BAND_FROM * 16 ** (band - 1)
    return f"{_size(low)}-{_size(low * 16)}"


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


@dataclass(frozen=True)
class Transfers:
    """One group's calls of one op that moved data (or one direction of a point-to-point pair):
    what a bandwidth row sums up, call by call."""

    group: str  # the group's name; point-to-point: "<group> <src>-><dst>"
    ranks: tuple[int, ...]  # its members, ascending; point-to-point: (src, dst)
    op: str  # point-to-point: "p2p"
    factor: float  # nccl-tests' bus bandwidth factor
    step: np.ndarray  # (n,) each call's step
    size: np.ndarray  # (n,) bytes, as nccl-tests counts them
    t_ns: np.ndarray  # (n,) from the last member's arrival to completion

    @property
    def busbw(self) -> np.ndarray:
        """Each call's bus bandwidth, GB/s."""
        return self.size / self.t_ns * self.factor

    @property
    def band(self) -> np.ndarray:
        return band_of(self.size)


def transfers(
    matched: list[GroupMatrix],
    steps: tuple[int | None, int | None] = (None, None),
    collectives: pa.Table | None = None,
) -> list[Transfers]:
    """Every group's calls, op by op, of steps first <= step < last (None: open on that side);
    with ``collectives`` (the run's records), point-to-point transfers too."""
    out: list[Transfers] = []
    for gm in matched:
        if gm.size < 2:  # a group of one rank: nothing moves between ranks
            continue
        whole = gm.complete & gm.agree & in_steps(gm.step, *steps)
        if not whole.any():
            continue
        n = gm.size
        start, end = gm.start[whole], gm.end[whole]
        t_ns = (end.max(axis=1) - start.max(axis=1)).astype(np.float64)
        ops, nbytes, step = gm.op[whole], gm.nbytes[whole], gm.step[whole]
        for op in sorted(set(ops.tolist())):
            factor = bus_factor(str(op), n)
            pick = (ops == op) & (t_ns > 0) & (nbytes > 0)
            if factor is None or not pick.any():
                continue
            size = nbytes[pick] * (n if _gathered(str(op)) else 1)
            members = tuple(int(r) for r in gm.ranks)
            out.append(Transfers(gm.group, members, str(op), factor, step[pick], size, t_ns[pick]))
    if collectives is not None:
        out += p2p_transfers(collectives, steps)
    return out


def bandwidth_rows(
    matched: list[GroupMatrix],
    steps: tuple[int | None, int | None] = (None, None),
    collectives: pa.Table | None = None,
) -> list[dict[str, Any]]:
    """Per group, op and size band, the calls' figures (module doc), slowest share first: rows
    in order of the time their calls took in all; the calls of steps first <= step < last
    (None: open on that side); with ``collectives`` (the run's records), point-to-point
    transfers too."""
    out = []
    for x in transfers(matched, steps, collectives):
        bands = x.band
        for band in np.unique(bands).tolist():
            at = bands == band
            out.append(_row(x, int(band), at))
    out.sort(key=lambda r: -r["total_ms"])
    return out


SENDS = ("send", "isend")


def p2p_transfers(
    collectives: pa.Table, steps: tuple[int | None, int | None] = (None, None)
) -> list[Transfers]:
    """Point-to-point transfers, one Transfers a direction of each pair (group
    ``<group> <src>-><dst>``): each send matched with the receive of the same group, pair and
    sequence number."""
    if collectives.column("peer").null_count == collectives.num_rows:  # none, or no p2p
        return []
    p2p = steps_between(rows(collectives, ~is_null(collectives, "peer")), *steps)
    if not p2p.num_rows:
        return []
    group, names = codes(p2p, "group")
    op = values(p2p, "op")
    send = np.isin(op, SENDS)
    rank, peer = values(p2p, "rank", np.int64), values(p2p, "peer", np.int64)
    src, dst = np.where(send, rank, peer), np.where(send, peer, rank)
    seq = values(p2p, "seq", np.int64)
    # one key per transfer: (group, src, dst, seq), packed into an int64 by ranking each part
    parts = [np.unique(x, return_inverse=True)[1].astype(np.int64) for x in (group, src, dst, seq)]
    key = parts[0]
    for part in parts[1:]:
        key = key * (int(part.max()) + 1) + part
    start, end = values(p2p, "start_ns", np.int64), values(p2p, "end_ns", np.int64)
    nbytes = values(p2p, "bytes", np.float64)
    step = values(p2p, "step")
    s_at, r_at = np.flatnonzero(send), np.flatnonzero(~send)
    if not len(r_at):
        return []
    order = np.argsort(key[r_at], kind="stable")
    found = np.searchsorted(key[r_at][order], key[s_at]).clip(0, len(r_at) - 1)
    r_match = r_at[order][found]
    hit = key[r_match] == key[s_at]
    s_at, r_match = s_at[hit], r_match[hit]
    t = (np.minimum(end[s_at], end[r_match]) - np.maximum(start[s_at], start[r_match])).astype(
        np.float64
    )
    size = nbytes[s_at]
    good = (t > 0) & (size > 0)
    s_at, t, size = s_at[good], t[good], size[good]
    out = []
    pair = group[s_at].astype(np.int64) * (1 << 42) + src[s_at] * (1 << 21) + dst[s_at]
    for p_key in np.unique(pair).tolist():
        mine = pair == p_key
        i = s_at[np.flatnonzero(mine)[0]]
        label = f"{names[group[i]]} {src[i]}->{dst[i]}"
        ends = (int(src[i]), int(dst[i]))
        out.append(Transfers(label, ends, "p2p", 1.0, step[s_at[mine]], size[mine], t[mine]))
    return out


def _row(x: Transfers, band: int, at: np.ndarray) -> dict[str, Any]:
    size, t = x.size[at], x.t_ns[at]
    algbw = size / t  # bytes per ns = GB/s
    return {
        "group": x.group,
        "ranks": len(x.ranks),
        "op": x.op,
        "band": band_label(band),
        "calls": len(t),
        "bytes": float(np.median(size)),
        "time_ms": float(np.median(t)) / 1e6,
        "total_ms": float(t.sum()) / 1e6,
        "algbw_gbs": float(np.median(algbw)),
        "busbw_gbs": float(np.median(algbw)) * x.factor,
        "busbw_p10_gbs": float(np.percentile(algbw, 10)) * x.factor,
    }


def link_peak(text: str) -> tuple[float, str]:
    """A link's peak (Gb/s, what it is) from a number of Gb/s or a name of LINKS."""
    if text.lower() in LINKS:
        what, gbps = LINKS[text.lower()]
        return gbps, what
    try:
        gbps = float(text)
    except ValueError:
        names = ", ".join(LINKS)
        raise ValueError(f"not a number of Gb/s nor a link dtprof knows ({names})") from None
    if not math.isfinite(gbps) or gbps <= 0:
        raise ValueError("a link's speed must be a positive number of Gb/s")
    return gbps, f"{gbps:g} Gb/s"


def bandwidth_summary(
    matched: list[GroupMatrix], collectives: pa.Table | None = None, link: str | None = None
) -> dict[str, Any]:
    """The report's ``bandwidth`` block ({} without any call to measure): its rows, rounded, each
    with its share of the link's peak where ``link`` (Gb/s, or a name of LINKS) is given."""
    found = bandwidth_rows(matched, collectives=collectives)
    if not found:
        return {}
    peak = link_peak(link) if link is not None else None
    for row in found:
        for key in ("time_ms", "total_ms", "algbw_gbs", "busbw_gbs", "busbw_p10_gbs"):
            row[key] = round(row[key], 3)
        row["bytes"] = int(row["bytes"])
        if peak is not None:
            row["of_link_pct"] = round(100 * row["busbw_gbs"] * 8 / peak[0], 1)
    block: dict[str, Any] = {"rows": found, "definitions": NOTE}
    if peak is not None:
        block["link"] = {"gbps": peak[0], "what": peak[1]}
    return {"bandwidth": block}
