"""Side-by-side timing for `metal-accel bench`: contenders called one at a time in a balanced order.

The order is proof/rotation.py's (each contender right after each other equally often, across rounds
too); here every call is timed alone with the backend's timer, a round of N contenders is
N * (N - 1) calls on one input set, N - 1 samples of each, the next round on the next input set.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from ..backends.timing import TimingRejected, time_call
from ..proof.rotation import balanced_sequence

Timer = Callable[..., tuple[float, Any]]


def interleave(fns: dict[str, Callable[..., Any]], input_sets: list[tuple], sync: Callable[[], None],
               timer: Timer | None, budget_s: float, min_samples: int = 10,
               max_samples: int = 300) -> dict[str, list[float]]:
    """Seconds of each call of each function, in balanced rounds (each on the next input set) until every
    function has MIN_SAMPLES and BUDGET_S has passed, or MAX_SAMPLES. Two warm-up calls each first."""
    timer = timer or time_call
    names = list(fns)
    for args in input_sets[:2]:
        for n in names:
            fns[n](*args)
    order = [names[i] for i in balanced_sequence(len(names))]
    per_round = max(1, len(names) - 1)
    times: dict[str, list[float]] = {n: [] for n in names}
    start, rnd = time.perf_counter(), 0
    while rnd * per_round < max_samples and (rnd * per_round < min_samples or time.perf_counter() - start < budget_s):
        args = input_sets[rnd % len(input_sets)]
        for n in order:
            for _ in range(4):  # a rejected timing (an outlier the timer refuses) is taken again
                try:
                    times[n].append(timer(fns[n], args, {}, sync)[0])
                    break
                except TimingRejected:
                    continue
        rnd += 1
    return times


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def side_by_side(fns: dict[str, Callable[..., Any]], input_sets: list[tuple], sync: Callable[[], None],
                 timer: Timer | None, budget_s: float, min_reps: int = 10,
                 max_reps: int = 300) -> dict[str, float]:
    """Median seconds per call of each function, timed in balanced rounds on rotating inputs."""
    times = interleave(fns, input_sets, sync, timer, budget_s, min_reps, max_reps)
    return {n: median(t) for n, t in times.items()}


def self_noise(eager_s: float, again_s: float) -> float:
    """How far two timings of the same function disagree: |1 - again / eager| (0.05: 5%)."""
    if not eager_s or math.isnan(eager_s) or math.isnan(again_s):
        return float("nan")
    return abs(1.0 - again_s / eager_s)
