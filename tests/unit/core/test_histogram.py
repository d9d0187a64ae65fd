"""core.histogram: the one-pass percentiles equal the per-quantile walk, bit for bit."""

from __future__ import annotations

import random

import pytest

from core.histogram import N_BUCKETS, bucket_bounds, percentile, percentiles

QS = (0.0, 0.5, 0.95, 0.99, 1.0)


def _histograms(n: int, seed: int = 7):
    rng = random.Random(seed)
    yield [0] * N_BUCKETS
    yield [5] + [0] * (N_BUCKETS - 1)
    yield [0] * (N_BUCKETS - 1) + [3]
    yield [0, 0, 4, 0, 0, 1] + [0] * (N_BUCKETS - 6)
    for _ in range(n):
        h = [0] * N_BUCKETS
        for _ in range(rng.choice((1, 2, 5, 48))):
            h[rng.randrange(N_BUCKETS)] += rng.choice((1, 2, 3, 7, 1000, 10**9))
        yield h


def test_percentiles_equal_percentile_at_every_quantile():
    for h in _histograms(3000):
        assert percentiles(h, QS) == tuple(percentile(h, q) for q in QS), h


def test_percentiles_of_an_empty_histogram_are_none_and_bounds_are_checked():
    assert percentiles([0] * N_BUCKETS, (0.5, 0.99)) == (None, None)
    assert percentiles([0, 2, 0, 2] + [0] * (N_BUCKETS - 4), (0.5,)) == (bucket_bounds(1)[1],)
    with pytest.raises(ValueError):
        percentiles([1], (1.5,))
