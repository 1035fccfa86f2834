"""No phase a kernel can tell apart (issue 25): proof buffers look like production memory, spot checks land on
every input set at unpredictable calls, structured inputs meet every candidate, out-of-bounds writes and in-place
edits of inputs or weights are rejected. Each attack goes through the real pipeline (a `dir:` provider on the CPU
backend); the model's output, its parameters and the caller's input are unchanged afterwards."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import metal_accel
from metal_accel.proof.speed import _sample_pairs, compare_speed, time_call
from metal_accel.proof.compare import Mismatch
from metal_accel.core.specs import InputSpec
from metal_accel.proof.testdata import PAD, ROW_KINDS, STRUCTURED, make_inputs
from metal_accel.proof.trial_buffers import FILLS, next_fill
from metal_accel.proof.validate import run_trial, trial_plan, validate

from harness import SAME_RESULT, candidate_dir, kernel_with
from toymodels import _CHAIN_BODY, CHAIN_HOST, Net, chain_candidate

SENTINEL = (0.5, 0.25)  # the caller's example input starts with these; no random trial ever does


def attack(tmp_path: Path, text: str, x: torch.Tensor | None = None) -> metal_accel.ModuleReport:
    """optimize() a toy Net with TEXT as the Chain's only candidate; the model (output, parameters, buffers) and
    the example input must be exactly as before. Returns the Chain's report."""
    model = Net().eval()
    before = copy.deepcopy(model)
    x = torch.randn(4, 256) if x is None else x
    x_before = x.clone()
    metal_accel.optimize(model, (x,), providers=[candidate_dir(tmp_path, text)])
    assert torch.equal(x, x_before), "optimize() changed the caller's input"
    for (name, a), (_, b) in zip([*model.named_parameters(), *model.named_buffers()],
                                 [*before.named_parameters(), *before.named_buffers()]):
        assert torch.equal(a, b), f"optimize() changed {name}"
    with torch.inference_mode():
        for _ in range(2):
            torch.testing.assert_close(model(x), before(x), **SAME_RESULT)
    return next(m for m in metal_accel.explain(model).modules if m.name == "chain")


def assert_rejected(rep: metal_accel.ModuleReport, *phrases: str) -> None:
    assert rep.status == "eager", rep
    text = " ".join(rep.rejected) + " " + rep.reason
    for phrase in phrases:
        assert phrase in text, (phrase, rep)


# ------------------------------------------------------------------ output buffers


NAN_ONLY = chain_candidate(_CHAIN_BODY.replace("out[r * n + i] = v;",
                                               "out[r * n + i] = std::isnan(out[r * n + i]) ? v : v + 1.0f;"))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_a_kernel_correct_only_on_nan_poisoned_outputs_is_rejected(tmp_path):
    assert_rejected(attack(tmp_path, NAN_ONLY), "incorrect")


def test_fills_are_never_nan_and_every_kind_comes_in_any_window_of_the_deck():
    """Plain is the allocator's memory as production gets it; the other fills hold ordinary values."""
    draws = [next_fill() for _ in range(60)]
    window = 2 * len(FILLS) - 1
    assert all(set(draws[i:i + window]) == set(FILLS) for i in range(len(draws) - window))
    from metal_accel.sandbox.host import load_forward
    from metal_accel.proof.trial_buffers import proof_call
    fwd = load_forward("SOURCE = ''\ndef forward(module, x):\n    return torch.empty_like(x)\n", None, proof=True)
    x = torch.randn(8, 64)
    for fill in ("noise", "leftover"):
        with proof_call(fill, [x]):
            out = fwd(None, x)
        assert torch.isfinite(out).all() and len(set(out.flatten().tolist())) > 64


def test_an_unwritten_element_is_caught_by_the_repeat_whatever_the_first_fill():
    """The repeat call gets fresh noise: an element left unwritten differs between the two calls, even where the
    first call's fill (plain, leftover) happened to hold the right value."""
    from metal_accel.sandbox.host import load_forward
    code = ("SOURCE = ''\ndef forward(module, x):\n    out = torch.empty_like(x)\n"
            "    out[1:] = x[1:] * 2\n    return out\n")
    fwd = load_forward(code, None, proof=True)
    x = torch.randn(64)
    for _ in range(2 * len(FILLS)):
        res = run_trial(lambda *a: fwd(None, *a), (x,), {}, [], repeat=True)
        assert res["repeat_equal"] is False


# ------------------------------------------------------------------ spot checks while timed

def test_spot_checks_cover_every_input_set_at_unpredictable_calls():
    sets = [((torch.full((4,), float(i)),), {}) for i in range(8)]
    checked: list[tuple[int, int]] = []

    def record(k_out, e_out, label, which):
        assert torch.equal(k_out, e_out)
        checked.append((int(label.split()[-1]), which))
    eager, kernel = (lambda x: torch.neg(x)), (lambda x: -x)
    runs = []
    for _ in range(2):
        checked.clear()
        e, k, reps, _, _ = _sample_pairs(eager, kernel, sets, lambda: None, time_call, 400, 400, 0.0,
                                         record, 8, None)
        late = [w for r, w in checked if r >= 400]  # sets still unchecked after 400 pairs (about 1% of runs)
        assert reps == 400 + len(late) and len(e) == reps
        assert len(set(late)) == len(late) and not {w for r, w in checked if r < 400} & set(late)
        assert {w for _, w in checked} == set(range(8))  # every set, at least once
        assert 20 <= len(checked) <= 100  # about one call in eight
        runs.append([r for r, _ in checked])
    assert runs[0] != runs[1]  # the checked calls differ from one measurement to the next
    checked.clear()  # a short measurement still checks every set: extra pairs where needed
    _, _, reps, _, _ = _sample_pairs(eager, kernel, sets, lambda: None, time_call, 4, 4, 0.0, record, 8, None)
    assert {w for _, w in checked} == set(range(8)) and reps >= 8


def test_a_kernel_wrong_only_on_one_input_set_other_than_the_first_is_caught():
    sets = [((torch.randn(64),), {}) for _ in range(8)]
    bad = sets[5][0][0]

    def kernel(x):
        return torch.tanh(x) + (1.0 if x is bad else 0.0)

    def check(k_out, e_out, label, which):
        if not torch.equal(k_out, e_out):
            raise Mismatch(f"{label}: differs on set {which}")
    with pytest.raises(Mismatch, match="set 5"):
        compare_speed(torch.tanh, kernel, sets, min_reps=30, max_reps=60, budget_s=0.0, check=check)


EXAMPLE_ONLY = chain_candidate(_CHAIN_BODY.replace(
    "out[r * n + i] = v;", f"out[r * n + i] = x[0] == {SENTINEL[0]}f && x[1] == {SENTINEL[1]}f ? v + 1.0f : v;"))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_a_kernel_wrong_only_on_the_callers_own_values_is_caught_while_timed(tmp_path):
    """Random trials never hold the caller's values; the speed gate's input sets are copies of them."""
    x = torch.randn(4, 256)
    x[0, :2] = torch.tensor(SENTINEL)
    assert_rejected(attack(tmp_path, EXAMPLE_ONLY, x))


# ------------------------------------------------------------------ structured inputs

PADDED_WRONG = chain_candidate(
    _CHAIN_BODY.replace("out[r * n + i] = v;", "out[r * n + i] = lead ? v + 1.0f : v;"),
    extra="    bool lead = n >= 16;\n    for (int64_t k = 0; k < 16 && k < n; ++k) lead = lead && x[r * n + k] == 0.0f;\n")


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_a_kernel_wrong_on_rows_starting_with_16_zeros_is_rejected(tmp_path):
    assert_rejected(attack(tmp_path, PADDED_WRONG), "incorrect", "structured inputs")


def test_every_plan_has_structured_rows_and_padded_rows_meet_every_candidate():
    for shape in ((4, 256), (1, 300), (512, 8), (300,)):
        spec = InputSpec.of((torch.randn(*shape),))
        plan = [d for _, d in trial_plan(spec)]
        assert STRUCTURED in plan
        for seed in range(5):
            (x,), _ = make_inputs(spec, STRUCTURED, torch.Generator().manual_seed(seed), "cpu")
            rows = x.reshape(-1, x.shape[-1])
            assert ((rows[:, :PAD] == 0).all(dim=1)).any()  # some row starts with PAD zeros
            if rows.shape[0] >= len(ROW_KINDS):
                assert ((rows == rows[:, :1]).all(dim=1) & (rows[:, 0] != 0)).any()  # an all-equal row


def test_structured_integer_inputs_stay_in_the_observed_range():
    from metal_accel.core.specs import TensorSpec
    spec = TensorSpec((12, 40), "int64", (40, 1), "cpu", (3, 9))
    from metal_accel.proof.testdata import make_tensor
    t = make_tensor(spec, STRUCTURED, torch.Generator().manual_seed(0), "cpu")
    assert t.min() >= 3 and t.max() <= 9 and (t == 3).any() and (t == 9).any()


def test_a_correct_candidate_passes_structured_trials_under_the_tolerances():
    spec = InputSpec.of((torch.randn(16, 512),))
    for ref, cand in ((lambda x: torch.softmax(x, -1), lambda x: (e := torch.exp(x - x.amax(-1, keepdim=True)))
                       / e.sum(-1, keepdim=True)),
                      (lambda x: torch.nn.functional.layer_norm(x, (512,)),
                       lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True)
                                                                               + 1e-5))):
        res = validate(ref, cand, spec, device="cpu", dists=(STRUCTURED,) * 4)
        assert res.ok, res.reason


# ------------------------------------------------------------------ out-of-bounds writes

def _oob(statement: str) -> str:
    return chain_candidate(_CHAIN_BODY + "\n      if (r == rows - 1 && i == n - 1) { " + statement + " }")


@pytest.mark.needs_cxx
@pytest.mark.parametrize("statement, where", [
    ("out[rows * n] = 1.0f;", "wrote outside its output buffer (1 element after the end of output 0)"),
    ("out[-1] = 1.0f;", "wrote outside its output buffer (1 element before the start of output 0)"),
    ("((float*)x)[rows * n] = 1.0f;", "wrote outside its input buffer (1 element after the end of input 0)"),
])
@pytest.mark.slow
def test_a_one_float_write_outside_a_buffer_is_rejected(tmp_path, statement, where):
    assert_rejected(attack(tmp_path, _oob(statement)), where)


# ------------------------------------------------------------------ in-place edits by host code

@pytest.mark.needs_cxx
@pytest.mark.parametrize("edit", [
    "w = module.scale\n    w.mul_(1.0001)\n",
    "x.add_(0)\n",
    "y = x.view(-1)\n    y[0] = y[0]\n",
    "x += 0\n",
])
def test_host_code_editing_the_input_or_a_weight_in_place_is_rejected(tmp_path, edit):
    host = CHAIN_HOST.replace("    out = torch.empty_like(x)\n", "    " + edit + "    out = torch.empty_like(x)\n")
    assert_rejected(attack(tmp_path, kernel_with(host=host)), "sandbox")
