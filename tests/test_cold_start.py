"""Cold optimize() time: the proof worker starts while torch.compile's candidates are proven, and a CUDA-graph
candidate is neither compiled again nor proven where torch.compile's own code was rejected."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

import metal_accel
from metal_accel.backends import get_backend
from metal_accel.candidates import compile as compile_mod
from metal_accel.candidates.compile import compile_candidate, graph_variant_futile
from metal_accel.core.provider import Evaluation
from metal_accel.core.verdict import Verdict
from metal_accel.pipeline import Pipeline
from metal_accel.proof import worker as worker_mod

from test_optimize import candidates
from toymodels import GOOD, Net

ENV = get_backend("cpu").environment()


def verdict(accepted: bool, reason: str) -> Verdict:
    return Verdict(ENV, accepted, reason, "d")


def test_a_graph_replay_is_futile_only_where_the_compiled_code_itself_was_rejected():
    for reason in ("incorrect: trial 7 (structured inputs): output 0: 4 of 4194304 elements outside tolerance",
                   "torch.compile graph break: the forward compiled into 2 graphs, not one",
                   "torch.compile failed: RuntimeError: boom",
                   "torch.compile's first call ran past 300 s (compile_timeout_s); given up, eager stays"):
        why = graph_variant_futile(verdict(False, reason))
        assert why.startswith("not tried: torch.compile's code") and reason[:40] in why
    for ok in (verdict(False, "not faster: 1.01x eager (needs >= 1.05x)"), verdict(True, "1.4x eager"),
               verdict(False, "failed while timed: RuntimeError: x")):
        assert graph_variant_futile(ok) == ""  # a faster launch may still win; a timing failure may be the launch's


class FakeCuda:
    """Enough of a CUDA backend for the pipeline to list both built-in candidates; nothing runs on it."""
    name, device_type, language = "cuda", "cuda", "cuda"

    def environment(self):
        return ENV


def collect_with(first_reason: str) -> tuple[list[str], list[Evaluation]]:
    plan = Pipeline(FakeCuda(), try_compile=True)  # type: ignore[arg-type]
    proven: list[str] = []

    def evaluate(call, key, cand):
        proven.append(cand.kind)
        return Evaluation(cand, Verdict(ENV, False, first_reason, cand.digest))
    plan.evaluate = evaluate  # type: ignore[method-assign]
    call = SimpleNamespace(compile_only="", module=torch.nn.Identity(), args=(), kwargs={})
    request = SimpleNamespace(compile_us=None, eager_us=0.0, eager_benchmarked=False, compiled_code="")
    rep = SimpleNamespace(rejected=[])
    return proven, plan._collect(call, "k" * 32, request, rep, set())  # type: ignore[arg-type]


def test_the_pipeline_records_the_futile_graph_candidate_as_rejected_without_proving_it():
    proven, evs = collect_with("incorrect: 4 of 4194304 elements outside tolerance")
    assert proven == ["inductor"]
    graph = evs[1]
    assert graph.candidate.digest == compile_candidate(FakeCuda(), "cuda-graph").digest  # type: ignore[arg-type]
    assert not graph.verdict.accepted and graph.verdict.reason.startswith("not tried")
    assert graph.verdict.candidate_digest == graph.candidate.digest  # cached as rejected: no later run proves it
    proven, evs = collect_with("not faster: 1.01x eager (needs >= 1.05x)")
    assert proven == ["inductor", "cuda-graph"]  # a replay may still beat eager where the plain launch did not


def test_the_graph_candidate_takes_the_compiled_code_of_the_same_module_and_key_once():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    memo = compile_mod._LastCompiled()
    op = object()
    memo.put(a, "key1", op)  # type: ignore[arg-type]
    assert memo.get(b, "key1") is None  # another module: compiled anew (and the entry is spent)
    memo.put(a, "key1", op)  # type: ignore[arg-type]
    assert memo.get(a, "key2") is None
    memo.put(a, "key1", op)  # type: ignore[arg-type]
    assert memo.get(a, "key1") is op and memo.get(a, "key1") is None


@pytest.mark.needs_cxx
def test_prestart_starts_the_worker_in_the_background_and_the_first_request_uses_it(monkeypatch):
    starts: list[str] = []
    real = worker_mod.Worker._start

    def spy(self, backend, device, timeout):
        if self._proc is None or self._proc.poll() is not None:
            starts.append(threading.current_thread().name)
        return real(self, backend, device, timeout)
    monkeypatch.setattr(worker_mod.Worker, "_start", spy)
    w = worker_mod.Worker()
    try:
        thread = w.prestart("cpu", "cpu")
        assert thread is not None
        thread.join(worker_mod.START_TIMEOUT_S)
        assert starts == ["metal_accel-worker-start"] and w._proc is not None and w._proc.poll() is None
        assert w.prestart("cpu", "cpu") is None  # one runs for them already
        pid = w.pid
        reply = w.request({"backend": "cpu", "device": "cpu", "code": "", "source": "", "static": {},
                           "slots": [], "state": [], "trials": []})
        assert "ok" in reply and w.pid == pid and starts == ["metal_accel-worker-start"]  # no second start
    finally:
        w.close()


@pytest.mark.needs_cxx
def test_optimize_prestarts_the_worker_only_for_calls_with_a_candidate_to_prove(tmp_path, monkeypatch):
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(worker_mod.Worker, "prestart", lambda self, b, d: asked.append((b, d)))
    model, x = Net().eval(), torch.randn(4, 256)
    with torch.inference_mode():
        ref = model(x)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)], progress=False)
    status = {m.name: m.status for m in metal_accel.explain(model).modules}
    assert status["chain"] == "kernel"  # the request that found no started worker started it itself
    assert asked == [("cpu", "cpu")]  # the Chain's candidate; the Linear has none (and no LLM is asked)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref, rtol=1e-4, atol=1e-4)  # the proof's float32 tolerance


def test_the_build_directory_exists_before_a_worker_confines_itself(monkeypatch, tmp_path):
    """The worker is granted the build directory (read-only) when it confines itself, and nothing is granted for a
    path not there yet: a worker started before the first build (prestart, on a GPU whose worker builds nothing
    itself) then could not load any kernel ("Permission denied"), every proof failed."""
    from metal_accel.core import config
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "fresh-cache"))
    seen: list[bool] = []

    def popen(*args, **kwargs):
        seen.append(config.build_dir().is_dir())
        raise OSError("not started in this test")
    monkeypatch.setattr(worker_mod.subprocess, "Popen", popen)
    w = worker_mod.Worker()
    with pytest.raises(OSError):
        w._start("cuda", "cuda:0", 1.0)
    assert seen == [True]
    w.close()
