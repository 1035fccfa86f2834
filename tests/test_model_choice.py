"""The model-level proof of speed (model_choice.py): the optimized model timed whole against eager."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from torch import nn

from metal_accel.core.specs import call_signature
from metal_accel.model_choice import DROPPED, MIN_NOISE, prove_end_to_end, time_contenders
from metal_accel.proof.rotation import predecessor_pairs
from metal_accel.report import COVERED, ModuleReport, OptimizeReport
from metal_accel.runtime.dispatch import dispatcher_of, install


class Cheap(nn.Module):
    """One add: eager is already one op, so an op doing much more work only loses."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class Costly(nn.Module):
    """Many small ops whose sum one op computes in a single step."""

    def __init__(self, n: int = 300) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = x + 1e-3
        return x


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = Cheap()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cheap = Inner()
        self.costly = Costly()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.costly(self.cheap(x))


class FakeOp:
    """An installed choice: called as the dispatcher calls ops, `op(args, kwargs, state)`."""

    def __init__(self, name: str, fn) -> None:
        self.name, self.fn = name, fn

    def __call__(self, args: tuple, kwargs: dict, state: list) -> torch.Tensor:
        return self.fn(args[0])


def slow_add(x: torch.Tensor) -> torch.Tensor:
    """Eager's one add, done after 4000 more: far slower than any noise of a busy machine."""
    y = x
    for _ in range(4000):
        y = y + 0.0
    return y + 1


def report_for(*entries: tuple[str, str, str]) -> OptimizeReport:
    rep = OptimizeReport("cpu", "test")
    rep.modules = [ModuleReport(name, f"tests.{cls}", "float32[64]", status, "proven alone")
                   for name, cls, status in entries]
    return rep


def test_contenders_run_in_blocks_each_right_after_each_other_equally_often():
    calls: list[str] = []
    names = ["eager", "eager_again", "optimized", "whole"]
    contenders = {n: (lambda n=n: calls.append(n)) for n in names}
    syncs: list[int] = []
    samples, block = time_contenders(contenders, lambda: syncs.append(len(calls)), budget_s=0.0, min_rounds=6)
    timed = calls[2 * len(names):]  # after the warm-up and the calibration call of each
    blocks = timed[::block]
    assert all(timed[i:i + block] == [b] * block for i, b in zip(range(0, len(timed), block), blocks))
    follows = predecessor_pairs(blocks)
    assert set(follows) == set(itertools.permutations(names, 2))
    assert max(follows.values()) - min(follows.values()) <= 1, follows
    assert {len(v) for v in samples.values()} == {6}  # 2 rounds of 4 * 3 blocks, 3 of each per round
    assert Counter(blocks) == {n: 6 for n in names}
    assert len(syncs) >= 2 * len(blocks) and syncs[-1] == len(calls)  # a sync opens and closes every block


def test_a_choice_that_slows_the_whole_model_is_dropped_and_the_report_says_so():
    model, x = Pair().eval(), torch.randn(64)
    install(model.cheap.act, call_signature((x,), {}), FakeOp("slow", slow_add))
    report = report_for(("cheap.act", "Cheap", "kernel"))
    result = prove_end_to_end(model, (x,), {}, report, sync=lambda: None, budget_s=0.5)
    assert result is not None and result.speedup < 1.0, result
    assert dispatcher_of(model.cheap.act) is None
    assert report.modules[0].status == "eager" and report.modules[0].reason == DROPPED
    assert result.final_speedup == 1.0 and result.decision
    assert torch.equal(model(x), Pair.forward(model, x))


def test_a_faster_model_keeps_its_choices():
    model, x = Pair().eval(), torch.randn(64)
    install(model.costly, call_signature((x,), {}), FakeOp("fused", lambda t: t + 0.3))
    report = report_for(("costly", "Costly", "kernel"))
    result = prove_end_to_end(model, (x,), {}, report, sync=lambda: None, budget_s=0.5)
    assert result is not None and result.speedup > 1.0 and not result.dropped, result
    assert dispatcher_of(model.costly) is not None and report.modules[0].status == "kernel"
    assert "end to end" in result.describe()


def test_only_the_group_that_slows_the_model_goes():
    model, x = Pair().eval(), torch.randn(64)
    model.costly.n = 3000  # its saving (3000 ops) and the slow op's loss (4000) both far beyond a busy machine's noise
    install(model.costly, call_signature((x,), {}), FakeOp("fused", lambda t: t + 3.0))
    install(model.cheap.act, call_signature((x,), {}), FakeOp("slow", slow_add))
    report = report_for(("costly", "Costly", "kernel"), ("cheap.act", "Cheap", "compile"))
    result = prove_end_to_end(model, (x,), {}, report, sync=lambda: None, budget_s=0.5)
    assert result is not None
    # the stage acts only on a loss beyond eager-against-itself (at least MIN_NOISE): when the fused op's saving
    # outweighed the slow one's loss, or a busy machine's noise hid the difference, nothing is dropped
    if math.log(result.speedup) >= -max(math.log1p(result.self_noise), math.log1p(MIN_NOISE)):
        assert not result.dropped, result
        return
    assert result.dropped == ["Cheap: compile"], result
    assert dispatcher_of(model.cheap.act) is None and dispatcher_of(model.costly) is not None
    assert [m.status for m in report.modules] == ["kernel", "eager"]


def test_calls_covered_by_a_dropped_choice_say_they_were_never_decided_alone():
    model, x = Pair().eval(), torch.randn(64)
    install(model.cheap, call_signature((x,), {}), FakeOp("slow", slow_add))
    report = report_for(("cheap", "Inner", "compile"), ("cheap.act", "Cheap", "eager"))
    report.modules[1].reason = COVERED
    prove_end_to_end(model, (x,), {}, report, sync=lambda: None, budget_s=0.5)
    assert report.modules[0].reason == DROPPED
    assert "dropped end to end" in report.modules[1].reason


def test_nothing_installed_means_no_end_to_end_run():
    model, x = Pair().eval(), torch.randn(64)
    assert prove_end_to_end(model, (x,), {}, report_for(), sync=lambda: None, budget_s=0.5) is None


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_optimize_reports_the_end_to_end_figures_first(tmp_path):
    import metal_accel
    from toymodels import GOOD, Net
    if not metal_accel.get_backend("cpu").is_available():
        pytest.skip("no C++ compiler")
    folder = tmp_path / "cands" / "cpu" / "Chain"
    folder.mkdir(parents=True)
    (folder / "good.py").write_text(GOOD)
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[f"dir:{tmp_path / 'cands'}"])
    report = metal_accel.explain(model)
    assert report.end_to_end is not None and report.end_to_end["rounds"] >= 6, report.end_to_end
    assert report.table().startswith("end to end on the example inputs: ")
    assert report.to_dict()["end_to_end"] == report.end_to_end
    metal_accel.restore(model)
    metal_accel.optimize(model, (x,), providers=[f"dir:{tmp_path / 'cands'}"], end_to_end=False)
    assert metal_accel.explain(model).end_to_end is None


def _busy_machine(monkeypatch, optimized_factor: float) -> list[int]:
    """time_contenders as on a machine so busy that eager strays ±100% against itself, every time it is timed."""
    import metal_accel.model_choice as mc
    calls: list[int] = []

    def fake(contenders, sync, budget_s, min_rounds=mc.MIN_ROUNDS):
        calls.append(min_rounds)
        for fn in contenders.values():
            fn()  # the dispatchers count their hits as in a real rotation
        n = max(min_rounds, 8)
        eager = [1e-3 * (1 + (i % 2)) for i in range(n)]
        samples = {name: [t * optimized_factor for t in eager] for name in contenders}
        samples["eager"], samples["eager_again"] = eager, [1e-3 * (2 - (i % 2)) for i in range(n)]
        return samples, 1
    monkeypatch.setattr(mc, "time_contenders", fake)
    return calls


def test_a_busy_machine_makes_the_verdict_inconclusive_and_it_is_not_remembered(monkeypatch):
    calls = _busy_machine(monkeypatch, optimized_factor=1.6)  # reads 0.62x: inside ±100% of noise
    model, x = Pair().eval(), torch.randn(64)
    install(model.costly, call_signature((x,), {}), FakeOp("fused", lambda t: t + 0.3))
    report = report_for(("costly", "Costly", "kernel"))
    result = prove_end_to_end(model, (x,), {}, report, sync=lambda: None, budget_s=0.5)
    assert result is not None and len(calls) == 2, calls  # timed again, longer, before deciding
    assert result.inconclusive and not result.remembered, result
    assert result.self_noise > 0.25 and not result.dropped  # nothing acted on inside the noise
    assert "inconclusive" in result.describe()
    report.end_to_end = result.to_dict()
    assert "not remembered" in report.table()


def test_a_quiet_machine_gives_a_verdict_that_is_remembered():
    model, x = Pair().eval(), torch.randn(64)
    install(model.costly, call_signature((x,), {}), FakeOp("fused", lambda t: t + 0.3))
    result = prove_end_to_end(model, (x,), {}, report_for(("costly", "Costly", "kernel")), sync=lambda: None,
                              budget_s=0.5)
    assert result is not None
    assert result.remembered == (result.self_noise <= 0.25)
