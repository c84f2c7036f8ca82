"""The exponential histogram follows OTel's bucket definition and its
quantiles stay within half a bucket of the exact values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrace.core.histogram import ExpHistogram, map_to_index


def reference_index(v: float, scale: int) -> int:
    """OTel's definition: bucket i holds (base**i, base**(i+1)]."""
    base = 2.0 ** (2.0**-scale)
    i = math.floor(math.log(v, base))
    # Walk to the exact bucket, immune to log rounding.
    while base ** (i + 1) < v:
        i += 1
    while base**i >= v:
        i -= 1
    return i


@given(st.floats(min_value=1e-9, max_value=1e12, allow_nan=False), st.integers(min_value=-3, max_value=8))
@settings(max_examples=400, deadline=None)
def test_index_matches_the_otel_definition(v: float, scale: int) -> None:
    got = int(map_to_index(np.array([v]), scale)[0])
    want = reference_index(v, scale)
    # Values within float rounding of a boundary may land either side.
    base = 2.0 ** (2.0**-scale)
    if got != want:
        assert abs(v / base ** max(got, want) - 1) < 1e-9
    else:
        assert got == want


@pytest.mark.parametrize("scale", [0, 3, 5])
def test_exact_powers_of_two_close_their_bucket(scale: int) -> None:
    v = np.array([0.25, 1.0, 2.0, 1024.0])
    idx = map_to_index(v, scale)
    assert list(idx) == [((int(math.log2(x))) << scale) - 1 for x in v]


def test_quantiles_within_half_a_bucket() -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=-11, sigma=1.5, size=50_000)
    h = ExpHistogram()
    for chunk in np.array_split(values, 17):
        h.add(chunk)
    assert h.count == len(values)
    assert h.max == values.max() and h.min == values.min()
    assert math.isclose(h.sum, values.sum(), rel_tol=1e-9)
    half_bucket = 2.0 ** (2.0**-h.scale / 2) - 1
    for q in (0.5, 0.95, 0.99):
        exact = np.quantile(values, q, method="lower")
        assert abs(h.quantile(q) / exact - 1) <= half_bucket * 1.01 + 1e-3, q


def test_zeros_and_downscale_keep_counts() -> None:
    h = ExpHistogram(scale=5)
    h.add(np.array([0.0, 0.0, 1e-6, 2e-6, 3.5, 1e3]))
    assert h.zero_count == 2 and h.count == 6
    d = h.downscaled(0)
    assert sum(d.counts.values()) == sum(h.counts.values()) == 4
    f = h.fit(4)
    assert max(f.counts) - min(f.counts) + 1 <= 4 and sum(f.counts.values()) == 4
    assert h.quantile(0.1) == 0.0


def test_merge_of_different_scales() -> None:
    a, b = ExpHistogram(scale=5), ExpHistogram(scale=2)
    a.add(np.array([1.0, 2.0, 3.0]))
    b.add(np.array([4.0, 5.0]))
    a.merge(b)
    assert a.scale == 2 and a.count == 5 and sum(a.counts.values()) == 5


def test_grouped_add_equals_one_add_per_group() -> None:
    from memtrace.core.histogram import add_grouped

    rng = np.random.default_rng(7)
    for _ in range(50):
        sizes = rng.integers(0, 6, rng.integers(1, 12))  # empty groups included
        values = np.concatenate([rng.choice([0.0, 1e-9, 3.5, 2.0**20], n) * rng.random(n) for n in sizes])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        one = [ExpHistogram() for _ in sizes]
        for h, s, n in zip(one, starts.tolist(), sizes.tolist(), strict=True):
            h.add(values[s : s + n])
        grouped = [ExpHistogram() for _ in sizes]
        add_grouped(grouped, starts, values)
        for a, b in zip(one, grouped, strict=True):
            assert (a.count, a.zero_count, a.counts, a.min, a.max) == (b.count, b.zero_count, b.counts, b.min, b.max)
            assert abs(a.sum - b.sum) <= 1e-9 * max(1.0, abs(a.sum))


def test_many_drains_of_a_few_values_each_count_as_one_add_would() -> None:
    # At 1000 processes a drain brings each series one or two values: the
    # histograms then count them one at a time (add_few), growing and
    # downscaling as the values spread; the buckets must be add()'s.
    from memtrace.core.histogram import add_grouped

    rng = np.random.default_rng(11)
    groups = 30
    one = [ExpHistogram() for _ in range(groups)]
    grouped = [ExpHistogram() for _ in range(groups)]
    for r in range(400):
        sizes = rng.integers(0, 3, groups)
        n = int(sizes.sum())
        # Values spread over more powers of two as the rounds go: growth, then downscaling.
        values = rng.random(n) * 2.0 ** rng.integers(-(r // 10), r // 10 + 1, n)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        for h, s, k in zip(one, starts.tolist(), sizes.tolist(), strict=True):
            h.add(values[s : s + k])
        add_grouped(grouped, starts, values)
    for a, b in zip(one, grouped, strict=True):
        assert (a.scale, a.count, a.zero_count, a.counts) == (b.scale, b.count, b.zero_count, b.counts)
    assert min(h.scale for h in one) < 3  # the spread did force downscaling


def test_buckets_stay_bounded_whatever_the_values() -> None:
    from memtrace.core.histogram import MAX_BUCKETS, add_grouped

    rng = np.random.default_rng(3)
    one, grouped = ExpHistogram(), ExpHistogram()
    for _ in range(20):
        v = rng.random(5000) * 2.0 ** rng.integers(-30, 40, 5000)  # 70 powers of two
        one.add(v)
        add_grouped([grouped], np.array([0]), v)
    for h in (one, grouped):
        assert len(h.counts) <= MAX_BUCKETS and h.count == 100_000
        assert sum(h.counts.values()) + h.zero_count == h.count
    assert one.scale == grouped.scale and one.counts == grouped.counts
    assert len(one.buckets) <= MAX_BUCKETS and one.buckets.nbytes <= MAX_BUCKETS * 8  # memory per series is bounded


@given(
    st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), max_size=50),
    st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), max_size=50),
    st.integers(min_value=-2, max_value=8),
)
@settings(max_examples=300, deadline=None)
def test_minus_is_what_was_added_since_the_copy(first: list[float], then: list[float], scale: int) -> None:
    # A delta export subtracts the last export's copy: the result must be the
    # later values alone, counted at whatever scale the histogram reached.
    h = ExpHistogram(scale=scale)
    h.add(np.array(first))
    base = h.copy()
    h.add(np.array(then))
    d = h.minus(base)
    alone = ExpHistogram(scale=scale)
    alone.add(np.array(then))
    if alone.scale > d.scale:
        alone = alone.downscaled(d.scale)
    assert (d.count, d.zero_count, d.counts) == (alone.count, alone.zero_count, alone.counts)
    assert all(n > 0 for n in d.counts.values())
    merged = base.copy()
    merged.merge(d)
    if merged.scale > h.scale:
        merged = merged.downscaled(h.scale)
    assert (merged.count, merged.counts) == (h.count, h.counts)


def test_parts_added_at_once_equal_one_grouped_add_per_part() -> None:
    from memtrace.core.histogram import add_grouped, add_grouped_all

    rng = np.random.default_rng(13)
    for _ in range(40):
        parts_one, parts_all = [], []
        for _part in range(int(rng.integers(1, 4))):
            sizes = rng.integers(0, 6, rng.integers(1, 6))  # empty groups and empty parts included
            values = np.concatenate([rng.choice([0.0, 1e-9, 3.5, 2.0**20], n) * rng.random(n) for n in sizes])
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            scale = int(rng.choice([5, 3]))  # histograms of different scales in one pass
            parts_one.append(([ExpHistogram(scale=scale) for _ in sizes], starts, values))
            parts_all.append(([ExpHistogram(scale=scale) for _ in sizes], starts, values))
        for part in parts_one:
            add_grouped(*part)
        add_grouped_all(parts_all)
        for (one, _s, _v), (grouped, _s2, _v2) in zip(parts_one, parts_all, strict=True):
            for a, b in zip(one, grouped, strict=True):
                assert (a.scale, a.count, a.zero_count, a.counts, a.min, a.max) == (
                    b.scale,
                    b.count,
                    b.zero_count,
                    b.counts,
                    b.min,
                    b.max,
                )
                assert a.sum == b.sum
