"""Collectives matched across ranks: per process group, one row per seq, one column per member.

The same operation carries the same (group, seq) on every member rank, and a group's seq
numbers are dense, so each group's records scatter straight into a (seq x member) matrix: no
sort and no hash join, and memory linear in the records. p2p operations are left out (their seq
counts per sender-receiver pair). A row is complete when every member of the group recorded it:
with a member's trace missing (a --ranks subset, a stopped rank) none is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import codes, is_null, values

ABSENT = np.iinfo(np.int64).min
SPARSE_FROM = 4  # seq numbers spanning more than this many rows per record are not dense


@dataclass(frozen=True)
class GroupMatrix:
    """One process group's collectives: rows are seq numbers, columns member ranks."""

    group: str
    size: int  # the group's size, from the groups table (else the world's)
    ranks: np.ndarray  # (m,) global ranks of the members seen, ascending
    seq: np.ndarray  # (n,) the seq of each row
    step: np.ndarray  # (n,) the step of each row (one member's)
    start: np.ndarray  # (n, m) entry time per member, ns; ABSENT where it has no record
    end: np.ndarray  # (n, m) completion time per member, ns; ABSENT likewise
    op: np.ndarray  # (n,) the op name of each row (one member's)
    nbytes: np.ndarray  # (n,) the members' mean bytes of each row (their data argument's)
    agree: np.ndarray  # (n,) the members with a record agree on op and bytes (all-to-all: op)

    @property
    def complete(self) -> np.ndarray:
        """Rows every member recorded."""
        if len(self.ranks) < self.size:
            return np.zeros(len(self.seq), bool)
        return (self.start != ABSENT).all(axis=1)


def match(collectives: pa.Table, sizes: pa.Table, world_size: int) -> list[GroupMatrix]:
    """Scatter every group's collectives (not p2p) into its matrix.

    sizes (group, size) come from the groups table; a group missing there is taken to span the
    world, so that a subset of ranks never passes for a whole group.
    """
    size_of = {}
    if sizes.num_rows:
        size_of = dict(zip(values(sizes, "group"), values(sizes, "size"), strict=True))
    coll = collectives
    keep = is_null(coll, "peer")
    group_codes, group_names = codes(coll, "group")
    op_codes, op_names = codes(coll, "op")
    # all-to-all with uneven splits sends different sizes from each member by design
    uneven = np.array(["all_to_all" in str(n) or "alltoall" in str(n) for n in op_names], bool)
    size = np.where(uneven[op_codes], 0, values(coll, "bytes", np.int64))
    columns = {
        "rank": values(coll, "rank"),
        "seq": values(coll, "seq", np.int64),
        "step": values(coll, "step", np.int64),
        "start": values(coll, "start_ns", np.int64),
        "end": values(coll, "end_ns", np.int64),
        # op and bytes in one number, to tell members that disagree
        "kind": op_codes.astype(np.int64) * (1 << 48) + size,
        "op": op_codes,
        "bytes": values(coll, "bytes", np.float64),
    }
    out = []
    # bincounts instead of np.unique: codes and ranks are small non-negative ints, and a sort
    # of every record costs seconds at a thousand ranks
    for code in np.flatnonzero(np.bincount(group_codes[keep & (group_codes >= 0)])):
        pick = keep & (group_codes == code)
        c = {k: v if pick.all() else v[pick] for k, v in columns.items()}
        members = np.flatnonzero(np.bincount(c["rank"]))
        position = np.zeros(int(members[-1]) + 1, np.int64)
        position[members] = np.arange(len(members))
        col = position[c["rank"]]
        first = int(c["seq"].min())
        seqs = None
        if int(c["seq"].max()) - first >= SPARSE_FROM * len(c["seq"]) + 1024:
            # far-apart numbers (a broken or hostile file): a row per seq seen, not per number
            seqs = np.unique(c["seq"])
            row = np.searchsorted(seqs, c["seq"])
        else:
            row = c["seq"] - first
        n, m = int(row.max()) + 1, len(members)
        start = np.full((n, m), ABSENT, np.int64)
        end = np.full((n, m), ABSENT, np.int64)
        start[row, col] = c["start"]
        end[row, col] = c["end"]
        # one member's step, op and bytes per row; rows where another member differs disagree
        step = np.zeros(n, np.int64)
        step[row] = c["step"]
        ref = np.zeros(n, np.int64)
        ref[row] = c["kind"]
        differ = np.bincount(row, weights=c["kind"] != ref[row], minlength=n) > 0
        op = np.zeros(n, op_codes.dtype)
        op[row] = c["op"]
        records = np.bincount(row, minlength=n)
        nbytes = np.bincount(row, weights=c["bytes"], minlength=n) / np.maximum(records, 1)
        seen = np.flatnonzero(records > 0)
        # every row seen (the usual case): no copy of the matrices
        rows: np.ndarray | slice = slice(None) if len(seen) == n else seen
        name = str(group_names[code])
        out.append(
            GroupMatrix(
                group=name,
                size=int(size_of.get(name, world_size)),
                ranks=members,
                seq=np.arange(first, first + n)[rows] if seqs is None else seqs[rows],
                step=step[rows],
                start=start[rows],
                end=end[rows],
                op=np.asarray(op_names, dtype=object)[op[rows]],
                nbytes=nbytes[rows],
                agree=~differ[rows],
            )
        )
    return out
