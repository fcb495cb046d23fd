"""numpy views of the summaries' Arrow tables, and what the checks share: group-bys, medians,
the warm-up steps they skip.

The summaries are Arrow tables (the trace's own format); the checks compute on numpy arrays
of their columns. Rules kept from pandas, which the analyzer used before: text columns are
object arrays, integers with nulls are floats with NaN, and a median skips NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def values(t: pa.Table, name: str, dtype: type | np.dtype | None = None) -> np.ndarray:
    """A column as numpy: numbers as they are (integers with nulls as floats, NaN), text as
    objects, None where null (a dictionary column decoded, each distinct string shared)."""
    column = t.column(name)
    if pa.types.is_dictionary(column.type):
        code, names = codes(t, name)
        out = np.concatenate([names, np.array([None], object)])[code]  # -1 (null): None
    else:
        out = column.to_numpy()
    return out if dtype is None else out.astype(dtype, copy=False)


def distinct(t: pa.Table, name: str) -> list[Any]:
    """A column's distinct values that are not null, as Python values (no object per row)."""
    return pc.unique(t.column(name)).drop_null().to_pylist()


def is_null(t: pa.Table, name: str) -> np.ndarray:
    """Mask of the rows where a column is null."""
    column = t.column(name)
    if not column.null_count:
        return np.zeros(t.num_rows, bool)
    return column.is_null().to_numpy()


def codes(t: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A text column as integer codes (-1: null) and the names they stand for."""
    column = t.column(name)
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array, pa.ChunkedArray):  # no chunks at all
        return np.zeros(0, np.int64), np.zeros(0, object)
    indices = array.indices  # without nulls, read in place (int32 as a rule)
    code = pc.fill_null(indices, -1).to_numpy() if indices.null_count else indices.to_numpy()
    return code, np.asarray(array.dictionary.to_numpy(zero_copy_only=False), dtype=object)


def rows(t: pa.Table, mask: np.ndarray) -> pa.Table:
    """The rows of a mask (t itself when it keeps them all)."""
    return t if mask.all() else t.filter(mask)


def steps_between(t: pa.Table, first: int | None, last: int | None) -> pa.Table:
    """The rows with first <= step < last (None: open on that side; a table without a step
    column whole)."""
    if not t.num_rows or "step" not in t.column_names or first is last is None:
        return t
    return rows(t, in_steps(values(t, "step"), first, last))


def in_steps(step: np.ndarray, first: int | None, last: int | None) -> np.ndarray:
    """Mask of first <= step < last (None: open on that side)."""
    mask = np.ones(len(step), bool)
    if first is not None:
        mask &= step >= first
    if last is not None:
        mask &= step < last
    return mask


def groups(*keys: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct key tuples in sorted order (one array per key), and each row's group."""
    if len(keys) == 1:
        distinct, inverse = np.unique(keys[0], return_inverse=True)
        return [distinct], inverse.ravel()
    parts = [np.unique(k, return_inverse=True) for k in keys]
    combined = np.zeros(len(keys[0]), np.int64)
    for distinct, inverse in parts:
        combined = combined * len(distinct) + inverse.ravel()
    used, inverse = np.unique(combined, return_inverse=True)
    out = []
    for distinct, _ in reversed(parts):
        out.append(distinct[used % len(distinct)])
        used = used // len(distinct)
    return out[::-1], inverse.ravel()


def group_sum(inverse: np.ndarray, n: int, weights: np.ndarray, min_count: int = 0) -> np.ndarray:
    """Per group, the sum of the values that are not NaN; NaN where fewer than min_count."""
    weights = np.asarray(weights, np.float64)
    known = ~np.isnan(weights)
    total = np.bincount(inverse[known], weights=weights[known], minlength=n).astype(np.float64)
    if min_count:
        total[np.bincount(inverse[known], minlength=n) < min_count] = np.nan
    return total


def group_sum_ns(inverse: np.ndarray, n: int, ns: np.ndarray) -> np.ndarray:
    """Per group, the sum of integer ns, exact."""
    total = np.zeros(n, np.int64)
    np.add.at(total, inverse, ns)
    return total


def nan_median(x: np.ndarray) -> float:
    """The median of the values that are not NaN; NaN where none (as pandas takes it)."""
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else float("nan")


def warmup_steps(steps: np.ndarray) -> int:
    """How many first steps the checks skip: 10% of them, at least 2 (DDP rebuilds its buckets
    in the first steps, and caches are cold)."""
    steps = np.asarray(steps)
    if steps.dtype.kind == "f":
        steps = steps[~np.isnan(steps)]
    return max(2, len(np.unique(steps)) // 10)


def group_median(inverse: np.ndarray, n: int, data: np.ndarray) -> np.ndarray:
    """Per group, the median of the values that are not NaN; NaN where none."""
    data = np.asarray(data, np.float64)
    known = ~np.isnan(data)
    group, data = inverse[known], data[known]
    # by group, then value: one sort of integers keyed on both (quicker than a lexsort)
    by_value = np.argsort(data)
    place = np.empty(len(data), np.int64)
    place[by_value] = np.arange(len(data))
    order = np.argsort(group.astype(np.int64) * len(data) + place)
    group, data = group[order], data[order]
    count = np.bincount(group, minlength=n)
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    out = np.full(n, np.nan)
    has = count > 0
    lo = first[has] + (count[has] - 1) // 2
    hi = first[has] + count[has] // 2
    out[has] = (data[lo] + data[hi]) / 2
    return out


def concat(tables: Sequence[pa.Table]) -> pa.Table:
    """Tables of one kind in one, each column in one chunk (text columns of dictionaries
    merged), so that the checks' numpy views of it copy nothing. In memory from the system's
    allocator: Arrow's own (mimalloc) faulted in fresh huge pages and was slower at scale
    (docs/scale.md)."""
    tables = [t for t in tables if t.num_columns]
    if not tables:
        return pa.table({})
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables).combine_chunks(memory_pool=pa.system_memory_pool())


def sort_order(t: pa.Table, name: str) -> np.ndarray:
    """The rows' order by one column as pandas' sort_values gave it: numpy's quicksort of the
    values that are not null (ties in its order, not the rows'), then the nulls."""
    null = is_null(t, name)
    if not null.any():
        return np.argsort(values(t, name), kind="quicksort")
    known = np.flatnonzero(~null)
    order = np.argsort(values(t, name)[known], kind="quicksort")
    return np.concatenate([known[order], np.flatnonzero(null)])


def group_union_ns(group: np.ndarray, n: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per group, the length of the union of its [start, end) intervals, by a sorted sweep of
    their edges (each group's depth comes back to 0 at its last edge)."""
    real = end > start
    group = np.concatenate([group[real], group[real]])
    t = np.concatenate([start[real], end[real]])
    depth = np.repeat(np.array([1, -1]), real.sum())
    order = np.lexsort((t, group))
    group, t, depth = group[order], t[order], np.cumsum(depth[order])
    inside = depth[:-1] > 0
    return np.bincount(group[:-1][inside], weights=np.diff(t)[inside], minlength=n)
