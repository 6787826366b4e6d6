"""suite.measure.stats: the medians, intervals and speedups every table states."""
from __future__ import annotations

import math

import numpy as np

from suite.measure.stats import bootstrap_median_ci, paired_speedup


def test_the_median_interval_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = 0
    for seed in range(300):
        xs = list(rng.lognormal(0.0, 0.3, 25))  # the true median is exp(0) = 1
        lo, hi = bootstrap_median_ci(xs, seed=seed)
        assert lo <= float(np.median(xs)) <= hi
        hits += lo <= 1.0 <= hi
    assert 0.88 * 300 <= hits <= 0.99 * 300, hits  # percentile intervals of a median run a little narrow


def test_degenerate_samples_and_paired_speedups():
    assert all(math.isnan(v) for v in bootstrap_median_ci([]))
    assert bootstrap_median_ci([2.0]) == (2.0, 2.0)
    assert bootstrap_median_ci([1.5, 1.5, 1.5]) == (1.5, 1.5)
    sp = paired_speedup([1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5])
    assert sp["speedup"] == 2.0 and sp["ci"] == [2.0, 2.0] and sp["rounds"] == 4
    assert math.isnan(paired_speedup([1.0], [0.0])["speedup"])
