"""optimize() never harms the user's model: a train-mode model keeps its statistics and its training flags,
host code that writes a parameter leaves no trace, and the report says when kernels will not run."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.api import GRAD_NOTE
from metal_accel.runtime.model_state import StateGuard, bit_equal

from harness import ANY_SPEED, candidate_dir, kernel_with, run_attack
from toymodels import GOOD, Net

pytestmark = pytest.mark.needs_cxx

BN_KERNEL = '''SOURCE = r"""
#include <cmath>
#include <cstdint>
extern "C" void bn(const float* x, const float* m, const float* v, const float* w, const float* b, float* out,
                   int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i)
      out[r * n + i] = (x[r * n + i] - m[i]) / std::sqrt(v[i] + eps) * w[i] + b[i];
}
"""

def forward(module, x):
    out = torch.empty_like(x)
    lib.bn(x.contiguous(), module.running_mean, module.running_var, module.weight, module.bias, out,
           x.shape[0], x.shape[1], module.eps)
    return out
'''


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU())
    with torch.no_grad():  # statistics of a model that has trained a while, not the fresh 0 and 1
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        model[1].num_batches_tracked.fill_(7)
    return model.train()


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    now = model.state_dict()
    assert set(now) == set(before)
    changed = [k for k in before if not bit_equal(now[k].detach(), before[k])]
    assert not changed, f"changed by optimize(): {changed}"


@pytest.mark.slow
@pytest.mark.parametrize("with_candidate", [False, True])
def test_train_mode_model_is_untouched_by_optimize_and_restore(tmp_path, with_candidate):
    model = bn_model()
    before = state_of(model)
    providers = [candidate_dir(tmp_path, BN_KERNEL, cls="BatchNorm1d")] if with_candidate else None
    with pytest.warns(UserWarning, match="training mode"):
        metal_accel.optimize(model, (torch.randn(8, 16),), providers=providers, progress=False)
    assert_same_state(model, before)  # running_mean/var/num_batches_tracked included: no NaN, no update
    assert all(m.training for m in model.modules())  # the flags are put back
    report = metal_accel.explain(model)
    assert any("training mode" in n for n in report.notes)
    if with_candidate:
        bn = next(m for m in report.modules if m.name == "1")
        assert bn.rejected or bn.status == "kernel", bn  # the candidate was really proven
    metal_accel.restore(model)
    assert_same_state(model, before)
    assert all(m.training for m in model.modules())


@pytest.mark.slow
def test_an_installed_kernel_runs_only_in_eval_mode(tmp_path):
    model, x = Net().train(), torch.randn(4, 256)
    with pytest.warns(UserWarning, match="training mode"):
        metal_accel.optimize(model, (x,), providers=[candidate_dir(tmp_path, GOOD)], progress=False, **ANY_SPEED)
    chain = next(m for m in metal_accel.explain(model).modules if m.name == "chain")
    assert chain.status == "kernel", chain
    assert any("training mode" in n for n in chain.notes)
    disp = model.chain.__dict__["forward"]
    with torch.inference_mode():
        model(x)
    assert disp.hits == 0  # training mode: eager
    model.eval()
    with torch.inference_mode():
        model(x)
    assert disp.hits == 1
    assert not any("training mode" in n for n in next(m for m in metal_accel.explain(model).modules
                                                      if m.name == "chain").notes)


WRITES_WEIGHT = '''
def forward(module, x):
    w = module.scale
    w.mul_(2)
    out = torch.empty_like(x)
    n = x.shape[-1]
    lib.chain(x.contiguous(), module.scale, out, x.numel() // n, n, module.shift)
    return out
'''


def test_host_code_writing_a_parameter_leaves_no_trace(tmp_path):
    """Whether the sandbox refuses it up front or a proof catches it, the model's weights keep their bits
    (run_attack also checks the optimized model's output against eager's)."""
    scale_before = Net().chain.scale.detach().clone()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = run_attack(tmp_path, kernel_with(host=WRITES_WEIGHT))
    assert rep.status != "kernel", rep
    assert torch.equal(Net().chain.scale, scale_before)  # the class's init is deterministic: a sanity check


def test_host_code_writing_a_parameter_is_put_back_on_the_real_model(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    before = state_of(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metal_accel.optimize(model, (x,), providers=[candidate_dir(tmp_path, kernel_with(host=WRITES_WEIGHT))],
                             progress=False)
    assert_same_state(model, before)
    assert next(m for m in metal_accel.explain(model).modules if m.name == "chain").status != "kernel"


def test_state_guard_restores_in_place_writes_replacements_and_flags():
    model = bn_model()
    before = state_of(model)
    guard = StateGuard(model)
    guard.eval()
    assert not any(m.training for m in model.modules())
    guard.protect(model[1])  # a proof is about to run on the BatchNorm: it is copied
    with torch.no_grad():
        model[1].weight.mul_(2)                                   # in place, through an alias
        model[1].running_var.fill_(float("nan"))
        model[1].running_mean = torch.zeros(32)                   # a replaced buffer
        model[0].bias.mul_(2)                                     # unprotected: detected, not restorable
    model[1].bias.requires_grad_(False)
    changes = guard.restore()
    text = "\n".join(changes)
    for name in ("1.weight", "1.running_var", "1.running_mean", "1.bias.requires_grad", "0.bias"):
        assert name in text, text
    assert "not restored" in next(c for c in changes if c.startswith("0.bias"))
    assert all(m.training for m in model.modules())
    assert model[1].bias.requires_grad
    with torch.no_grad():
        model[0].bias.div_(2)  # the one write no copy covered (halving undoes doubling exactly)
    assert_same_state(model, before)
    assert guard.restore() == ["0.bias was written in place by the model's own forward while optimize() ran it; "
                               "no copy was taken, so it was not restored"]


def test_bit_equal_sees_nan_payloads_and_signed_zeros():
    a = torch.tensor([0.0, float("nan"), 1.0])
    assert bit_equal(a, a.clone())
    assert not bit_equal(a, torch.tensor([-0.0, float("nan"), 1.0]))
    assert not torch.equal(a, a.clone())  # why torch.equal alone will not do: NaN != NaN


@pytest.mark.slow
def test_grad_mode_is_reported_and_warned(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidate_dir(tmp_path, GOOD)], progress=False, **ANY_SPEED)
    chain = next(m for m in metal_accel.explain(model).modules if m.name == "chain")
    assert chain.status == "kernel"
    assert any(GRAD_NOTE in n for n in chain.notes)
    assert GRAD_NOTE in metal_accel.explain(model).table()
    with pytest.warns(UserWarning, match="autograd is recording"):
        model(x)  # autograd recording: eager, and said so once
    assert model.chain.__dict__["forward"].hits == 0
    model.requires_grad_(False)
    chain = next(m for m in metal_accel.explain(model).modules if m.name == "chain")
    assert not any(GRAD_NOTE in n for n in chain.notes)
    model(x)
    assert model.chain.__dict__["forward"].hits == 1
