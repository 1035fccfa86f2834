"""`import metal_accel` patches only classes with a kernel accepted for this machine, stays invisible to
torch.jit.script / torch.jit.trace, and never compiles anything on a call path the user did not optimize.

Each check runs `import metal_accel` in a fresh interpreter (as tests/test_auto.py does) over a user cache
whose entries are written here directly: no kernel is compiled or proven."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from metal_accel.store import cache as cache_mod
from metal_accel import get_backend
from metal_accel.auto.autoload import kernel_for_call
from metal_accel.candidates.compile import compile_candidate
from metal_accel.store.cache import CacheEntry, Verdict
from metal_accel.core.candidate import parse_candidate
from metal_accel.core.keys import class_path, class_source_sha, entry_key, module_fingerprint
from metal_accel.core.specs import InputSpec, OutputSpec
from limits import HANG_S

# slow: cold subprocesses that import metal_accel, some with torch.compile
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent

LAYER_NORM = '''SOURCE = r"""
#include <cstdint>
#include <cmath>
extern "C" void ln(const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = x + r * n;
    float mean = 0.0f, var = 0.0f;
    for (int64_t i = 0; i < n; ++i) mean += v[i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (v[i] - mean) * (v[i] - mean);
    float inv = 1.0f / std::sqrt(var / n + eps);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = (v[i] - mean) * inv * w[i] + b[i];
  }
}
"""

def forward(module, x):
    out = torch.empty_like(x)
    n = x.shape[-1]
    lib.ln(x.contiguous(), module.weight, module.bias, out, x.numel() // n, n, module.eps)
    return out
'''


def put_entry(module: nn.Module, x: torch.Tensor, *, kind: str = "kernel", accepted: bool | None = True,
              foreign_accepted: bool = False, details: dict | None = None) -> None:
    """Write a user-cache entry for (MODULE, X): a kernel (or the built-in torch.compile) whose verdict here is
    ACCEPTED (None: no verdict here), optionally also accepted on another machine; candidate None when
    ACCEPTED is False and nothing was accepted anywhere (a plain rejection)."""
    backend = get_backend("cpu")
    env = backend.environment()
    spec = InputSpec.of((x,), {})
    with torch.inference_mode():
        out_spec = OutputSpec.of(module(x))
    key = entry_key(module_fingerprint(module), spec, "cpu")
    cand = compile_candidate(backend) if kind == "inductor" else parse_candidate(LAYER_NORM, "cpu", "test")
    verdicts = {}
    if accepted is not None:
        verdicts[env.id] = Verdict(env, accepted, "accepted" if accepted else "incorrect: test", cand.digest, 2.0,
                                   details=dict(details or {}))
    if foreign_accepted:
        other = type(env)(**{**env.to_dict(), "device_name": "Some Other CPU"})
        verdicts[other.id] = Verdict(other, True, "accepted elsewhere", cand.digest, 2.0)
    keep = accepted or foreign_accepted
    cache_mod.user_cache().put(CacheEntry(
        key=key, backend="cpu", module_class=class_path(type(module)), module_fingerprint=module_fingerprint(module),
        input_spec=spec, output_spec=out_spec, candidate=cand if keep else None, verdicts=verdicts,
        rejected=[] if keep else [{"digest": cand.digest, "origin": "test", "reason": "incorrect: test"}],
        class_source_sha=class_source_sha(type(module))))


def run_python(script: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", f"import sys\nsys.path.insert(0, {str(HERE)!r})\n" + script],
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


PATCHED = """
import json, torch
import metal_accel, metal_accel.auto.hook as hook
from torch import nn
m = nn.Sequential(nn.LayerNorm(8)).eval()
scripted = torch.jit.script(m)
x = torch.randn(4, 8)
with torch.no_grad():
    got = scripted(x)
patched = [c.__name__ for c in hook.patched_classes()]
hook.deactivate()
with torch.no_grad():
    ref = m(x)
print(json.dumps({"patched": patched, "script_ok": torch.equal(got, ref)}))
"""


@pytest.mark.parametrize("entry", [
    dict(accepted=False),                           # rejected here, no kernel anywhere
    dict(accepted=False, foreign_accepted=True),    # accepted on another machine, rejected on this one
    dict(kind="inductor"),                          # a torch.compile verdict: only optimize() compiles
])
def test_rejected_or_compile_only_entries_patch_nothing(entry):
    put_entry(nn.LayerNorm(8).eval(), torch.randn(4, 8), **entry)
    res = run_python(PATCHED)
    assert res["patched"] == []
    assert res["script_ok"] is True


def test_an_accepted_kernel_patches_its_class_and_foreign_ones_only_under_first_use():
    put_entry(nn.LayerNorm(8).eval(), torch.randn(4, 8), accepted=None, foreign_accepted=True)
    assert run_python(PATCHED)["patched"] == ["LayerNorm"]
    assert run_python(PATCHED, METAL_ACCEL_REVALIDATE="optimize")["patched"] == []


GRAPH_ONLY = {"launch": "cuda-graph", "direct_bench": {"accepted": False, "reason": "not faster: 0.97x"}}
GRAPH_AND_DIRECT = {"launch": "cuda-graph", "direct_bench": {"accepted": True, "reason": "1.3x faster"}}


def test_a_kernel_that_won_only_replayed_as_a_cuda_graph_is_left_to_optimize():
    """Without optimize()'s end-to-end check, a win that only the graph replay gave runs neither way: the class
    is not patched and a call resolves to eager."""
    ln, x = nn.LayerNorm(8).eval(), torch.randn(4, 8)
    put_entry(ln, x, details=GRAPH_ONLY)
    assert run_python(PATCHED)["patched"] == []
    assert kernel_for_call(ln, (x,), {}, prove_here=True) is None


@pytest.mark.needs_cxx
def test_a_kernel_whose_direct_launch_also_won_runs_launched_directly():
    from metal_accel.runtime.graph import GraphedOp
    from metal_accel.runtime.ops import KernelOp
    ln, x = nn.LayerNorm(8).eval(), torch.randn(4, 8)
    put_entry(ln, x, details=GRAPH_AND_DIRECT)
    assert run_python(PATCHED)["patched"] == ["LayerNorm"]
    op = kernel_for_call(ln, (x,), {}, prove_here=True)
    assert isinstance(op, KernelOp) and not isinstance(op, GraphedOp)


def test_a_first_use_proof_times_the_direct_launch_only(monkeypatch):
    import metal_accel.auto.autoload as autoload
    from metal_accel.core.provider import Evaluation
    seen = []

    def prove(call, key, cand, backend, settings):
        seen.append(settings)
        return Evaluation(cand, Verdict(backend.environment(), False, "not faster: test", cand.digest))
    monkeypatch.setattr(autoload, "prove_candidate", prove)
    ln, x = nn.LayerNorm(8).eval(), torch.randn(4, 8)
    put_entry(ln, x, accepted=None, foreign_accepted=True)  # accepted elsewhere: proven here at first use
    assert kernel_for_call(ln, (x,), {}, prove_here=True) is None
    assert [s.graph_launch for s in seen] == [False]


SCRIPT_AND_TRACE = """
import json, torch
import metal_accel, metal_accel.auto.hook as hook
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 8)).eval()
x = torch.randn(4, 8)   # the cached shape: the patched forward would dispatch it
scripted = torch.jit.script(m)
with torch.no_grad():
    traced = torch.jit.trace(m, (x,))
    got_script, got_trace = scripted(x), traced(x)
fresh = nn.LayerNorm(8).train()
with torch.inference_mode():
    fresh(x)             # training mode: the patched forward runs the original, nothing is resolved
auto_in_training = "_metal_accel_auto" in fresh.__dict__
patched = [c.__name__ for c in hook.patched_classes()]
hook.deactivate()
with torch.no_grad():
    ref = m(x)
print(json.dumps({"patched": patched, "script": torch.equal(got_script, ref), "trace": torch.equal(got_trace, ref),
                  "op_in_graphs": "metal_accel" in str(traced.graph) + str(scripted.graph),
                  "auto_in_training": auto_in_training}))
"""


def test_script_and_trace_of_a_model_with_a_patched_class_see_the_original_forward():
    put_entry(nn.LayerNorm(8).eval(), torch.randn(4, 8))
    res = run_python(SCRIPT_AND_TRACE)
    assert res["patched"] == ["LayerNorm"]
    assert res["script"] and res["trace"]
    assert not res["op_in_graphs"]
    assert not res["auto_in_training"]


UNRELATED_LINEAR = """
import json, torch
compiles = []
_compile = torch.compile
def counting_compile(*a, **k):
    compiles.append(repr(a[:1]))
    return _compile(*a, **k)
torch.compile = counting_compile
import metal_accel, metal_accel.auto.hook as hook
from torch import nn
from torch._dynamo.utils import counters
lin = nn.Linear(256, 256).eval()
with torch.inference_mode():
    for _ in range(3):
        lin(torch.randn(4, 256))
print(json.dumps({"patched": [c.__name__ for c in hook.patched_classes()], "compiles": compiles,
                  "graphs": int(counters["stats"]["unique_graphs"])}))
"""


def test_an_unrelated_linear_after_import_compiles_nothing():
    put_entry(nn.Linear(256, 256).eval(), torch.randn(4, 256), kind="inductor")
    res = run_python(UNRELATED_LINEAR)
    assert res == {"patched": [], "compiles": [], "graphs": 0}


def test_autoload_never_resolves_a_cached_compile_verdict(monkeypatch):
    lin, x = nn.Linear(256, 256).eval(), torch.randn(4, 256)
    put_entry(lin, x, kind="inductor")

    def refuse(*a, **k):
        raise AssertionError("torch.compile called on a path the user did not optimize")
    monkeypatch.setattr(torch, "compile", refuse)
    assert kernel_for_call(lin, (x,), {}, prove_here=True) is None
