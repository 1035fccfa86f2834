"""The whole model compiled as a model-level candidate (whole_model.py, model_choice.py)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.model_choice import WHOLE, prove_end_to_end
from metal_accel.proof.testdata import like_example
from metal_accel.proof.validate import to_float64
from metal_accel.report import ModuleReport, OptimizeReport
from metal_accel.runtime.dispatch import dispatcher_of
from metal_accel.whole_model import output_tensors, prove_whole_model


class Cache:
    """A cache-like object the model makes and returns: not a tensor, not a container."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self._private = torch.zeros(1)


@dataclass
class Out:
    logits: torch.Tensor
    cache: Cache
    extra: tuple


class Toy(nn.Module):
    """Many small ops (a compile fuses them) and an output no call-by-call op can return."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.scale = nn.Parameter(torch.ones(32))

    def forward(self, ids: torch.Tensor) -> Out:
        h = self.emb(ids)
        cache = Cache()
        for _ in range(40):
            h = torch.tanh(h * self.scale + 0.01)
        cache.keys.append(h * 2)
        return Out(h.sum(-1), cache, (None, h.mean()))


def test_output_tensors_walk_containers_mappings_and_objects_in_a_fixed_order():
    h = torch.arange(4.0)
    cache = Cache()
    cache.keys.append(h + 1)
    found = output_tensors(Out(h, cache, (None, h + 2)))
    assert [t.tolist() for t in found] == [[1, 2, 3, 4], [2, 3, 4, 5], [0, 1, 2, 3]]  # cache < extra < logits
    assert output_tensors({"a": h, "b": [None, 3, "x"]})[0] is h


def test_a_second_draw_keeps_token_ids_in_their_range_and_floats_near_their_scale():
    ids = torch.tensor([[3, 9, 7, 5]])
    x = torch.randn(1000) * 5 + 2
    mask = torch.rand(4, 4) > 0.5
    gen = torch.Generator().manual_seed(0)
    (ids2, x2, (x3, mask2)), kw = like_example((ids, x, (x, mask)), {"flag": True, "one": torch.ones(1)}, gen)
    assert ids2.dtype == ids.dtype and int(ids2.min()) >= 3 and int(ids2.max()) <= 9 and kw["flag"] is True
    for y in (x2, x3):  # containers walked
        assert abs(float(y.mean()) - 2) < 1.0 and 3 < float(y.std()) < 7 and not torch.equal(y, x)
    assert mask2 is mask  # boolean masks as they are
    assert torch.isfinite(kw["one"]).all()  # one element: no spread to scale by, yet finite values
    channels_last = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    (cl,), _ = like_example((channels_last,), {}, gen)
    assert cl.stride() == channels_last.stride()


def test_float64_reference_inputs_are_copies_with_containers_walked():
    x, cos, ids, already = torch.randn(3), torch.randn(3), torch.arange(3), torch.randn(3, dtype=torch.float64)
    (x64, (cos64, ids64)), kw = to_float64(((x, (cos, ids)), {"k": already}))
    assert x64.dtype == cos64.dtype == kw["k"].dtype == torch.float64 and ids64 is ids
    assert kw["k"] is not already and torch.equal(kw["k"], already)  # a float64 input is copied too


@pytest.mark.slow
def test_a_model_no_call_can_replace_is_compiled_whole_proven_and_installed_where_faster():
    model, ids = Toy().eval(), torch.randint(0, 50, (4, 64))
    with torch.inference_mode():
        ref = model(ids)
    whole, why = prove_whole_model(model, (ids,), {}, torch.device("cpu"))
    assert whole is not None, why
    report = OptimizeReport("cpu", "test", [ModuleReport("Toy", "tests.Toy", "int64[4,64]", "eager", "no op")])
    result = prove_end_to_end(model, (ids,), {}, report, sync=lambda: None, budget_s=0.5, whole=whole)
    assert result is not None and result.whole_speedup is not None
    if dispatcher_of(model) is not None:  # installed: faster than eager beyond the noise
        assert result.whole_speedup > 1.0 and WHOLE in result.decision and report.modules[0].status == "compile"
    with torch.inference_mode():
        got = model(ids)
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-5)
    other = torch.randint(0, 50, (2, 8))  # another call signature: the model's own forward
    with torch.inference_mode():
        torch.testing.assert_close(model(other).logits, Toy.forward(model, other).logits)


@pytest.mark.slow
def test_a_whole_model_compile_that_changes_the_answer_is_not_used(monkeypatch):
    model, ids = Toy().eval(), torch.randint(0, 50, (2, 16))
    import metal_accel.whole_model as wm
    real = wm.CompiledOp.__call__

    def drifting(self, args, kwargs, state):
        out = real(self, args, kwargs, state)
        out.cache.keys[0] = out.cache.keys[0] + 1e-2  # a wrong tensor deep inside the output
        return out
    monkeypatch.setattr(wm.CompiledOp, "__call__", drifting)
    whole, why = prove_whole_model(model, (ids,), {}, torch.device("cpu"))
    assert whole is None and "incorrect on example inputs" in why, why


def test_optimize_does_not_try_the_whole_model_when_compile_is_off():
    model, ids = Toy().eval(), torch.randint(0, 50, (2, 16))
    metal_accel.optimize(model, (ids,), compile=False, progress=False)
    report = metal_accel.explain(model)
    assert report.end_to_end is None and not any(WHOLE in n for n in report.notes)


@pytest.mark.parametrize("on", [False, True])
def test_the_whole_model_with_kernels_inside_is_tried_only_when_asked(monkeypatch, on):
    """Off by default (it never won in the zoo and costs a second whole-model compile); kernels_in_whole=True."""
    import metal_accel.api as api
    tried: list[bool] = []

    def fake_prove(model, args, kwargs, device, with_kernels=False):
        tried.append(with_kernels)
        return object(), ""
    monkeypatch.setattr(api, "prove_whole_model", fake_prove)
    monkeypatch.setattr(api, "_whole_not_tried", lambda model, report: True)
    monkeypatch.setattr(api, "_kernels_below", lambda model, report: True)
    monkeypatch.setattr(api, "prove_end_to_end", lambda *a, **k: None)
    model = nn.Sequential(nn.Linear(8, 8)).eval()
    metal_accel.optimize(model, (torch.randn(2, 8),), compile=True, kernels_in_whole=on, progress=False)
    assert tried == ([False, True] if on else [False])
    stages = metal_accel.explain(model).stage_s
    assert (f"{WHOLE} with our kernels inside" in stages) == on, stages

