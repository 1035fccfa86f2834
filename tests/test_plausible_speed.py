"""The speed gate does not believe a win it measured once on what may have been a busy machine."""
from __future__ import annotations

from metal_accel.core.verdict import BenchResult
from metal_accel.proof.speed import compare_speed, implausible, implausible_verdict


def scripted(eager_times: list[float], kernel_s: float = 0.001):
    """A timer reporting the kernel at KERNEL_S and eager at the next of EAGER_TIMES (deterministic)."""
    it = iter(eager_times)

    def timer(fn, args, kwargs, sync):
        return (next(it) if fn.__name__ == "eager" else kernel_s), None
    return timer


def fixed(eager_s: float, kernel_s: float, calls: list[str]):
    """A timer reporting eager at EAGER_S and the kernel at KERNEL_S on every pair, recording the calls in CALLS."""
    def timer(fn, args, kwargs, sync):
        calls.append(fn.__name__)
        return (eager_s if fn.__name__ == "eager" else kernel_s), None
    return timer


SLOW = dict(min_reps=30, max_reps=30, budget_s=0.0, warmup=0, retry_pause_s=0.0)  # no 30 pairs fit the budget


def named(name: str):
    def fn(*args):
        return None
    fn.__name__ = name
    return fn


def result(speedup: float, eager_spread: float = 0.1, kernel_spread: float = 0.1, accepted: bool = True) -> BenchResult:
    return BenchResult(speedup * 10, 10.0, speedup, speedup, eager_spread, kernel_spread, 30, accepted, "x")


def test_what_counts_as_implausible():
    assert implausible(result(1.4)) == ""
    assert "implausibly large" in implausible(result(40.0))
    assert "spread" in implausible(result(1.4, eager_spread=3.0))
    assert implausible(result(40.0, accepted=False)) == ""


def test_a_huge_win_from_a_stalled_eager_is_timed_again_and_the_lower_figure_kept():
    # first measurement: eager stalled (40 ms against a 1 ms kernel; a call this slow for the budget stops at 8
    # pairs, a clear win); second: the real 1.5x
    timer = scripted([0.04] * 8 + [0.0015] * 30)
    res = compare_speed(named("eager"), named("kernel"), [((), {})], timer=timer, min_reps=30, max_reps=30,
                        budget_s=0.0, warmup=0, retry_pause_s=0.0)
    assert res.accepted and abs(res.speedup - 1.5) < 1e-6, res
    assert "timed twice" in res.reason and "40.00x" in res.reason, res.reason


def test_a_real_large_win_survives_its_second_measurement():
    timer = scripted([0.02] * 60)
    res = compare_speed(named("eager"), named("kernel"), [((), {})], timer=timer, min_reps=30, max_reps=30,
                        budget_s=0.0, warmup=0, retry_pause_s=0.0)
    assert res.accepted and abs(res.speedup - 20.0) < 1e-6 and "timed twice" in res.reason, res


def test_cached_verdicts_measured_once_are_doubted_but_not_those_timed_twice():
    assert implausible_verdict(640.0, "640.00x eager over 30 interleaved pairs", None)
    assert implausible_verdict(1.3, "1.30x eager over 30 interleaved pairs", {"eager_spread": 2.5, "kernel_spread": 0.1,
                                                                             "speedup": 1.3, "accepted": True})
    assert implausible_verdict(20.0, "20.00x eager over 30 pairs (timed twice: ...)", None) == ""
    assert implausible_verdict(1.3, "1.30x eager over 30 interleaved pairs", None) == ""


def test_a_negative_margin_accepts_a_slower_kernel_and_the_bound_is_judged_against_it():
    # the kernel is 0.8x eager on every pair: not faster, but within what margin=-0.5 allows
    timer = scripted([0.0008] * 30)
    gate = dict(timer=timer, min_reps=30, max_reps=30, budget_s=0.0, warmup=0, retry_pause_s=0.0, extra_looks=0)
    res = compare_speed(named("eager"), named("kernel"), [((), {})], margin=-0.5, **gate)
    assert res.accepted and abs(res.speedup - 0.8) < 1e-6, res
    timer = scripted([0.0008] * 30)
    res = compare_speed(named("eager"), named("kernel"), [((), {})], margin=0.0, **{**gate, "timer": timer})
    assert not res.accepted and "not faster" in res.reason, res
    # a bound below the (negative-margin) floor still rejects: half the pairs at 0.3x
    timer = scripted([0.0003, 0.0012] * 15)
    res = compare_speed(named("eager"), named("kernel"), [((), {})], margin=-0.4, **{**gate, "timer": timer})
    assert not res.accepted and "within noise" in res.reason, res


def test_a_clear_loss_stops_timing_early_and_a_close_call_does_not():
    calls: list[str] = []
    gate = SLOW
    res = compare_speed(named("eager"), named("kernel"), [((), {})], timer=fixed(0.001, 0.0025, calls), **gate)
    assert not res.accepted and res.reps == 8 and "timing stopped after 8 pairs" in res.reason, res
    assert "not faster: 0.40x" in res.reason and len(calls) == 16
    # one pair in eight wins: the bound at 8 pairs is not below the margin, so timing goes on to a verdict
    times = iter([0.003 if i % 8 == 3 else 0.001 for i in range(400)])

    def mixed(fn, args, kwargs, sync):
        return (next(times) if fn.__name__ == "eager" else 0.0025), None
    res = compare_speed(named("eager"), named("kernel"), [((), {})], timer=mixed, **gate)
    assert not res.accepted and res.reps >= 16 and "not faster" in res.reason, res


def test_a_clear_win_of_a_slow_call_stops_timing_early_and_a_close_call_does_not():
    calls: list[str] = []
    timer = fixed(0.003, 0.002, calls)  # the kernel at 1.5x, every pair
    gate = SLOW
    res = compare_speed(named("eager"), named("kernel"), [((), {})], timer=timer, **gate)
    assert res.accepted and res.reps == 8 and abs(res.speedup - 1.5) < 1e-9, res
    assert "timing stopped early" in res.reason and len(calls) == 16, res.reason
    # a fast call (its 30 pairs fit the budget) is timed in full
    calls.clear()
    res = compare_speed(named("eager"), named("kernel"), [((), {})], timer=timer, **{**gate, "budget_s": 1e9})
    assert res.accepted and res.reps == 30 and "stopped early" not in res.reason and len(calls) == 60, res
    # one pair in eight loses: no early verdict at 8 pairs, timing goes on (and still accepts on all its pairs)
    times = iter([0.001 if i % 8 == 5 else 0.003 for i in range(400)])

    def mixed(fn, args, kwargs, sync):
        return (next(times) if fn.__name__ == "eager" else 0.002), None
    res = compare_speed(named("eager"), named("kernel"), [((), {})], timer=mixed, **gate)
    assert res.accepted and res.reps > 8, res
    # every input set is still checked before an early verdict is kept
    checked = set()

    def check(out, ref, label, which):
        checked.add(which)
    res = compare_speed(named("eager"), named("kernel"), [((), {})] * 5, timer=timer, check=check, check_every=1000,
                        **gate)
    assert res.accepted and checked == set(range(5)), (res, checked)
