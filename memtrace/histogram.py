"""Base-2 exponential histograms (the OTLP ExponentialHistogram model),
filled from numpy batches.

Bucket i at scale s holds values in (base**i, base**(i+1)] with
base = 2 ** (2 ** -s), exactly as OpenTelemetry defines them, so a
histogram can be exported as is, or downscaled to fit a bucket budget.
"""

from __future__ import annotations

import itertools
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
        return idx.astype(np.int64)
    idx = np.ceil(np.log2(values) * (1 << scale)).astype(np.int64) - 1
    idx[exact_pow2] = ((exp[exact_pow2].astype(np.int64) - 1) << scale) - 1
    return idx


@dataclass
class ExpHistogram:
    scale: int = DEFAULT_SCALE
    counts: dict[int, int] = field(default_factory=dict)
    zero_count: int = 0
    count: int = 0
    sum: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    # min and max since the last take_window(): what a delta export reports
    window_min: float = math.inf
    window_max: float = -math.inf

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
            idx, n = np.unique(map_to_index(pos, self.scale), return_counts=True)
            c = self.counts
            for i, k in zip(idx.tolist(), n.tolist(), strict=True):
                c[i] = c.get(i, 0) + k
            self._bound()

    def _bound(self) -> None:
        """Keep at most MAX_BUCKETS buckets: memory per series is bounded
        whatever the values, as in OTel's SDK (which downscales the same way)."""
        while len(self.counts) > MAX_BUCKETS and self.scale > -10:
            self.__dict__.update(self.downscaled(self.scale - 1).__dict__)

    def take_window(self) -> tuple[float, float]:
        w = (self.window_min, self.window_max)
        self.window_min, self.window_max = math.inf, -math.inf
        return w

    def restore_window(self, w: tuple[float, float]) -> None:
        self.window_min = min(self.window_min, w[0])
        self.window_max = max(self.window_max, w[1])

    def copy(self) -> ExpHistogram:
        return ExpHistogram(self.scale, dict(self.counts), self.zero_count, self.count, self.sum, self.min, self.max)

    def minus(self, base: ExpHistogram) -> ExpHistogram:
        """What was added since `base`, a copy of this histogram taken earlier
        (at the same or a finer scale: a histogram only ever downscales)."""
        if base.scale > self.scale:
            base = base.downscaled(self.scale)
        assert base.scale == self.scale
        d = ExpHistogram(
            self.scale, {}, self.zero_count - base.zero_count, self.count - base.count, self.sum - base.sum
        )
        for i, k in self.counts.items():
            n = k - base.counts.get(i, 0)
            if n:
                d.counts[i] = n
        return d

    def merge(self, other: ExpHistogram) -> None:
        o = other.downscaled(self.scale) if other.scale > self.scale else other
        if o.scale < self.scale:
            self.__dict__.update(self.downscaled(o.scale).__dict__)
        for i, k in o.counts.items():
            self.counts[i] = self.counts.get(i, 0) + k
        self.zero_count += o.zero_count
        self.count += o.count
        self.sum += o.sum
        self.min = min(self.min, o.min)
        self.max = max(self.max, o.max)

    def downscaled(self, scale: int) -> ExpHistogram:
        shift = self.scale - scale
        assert shift >= 0
        h = ExpHistogram(
            scale, {}, self.zero_count, self.count, self.sum, self.min, self.max, self.window_min, self.window_max
        )
        for i, k in self.counts.items():
            j = i >> shift
            h.counts[j] = h.counts.get(j, 0) + k
        return h

    def fit(self, max_buckets: int) -> ExpHistogram:
        """The finest downscale whose bucket span fits max_buckets."""
        h = self
        while h.counts and max(h.counts) - min(h.counts) + 1 > max_buckets and h.scale > -10:
            h = h.downscaled(h.scale - 1)
        return h

    def quantile(self, q: float) -> float:
        """An estimate within half a bucket (relative), clamped to [min, max]."""
        if self.count == 0:
            return 0.0
        rank = q * (self.count - 1)
        seen = self.zero_count
        if rank < seen:
            return 0.0
        base = 2.0 ** (2.0**-self.scale)
        for i in sorted(self.counts):
            seen += self.counts[i]
            if rank < seen:
                mid = base ** (i + 0.5)
                return min(max(mid, self.min), self.max)
        return self.max


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
    scales = np.array([h.scale for h in hs], dtype=np.int64)
    top = int(scales.max())
    group = np.repeat(np.arange(len(hs), dtype=np.int64), counts)[pos]
    # The index at a lower scale is the index at a higher one shifted right.
    idx = map_to_index(v[pos], top) >> (top - scales)[group]
    lo_idx = int(idx.min())
    width = int(idx.max()) - lo_idx + 1
    key = group * width + (idx - lo_idx)
    if len(hs) * width <= 4 * len(key) + 4096:  # counting is cheaper than sorting
        nk = np.bincount(key, minlength=len(hs) * width)
        uk = np.flatnonzero(nk)
        nk = nk[uk]
    else:
        uk, nk = np.unique(key, return_counts=True)
    # Per histogram, its buckets' counts are merged into its dict by C-level
    # iteration (map, zip, dict.update): a Python step per bucket was the cost.
    gid = uk // width
    buckets = (uk % width + lo_idx).tolist()
    bounds = np.searchsorted(gid, np.arange(len(hs) + 1)).tolist()
    for g in np.unique(gid).tolist():
        lo, hi = bounds[g], bounds[g + 1]
        keys, c = buckets[lo:hi], hs[g].counts
        new = nk[lo:hi] + np.fromiter(map(c.get, keys, itertools.repeat(0)), np.int64, hi - lo)
        c.update(zip(keys, new.tolist(), strict=True))
        hs[g]._bound()
