"""Speed: interleaved A/B timing of eager against a candidate, with a noise-aware margin."""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

DEFAULT_MARGIN = 0.05


@dataclass
class BenchResult:
    eager_us: float          # median per call
    kernel_us: float
    speedup: float           # median eager / median kernel
    ratio_p25: float         # 25th percentile of per-pair eager/kernel ratios
    eager_spread: float      # interquartile range / median
    kernel_spread: float
    reps: int
    accepted: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _spread(xs: Sequence[float]) -> float:
    med = statistics.median(xs)
    return (_quantile(xs, 0.75) - _quantile(xs, 0.25)) / med if med > 0 else 0.0


def time_call(fn: Callable[..., Any], args: tuple, kwargs: dict, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    sync()
    return time.perf_counter() - t0


def compare_speed(eager: Callable[..., Any], kernel: Callable[..., Any], input_sets: Sequence[tuple[tuple, dict]],
                  sync: Callable[[], None] = lambda: None, *, margin: float = DEFAULT_MARGIN,
                  warmup: int = 5, min_reps: int = 30, max_reps: int = 500, budget_s: float = 1.0) -> BenchResult:
    """Time eager and kernel alternately on rotating inputs; accept only a win beyond the noise.

    Accepted when the median speedup is at least 1 + margin and the kernel won at least three
    quarters of the interleaved pairs (25th percentile of per-pair ratios above 1).
    """
    if not input_sets:
        raise ValueError("compare_speed needs at least one input set")
    for i in range(warmup):
        args, kwargs = input_sets[i % len(input_sets)]
        eager(*args, **kwargs)
        kernel(*args, **kwargs)
    e_times: list[float] = []
    k_times: list[float] = []
    start = time.perf_counter()
    rep = 0
    while rep < max_reps and (rep < min_reps or time.perf_counter() - start < budget_s):
        args, kwargs = input_sets[rep % len(input_sets)]
        if rep % 2 == 0:
            e_times.append(time_call(eager, args, kwargs, sync))
            k_times.append(time_call(kernel, args, kwargs, sync))
        else:
            k_times.append(time_call(kernel, args, kwargs, sync))
            e_times.append(time_call(eager, args, kwargs, sync))
        rep += 1
    e_med, k_med = statistics.median(e_times), statistics.median(k_times)
    speedup = e_med / k_med if k_med > 0 else float("inf")
    ratios = [e / k if k > 0 else float("inf") for e, k in zip(e_times, k_times)]
    p25 = _quantile(ratios, 0.25)
    if speedup < 1 + margin:
        accepted, reason = False, f"not faster: {speedup:.2f}x eager (needs >= {1 + margin:.2f}x)"
    elif p25 <= 1.0:
        accepted, reason = False, (f"within noise: median {speedup:.2f}x eager but the kernel lost "
                                   f"over a quarter of {rep} interleaved pairs")
    else:
        accepted, reason = True, f"{speedup:.2f}x eager over {rep} interleaved pairs"
    return BenchResult(e_med * 1e6, k_med * 1e6, speedup, p25, _spread(e_times), _spread(k_times),
                       rep, accepted, reason)
