"""optimize() end to end on the CPU: install, fall back with reasons, restore, cache across processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import metal_accel
from metal_accel.store import cache as cache_mod

from toymodels import GOOD, NO_COMPILE, RAISES, SANDBOX_ESCAPE, SLOW, UNWRITTEN_TAIL, WRONG, Chain, Net
from limits import HANG_S

# slow: optimize() end to end: each test compiles and proves kernels
pytestmark = [pytest.mark.slow, pytest.mark.needs_cxx]
KERNEL_TOL = {"rtol": 1e-4, "atol": 1e-4}  # validate.TOLERANCES for float32
HERE = Path(__file__).parent


def candidates(tmp_path: Path, cls: str = "Chain", **files: str) -> str:
    folder = tmp_path / "cands" / "cpu" / cls
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return f"dir:{tmp_path / 'cands'}"


def run(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x)


def chain_report(model: torch.nn.Module) -> metal_accel.ModuleReport:
    return next(m for m in metal_accel.explain(model).modules if m.name == "chain")


def test_correct_kernel_is_installed_and_matches_eager(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    ref = run(model, x)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    rep = chain_report(model)
    assert rep.status == "kernel", rep
    assert rep.speedup is not None and rep.speedup >= 1.05
    assert "forward" in model.chain.__dict__
    x2 = torch.randn(4, 256)
    with torch.inference_mode():
        got = model(x2)
    disp = model.chain.__dict__["forward"]
    assert disp.hits >= 1
    # at the pipeline's float32 tolerance: the fused kernel's contracted multiply-adds round differently
    torch.testing.assert_close(got, model.proj(model.chain.__class__.forward(model.chain, x2)), **KERNEL_TOL)
    torch.testing.assert_close(run(model, x), ref, **KERNEL_TOL)


def test_other_shape_runs_eager(tmp_path):
    model = Net().eval()
    metal_accel.optimize(model, (torch.randn(4, 256),), providers=[candidates(tmp_path, good=GOOD)])
    disp = model.chain.__dict__["forward"]
    x = torch.randn(3, 256)
    with torch.inference_mode():
        got = model(x)
    assert disp.misses == 1 and disp.hits == 0
    torch.testing.assert_close(got, metal_accel.restore(model)(x))


@pytest.mark.parametrize("name, text, why", [
    ("wrong", WRONG, "incorrect"),
    ("unwritten", UNWRITTEN_TAIL, "incorrect: trial"),  # the unwritten element keeps a fill eager never gives
    ("slow", SLOW, "not faster"),
    ("nocompile", NO_COMPILE, "compile error"),
    ("raises", RAISES, "candidate raised"),
    ("escape", SANDBOX_ESCAPE, "sandbox"),
])
def test_bad_kernel_falls_back_with_reason(tmp_path, name, text, why):
    model, x = Net().eval(), torch.randn(4, 256)
    ref = run(model, x)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, **{name: text})])
    rep = chain_report(model)
    assert rep.status == "eager"
    assert any(why in r for r in rep.rejected), rep.rejected
    assert why in rep.reason
    assert "forward" not in model.chain.__dict__
    torch.testing.assert_close(run(model, x), ref, rtol=0, atol=0)
    entry = cache_mod.user_cache().get("cpu", rep.key)
    assert entry is not None and entry.candidate is None
    assert why in json.dumps(entry.to_dict())


def test_best_of_several_candidates_wins(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, a_wrong=WRONG, b_good=GOOD, c_slow=SLOW)])
    rep = chain_report(model)
    assert rep.status == "kernel" and rep.source.endswith("b_good.py")
    assert len(rep.rejected) == 2


def test_kernel_failing_at_run_time_falls_back(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    disp = model.chain.__dict__["forward"]
    disp.table = {sig: _Raising() for sig in disp.table}  # the kernel now fails like a lost device
    ref = Net().eval()
    ref.load_state_dict(model.state_dict())
    got = run(model, x)
    torch.testing.assert_close(got, run(ref, x))
    assert disp.table == {} and "device lost" in next(iter(disp.failures.values()))
    assert metal_accel.explain(model).modules  # explain still works
    rep = chain_report(model)
    assert rep.status == "eager" and "failed at run time" in rep.reason


class _Raising:
    name = "k_raising"

    def __call__(self, args, kwargs, state):
        raise RuntimeError("device lost")


def test_strict_mode_raises_at_run_time(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)], strict=True)
    disp = model.chain.__dict__["forward"]
    disp.table = {sig: _Raising() for sig in disp.table}
    with pytest.raises(RuntimeError, match="device lost"):
        run(model, x)


def test_restore_puts_eager_back(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    assert "forward" in model.chain.__dict__
    assert metal_accel.restore(model) is model
    assert "forward" not in model.chain.__dict__
    with pytest.raises(metal_accel.MetalAccelError):
        metal_accel.explain(model)


def test_grad_mode_runs_eager(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    out = model(x)  # grad enabled and parameters require grad: the kernel has no backward
    assert out.grad_fn is not None
    assert model.chain.__dict__["forward"].hits == 0


def test_second_process_reads_the_cache(tmp_path, isolated_user_cache):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    assert chain_report(model).status == "kernel"
    script = (
        "import sys, torch, metal_accel\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "from toymodels import Net\n"
        "m = Net().eval(); x = torch.randn(4, 256)\n"
        "metal_accel.optimize(m, (x,))\n"
        "r = [r for r in metal_accel.explain(m).modules if r.name == 'chain'][0]\n"
        "print(r.status, r.source)\n"
        "before = m.chain.__dict__['forward'].hits\n"  # optimize() ran the model too (its end-to-end check)
        "with torch.inference_mode(): y = m(x)\n"
        "print(m.chain.__dict__['forward'].hits - before)\n"
        "from metal_accel.backends.cpu import backend as cpu\n"
        "print(cpu.compile_count)\n"
    )
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(isolated_user_cache)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    status, source, hits, compiles = out.stdout.split()
    assert (status, source, hits) == ("kernel", "cache:user", "1")
    assert compiles == "0"  # the compiled library was reused from the on-disk build cache


def test_cached_rejection_is_not_retried(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    provider = candidates(tmp_path, wrong=WRONG)
    metal_accel.optimize(model, (x,), providers=[provider])
    metal_accel.optimize(model, (x,), providers=[provider])
    rep = chain_report(model)
    assert rep.status == "eager" and "incorrect" in rep.reason
    assert rep.rejected == []  # nothing new was evaluated the second time


def test_disabled_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_DISABLE", "1")
    model = Net().eval()
    metal_accel.optimize(model, (torch.randn(4, 256),), providers=[candidates(tmp_path, good=GOOD)])
    assert "forward" not in model.chain.__dict__
    assert metal_accel.explain(model).modules == []


def test_installed_kernel_is_a_custom_op_that_passes_opcheck(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    disp = model.chain.__dict__["forward"]
    op = next(iter(disp.table.values()))
    assert str(op.op).startswith("metal_accel.k_")
    state = [t.detach() for t in disp.layout.gather()]
    result = torch.library.opcheck(op.op, ([torch.randn(4, 256)], state))
    assert set(result.values()) == {"SUCCESS"}, result


def test_optimized_model_under_torch_compile(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        assert "metal_accel.k_" in explained.graphs[0].code  # the kernel is one op inside the graph
        compiled = torch.compile(model)
        torch.testing.assert_close(compiled(x), model(x))


def test_kernel_shows_by_name_in_the_profiler(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    with torch.inference_mode(), torch.profiler.profile() as prof:
        model(x)
    assert any(e.name.startswith("metal_accel::k_") for e in prof.events())
    assert model.chain.__dict__["forward"].hits == 1


def test_candidates_that_pass_but_lose_are_reported_as_outpaced(tmp_path):
    from toymodels import chain_candidate
    slower = chain_candidate(extra="    for (volatile int spin = 0; spin < 2000; ++spin) {}\n")
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD, slower=slower)])
    rep = chain_report(model)
    assert rep.status == "kernel" and not rep.rejected, rep
    assert len(rep.outpaced) == 1 and "eager over" in rep.outpaced[0], rep.outpaced


def test_cpu_verdicts_carry_no_graph_launch_and_a_graph_verdict_is_ignored_off_cuda(tmp_path):
    from metal_accel.backends import get_backend
    from metal_accel.candidates.compile import candidate_op
    from metal_accel.runtime.ops import KernelOp

    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD)])
    rep = chain_report(model)
    assert rep.status == "kernel", rep
    backend = get_backend("cpu")
    entry = cache_mod.lookup("cpu", rep.key)
    verdict = entry.verdict_for(backend.environment())
    assert "graph_launch" not in verdict.details and "launch" not in verdict.details  # CUDA graphs are CUDA's
    verdict.details["launch"] = "cuda-graph"  # as if proven so on a GPU: not a launch this backend has
    op = candidate_op(entry.candidate, rep.key, model.chain, entry.input_spec, entry.output_spec, backend, verdict)
    assert isinstance(op, KernelOp)


def test_a_rejected_kernel_names_its_graph_replay_too_where_one_was_timed():
    from metal_accel.proof.speed import BenchResult
    from metal_accel.proof.prove import rejection_reason

    direct = BenchResult(100.0, 120.0, 0.83, 0.8, 0.01, 0.01, 50, False, "not faster: 0.83x eager (needs >= 1.05x)")
    assert rejection_reason(direct, {}) == direct.reason  # CPU, or the graph launch switched off
    why = rejection_reason(direct, {"graph_launch": "not faster: 0.52x eager (needs >= 1.05x)"})
    assert why.startswith(direct.reason) and "replayed as a CUDA graph: not faster: 0.52x" in why
    failed = rejection_reason(direct, {"graph_launch": "not possible: RuntimeError: capture failed"})
    assert "replayed as a CUDA graph: not possible: RuntimeError" in failed


class WideChain(Chain):
    """A Chain with more submodules than an LLM prompt takes (capture.MAX_COMPOSITE_MODULES)."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = torch.nn.ModuleList(torch.nn.Identity() for _ in range(20))


def test_file_candidates_are_tried_for_composites_too_large_for_a_prompt(tmp_path):
    from metal_accel.runtime.capture import llm_limit
    model, x = WideChain().eval(), torch.randn(4, 256)
    assert llm_limit(model)  # no LLM would be asked for it
    folder = tmp_path / "cands" / "cpu"
    folder.mkdir(parents=True)
    (folder / "WideChain.py").write_text(GOOD)
    ref = run(model, x)
    metal_accel.optimize(model, (x,), providers=[f"dir:{tmp_path / 'cands'}"])
    rep = next(m for m in metal_accel.explain(model).modules if m.name == "WideChain")
    assert rep.status == "kernel", rep
    torch.testing.assert_close(run(model, x), ref, **KERNEL_TOL)


def test_the_report_says_where_optimizes_time_went(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, good=GOOD, wrong=WRONG)], end_to_end=False)
    rep = metal_accel.explain(model)
    assert set(rep.stage_s) >= {"capture", "module decisions"}, rep.stage_s
    assert rep.module_s["kernel candidates"] > 0, rep.module_s  # two candidates compiled and proven
    # the parts of the module decisions add up to it, and no stage is longer than the whole call
    assert abs(sum(rep.module_s.values()) - rep.stage_s["module decisions"]) < 1e-6
    assert sum(rep.stage_s.values()) <= rep.elapsed_s + 1e-6
    assert chain_report(model).elapsed_s >= rep.module_s["kernel candidates"] * 0.99
    assert "time: module decisions" in rep.table() and "kernel candidates" in rep.table()
    assert rep.to_dict()["stage_s"] == rep.stage_s
