"""dtprof.analysis.columns against pandas, whose rules the checks kept: random tables with ties,
NaN and nulls."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dtprof.analysis.columns import (
    codes,
    concat,
    group_median,
    group_sum,
    groups,
    is_null,
    sort_order,
    values,
)


def _random_values(rng: np.random.Generator, n: int) -> np.ndarray:
    if rng.random() < 0.5:  # many ties
        return rng.choice([1.0, 2.0, 3.5, np.nan, 7.0], n)
    out = rng.random(n) * 1e8
    out[rng.random(n) < 0.2] = np.nan
    return out


@pytest.mark.parametrize("seed", range(3))
def test_group_median_and_sum_are_pandas_groupby(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n, k = int(rng.integers(0, 300)), int(rng.integers(1, 12))
        group, data = rng.integers(0, k, n), _random_values(rng, n)
        by = pd.Series(data).groupby(group)
        median = by.median().reindex(range(k)).to_numpy()
        assert np.allclose(group_median(group, k, data), median, equal_nan=True)
        total = by.sum().reindex(range(k), fill_value=0.0).to_numpy()
        assert np.allclose(group_sum(group, k, data), total)
        at_least_one = by.sum(min_count=1).reindex(range(k)).to_numpy()
        assert np.allclose(group_sum(group, k, data, min_count=1), at_least_one, equal_nan=True)


def test_groups_are_the_sorted_distinct_key_tuples() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.integers(-3, 4, 500), rng.choice(np.array(["x", "y", "z"], object), 500)
    (ka, kb), inverse = groups(a, b)
    want = pd.DataFrame({"a": a, "b": b}).groupby(["a", "b"]).size()
    assert list(zip(ka.tolist(), kb.tolist(), strict=True)) == want.index.tolist()
    assert np.array_equal(ka[inverse], a) and np.array_equal(kb[inverse], b)


def test_text_reads_as_objects_and_codes_whether_encoded_or_not() -> None:
    text = pa.array(["b", None, "a", "b"])
    for column in (text, text.dictionary_encode()):
        t = pa.table({"s": column, "n": pa.array([1, None, 3, 4], pa.int32())})
        assert values(t, "s").tolist() == ["b", None, "a", "b"]
        code, names = codes(t, "s")
        assert code[1] == -1 and [names[c] for c in code[[0, 2, 3]]] == ["b", "a", "b"]
        assert is_null(t, "s").tolist() == [False, True, False, False]
        n = values(t, "n")  # integers with a null: floats, NaN, as pandas had them
        assert n.dtype == np.float64 and np.isnan(n[1]) and n[3] == 4


def test_concat_merges_dictionaries_into_one_chunk() -> None:
    parts = [
        pa.table(
            {
                "g": pa.array(words, pa.string()).dictionary_encode(),
                "v": pa.array(range(len(words)), pa.int64()),
            }
        )
        for words in (["x", "y"], ["z", "x"], [])
    ]
    both = concat([*parts, pa.table({})])  # a table without columns: a rank with none
    assert both.column("g").num_chunks == 1
    assert values(both, "g").tolist() == ["x", "y", "z", "x"]
    assert concat([]).num_columns == 0


def test_sort_order_is_pandas_sort_values() -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(0, 80))
        data = rng.integers(0, 5, n).astype(float)
        data[rng.random(n) < 0.2] = np.nan
        t = pa.table({"x": pa.array(data, from_pandas=True)})
        want = pd.Series(data).sort_values().index.to_numpy()
        assert np.array_equal(sort_order(t, "x"), want)
