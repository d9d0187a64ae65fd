"""Fixed log-spaced latency buckets and percentiles computed from bucket counts.

The minute rollups store one count per bucket, so any window's percentile is a sum of columns in
SQL followed by :func:`percentile` here. Bucket ``i`` holds values in ``[EDGES[i-1], EDGES[i])``
milliseconds (bucket 0 starts at 0); the last bucket is open-ended. With a growth factor of 1.3 a
percentile read from the histogram is within about 15 % of the exact value (interpolation inside the
bucket usually does much better), which is what a latency dashboard needs at a fixed storage cost.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import accumulate

N_BUCKETS = 48
FIRST_EDGE_MS = 1.0
GROWTH = 1.3
# EDGES[i] is the upper bound of bucket i; the last bucket has no upper bound.
EDGES: tuple[float, ...] = tuple(FIRST_EDGE_MS * GROWTH**i for i in range(N_BUCKETS - 1))


def bucket_of(value_ms: float) -> int:
    """Index of the bucket holding ``value_ms``."""
    return bisect.bisect_right(EDGES, max(value_ms, 0.0))


def bucket_bounds(i: int) -> tuple[float, float]:
    lo = 0.0 if i == 0 else EDGES[i - 1]
    hi = EDGES[i] if i < len(EDGES) else EDGES[-1] * GROWTH
    return lo, hi


def percentile(counts: Sequence[int | float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of the distribution in ``counts``; ``None`` when empty.

    Interpolates linearly by rank inside the bucket where the quantile falls.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within 0..1, got {q}")
    total = float(sum(counts))
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for i, c in enumerate(counts):
        c = float(c or 0)
        if c <= 0:
            continue
        if seen + c >= rank:
            lo, hi = bucket_bounds(i)
            frac = (rank - seen) / c
            return lo + (hi - lo) * frac
        seen += c
    lo, hi = bucket_bounds(len(counts) - 1)
    return hi


def percentiles(counts: Sequence[int | float], qs: Sequence[float]) -> tuple[float | None, ...]:
    """:func:`percentile` of ``counts`` at each of ``qs``, from one pass over the counts: each value
    equals :func:`percentile`'s bit for bit (whole counts below 2**53 add up exactly as floats, and
    other counts are added as floats in percentile()'s order)."""
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within 0..1, got {q}")
    total = sum(counts)
    if isinstance(total, int) and 0 < total < 2**53 and min(counts) >= 0:
        values: Sequence[int | float] = counts
    else:
        values = [max(float(c or 0), 0.0) for c in counts]  # percentile() skips empty and negative buckets
        total = float(sum(counts))
        if total <= 0:
            return tuple(None for _ in qs)
    # cum[i]: the counts of buckets 0..i added up, as percentile() adds them ("seen + c")
    cum = list(accumulate(values))
    out: list[float | None] = []
    for q in qs:
        rank = q * total
        # the first bucket holding samples whose running total reaches the rank
        i = bisect.bisect_left(cum, rank)
        while i < len(values) and values[i] <= 0:
            i += 1
        if i >= len(values):
            out.append(bucket_bounds(len(counts) - 1)[1])
            continue
        lo, hi = bucket_bounds(i)
        seen = float(cum[i - 1]) if i else 0.0
        out.append(lo + (hi - lo) * ((rank - seen) / float(values[i])))
    return tuple(out)
