"""The first honest validate and benchmark: what must fail does fail."""
from __future__ import annotations

import time

import pytest
import torch

from metal_accel.bench import compare_speed
from metal_accel.specs import InputSpec
from metal_accel.testdata import make_inputs
from metal_accel.validate import Mismatch, compare_output, validate


def softmax(x):
    return torch.softmax(x, dim=-1)


SPEC = InputSpec.of((torch.randn(4, 4096),))


def test_exact_reimplementation_passes():
    def cand(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)
    res = validate(softmax, cand, SPEC, device="cpu")
    assert res.ok, res.reason
    assert res.trials == 6  # five distributions and the special-values trial


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
    win = compare_speed(_sleeper(0.004), _sleeper(0.001), inputs, min_reps=10, max_reps=20)
    assert win.accepted and win.speedup > 2
    loss = compare_speed(_sleeper(0.001), _sleeper(0.002), inputs, min_reps=10, max_reps=20)
    assert not loss.accepted and "not faster" in loss.reason
    tie = compare_speed(_sleeper(0.002), _sleeper(0.002), inputs, min_reps=10, max_reps=20)
    assert not tie.accepted
