"""optimize(workload=...): the workload's own calls (decode steps) are decided only when the model compiled
whole does not take every call of the workload; where it does, their proofs are never paid for."""
from __future__ import annotations

import torch
from torch import nn

import metal_accel
import metal_accel.api as api
import metal_accel.pipeline as pipeline
from metal_accel.model_choice import prove_end_to_end
from metal_accel.report import OptimizeReport
from metal_accel.runtime.dispatch import dispatcher_of
from test_workload import Whole, _slow_decoder, decode, slow


def _waste(twin: nn.Module):
    """Answers as TWIN, after wasting more time than the slow eager MLP does."""
    def call(x, past=None):
        slow(x, nn.Identity())
        slow(x, nn.Identity())
        return twin(x, past)
    return call


def test_decisions_for_the_workload_wait_until_the_whole_model_loses_there():
    model, twin = _slow_decoder()
    decided = []
    report = OptimizeReport("cpu", "test")
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5,
                              whole=Whole(twin), workload=decode, fresh_whole=lambda: Whole(twin),
                              decide_later=lambda: decided.append(1))
    assert result is not None and result.workload["outcome"] == "everywhere", result
    assert not decided  # the model compiled whole takes every call: nothing else to decide

    model, twin = _slow_decoder()
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, report, sync=lambda: None, budget_s=0.5,
                              whole=Whole(twin), workload=decode, fresh_whole=lambda: Whole(_waste(twin)),
                              decide_later=lambda: decided.append(1))
    assert result is not None and result.workload.get("outcome") != "everywhere", result
    assert decided == [1] and "not used for the workload" in result.workload["decision"], result
    disp = dispatcher_of(model)
    assert disp is None or disp.fallback is None


def test_decisions_for_the_workload_are_made_when_the_whole_model_is_wrong_there():
    model, twin = _slow_decoder()
    wrong = Whole(lambda x, past=None: (twin(x, past)[0] + (x.shape[1] == 1), twin(x, past)[1]))
    decided = []
    result = prove_end_to_end(model, (torch.randn(2, 6, 8),), {}, OptimizeReport("cpu", "test"), sync=lambda: None,
                              budget_s=0.5, whole=Whole(twin), workload=decode, fresh_whole=lambda: wrong,
                              decide_later=lambda: decided.append(1))
    assert decided == [1] and "incorrect on the workload" in result.workload["decision"], result


def _optimize_with_whole(monkeypatch, every) -> tuple[nn.Module, list[str]]:
    """optimize() of the slow decoder with torch.compile stood in for: no per-module compile candidates, the
    model compiled whole answered by TWIN (the example's call) and EVERY (the workload's)."""
    model, twin = _slow_decoder()
    processed: list[str] = []
    real = pipeline.Pipeline.process

    def process(self, call):
        processed.append(f"{call.name}{' (workload)' if call.from_workload else ''}")
        return real(self, call)
    monkeypatch.setattr(pipeline.Pipeline, "process", process)
    monkeypatch.setattr(pipeline, "builtin_kinds", lambda backend: [])
    monkeypatch.setattr(api, "prove_whole_model", lambda *a, **k: (Whole(twin), ""))
    monkeypatch.setattr(api, "whole_model_op", lambda *a, **k: Whole(every(twin)))
    metal_accel.optimize(model, torch.randn(2, 6, 8), workload=decode, compile=True, end_to_end=True,
                         bench_budget_s=0.25)
    return model, processed


def test_optimize_leaves_the_decode_steps_to_the_whole_model_that_takes_them(monkeypatch):
    model, processed = _optimize_with_whole(monkeypatch, lambda twin: twin)
    rep = metal_accel.explain(model)
    assert rep.end_to_end["workload"]["outcome"] == "everywhere", rep.end_to_end
    assert processed and not [p for p in processed if p.endswith("(workload)")], processed
    left = [m for m in rep.modules if m.reason.startswith("not decided alone")]
    assert left and {m.name for m in left} >= {"mlp"}, [(m.name, m.reason) for m in rep.modules]
    assert all("takes every call of the workload" in m.reason for m in left)


def test_optimize_decides_the_decode_steps_when_the_whole_model_is_slower_there(monkeypatch):
    model, processed = _optimize_with_whole(monkeypatch, _waste)
    rep = metal_accel.explain(model)
    assert rep.end_to_end["workload"].get("outcome") != "everywhere", rep.end_to_end
    assert "mlp (workload)" in processed, processed
    assert not [m for m in rep.modules if m.reason.startswith("not decided alone")]
    assert len(rep.modules) == len(processed)


def test_decode_attention_is_not_proven_for_a_model_whose_workload_the_whole_model_takes(monkeypatch, tmp_path):
    """An HF LM with a generate() workload: where the model compiled whole (stood in for) takes every call of
    it, the decode attention kernels are never proven and the model keeps sdpa; where it loses, they are."""
    import pytest
    pytest.importorskip("transformers")
    from test_library_attention import tiny_llama
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    monkeypatch.setattr(pipeline, "builtin_kinds", lambda backend: [])
    proven = []
    real_attach = api.hf_attention.attach
    monkeypatch.setattr(api.hf_attention, "attach", lambda *a, **k: proven.append(1) or real_attach(*a, **k))
    ids = torch.randint(0, 96, (1, 5))

    def generate(m: nn.Module) -> torch.Tensor:
        return m.generate(ids, max_new_tokens=4, do_sample=False)

    for twin_wins in (True, False):
        monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / f"cache-{twin_wins}"))  # no model-level verdict
        model, twin = tiny_llama(), tiny_llama()
        twin.load_state_dict(model.state_dict())
        model.model.layers[0].mlp.act_fn = SlowSiLU()  # eager wastes time where the twin does not
        proven.clear()
        every = (lambda *a, **k: twin(*a, **k)) if twin_wins else _waste_kw(twin)
        monkeypatch.setattr(api, "prove_whole_model", lambda *a, **k: (Whole(twin), ""))
        monkeypatch.setattr(api, "whole_model_op", lambda *a, every=every, **k: Whole(every))
        with torch.no_grad():
            want = generate(model)
        metal_accel.optimize(model, (ids,), workload=generate, compile=True, end_to_end=True, bench_budget_s=0.25)
        rep = metal_accel.explain(model)
        assert (rep.end_to_end["workload"].get("outcome") == "everywhere") == twin_wins, rep.end_to_end
        notes = [n for n in rep.notes if n.startswith("attention:")]
        if twin_wins:
            assert not proven and notes == [f"attention: sdpa kept ({api.WHOLE} takes every call of the workload "
                                            "(decided end to end))"], notes
            assert model.config._attn_implementation == "sdpa"
        else:
            assert proven == [1] and notes and "takes every call" not in notes[0], notes
        with torch.no_grad():
            assert torch.equal(generate(model), want)
        metal_accel.restore(model)


def _waste_kw(twin: nn.Module):
    def call(*args, **kwargs):
        for _ in range(4):
            slow(torch.zeros(1), nn.Identity())
        return twin(*args, **kwargs)
    return call


class SlowSiLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return slow(x, nn.SiLU())


def test_decisions_made_in_two_parts_account_their_time_once():
    """The module decisions' time outside proofs ('keys, caches and matching') stays what the clock says when the
    workload's calls are decided after the example's."""
    from types import SimpleNamespace

    from metal_accel.decisions import MATCHING, decide_calls
    from metal_accel.report import MODULES, ModuleReport

    class Plan:
        stage_s: dict = {}

        def process(self, call):
            self.stage_s["kernels"] = self.stage_s.get("kernels", 0.0) + 0.001
            slow(torch.zeros(1), nn.Identity())
            return ModuleReport(call.name, "x.Y", "?", "eager", "")
    plan, report = Plan(), OptimizeReport("cpu", "test")
    calls = [SimpleNamespace(name=f"m{i}") for i in range(3)]
    decide_calls(plan, report, calls[:2], False, 3)
    decide_calls(plan, report, calls[2:], False, 3)
    assert len(report.modules) == 3
    assert abs(plan.stage_s[MATCHING] + plan.stage_s["kernels"] - report.stage_s[MODULES]) < 1e-9, plan.stage_s


def test_a_model_whose_attention_is_not_switched_gets_its_attention_line_at_once(monkeypatch, tmp_path):
    """Only sdpa models wait for the workload's verdict; another implementation is reported as kept, as before."""
    import pytest
    pytest.importorskip("transformers")
    from test_library_attention import tiny_llama
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    monkeypatch.setattr(pipeline, "builtin_kinds", lambda backend: [])
    model, twin = tiny_llama(), tiny_llama()
    twin.load_state_dict(model.state_dict())
    model.set_attn_implementation("eager")
    monkeypatch.setattr(api, "prove_whole_model", lambda *a, **k: (Whole(twin), ""))
    monkeypatch.setattr(api, "whole_model_op", lambda *a, **k: Whole(twin))
    ids = torch.randint(0, 96, (1, 5))
    metal_accel.optimize(model, (ids,), workload=lambda m: m.generate(ids, max_new_tokens=4, do_sample=False),
                         compile=True, end_to_end=True, bench_budget_s=0.25)
    notes = [n for n in metal_accel.explain(model).notes if n.startswith("attention:")]
    assert notes == ["attention: 'eager' kept (the library's attention kernels are proven against sdpa's computation)"], \
        notes
