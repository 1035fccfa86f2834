"""The whole model compiled as a model-level candidate (whole_model.py, model_choice.py)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.model_choice import WHOLE, prove_end_to_end
from metal_accel.report import ModuleReport, OptimizeReport
from metal_accel.runtime.dispatch import dispatcher_of
from metal_accel.whole_model import output_tensors, prove_whole_model, similar_inputs


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


def test_similar_inputs_keep_token_ids_in_their_range_and_floats_near_their_scale():
    ids = torch.tensor([[3, 9, 7, 5]])
    x = torch.randn(1000) * 5 + 2
    (ids2, x2), kw = similar_inputs((ids, x), {"flag": True})
    assert ids2.dtype == ids.dtype and int(ids2.min()) >= 3 and int(ids2.max()) <= 9 and kw == {"flag": True}
    assert abs(float(x2.mean()) - 2) < 1.0 and 3 < float(x2.std()) < 7 and not torch.equal(x2, x)


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
