"""Model-level verdicts (store/model_verdicts.py): a warm optimize() does what the end-to-end stage decided."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from metal_accel.core.specs import call_signature
from metal_accel.core.verdict import Environment
from metal_accel.model_choice import DROPPED, apply_verdict
from metal_accel.report import ModuleReport, OptimizeReport
from metal_accel.runtime.dispatch import dispatcher_of, install
from metal_accel.store import model_verdicts as mv

ENV = Environment("cpu", "test CPU", "Linux", "2.13")


class Leaf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Leaf(), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class Op:
    def __init__(self, fn) -> None:
        self.name, self.fn = "op", fn

    def __call__(self, args: tuple, kwargs: dict, state: list) -> torch.Tensor:
        return self.fn(*args)


def _key(model: nn.Module, x: torch.Tensor, choices=(("a", "kernel", "k1"),)) -> str:
    key = mv.model_key(model, (x,), {}, "cpu", list(choices))
    assert key is not None
    return key


def test_a_stored_verdict_comes_back_only_for_its_environment_and_untouched():
    model, x = Two(), torch.randn(2, 8)
    key = _key(model, x)
    mv.put("cpu", key, ENV, mv.ModelVerdict("modules", ["Leaf: kernel"], {"speedup": 1.3}))
    got = mv.get("cpu", key, ENV)
    assert got is not None and got.outcome == "modules" and got.dropped == ["Leaf: kernel"]
    assert got.end_to_end == {"speedup": 1.3}
    assert mv.get("cpu", key, Environment("cpu", "other CPU", "Linux", "2.13")) is None
    path = next((mv.config.current().user_cache / mv.DIR_NAME / "cpu").glob("*.json"))
    doc = json.loads(path.read_text())
    doc["verdicts"][ENV.id]["content"]["outcome"] = "whole"  # an edited verdict is a claim, not proof
    path.write_text(json.dumps(doc))
    assert mv.get("cpu", key, ENV) is None


def test_a_verdict_sealed_by_another_user_is_ignored(tmp_path, monkeypatch):
    model, x = Two(), torch.randn(2, 8)
    key = _key(model, x)
    mv.put("cpu", key, ENV, mv.ModelVerdict("eager"))
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "someone-else"))  # another verdict key
    assert mv.get("cpu", key, ENV) is None


def test_the_key_follows_the_model_the_call_the_choices_and_the_settings():
    model, x = Two(), torch.randn(2, 8)
    base = _key(model, x)
    assert base == _key(Two(), torch.randn(2, 8))  # same architecture and shapes: weights do not matter
    assert base != _key(model, torch.randn(3, 8))
    assert base != _key(model, x, (("a", "compile", "k1"),))
    other = Two()
    other.b = nn.Linear(8, 8, bias=False)
    assert base != _key(other, x)
    from metal_accel.core import config
    with config.using(config.current().with_(precision="compile")):
        assert base != _key(model, x)


def _report(*rows: tuple[str, str, str]) -> OptimizeReport:
    rep = OptimizeReport("cpu", "test")
    rep.modules = [ModuleReport(name, f"tests.{cls}", "float32[2,8]", status, "proven alone")
                   for name, cls, status in rows]
    return rep


def test_applying_a_verdict_drops_what_was_dropped_and_installs_the_whole_model():
    model, x = Two().eval(), torch.randn(2, 8)
    sig = call_signature((x,), {})
    install(model.a, sig, Op(lambda t: t * 2))
    install(model.b, sig, Op(lambda t: nn.functional.linear(t, model.b.weight, model.b.bias)))
    report = _report(("a", "Leaf", "kernel"), ("b", "Linear", "compile"))
    e2e = apply_verdict(model, (x,), {}, report, "modules", ["Leaf: kernel"], {"speedup": 0.9, "final_speedup": 1.1},
                        whole=lambda: pytest.fail("the whole model is not compiled for a 'modules' verdict"))
    assert e2e.cached and e2e.outcome == "modules" and e2e.final_speedup == 1.1 and "not timed again" in e2e.decision
    assert dispatcher_of(model.a) is None and dispatcher_of(model.b) is not None
    assert report.modules[0].reason == DROPPED and report.modules[1].status == "compile"

    report = _report(("Two", "Two", "eager"), ("b", "Linear", "compile"))
    calls = []
    apply_verdict(model, (x,), {}, report, "whole", [], {"whole_speedup": 2.0},
                  whole=lambda: Op(lambda t: calls.append(t) or Two.forward(model, t)))
    with torch.inference_mode():
        model(x)
    assert calls and report.modules[0].status == "compile" and report.modules[0].speedup == 2.0

    report = _report(("b", "Linear", "compile"))
    apply_verdict(model, (x,), {}, report, "eager", [], {}, whole=lambda: None)
    assert dispatcher_of(model.b) is None and report.modules[0].status == "eager"


def chain_provider(tmp_path) -> list[str]:
    """A dir: provider with the toy Chain's good kernel."""
    import metal_accel
    from toymodels import GOOD
    if not metal_accel.get_backend("cpu").is_available():
        pytest.skip("no C++ compiler")
    folder = tmp_path / "cands" / "cpu" / "Chain"
    folder.mkdir(parents=True)
    (folder / "good.py").write_text(GOOD)
    return [f"dir:{tmp_path / 'cands'}"]


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_a_second_optimize_of_the_same_model_reuses_the_end_to_end_verdict(tmp_path):
    import metal_accel
    from toymodels import Net
    provider = chain_provider(tmp_path)
    first, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(first, (x,), providers=provider, compile=False, progress=False)
    made = metal_accel.explain(first).end_to_end
    assert made is not None and not made["cached"] and made["rounds"] >= 6
    second = Net().eval()
    second.load_state_dict(first.state_dict())
    metal_accel.optimize(second, (x,), providers=provider, compile=False, progress=False)
    again = metal_accel.explain(second).end_to_end
    if made["inconclusive"]:  # a busy machine: the first verdict was not remembered, so it was timed again
        assert again is not None and not again["cached"], again
        return
    assert again is not None and again["cached"] and again["outcome"] == made["outcome"], again
    assert again["final_speedup"] == made["final_speedup"]
    assert (dispatcher_of(second.chain) is None) == (dispatcher_of(first.chain) is None)
    with torch.inference_mode():
        torch.testing.assert_close(second(x), Net.forward(second, x))


@pytest.mark.needs_cxx
def test_an_inconclusive_verdict_is_not_stored(tmp_path, monkeypatch):
    import metal_accel
    import metal_accel.model_choice as mc
    from toymodels import Net
    provider = chain_provider(tmp_path)
    real = mc.time_contenders

    def busy(contenders, sync, budget_s, min_rounds=mc.MIN_ROUNDS):  # eager strays ±100% against itself
        samples, block = real(contenders, sync, 0.0, min_rounds)
        n = len(samples["eager"])
        samples["eager_again"] = [t * (4.0 if i % 2 else 0.25) for i, t in enumerate(samples["eager"][:n])]
        return samples, block
    monkeypatch.setattr(mc, "time_contenders", busy)
    stored: list[object] = []
    monkeypatch.setattr(mv, "put", lambda *a, **k: stored.append(a))
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=provider, compile=False, progress=False)
    made = metal_accel.explain(model).end_to_end
    assert made is not None and made["inconclusive"] and not stored, made
