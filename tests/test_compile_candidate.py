"""torch.compile as a built-in candidate: chosen where it wins, eager where it does not, failures explained."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.candidates.compile import compiled_graphs
from metal_accel.store import cache as cache_mod
from metal_accel.core.keys import class_path
from metal_accel.report import COVERED

from test_optimize import candidates
from toymodels import GOOD, Chain

pytestmark = [pytest.mark.needs_cxx, pytest.mark.slow]


class Branchy(nn.Module):
    """Data-dependent control flow: no single graph exists, so fullgraph compile must fail."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1


class LongChain(nn.Module):
    """48 cheap elementwise ops: eager pays 48 dispatches and memory passes, inductor one fused loop."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(24):
            x = x * 0.999 + 0.001
        return x


class Trio(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.chain = LongChain()
        self.lin = nn.Linear(1024, 1024)
        self.branchy = Branchy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branchy(self.lin(self.chain(x)))


def report_of(model: nn.Module) -> dict[str, metal_accel.ModuleReport]:
    return {m.name: m for m in metal_accel.explain(model).modules}


@pytest.fixture
def compile_on(monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "1")


def test_per_module_winner_and_reasons(compile_on):
    model, x = Trio().eval(), torch.randn(64, 1024)
    with torch.inference_mode():
        ref = model(x)
    metal_accel.optimize(model, (x,), progress=False)
    rep = report_of(model)
    # four dozen elementwise ops: inductor fuses them into one loop and wins by several times
    assert rep["chain"].status == "compile", rep["chain"]
    assert rep["chain"].compile_us < rep["chain"].eager_us and rep["chain"].source == "builtin:torch.compile"
    # one matmul: compile would make the same library call eager already makes, so it is not even tried
    assert rep["lin"].status == "eager" and rep["lin"].compile_us is None
    assert "one library call (aten.linear)" in rep["lin"].reason, rep["lin"]
    # data-dependent branch: fullgraph compile fails, the reason says so
    assert rep["branchy"].status == "eager" and "graph break" in rep["branchy"].reason
    graphs = compiled_graphs()
    with torch.inference_mode():
        for _ in range(5):
            model(x)
    assert compiled_graphs() == graphs  # the installed compile runs its proven graph: no recompiles
    eager_twin = Trio().eval()
    eager_twin.load_state_dict(model.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref)
        x2 = torch.randn(64, 1024)
        torch.testing.assert_close(model(x2), eager_twin(x2))
    # the user's own torch.compile of the optimized model traces the eager code of compiled modules
    with torch.inference_mode():
        torch.testing.assert_close(torch.compile(model)(x2), eager_twin(x2))
    # the verdicts are cached like any kernel's: a second optimize() compiles nothing new to decide
    cached = [e for e in cache_mod.user_cache().entries("cpu") if e.candidate is not None]
    assert any(e.candidate.kind == "inductor" for e in cached)
    model2 = Trio().eval()
    metal_accel.optimize(model2, (x,), progress=False)
    rep2 = report_of(model2)
    assert rep2["chain"].status == "compile" and rep2["chain"].source == "cache:user"


def test_llm_kernel_beats_compile_when_faster(compile_on, tmp_path):
    # the supplied fused kernel (one pass, vectorized) against inductor's: whichever is faster wins,
    # and both times are reported side by side
    model, x = Chain(256).eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)], progress=False)
    rep = metal_accel.explain(model).modules[0]
    assert rep.status in ("kernel", "compile")
    assert rep.compile_us is not None and rep.kernel_us is not None and rep.eager_us is not None
    # the winner is the larger speedup over eager, each timed against eager in its own interleaved pairs (the
    # absolute times of two gates drift apart on a busy machine); a loser that passed is listed with its own
    assert rep.speedup is not None
    for line in rep.outpaced:
        assert rep.speedup >= float(re.search(r"(\d+(?:\.\d+)?)x eager", line).group(1)) - 0.005, line


def test_compile_off_by_environment(monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "0")
    model = Trio().eval()
    metal_accel.optimize(model, (torch.randn(64, 1024),), progress=False)
    assert all(m.compile_us is None and m.status == "eager" for m in metal_accel.explain(model).modules)


class _Recorder:
    """An interactive provider that proposes nothing and keeps the request it was given."""

    name = "recorder"

    def __init__(self) -> None:
        self.requests = []

    def synthesize(self, request, evaluate):
        self.requests.append(request)
        return []


def test_llm_request_carries_compile_time_and_generated_code(compile_on):
    recorder = _Recorder()
    model = Chain(1024).eval()
    metal_accel.optimize(model, (torch.randn(64, 1024),), providers=[recorder], progress=False)
    (req,) = recorder.requests
    assert req.compile_us is not None and req.compile_us > 0
    assert "def " in req.compiled_code or "void" in req.compiled_code  # inductor's output for this call


def test_many_compiled_modules_do_not_share_one_recompile_budget():
    # Dynamo limits recompiles per code object (8); each installed compile must have its own frame,
    # or the ninth module of a process would fail to compile (fullgraph) for no reason of its own.
    from torch._dynamo.utils import counters

    from metal_accel.candidates.compile import CompiledOp
    before = counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        for i in range(12):
            module = nn.Linear(8, 8 + i) if i % 2 else nn.Sequential(*[nn.ReLU() for _ in range(1 + i % 3)])
            x = torch.randn(4, 8)
            torch.testing.assert_close(CompiledOp(module, f"compile_t{i}")((x,), {}, []), module(x))
    assert counters["stats"]["unique_graphs"] - before == 12


class Deep(nn.Module):
    """A whole network by the LLM limit (18 modules): no prompt for it, but torch.compile may win."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = nn.ModuleList(LongChain() for _ in range(17))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step(x)
        return x


def test_composite_beyond_llm_limit_gets_compile_but_no_prompt(compile_on):
    recorder = _Recorder()
    model, x = Deep().eval(), torch.randn(64, 1024)
    with torch.inference_mode():
        ref = model(x)
    metal_accel.optimize(model, (x,), providers=[recorder], progress=False)
    rep = report_of(model)
    assert rep["Deep"].status == "compile", rep["Deep"]
    assert any("LLM providers not asked: composite of 18 modules" in r for r in rep["Deep"].rejected)
    assert all(r.module_class != class_path(Deep) for r in recorder.requests)  # nothing asked for the whole
    assert all(rep[f"steps.{i}"].reason == COVERED for i in range(17))
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref)


def test_composite_beyond_llm_limit_stays_eager_without_compile(monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "0")
    model = Deep().eval()
    metal_accel.optimize(model, (torch.randn(8, 64),), progress=False)
    rep = report_of(model)
    assert rep["Deep"].status == "eager" and "composite of 18 modules" in rep["Deep"].reason


def test_cuda_graph_candidate_only_on_cuda_and_checked_from_the_cache():
    from metal_accel.backends import get_backend
    from metal_accel.candidates.compile import builtin_kinds, compile_candidate
    from metal_accel.core.candidate import check_builtin
    from metal_accel.core.candidate import Candidate
    from metal_accel.core.errors import CacheError

    cpu = get_backend("cpu")
    assert builtin_kinds(cpu) == ["inductor"]  # no CUDA graph where there is no CUDA

    class FakeCuda:
        name, device_type = "cuda", "cuda"

    assert builtin_kinds(FakeCuda()) == ["inductor", "cuda-graph"]
    graph = compile_candidate(FakeCuda(), "cuda-graph")
    check_builtin(graph)
    assert graph.digest != compile_candidate(FakeCuda()).digest and graph.origin == "builtin:cuda-graph"
    with pytest.raises(CacheError):  # a cached entry claiming to be built-in must carry exactly our code
        check_builtin(Candidate(code="import os", source="", backend="cuda", kind="cuda-graph"))
