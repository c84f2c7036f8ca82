"""Base-2 exponential histograms (the OTLP ExponentialHistogram model),
filled from numpy batches.

Bucket i at scale s holds values in (base**i, base**(i+1)] with
base = 2 ** (2 ** -s), exactly as OpenTelemetry defines them, so a
histogram can be exported as is, or downscaled to fit a bucket budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

DEFAULT_SCALE = 5  # 32 buckets per power of two: quantiles within 1.1%
MAX_BUCKETS = 160  # as OTel's SDK: a histogram keeps at most this many buckets, downscaling to fit


def map_to_index(values: np.ndarray, scale: int) -> np.ndarray:
    """OTel MapToIndex for positive float64 values."""
    mant, exp = np.frexp(values)  # values = mant * 2**exp, mant in [0.5, 1)
    exact_pow2 = mant == 0.5
    if scale <= 0:
        idx = (exp - 1 - exact_pow2.astype(np.int64)) >> -scale
        out: np.ndarray = idx.astype(np.int64)
        return out
    idx = np.ceil(np.log2(values) * (1 << scale)).astype(np.int64) - 1
    idx[exact_pow2] = ((exp[exact_pow2].astype(np.int64) - 1) << scale) - 1
    result: np.ndarray = idx
    return result


_NO_BUCKETS = np.zeros(0, np.int64)
_NO_BUCKETS.flags.writeable = False  # shared by every empty histogram


@dataclass
class ExpHistogram:
    """Counts in one dense array from `offset` (as OTel's SDK keeps them):
    about 8 bytes a bucket, at most MAX_BUCKETS buckets, so a series costs
    the same memory after a billion values as after a thousand."""

    scale: int = DEFAULT_SCALE
    offset: int = 0  # the bucket index of buckets[0]
    buckets: np.ndarray = field(default_factory=lambda: _NO_BUCKETS)  # int64 counts
    zero_count: int = 0
    count: int = 0
    sum: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    # min and max since the last take_window(): what a delta export reports
    window_min: float = math.inf
    window_max: float = -math.inf

    @property
    def counts(self) -> dict[int, int]:
        """The non-empty buckets: index -> count."""
        nz = np.flatnonzero(self.buckets)
        return dict(zip((nz + self.offset).tolist(), self.buckets[nz].tolist(), strict=True))

    def add(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        v = np.asarray(values, dtype=np.float64)
        self.count += len(v)
        self.sum += float(v.sum())
        lo, hi = float(v.min()), float(v.max())
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)
        self.window_min = min(self.window_min, lo)
        self.window_max = max(self.window_max, hi)
        pos = v[v > 0]
        self.zero_count += len(v) - len(pos)
        if len(pos):
            self.add_indices(map_to_index(pos, self.scale), self.scale)

    def add_indices(self, idx: np.ndarray, scale: int) -> None:
        """Count values by their bucket index at `scale` (this histogram's or finer)."""
        idx = np.asarray(idx, dtype=np.int64) >> (scale - self.scale)
        idx = idx >> self._cover(int(idx.min()), int(idx.max()))
        self.buckets += np.bincount(idx - self.offset, minlength=len(self.buckets))

    def add_few(self, idx: list[int], scale: int) -> None:
        """add_indices for a handful of indices: one at a time in Python, which
        costs less than numpy's fixed cost per call below about four."""
        shift = scale - self.scale
        end = self.offset + len(self.buckets)
        for i in idx:
            j = i >> shift
            if self.offset <= j < end:
                self.buckets[j - self.offset] += 1
            else:  # outside the array: grown (or downscaled) the general way
                self.add_indices(np.array([i], np.int64), scale)
                shift = scale - self.scale
                end = self.offset + len(self.buckets)

    def _cover(self, lo: int, hi: int) -> int:
        """Make the array span buckets lo..hi (indices at this scale),
        downscaling first while the span would pass MAX_BUCKETS, as OTel's
        SDK does; return by how much it downscaled."""
        if len(self.buckets):
            lo, hi = min(lo, self.offset), max(hi, self.offset + len(self.buckets) - 1)
        shift = 0
        while (hi >> shift) - (lo >> shift) + 1 > MAX_BUCKETS and self.scale - shift > -10:
            shift += 1
        if shift:
            self._downscale_in_place(self.scale - shift)
            lo, hi = lo >> shift, hi >> shift
        end = self.offset + len(self.buckets)
        if len(self.buckets) and self.offset <= lo and hi < end:
            return shift
        grown = np.zeros(hi - lo + 1, np.int64)
        if len(self.buckets):
            grown[self.offset - lo : end - lo] = self.buckets
        self.offset, self.buckets = lo, grown
        return shift

    def _downscale_in_place(self, scale: int) -> None:
        shift = self.scale - scale
        self.scale = scale
        if not len(self.buckets):
            self.offset >>= shift
            return
        idx = np.arange(self.offset, self.offset + len(self.buckets)) >> shift  # every index from first to last
        self.offset = int(idx[0])
        self.buckets = np.add.reduceat(self.buckets, np.flatnonzero(np.diff(idx, prepend=idx[0] - 1)))

    def _trim(self) -> None:
        """Drop empty buckets at either end."""
        nz = np.flatnonzero(self.buckets)
        if len(nz) == 0:
            self.offset, self.buckets = 0, _NO_BUCKETS
        elif nz[0] or nz[-1] < len(self.buckets) - 1:
            self.offset += int(nz[0])
            self.buckets = self.buckets[nz[0] : nz[-1] + 1].copy()

    def take_window(self) -> tuple[float, float]:
        w = (self.window_min, self.window_max)
        self.window_min, self.window_max = math.inf, -math.inf
        return w

    def restore_window(self, w: tuple[float, float]) -> None:
        self.window_min = min(self.window_min, w[0])
        self.window_max = max(self.window_max, w[1])

    def copy(self) -> ExpHistogram:
        return ExpHistogram(
            self.scale, self.offset, self.buckets.copy() if len(self.buckets) else _NO_BUCKETS,
            self.zero_count, self.count, self.sum, self.min, self.max,
        )  # fmt: skip

    def minus(self, base: ExpHistogram) -> ExpHistogram:
        """What was added since `base`, a copy of this histogram taken earlier
        (at the same or a finer scale: a histogram only ever downscales, and
        its span only grows)."""
        if base.scale > self.scale:
            base = base.downscaled(self.scale)
        assert base.scale == self.scale
        d = self.copy()
        d.zero_count -= base.zero_count
        d.count -= base.count
        d.sum -= base.sum
        d.min, d.max = math.inf, -math.inf
        if len(base.buckets):
            at = base.offset - d.offset
            d.buckets[at : at + len(base.buckets)] -= base.buckets
        d._trim()
        return d

    def merge(self, other: ExpHistogram) -> None:
        o = other.downscaled(self.scale) if other.scale > self.scale else other
        if o.scale < self.scale:
            self._downscale_in_place(o.scale)
        if len(o.buckets):
            if self._cover(o.offset, o.offset + len(o.buckets) - 1):
                o = o.downscaled(self.scale)
            at = o.offset - self.offset
            self.buckets[at : at + len(o.buckets)] += o.buckets
        self.zero_count += o.zero_count
        self.count += o.count
        self.sum += o.sum
        self.min = min(self.min, o.min)
        self.max = max(self.max, o.max)

    def downscaled(self, scale: int) -> ExpHistogram:
        assert scale <= self.scale
        h = self.copy()
        h.window_min, h.window_max = self.window_min, self.window_max
        if scale < self.scale:
            h._downscale_in_place(scale)
        return h

    def fit(self, max_buckets: int) -> ExpHistogram:
        """The finest downscale whose bucket span fits max_buckets."""
        h = self
        while len(h.buckets) > max_buckets and h.scale > -10:
            h = h.downscaled(h.scale - 1)
        return h

    def quantile(self, q: float) -> float:
        """An estimate within half a bucket (relative), clamped to [min, max]."""
        if self.count == 0:
            return 0.0
        rank = q * (self.count - 1)
        if rank < self.zero_count:
            return 0.0
        seen = self.zero_count + np.cumsum(self.buckets)
        i = int(np.searchsorted(seen, rank, side="right"))
        if i >= len(seen):
            return self.max
        base = 2.0 ** (2.0**-self.scale)
        return float(min(max(base ** (self.offset + i + 0.5), self.min), self.max))


def add_grouped(hists: list[ExpHistogram], starts: np.ndarray, values: np.ndarray) -> None:
    """hists[g].add(values[starts[g]:starts[g+1]]) for every group g at once:
    one pass of numpy over the whole batch instead of one per group (a batch
    holds tens of series, and numpy's per-call overhead was the agent's cost).
    Groups may be empty; histograms may have different scales."""
    n = len(values)
    if n == 0 or not hists:
        return
    counts = np.diff(np.append(np.asarray(starts, dtype=np.int64), n))
    live = np.flatnonzero(counts > 0)
    hs = [hists[i] for i in live.tolist()]
    st = np.asarray(starts, dtype=np.int64)[live]
    counts = counts[live]
    v = np.asarray(values, dtype=np.float64)
    sums = np.add.reduceat(v, st)
    mins = np.minimum.reduceat(v, st)
    maxs = np.maximum.reduceat(v, st)
    pos = v > 0
    zeros = counts - np.add.reduceat(pos.astype(np.int64), st)
    for h, c, s, lo, hi, z in zip(
        hs, counts.tolist(), sums.tolist(), mins.tolist(), maxs.tolist(), zeros.tolist(), strict=True
    ):
        h.count += c
        h.sum += s
        h.min = min(h.min, lo)
        h.max = max(h.max, hi)
        h.window_min = min(h.window_min, lo)
        h.window_max = max(h.window_max, hi)
        h.zero_count += z
    if not pos.any():
        return
    top = max(h.scale for h in hs)
    idx = map_to_index(v[pos], top)  # each histogram shifts to its own scale
    group = np.repeat(np.arange(len(hs), dtype=np.int64), counts)[pos]
    bounds = np.searchsorted(group, np.arange(len(hs) + 1)).tolist()
    few = idx.tolist() if len(idx) <= 4 * len(hs) else None  # mostly tiny groups (many processes, a drain each)
    for g, h in enumerate(hs):
        a, b = bounds[g], bounds[g + 1]
        if b - a > 4 or (few is None and b > a):
            h.add_indices(idx[a:b], top)
        elif b > a:
            assert few is not None
            h.add_few(few[a:b], top)


Grouped = tuple[list[ExpHistogram], np.ndarray, np.ndarray]  # add_grouped's histograms, starts, values


def add_grouped_all(parts: list[Grouped]) -> None:
    """add_grouped(*part) for every part, as one add_grouped over them all:
    numpy's cost per call is fixed, and each histogram is one group, so the
    result is that of one call per part. A histogram must not be in two parts."""
    if len(parts) == 1:
        add_grouped(*parts[0])
    elif parts:
        offsets = np.cumsum([0] + [len(values) for _h, _s, values in parts[:-1]]).tolist()
        add_grouped(
            [h for hists, _s, _v in parts for h in hists],
            np.concatenate([np.asarray(s, np.int64) + o for (_h, s, _v), o in zip(parts, offsets, strict=True)]),
            np.concatenate([values for _h, _s, values in parts]),
        )
