"""Modules that change their input by design (ReLU(inplace=True), all through torchvision's ResNet) are judged
against eager's own change of the input: a candidate must leave each input exactly as eager leaves it."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.core.specs import InputSpec
from metal_accel.proof.validate import validate


def prove(reference: nn.Module, candidate) -> tuple[bool, str, dict]:
    x = torch.randn(8, 64)
    with torch.inference_mode():
        result = validate(reference, candidate, InputSpec.of((x,), {}), device="cpu")
    return result.ok, result.reason, result.details


def test_inplace_candidate_matches_inplace_eager():
    ok, reason, details = prove(nn.ReLU(inplace=True), torch.relu_)  # output is the input, as eager's is
    assert ok, reason
    assert "in place" in details["inplace"]


def test_candidate_must_change_the_input_as_eager_does():
    ok, reason, _ = prove(nn.ReLU(inplace=True), torch.relu)
    assert not ok and "candidate left it as it was" in reason
    ok, reason, _ = prove(nn.ReLU(inplace=True), lambda x: x.clamp_(min=0.01))
    assert not ok and "changed it otherwise" in reason


def test_candidate_may_not_change_an_input_eager_leaves_alone():
    ok, reason, _ = prove(nn.ReLU(), torch.relu_)
    assert not ok and "input 0 was modified by the candidate" in reason


def test_eager_reference_inputs_are_put_back():
    # later references (float64, trivial guesses) see the trial's inputs, not eager's leftovers: an in-place
    # module whose output depends on its input's old values must still pass against its own twin
    class AddSelf(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mul_(2).add_(1)
    ok, reason, _ = prove(AddSelf(), lambda x: x.mul_(2).add_(1))
    assert ok, reason


class ConvBNReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


@pytest.mark.needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: nn.ReLU(inplace=True), ConvBNReLU], ids=["relu", "conv-bn-relu"])
def test_optimize_judges_inplace_modules_against_eager(monkeypatch, make):
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "1")
    model = make().eval()
    twin = make().eval()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(16, 8, 32, 32)
    metal_accel.optimize(model, (x.clone(),), progress=False)
    mods = metal_accel.explain(model).modules
    reasons = {m.name: m.reason for m in mods}
    assert not any("modified" in r or "incorrect" in r for r in reasons.values()), reasons
    relu = next(m for m in mods if m.name.lower() == "relu")  # its compile passed the proof: speed decided
    assert relu.status == "compile" or "not faster" in relu.reason, reasons
    x1 = torch.randn(16, 8, 32, 32)
    x2 = x1.clone()
    with torch.inference_mode():
        out, ref = model(x1), twin(x2)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x1, x2)  # the input changed as eager changes it (or not at all, as eager)
