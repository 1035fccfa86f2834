"""Degenerate problems (a trivial output passes every trial) are proven with random module state."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.proof.perturb import perturbed_values, swapped_state

from test_optimize import candidates

# slow: full proofs, one with torch.compile
pytestmark = pytest.mark.slow


class FreshNorm(nn.Module):
    """An eval-mode BatchNorm with the statistics it was built with: within rounding, y = x."""

    def __init__(self, c: int = 256) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


COPY = '''SOURCE = r"""
#include <cstdint>
#include <cstring>
extern "C" void copy(const float* x, float* out, int64_t n) { std::memcpy(out, x, n * sizeof(float)); }
"""

def forward(module, x):
    out = torch.empty_like(x)
    lib.copy(x.contiguous(), out, x.numel())
    return out
'''

NORM = '''SOURCE = r"""
#include <cmath>
#include <cstdint>
extern "C" void norm(const float* x, const float* m, const float* v, const float* w, const float* b, float* out,
                     int64_t rows, int64_t c, float eps) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < c; ++j)
      out[i * c + j] = (x[i * c + j] - m[j]) / std::sqrt(v[j] + eps) * w[j] + b[j];
}
"""

def forward(module, x):
    out = torch.empty_like(x)
    lib.norm(x.contiguous(), module.bn.running_mean, module.bn.running_var, module.bn.weight, module.bn.bias, out,
             x.shape[0], x.shape[1], module.bn.eps)
    return out
'''


def report(model: nn.Module, name: str = "FreshNorm") -> metal_accel.ModuleReport:
    return next(m for m in metal_accel.explain(model).modules if m.name == name)


def test_perturbed_values_keep_signs_and_ties():
    w = torch.ones(64)
    state = [torch.zeros(64), w, torch.full((64,), 2.0), w, torch.arange(4)]
    new = perturbed_values(state, seed=1)
    assert not torch.equal(new[0], state[0]) and new[0].std() > 0.1   # zeros become values of both signs
    assert (new[1] > 0).all() and not torch.equal(new[1], w)           # positive stays positive (a variance)
    assert (new[2] > 0).all() and new[2].std() > 0.1
    assert new[3] is new[1]                                             # a tied tensor gets one value
    assert torch.equal(new[4], state[4])                                # integers are not touched
    assert torch.equal(perturbed_values(state, seed=1)[0], new[0])


def test_swapped_state_restores_even_on_error():
    with torch.inference_mode():
        frozen = torch.ones(8)  # an inference tensor: copied into inside inference mode
    param = nn.Parameter(torch.zeros(8))
    with pytest.raises(RuntimeError, match="inside"):
        with swapped_state([param, frozen], [torch.full((8,), 3.0), torch.full((8,), 5.0)]):
            assert param.detach().eq(3).all() and frozen.eq(5).all()
            raise RuntimeError("inside")
    assert param.detach().eq(0).all() and frozen.eq(1).all() and param.requires_grad


@pytest.mark.needs_cxx
def test_copy_kernel_is_caught_and_a_real_one_is_proven(tmp_path, monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "0")
    x = torch.randn(512, 256)
    model = FreshNorm().eval()
    before = [t.clone() for t in model.state_dict().values()]
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, "FreshNorm", copy=COPY)], progress=False)
    rep = report(model)
    assert rep.status == "eager" and "with random module state" in rep.reason, rep
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values()))  # state restored

    model = FreshNorm().eval()
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path / "b", "FreshNorm", norm=NORM)], progress=False)
    rep = report(model)
    # proven: installed, or turned down by the speed gate (a reason in "x eager"), never for correctness
    assert rep.status == "kernel" or "x eager" in rep.reason, rep
    assert "incorrect" not in rep.reason and "degenerate" not in rep.reason, rep
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values()))
    with torch.inference_mode():
        torch.testing.assert_close(model(x), FreshNorm().eval()(x))


@pytest.mark.needs_cxx
@pytest.mark.slow
def test_torch_compile_of_a_degenerate_module_is_proven(monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "1")
    model = FreshNorm().eval()
    metal_accel.optimize(model, (torch.randn(512, 256),), progress=False)
    rep = report(model)
    assert rep.compile_us is not None, rep  # compile passed the proof and was timed
    assert "degenerate" not in rep.reason and "incorrect" not in rep.reason, rep
