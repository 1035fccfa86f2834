"""Prompt contents: per-language guides, rules, worked examples, module context, references, feedback."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.store import cache as cache_mod
from metal_accel.backends.base import Environment
from metal_accel.store.cache import CacheEntry, Verdict
from metal_accel.core.candidate import Candidate, parse_candidate
from metal_accel.core.keys import class_path, entry_key, module_fingerprint
from metal_accel.kernelbench.problems import Problem
from metal_accel.core.specs import InputSpec, OutputSpec
from metal_accel.synth import prompts
from metal_accel.core.provider import Evaluation, SynthesisRequest
from metal_accel.synth.facts import op_multiset, signature
from metal_accel.synth.memo import AnswerCache
from metal_accel.synth.context import find_references, profile_breakdown
from metal_accel.synth.loop import SynthesisLoop
from metal_accel.synth.settings import SynthSettings

GUIDES = Path(prompts.__file__).parent / "guides"


def scaled_tanh(x: torch.Tensor, k: float) -> torch.Tensor:
    return torch.tanh(x * k)


class GatedNorm(nn.Module):
    """A module with a parameter, a buffer, a plain attribute, a submodule and a helper function."""

    def __init__(self, n: int = 64) -> None:
        super().__init__()
        self.eps = 1e-5
        self.weight = nn.Parameter(torch.ones(n))
        self.register_buffer("bias", torch.zeros(n))
        self.gate = nn.Linear(n, n)

    def forward(self, x: torch.Tensor, k: float = 2.0) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + self.bias
        return h * scaled_tanh(self.gate(x), k)


def request_for(module: nn.Module, x: torch.Tensor, k: float = 2.0, backend: str = "cpu",
                language: str = "c++") -> SynthesisRequest:
    spec = InputSpec.of((x,), {"k": k})
    with torch.no_grad():
        out = module(x, k=k)
    return SynthesisRequest(module, class_path(type(module)), type(module).__name__, module_fingerprint(module), spec,
                            OutputSpec.of(out), backend, language, eager_us=42.0)


@pytest.mark.parametrize("language, needles", [
    ("c++", ['extern "C"', "#pragma omp parallel for", "#pragma omp simd", '#include "ma_vecmath.h"',
             "contiguous CPU tensor", "`float*` float32", "-fno-trapping-math -fno-math-errno", "lib.rmsnorm(",
             "`ma_vecmath.h`", "`omp.h`"]),
    ("msl", ["threadgroup", "simd_sum", "simd_shuffle_down", "half", "coalesce", "threads=..., group_size=...",
             "constant long& n", "constant float& eps", "strides are not applied", "threadgroup_barrier",
             "kernel void rmsnorm", "`metal_stdlib`"]),
    ("cuda", ['extern "C" __global__', "__shfl_down_sync", "long long n", "group_size", "shared_mem=", "coalesced",
              "NVRTC", "__syncthreads()", "`cuda_fp16.h`"]),
], ids=["lang_cpp", "lang_msl", "lang_cuda"])  # ("cuda" alone as an id would select the GPU skip marker)
def test_system_prompt_per_language(language, needles):
    text = prompts.system_prompt(language)
    for needle in needles:
        assert needle in text, needle
    for common in ("## Answer format", 'SOURCE = r"""', "def forward(module", "torch.empty_like", "contiguous",
                   "Forbidden: import", "starting with `_`", "no inline assembly", "## Worked example",
                   "class RMSNorm(nn.Module)", "1.05x faster"):
        assert common in text, common


def test_cpu_guide_lists_every_vecmath_function():
    header = (Path(metal_accel.__file__).parent / "include" / "ma_vecmath.h").read_text()
    public = set(re.findall(r"^\s*\*\s+(ma_\w+)\s", header, re.M))
    assert {"ma_expf", "ma_sigmoidf", "ma_siluf", "ma_tanhf", "ma_erff", "ma_geluf"} <= public
    guide = prompts.language_guide("c++")
    for name in public:
        assert f"float {name}(float x)" in guide
    assert "<<" not in guide
    assert "-fno-trapping-math" in guide  # the backend's real flags, not a copy that can go stale


@pytest.mark.parametrize("language", ["c++", "msl", "cuda"], ids=["lang_cpp", "lang_msl", "lang_cuda"])
def test_worked_examples_are_well_formed_candidates(language):
    text = prompts.worked_example(language)
    cand = parse_candidate(text, "x")  # the answer block, not the module block
    assert "rmsnorm" in cand.source
    from metal_accel.sandbox.host import check_host_code
    from metal_accel.sandbox.kernel_source import check_kernel_source
    check_host_code(cand.code)
    check_kernel_source(cand.source, language)


@pytest.mark.needs_cxx
@pytest.mark.parametrize("backend, example", [("cpu", "cpp"), ("mps-emu", "msl")], ids=["cpu", "emulated_msl"])
@pytest.mark.slow
def test_worked_example_is_correct(tmp_path, backend, example):
    """The prompt's example answers pass validation (the CUDA one was checked on an H100 the same way)."""
    if backend not in metal_accel.available_backends():
        pytest.skip(f"backend {backend} is not available here")
    code = ("import torch\nfrom torch import nn\n\n" + (GUIDES / "example_module.txt").read_text() +
            "\nModel = RMSNorm\n\ndef get_inputs():\n    return [torch.randn(4, 8, 256)]\n\n"
            "def get_init_inputs():\n    return [256]\n")
    model, inputs = Problem("rmsnorm_example", code, "rmsnorm_example").instantiate()
    folder = tmp_path / backend / "RMSNorm"
    folder.mkdir(parents=True)
    (folder / "example.py").write_text((GUIDES / f"example_{example}.txt").read_text())
    metal_accel.optimize(model, inputs, backend=backend, providers=[f"dir:{tmp_path}"], bench_budget_s=0.3,
                         progress=False)
    rep = metal_accel.explain(model).modules[0]
    assert rep.status == "kernel" or "not faster" in rep.reason, rep  # correct; fast enough is another matter


def test_task_prompt_describes_the_module_call():
    module = GatedNorm().eval()
    req = request_for(module, torch.randn(2, 8, 64))
    text = prompts.task_prompt(req, device="Test CPU 9000", profile="| aten::mul | 1 | 2.0 | 50% |")
    assert "class GatedNorm(nn.Module)" in text and "def scaled_tanh" in text  # class and the helper it calls
    assert "eps=1e-05" in text and "training" not in text.split("Plain attributes:")[1].split("\n")[0]
    assert "module.weight: parameter float32[64]" in text and "module.bias: buffer float32[64]" in text
    assert "module.gate.weight: parameter float32[64,64]" in text and "gate: Linear(in_features=64" in text
    assert "forward(x, k)" in text and "x: float32[2,8,64] (contiguous) on cpu" in text and "k = 2.0" in text
    assert "returns one tensor, float32[2,8,64]" in text
    assert "Test CPU 9000" in text and "42.0 µs per call" in text and "at most 40.0 µs" in text
    assert "| aten::mul |" in text


def test_profile_breakdown_lists_the_eager_ops():
    module = GatedNorm().eval()
    table = profile_breakdown(module, InputSpec.of((torch.randn(2, 8, 64),), {"k": 2.0}), "cpu")
    assert table.startswith("| op |")
    assert "aten::" in table and ("aten::tanh" in table or "aten::addmm" in table or "aten::mul" in table)


def _store(module: nn.Module, spec: InputSpec, backend: str, language: str, out: OutputSpec) -> Candidate:
    code = (GUIDES / f"example_{prompts.LANGUAGE_FILES[language]}.txt").read_text()
    cand = parse_candidate(code, backend, origin="test")
    env = Environment(backend, "Test device", "Linux", "2.13")
    fp = module_fingerprint(module)
    entry = CacheEntry(key=entry_key(fp, spec, backend), backend=backend, module_class=class_path(type(module)),
                       module_fingerprint=fp, input_spec=spec, output_spec=out, candidate=cand,
                       verdicts={env.id: Verdict(env, True, "2.00x eager", cand.digest, 2.0, 10.0, 5.0)})
    cache_mod.user_cache().put(entry)
    return cand


class GatedNormV2(GatedNorm):
    pass


@pytest.mark.slow
def test_references_from_the_caches():
    module = GatedNorm().eval()
    req = request_for(module, torch.randn(2, 8, 64))
    cuda_spec = InputSpec.of((torch.randn(2, 8, 64),), {"k": 2.0})
    cuda_kernel = _store(module, cuda_spec, "cuda", "cuda", req.output_spec)
    similar = GatedNormV2(32).eval()  # another class, the same computation: found by its op signature
    spec = InputSpec.of((torch.randn(2, 8, 32),), {"k": 2.0})
    _store(similar, spec, "cpu", "c++", req.output_spec)
    ops = op_multiset(similar, spec, "cpu")
    AnswerCache("cpu", entry_key(module_fingerprint(similar), spec, "cpu")).save_signature(signature(ops, spec), ops)
    sig = signature(op_multiset(module, req.input_spec, "cpu"), req.input_spec)
    refs = find_references(req.fingerprint, sig, "cpu")
    assert [r.why for r in refs] == ["the same module on the cuda backend", "a cached module that runs the same ops"]
    text = prompts.task_prompt(req, device="cpu", references=refs)
    assert "## Reference kernels" in text and cuda_kernel.code.strip()[:60] in text and "2.00x eager there" in text
    loop = SynthesisLoop(["openai:gpt-4o"], SynthSettings(profile=False), client_factory=lambda m, s: None)
    assert "the same module on the cuda backend" in loop.prompt_for(req).user
    assert find_references("0" * 64, sig, "cpu", entries=[]) == []
    assert find_references("0" * 64, "", "cpu") == []  # no signature: nothing by structure, never by name


def _evaluation(reason: str, accepted: bool = False, speedup: float | None = None, origin: str = "m#s0r0") -> Evaluation:
    env = Environment("cpu", "x", "Linux", "2.13")
    timing = (20.0, 20.0 / speedup) if speedup else (None, None)
    cand = Candidate("SOURCE = ''\ndef forward(module, x):\n    return x\n", "", "cpu", origin)
    return Evaluation(cand, Verdict(env, accepted, reason, cand.digest, speedup, *timing))


def test_feedback_messages():
    best = prompts.Best(3.0, 6.7, "anthropic:claude#s1r0")
    text = prompts.feedback_for(_evaluation("compile error: kernel.cpp:3: error: 'flot' was not declared"), None)
    assert "did not compile" in text and "'flot' was not declared" in text and "No candidate has been accepted" in text
    text = prompts.feedback_for(_evaluation("incorrect: trial 2 (large inputs): output 0: max abs err 0.5"), best)
    assert "results are wrong" in text and "large inputs" in text and "3.00x eager" in text
    text = prompts.feedback_for(_evaluation("not faster: 0.80x eager (needs >= 1.05x)", speedup=0.8), best)
    assert "not fast enough" in text and "Eager: 20.0 µs; yours: 25.0 µs (0.80x)" in text and "3.00x" in text
    text = prompts.feedback_for(_evaluation("sandbox: line 2: import", origin="a"), best, duplicate=True)
    assert text.startswith("Your answer is identical") and "broke a rule" in text
    text = prompts.feedback_for(_evaluation("3.00x eager", True, 3.0, "anthropic:claude#s1r0"), best)
    assert "Accepted" in text and "This is the fastest accepted candidate so far" in text
    assert "no ```python block defining SOURCE and forward" in prompts.feedback_malformed("no SOURCE")


def test_torch_compile_time_and_code_are_context_to_beat():
    from dataclasses import replace

    import torch

    from metal_accel.core.specs import InputSpec, OutputSpec
    from metal_accel.core.provider import SynthesisRequest
    from metal_accel.synth.prompts import task_prompt
    from toymodels import Chain
    x = torch.randn(4, 256)
    req = SynthesisRequest(Chain(), "toymodels.Chain", "Chain", "f" * 64, InputSpec.of((x,)), OutputSpec.of(x),
                           "cpu", "c++", eager_us=20.0)
    assert "torch.compile" not in task_prompt(req, device="cpu")
    req = replace(req, compile_us=12.0, compiled_code="extern \"C\" void kernel_cpp_0(const float* in_ptr0) {}")
    text = task_prompt(req, device="cpu")
    assert "12.0 µs" in text and "faster than both eager and torch.compile" in text
    assert "kernel_cpp_0" in text and "at most 11.4 µs" in text
