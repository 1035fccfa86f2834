"""The first honest validate and benchmark: what must fail does fail."""
from __future__ import annotations

import time

import pytest
import torch

from metal_accel.proof.speed import compare_speed
from metal_accel.core.specs import InputSpec
from metal_accel.proof.testdata import make_inputs
from metal_accel.proof.validate import Mismatch, compare_output, validate


def softmax(x):
    return torch.softmax(x, dim=-1)


SPEC = InputSpec.of((torch.randn(4, 4096),))


def test_exact_reimplementation_passes():
    def cand(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)
    res = validate(softmax, cand, SPEC, device="cpu")
    assert res.ok, res.reason
    # five distributions, special values, the dtype's extremes and two structured trials (4 rows: fewer than
    # the row kinds)
    assert res.trials == 9


def test_all_zero_output_fails_on_long_softmax_rows():
    # Each element is ~1/4096: atol=rtol=1e-2 (the published harness) would let zeros pass.
    res = validate(softmax, lambda x: torch.zeros_like(x), SPEC, device="cpu")
    assert not res.ok and "outside tolerance" in res.reason


def test_small_error_fails_for_fp32():
    res = validate(softmax, lambda x: softmax(x) * (1 + 1e-3), SPEC, device="cpu")
    assert not res.ok


def test_unwritten_output_is_caught_by_nan_positions():
    def cand(x):
        out = softmax(x)
        out[0, 0] = float("nan")  # what a poisoned, never-written element looks like
        return out
    res = validate(softmax, cand, SPEC, device="cpu")
    assert not res.ok and "NaN positions differ" in res.reason


def test_input_mutation_is_caught():
    def cand(x):
        out = softmax(x)
        x.zero_()
        return out
    res = validate(softmax, cand, SPEC, device="cpu")
    assert not res.ok and "input 0 was modified" in res.reason


def test_parameter_mutation_is_caught():
    w = torch.ones(4)

    def cand(x):
        w.add_(1)
        return softmax(x)
    res = validate(softmax, cand, SPEC, device="cpu", state=[w])
    assert not res.ok and "parameter" in res.reason


def test_returning_an_input_is_caught():
    res = validate(lambda x: x.clone(), lambda x: x, SPEC, device="cpu")
    assert not res.ok and "shares memory" in res.reason


def test_shape_and_dtype_mismatch():
    with pytest.raises(Mismatch, match="shape"):
        compare_output(torch.zeros(2, 3), torch.zeros(3, 2), "output 0")
    with pytest.raises(Mismatch, match="dtype"):
        compare_output(torch.zeros(2), torch.zeros(2, dtype=torch.float64), "output 0")
    with pytest.raises(Mismatch, match="Inf"):
        compare_output(torch.tensor([float("inf")]), torch.tensor([float("-inf")]), "output 0")


def test_nondeterminism_is_caught():
    def cand(x):
        return softmax(x) + torch.rand(()) * 0  # deterministic value...
    assert validate(softmax, cand, SPEC, device="cpu").ok
    calls = []

    def flaky(x):
        calls.append(1)
        out = softmax(x)
        if len(calls) == 2:
            out[0, 0] = out[0, 0] + 1e-7  # within tolerance, but not bit-identical to the first call
        return out
    res = validate(softmax, flaky, SPEC, device="cpu")
    assert not res.ok and "different outputs" in res.reason


def test_candidate_exception_is_a_reason():
    def cand(x):
        raise ValueError("boom")
    res = validate(softmax, cand, SPEC, device="cpu")
    assert not res.ok and "ValueError: boom" in res.reason


def test_fresh_inputs_every_trial_and_int_ranges():
    gen = torch.Generator().manual_seed(0)
    spec = InputSpec.of((torch.randn(3, 5).t(), torch.tensor([2, 9])))
    a, _ = make_inputs(spec, "normal", gen, "cpu")
    b, _ = make_inputs(spec, "normal", gen, "cpu")
    assert not torch.equal(a[0], b[0])
    assert a[0].stride() == (1, 5) and a[0].shape == (5, 3)
    assert int(a[1].min()) >= 2 and int(a[1].max()) <= 9


def _sleeper(seconds):
    def fn(*args):
        time.sleep(seconds)
    return fn


def test_bench_accepts_a_clear_win_and_rejects_a_loss():
    inputs = [((), {})]
    # 8x apart: a sleep that oversleeps by milliseconds on a busy machine still leaves a clear win
    win = compare_speed(_sleeper(0.008), _sleeper(0.001), inputs, min_reps=10, max_reps=20)
    assert win.accepted and win.speedup > 2
    loss = compare_speed(_sleeper(0.001), _sleeper(0.004), inputs, min_reps=10, max_reps=20)
    assert not loss.accepted and "not faster" in loss.reason
    tie = compare_speed(_sleeper(0.002), _sleeper(0.002), inputs, min_reps=10, max_reps=20)
    assert not tie.accepted


def test_the_gate_bounds_the_median_pair_not_the_quartile():
    from metal_accel.proof.speed import median_lower_bound
    assert median_lower_bound(list(range(30))) == 8  # about the 27th percentile of 30 pairs
    assert median_lower_bound(list(range(500))) == 223  # about the 45th of 500
    # a clear win with a noisy quarter of pairs (the kernel slower in 30% of them) passes the bound ...
    ratios = [0.8] * 150 + [1.4] * 350
    assert median_lower_bound(ratios) == 1.4
    # ... a coin flip does not
    assert median_lower_bound([0.9, 1.1] * 250) == 0.9


def test_bench_rejects_a_median_win_that_the_pairs_do_not_show():
    import itertools
    # eager alternates 4 ms and 1 ms, the kernel takes 1.9 ms: the medians say 1.3x, but the kernel
    # wins only the half of the pairs where eager was slow
    e_cycle = itertools.cycle([0.004, 0.001])
    res = compare_speed(lambda: time.sleep(next(e_cycle)), _sleeper(0.0019), [((), {})],
                        min_reps=40, max_reps=40, warmup=0)
    assert res.speedup > 1.05 and res.ratio_low < 1.0 and not res.accepted, res
    assert "within noise" in res.reason


def test_special_values_must_match_eager_nan_inf_masks():
    def relu_eager(x):
        return torch.relu(x)

    def relu_nan_blind(x):  # a kernel that maps NaN to 0 (max(x, 0) in C does that)
        return torch.where(x > 0, x, torch.zeros_like(x))
    res = validate(relu_eager, relu_nan_blind, SPEC, device="cpu")
    assert not res.ok and "special inputs" in res.reason and "NaN positions differ" in res.reason


def test_degenerate_problem_is_reported():
    spec = InputSpec.of((torch.randn(8, 8),))

    def always_zero(x):
        return x * 0.0
    res = validate(always_zero, lambda x: torch.zeros_like(x), spec, device="cpu",
                   dists=("normal", "uniform"))
    assert not res.ok and "degenerate" in res.reason


def test_float64_reference_accepts_a_more_accurate_kernel():
    # eager float32 loses the low bits of x in (x + 4096) - 4096; a kernel that computes it exactly
    # disagrees with eager's rounding but matches the float64 truth, and must not be rejected for it.
    spec = InputSpec.of((torch.randn(64, 256),))

    def eager(x):
        return (x + 4096.0) - 4096.0

    def exact(x):
        return ((x.double() + 4096.0) - 4096.0).float()
    dists = ("normal", "uniform", "large")  # with NaN/Inf inputs float32 and float64 overflow differently
    assert not validate(eager, exact, spec, device="cpu", dists=dists).ok
    assert validate(eager, exact, spec, device="cpu", reference64=eager, dists=dists).ok
    sloppy = lambda x: eager(x) * (1 + 1e-3)  # noqa: E731  (the float64 path does not loosen the check)
    assert not validate(eager, sloppy, spec, device="cpu", reference64=eager, dists=dists).ok


def test_float64_reference_runs_only_where_the_plain_check_fails():
    """The float64 rule only ever passes more, so a candidate that matches eager plainly costs no float64
    run; one that needs the rule gets it (once per trial), and its verdict is the rule's."""
    spec = InputSpec.of((torch.randn(64, 256),))
    runs = []

    def eager(x):
        return (x + 4096.0) - 4096.0

    def eager64(x):
        runs.append(x.dtype)
        return eager(x)

    def exact(x):
        return ((x.double() + 4096.0) - 4096.0).float()
    dists = ("normal", "uniform", "large")
    assert validate(eager, eager, spec, device="cpu", reference64=eager64, dists=dists).ok
    assert runs == []
    assert validate(eager, exact, spec, device="cpu", reference64=eager64, dists=dists).ok
    assert runs and set(runs) == {torch.float64} and len(runs) <= len(dists)  # at most once per trial


def test_output_strides_must_match_eager():
    def eager(x):
        return x * 2

    def transposed_layout(x):
        return (x.t() * 2).contiguous().t()
    spec = InputSpec.of((torch.randn(16, 32),))
    res = validate(eager, transposed_layout, spec, device="cpu")
    assert not res.ok and "strides" in res.reason


def test_spot_checks_catch_a_kernel_that_changes_while_timed():
    from metal_accel.proof.validate import spot_check
    calls = []

    def eager(x):
        return x + 1

    def sneaky(x):  # right while validated, wrong (and fast) once timing starts
        calls.append(1)
        return x + 1 if len(calls) < 10 else torch.zeros_like(x)
    inputs = [((torch.randn(64),), {}) for _ in range(4)]
    with pytest.raises(Mismatch):
        compare_speed(eager, sneaky, inputs, check=spot_check(inputs), check_every=1, min_reps=20, max_reps=20)


def test_ill_conditioned_output_judged_by_eagers_error_level_not_its_luck():
    """Normalizing nearly constant rows: eager and the same computation summed in another order are equally
    inaccurate, at different elements. The reordered one passes; a 1% scale error still fails."""
    from metal_accel.proof.validate import Mismatch, compare_output

    def norm(x):
        d = x - x.mean(-1, keepdim=True)
        return d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5)

    g = torch.Generator().manual_seed(0)
    x = 30.0 + 1e-3 * torch.randn(64, 1024, generator=g)
    ref, ref64 = norm(x), norm(x.double())
    reordered = norm(x.flip(-1)).flip(-1)
    assert not torch.equal(reordered, ref)
    compare_output(reordered, ref, "o", ref64)
    with pytest.raises(Mismatch, match="outside tolerance"):
        compare_output(reordered * 1.01, ref, "o", ref64)
    with pytest.raises(Mismatch, match="outside tolerance"):  # without the exact reference: the plain tolerance
        compare_output(reordered, ref, "o")


def test_spot_checks_hold_ill_conditioned_outputs_to_the_proofs_rule():
    from metal_accel.proof.validate import Mismatch, spot_check

    def norm(x):
        d = x - x.mean(-1, keepdim=True)
        return d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5)

    g = torch.Generator().manual_seed(0)
    inputs = [((30.0 + 1e-3 * torch.randn(64, 1024, generator=g),), {}) for _ in range(2)]
    reordered = lambda x: norm(x.flip(-1)).flip(-1)  # noqa: E731
    ref64 = lambda x: norm(x)  # noqa: E731  (called with float64 inputs, as the proof's reference is)
    x = inputs[1][0][0]
    with pytest.raises(Mismatch):  # eager's plain tolerance alone rejects a correct reordering here
        spot_check(inputs)(reordered(x), norm(x), "timed call 0", 1)
    spot_check(inputs, ref64)(reordered(x), norm(x), "timed call 0", 1)
    with pytest.raises(Mismatch, match="outside tolerance"):
        spot_check(inputs, ref64)(reordered(x) * 1.01, norm(x), "timed call 0", 1)


def test_speed_gate_times_the_callers_own_inputs():
    """Speed can depend on values (eager's ELU skips expm1 on positive inputs): the gate times copies of
    the example the caller gave, and fresh normal inputs only where that example does not fit the spec."""
    from metal_accel.runtime.capture import ModuleCall
    from metal_accel.proof.prove import TIMING_SETS, timing_inputs

    x = torch.rand(4, 8)  # all positive, unlike normal inputs
    call = ModuleCall("m", torch.nn.ELU(), InputSpec.of((x,)), None, (x,), {})
    sets = timing_inputs(call, torch.device("cpu"))
    assert len(sets) == TIMING_SETS
    for args, kwargs in sets:
        assert torch.equal(args[0], x) and args[0].data_ptr() != x.data_ptr() and kwargs == {}
    other = ModuleCall("m", torch.nn.ELU(), InputSpec.of((x,)), None, (torch.rand(2, 8),), {})
    fresh = timing_inputs(other, torch.device("cpu"))
    assert fresh[0][0][0].shape == x.shape and (fresh[0][0][0] < 0).any()


def test_speed_gate_holds_fewer_copies_of_large_inputs(monkeypatch):
    from metal_accel.proof import prove
    from metal_accel.runtime.capture import ModuleCall

    x = torch.rand(256, 1024)  # 1 MiB
    call = ModuleCall("m", torch.nn.ELU(), InputSpec.of((x,)), None, (x,), {})
    monkeypatch.setattr(prove, "TIMING_BYTES", 3 << 20)
    assert len(prove.timing_inputs(call, torch.device("cpu"))) == 3
    monkeypatch.setattr(prove, "TIMING_BYTES", 1 << 10)
    assert len(prove.timing_inputs(call, torch.device("cpu"))) == 2  # two at least: no call reuses the last inputs


def _scripted_timer(eager_times):
    """A timer that reports the kernel at 1 ms and eager at the next of EAGER_TIMES (deterministic)."""
    it = iter(eager_times)

    def timer(fn, args, kwargs, sync):
        return (next(it) if fn.__name__ == "eager" else 0.001), None
    return timer


def _named(name):
    def fn(*args):
        return None
    fn.__name__ = name
    return fn


def test_an_inconclusive_win_gets_more_pairs_and_a_stricter_bound():
    # first 30 pairs: 14 where the kernel loses (0.95x), 16 where it wins 1.3x: median 1.3x, bound below 1;
    # the next 30 pairs all show 1.3x
    first = [0.00095, 0.0013] * 14 + [0.0013] * 2
    timer = _scripted_timer(first + [0.0013] * 30)
    res = compare_speed(_named("eager"), _named("kernel"), [((), {})], timer=timer, min_reps=30, max_reps=500,
                        budget_s=0.0, warmup=0)
    assert res.accepted and res.reps == 60, res
    once = compare_speed(_named("eager"), _named("kernel"), [((), {})], timer=_scripted_timer(first), min_reps=30,
                         max_reps=500, budget_s=0.0, warmup=0, extra_looks=0)
    assert not once.accepted and "within noise" in once.reason and once.reps == 30


def test_more_pairs_do_not_turn_a_coin_flip_into_a_win():
    noisy = [0.00095, 0.0013] * 200  # the kernel loses every other pair, at every look
    res = compare_speed(_named("eager"), _named("kernel"), [((), {})], timer=_scripted_timer(noisy), min_reps=30,
                        max_reps=500, budget_s=0.0, warmup=0)
    assert not res.accepted and res.reps == 90 and "99.5% bound, after more pairs" in res.reason, res
