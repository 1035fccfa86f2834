"""The shipped library's Metal kernels (metal_accel/library/kernels/mps/<family>.py), proven through the real
pipeline on the MSL emulator for the real transformers classes: each kernel file plus the glue the library
appends is a `dir:` candidate for the class, and optimize(backend="mps-emu") must accept it at every shape
and dtype tried (1 row, several, odd widths, non-contiguous inputs; fp32, fp16, bf16), and must reject a
deliberately broken variant. Only correctness is asserted: emulator timings say nothing about Apple GPUs."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import metal_accel
from metal_accel.core.candidate import parse_candidate
from metal_accel.library.families import FAMILIES
from metal_accel.proof.precision import TOLERANCES
from metal_accel.report import ModuleReport
from metal_accel.sandbox.host import load_forward

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "metal_accel" / "library" / "kernels" / "mps"
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16

# what the library appends to each kernel file for these classes (issue 29's glue)
GLUE = {
    "LlamaRMSNorm": ("rms_norm", "return rms_norm(x, module.weight, module.variance_epsilon)"),
    "Qwen2RMSNorm": ("rms_norm", "return rms_norm(x, module.weight, module.variance_epsilon)"),
    "LlamaMLP": ("gated_mlp", "return gated_mlp(x, module.gate_proj.weight, module.up_proj.weight, "
                              "module.down_proj.weight, {act!r})"),
    "NewGELUActivation": ("gelu_tanh", "return gelu_tanh(x)"),
    "GELUTanh": ("gelu_tanh", "return gelu_tanh(x)"),
    "GPT2MLP": ("gpt2_mlp", "return gpt2_mlp(x, module.c_fc.weight, module.c_fc.bias, module.c_proj.weight, "
                            "module.c_proj.bias)"),
    "BertIntermediate": ("linear_gelu", "return linear_gelu(x, module.dense.weight, module.dense.bias, {act!r})"),
    "LayerNorm": ("layer_norm", "return layer_norm(x, module.weight, module.bias, module.eps)"),
    "BertSelfOutput": ("linear_add_layer_norm", "return linear_add_layer_norm(x, residual, module.dense.weight, "
                                                "module.dense.bias, module.LayerNorm.weight, module.LayerNorm.bias, "
                                                "module.LayerNorm.eps)"),
}
GLUE["BertOutput"] = GLUE["BertSelfOutput"]


def kernel_file(family: str) -> str:
    return (KERNELS / f"{family}.py").read_text()


def with_glue(text: str, cls: str, act: str = "") -> str:
    inputs = ", ".join(FAMILIES[GLUE[cls][0]].inputs)
    return f"{text}\n\ndef forward(module, {inputs}):\n    {GLUE[cls][1].format(act=act)}\n"


@pytest.fixture(scope="module")
def shared_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mps_emu_build")


@pytest.fixture(autouse=True)
def _one_build_dir(shared_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kernel source compiles once per module run, not once per test (user caches stay per proof)."""
    monkeypatch.setenv("METAL_ACCEL_BUILD_DIR", str(shared_build))


def prove(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: torch.nn.Module,
          x: torch.Tensor | tuple[torch.Tensor, ...], text: str | None = None, act: str = "") -> ModuleReport:
    """optimize() MODULE on the emulator with the library's kernel for its class (or TEXT) as the only
    candidate (ACT: the activation the glue names), from a fresh user cache; returns the module's report. The module keeps its kernel."""
    cls = type(module).__name__
    root = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    (root / "mps-emu").mkdir(parents=True)
    (root / "mps-emu" / f"{cls}.py").write_text(with_glue(text or kernel_file(GLUE[cls][0]), cls, act))
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(root / "user_cache"))
    metal_accel.optimize(module.eval(), x if isinstance(x, tuple) else (x,), backend="mps-emu",
                         providers=[f"dir:{root}"])
    (rep,) = [m for m in metal_accel.explain(module).modules if m.module_class.endswith(cls)]
    return rep


def assert_proven(rep: ModuleReport, module: torch.nn.Module, x: torch.Tensor | tuple[torch.Tensor, ...],
                  expected: torch.Tensor) -> None:
    assert rep.status == "kernel" and rep.source.startswith("dir:"), (rep.status, rep.reason, rep.rejected)
    assert rep.speedup is None and "speed not measured" in rep.reason  # correctness only, never speed
    with torch.no_grad():
        out = module(*x) if isinstance(x, tuple) else module(x)  # now the kernel
    # the installed kernel runs and agrees with eager in norm (the proof judged each element, with float64 to
    # settle where eager's own rounding in half dtypes is the larger error)
    assert out.dtype == expected.dtype and out.shape == expected.shape and out.stride() == expected.stride()
    err = (out.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)
    assert err <= 2 * TOLERANCES[expected.dtype].norm, err


def inputs(shape: tuple[int, ...], dtype: torch.dtype, contiguous: bool | str = True) -> torch.Tensor:
    if contiguous is True:
        return torch.randn(shape, dtype=dtype)
    if contiguous == "sliced":  # rows further apart than their width (a view of a wider tensor)
        return torch.randn(*shape[:-1], shape[-1] + 3, dtype=dtype)[..., :shape[-1]]
    # the last two dimensions swapped in memory: neither rows nor elements are where a contiguous tensor has them
    return torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype).transpose(-1, -2)


def check_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Callable[[torch.dtype, int], Any],
                 cases: list[tuple[tuple[int, ...], torch.dtype, bool | str]], act: str = "") -> None:
    for shape, dtype, contiguous in cases:
        torch.manual_seed(hash((shape, str(dtype), contiguous)) % 1000)
        module = make(dtype, shape[-1])
        x = inputs(shape, dtype, contiguous)
        assert x.is_contiguous() == (contiguous is True)
        with torch.no_grad():
            expected = module.eval()(x)
        assert_proven(prove(tmp_path, monkeypatch, module, x, act=act), module, x, expected)


def check_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str, old: str, new: str,
                   module: torch.nn.Module, x: torch.Tensor | tuple[torch.Tensor, ...], why: str,
                   act: str = "") -> None:
    """The family's kernel with OLD replaced by NEW is rejected for MODULE on X, for a reason naming WHY."""
    text = kernel_file(family)
    assert text.count(old) == 1, old
    rep = prove(tmp_path, monkeypatch, module, x, text.replace(old, new), act)
    assert rep.status == "eager" and rep.rejected, (rep.status, rep.reason)
    assert why in " ".join(rep.rejected), rep.rejected


# ---------------------------------------------------------------- every file: format and host code (fast)

def test_kernel_files_are_candidates_with_glue() -> None:
    families = sorted(p.stem for p in KERNELS.glob("*.py"))
    assert "rms_norm" in families
    for cls, (family, _) in GLUE.items():
        if family not in families:
            continue
        text = kernel_file(family)
        assert "def forward" not in text  # the library appends the glue
        cand = parse_candidate(with_glue(text, cls, "silu"), "mps-emu", f"dir:{family}")
        assert cand.source and "kernel" in cand.source
        load_forward(cand.code, lib=None)  # the sandbox accepts the host code


# ---------------------------------------------------------------- 1. rms_norm

def _llama_rms(dtype: torch.dtype, h: int, weight_dtype: torch.dtype | None = None) -> torch.nn.Module:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    m = LlamaRMSNorm(h, eps=1e-6)
    with torch.no_grad():
        m.weight.normal_(1.0, 0.5)
    return m.to(weight_dtype or dtype)


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_rms_norm_llama_fp32_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_family(tmp_path, monkeypatch, _llama_rms, [
        ((1, 1, 64), FP32, True), ((2, 7, 64), FP32, True), ((3, 100), FP32, True), ((2, 5, 37), FP32, True),
        ((2, 6, 64), FP32, False)])


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_rms_norm_half_dtypes_and_qwen2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    def qwen(dtype: torch.dtype, h: int) -> torch.nn.Module:
        m = Qwen2RMSNorm(h, eps=1e-5)
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
        return m.to(dtype)

    check_family(tmp_path, monkeypatch, _llama_rms, [
        ((1, 1, 72), FP16, True), ((2, 7, 50), FP16, True), ((2, 7, 64), BF16, True), ((3, 33), BF16, False)])
    check_family(tmp_path, monkeypatch, qwen, [((2, 3, 72), BF16, True)])
    # float32 weight on half activations: the output is float32, as eager promotes it
    check_family(tmp_path, monkeypatch, lambda dt, h: _llama_rms(dt, h, FP32), [((2, 7, 64), BF16, True)])


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("old, new, shape, why", [
    # partials read before every SIMD-group wrote them (three SIMD-groups per row)
    ("    threadgroup_barrier(mem_flags::mem_threadgroup);\n", "\n", (2, 3, 264), "data race"),
    # the scalar path's last element left unwritten
    ("for (uint j = tid; j < D; j += tpg) yr[j]", "for (uint j = tid; j + 1 < D; j += tpg) yr[j]", (2, 7, 50),
     "incorrect"),
    # one vector too many per row
    ("const uint n4 = D / 4;", "const uint n4 = D / 4 + 1;", (2, 3, 64), "past the start of w"),
])
def test_rms_norm_broken_variants_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str,
                                           shape: tuple[int, ...], why: str) -> None:
    check_rejected(tmp_path, monkeypatch, "rms_norm", old, new, _llama_rms(FP32, shape[-1]), torch.randn(shape), why)


# ---------------------------------------------------------------- 2. gated_mlp

HF_ACT = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}


def _llama_mlp(act: str, intermediate: int) -> Callable[[torch.dtype, int], torch.nn.Module]:
    def make(dtype: torch.dtype, h: int) -> torch.nn.Module:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP
        cfg = LlamaConfig(hidden_size=h, intermediate_size=intermediate, hidden_act=HF_ACT[act],
                          num_attention_heads=1, num_key_value_heads=1)
        return LlamaMLP(cfg).to(dtype)
    return make


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gated_mlp_llama_silu_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 row with a 37-wide intermediate (one vector and a tail of 1 per row...), 14 rows of 50 (a tail of 2)
    check_family(tmp_path, monkeypatch, _llama_mlp("silu", 37), [((1, 1, 64), FP32, True)], act="silu")
    check_family(tmp_path, monkeypatch, _llama_mlp("silu", 50), [
        ((2, 7, 72), FP32, True), ((2, 6, 40), FP32, False), ((2, 7, 48), FP16, True), ((3, 5, 40), BF16, True)],
        act="silu")


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("act", ["gelu_tanh", "gelu"])
def test_gated_mlp_gelu_gates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, act: str) -> None:
    check_family(tmp_path, monkeypatch, _llama_mlp(act, 50), [
        ((2, 7, 64), FP32, True), ((1, 1, 40), FP16, True), ((2, 3, 40), BF16, False)], act=act)


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("old, new, why", [
    # the tail thread stops one short: the last element of h is never written (n = 7 * 50 = 350, a tail of 2)
    ("for (uint j = 4 * n4; j < n; ++j)", "for (uint j = 4 * n4; j + 1 < n; ++j)", "incorrect"),
    # silu without its division: a wrong activation
    ("if (act == 0) return x / (1.0f + exp(-x));", "if (act == 0) return x * (1.0f + exp(-x));", "incorrect"),
])
def test_gated_mlp_broken_variants_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str,
                                            why: str) -> None:
    module = _llama_mlp("silu", 50)(FP32, 32)
    check_rejected(tmp_path, monkeypatch, "gated_mlp", old, new, module, torch.randn(1, 7, 32), why, "silu")


# ---------------------------------------------------------------- 3. gelu_tanh

def _new_gelu(dtype: torch.dtype, h: int) -> torch.nn.Module:
    from transformers.activations import NewGELUActivation
    return NewGELUActivation()


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gelu_tanh_new_gelu_and_gelu_tanh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.activations import GELUTanh
    check_family(tmp_path, monkeypatch, _new_gelu, [
        ((1, 1, 64), FP32, True), ((2, 7, 37), FP32, True), ((2, 5, 100), FP32, False), ((2, 7, 72), FP16, True),
        ((3, 33), BF16, True), ((2, 3, 40), FP16, False)])
    check_family(tmp_path, monkeypatch, lambda dt, h: GELUTanh(), [((2, 7, 50), FP32, True), ((2, 7, 50), BF16, True)])


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("old, new, why", [
    ("for (uint j = 4 * n4; j < n; ++j)", "for (uint j = 4 * n4; j <= n; ++j)", "past the start of"),  # tail overrun
    ("gelu_tanh1(v.y), gelu_tanh1(v.z)", "gelu_tanh1(v.z), gelu_tanh1(v.y)", "incorrect"),  # lanes swapped
])
def test_gelu_tanh_broken_variants_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str,
                                            why: str) -> None:
    check_rejected(tmp_path, monkeypatch, "gelu_tanh", old, new, _new_gelu(FP32, 37), torch.randn(2, 7, 37), why)


# ---------------------------------------------------------------- 5. gpt2_mlp

def _gpt2_mlp(intermediate: int) -> Callable[[torch.dtype, int], torch.nn.Module]:
    def make(dtype: torch.dtype, h: int) -> torch.nn.Module:
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
        m = GPT2MLP(intermediate, GPT2Config(n_embd=h, n_head=1, activation_function="gelu_new"))
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0.0, 0.2)
        return m.to(dtype)
    return make


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gpt2_mlp_shapes_and_dtypes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_family(tmp_path, monkeypatch, _gpt2_mlp(37), [((1, 1, 32), FP32, True), ((2, 7, 40), FP32, "sliced")])
    check_family(tmp_path, monkeypatch, _gpt2_mlp(100), [
        ((2, 7, 72), FP32, True), ((2, 7, 48), FP16, True), ((3, 5, 40), BF16, True), ((1, 3, 40), FP16, "sliced")])


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gpt2_mlp_broken_variant_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the tail thread skipped: 7 * 37 = 259 hidden elements, the last 3 never activated
    check_rejected(tmp_path, monkeypatch, "gpt2_mlp", "} else if (i == n4) {", "} else if (i == n4 + 1) {",
                   _gpt2_mlp(37)(FP32, 32), torch.randn(1, 7, 32), "incorrect")


# ---------------------------------------------------------------- 4. linear_gelu

def _bert_intermediate(hidden_act: str, intermediate: int) -> Callable[[torch.dtype, int], torch.nn.Module]:
    def make(dtype: torch.dtype, h: int) -> torch.nn.Module:
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertIntermediate
        cfg = BertConfig(hidden_size=h, intermediate_size=intermediate, num_attention_heads=1, hidden_act=hidden_act)
        return BertIntermediate(cfg).to(dtype)
    return make


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_linear_gelu_bert_intermediate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_family(tmp_path, monkeypatch, _bert_intermediate("gelu", 37), [
        ((1, 1, 32), FP32, True), ((2, 7, 40), FP32, False), ((2, 5, 72), BF16, True)], act="none")
    check_family(tmp_path, monkeypatch, _bert_intermediate("gelu", 100), [
        ((2, 7, 48), FP32, True), ((2, 7, 48), FP16, True), ((3, 40), FP16, "sliced")], act="none")
    check_family(tmp_path, monkeypatch, _bert_intermediate("gelu_pytorch_tanh", 50), [
        ((2, 7, 40), FP32, True), ((2, 3, 40), BF16, True)], act="tanh")


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("old, new, why", [
    # erf's sign symmetry lost: the negative half of GELU wrong
    ("return z >= 0.0f ? r : 2.0f - r;", "return r;", "incorrect"),
    # the tail thread takes a whole vector: 7 * 37 = 259 elements, it writes one past the end
    ("if (i < n4) {", "if (i <= n4) {", "past the start of"),
])
def test_linear_gelu_broken_variants_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str,
                                             why: str) -> None:
    check_rejected(tmp_path, monkeypatch, "linear_gelu", old, new, _bert_intermediate("gelu", 37)(FP32, 32),
                   torch.randn(1, 7, 32), why, "none")


# ---------------------------------------------------------------- 6. layer_norm and linear_add_layer_norm

def _layer_norm(dtype: torch.dtype, h: int, param_dtype: torch.dtype | None = None) -> torch.nn.Module:
    m = torch.nn.LayerNorm(h, eps=1e-5)
    with torch.no_grad():  # nn.LayerNorm starts at ones and zeros: give weight and bias values to apply
        m.weight.normal_(1.0, 0.3)
        m.bias.normal_(0.0, 0.3)
    return m.to(param_dtype or dtype)


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_layer_norm_shapes_and_dtypes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_family(tmp_path, monkeypatch, _layer_norm, [
        ((1, 1, 64), FP32, True), ((2, 7, 64), FP32, True), ((3, 100), FP32, True), ((2, 5, 37), FP32, True),
        ((2, 6, 64), FP32, False), ((2, 7, 72), FP16, True), ((2, 3, 50), BF16, "sliced")])
    # float32 weight and bias on bfloat16 activations: the output in x's dtype, as eager's mixed-dtype LayerNorm
    check_family(tmp_path, monkeypatch, lambda dt, h: _layer_norm(dt, h, FP32), [((2, 7, 64), BF16, True)])


def _bert_output(cls: str, dtype: torch.dtype, hidden: int, inner: int) -> torch.nn.Module:
    from transformers import BertConfig
    from transformers.models.bert import modeling_bert
    m = getattr(modeling_bert, cls)(BertConfig(hidden_size=hidden, intermediate_size=inner, num_attention_heads=1))
    with torch.no_grad():
        m.dense.weight.normal_(0.0, 0.1)
        m.dense.bias.normal_(0.0, 0.5)
        m.LayerNorm.weight.normal_(1.0, 0.3)
        m.LayerNorm.bias.normal_(0.0, 0.3)
    return m.to(dtype).eval()


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("cls, lead, hidden, dtype", [
    ("BertSelfOutput", (2, 7), 64, FP32), ("BertSelfOutput", (1, 1), 37, FP32), ("BertOutput", (3,), 48, FP32),
    ("BertSelfOutput", (2, 5), 64, FP16), ("BertOutput", (2, 3), 40, BF16)])
def test_linear_add_layer_norm_bert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls: str,
                                    lead: tuple[int, ...], hidden: int, dtype: torch.dtype) -> None:
    torch.manual_seed(hidden)
    inner = hidden if cls == "BertSelfOutput" else 2 * hidden + 3
    module = _bert_output(cls, dtype, hidden, inner)
    inputs = (torch.randn(*lead, inner, dtype=dtype), torch.randn(*lead, hidden, dtype=dtype))
    with torch.no_grad():
        expected = module(*inputs)
    assert_proven(prove(tmp_path, monkeypatch, module, inputs), module, inputs, expected)


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("family, old, new, why", [
    # the mean's partials read before every SIMD-group wrote them (three SIMD-groups per row)
    ("layer_norm", "part[sg] = float2(s, m);\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n",
     "part[sg] = float2(s, m);\n", "data race"),
    # the unbiased variance
    ("layer_norm", "q += d * d; }\n        const float rstd = rsqrt(group_sum(q, part_var, lane, sg, nsg) "
     "/ float(D)", "q += d * d; }\n        const float rstd = rsqrt(group_sum(q, part_var, lane, sg, nsg) "
     "/ float(D - 1)", "incorrect"),

    # the residual left out of the scalar path
    ("linear_add_layer_norm", "const T t = T(float(hr[j]) + float(rr[j]));", "const T t = T(float(hr[j]));",
     "incorrect"),
])
def test_layer_norm_broken_variants_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str, old: str,
                                             new: str, why: str) -> None:
    if family == "layer_norm":
        D = 264 if why == "data race" else 37
        module, x = _layer_norm(FP32, D), torch.randn(2, 3, D)
    else:
        module, x = _bert_output("BertSelfOutput", FP32, 37, 37), (torch.randn(2, 3, 37), torch.randn(2, 3, 37))
    check_rejected(tmp_path, monkeypatch, family, old, new, module, x, why)


HUGE_VAR = ("const float var_u = group_sum(q, part_q, lane, sg, nsg) / float(D);",
            "const float var_u = group_sum(q, part_q, lane, sg, nsg) / float(D - 1);")


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("family", ["layer_norm", "linear_add_layer_norm"])
@pytest.mark.parametrize("broken", [False, True], ids=["kernel", "unbiased-variance-variant"])
def test_layer_norm_rows_where_float32_moments_break_down(family: str, broken: bool) -> None:
    """Rows over 2^48 in magnitude (squares overflow float32; eager's own float32 LayerNorm gives NaN on some),
    constant ones among them (a float mean one ulp off normalizes to +-1 where float64 gives the bias: a
    fresh-check's secret draw once rejected this kernel on such a row), on the emulator against float64; the
    check fails for a kernel whose path for such rows is wrong (the proof's random draws rarely reach it)."""
    from types import SimpleNamespace

    from metal_accel.backends import get_backend
    from metal_accel.core.candidate import declared_source
    from metal_accel.proof.prove import kernels_only
    from metal_accel.runtime.native_policy import runtime_library
    text = kernel_file(family).replace(*HUGE_VAR) if broken else kernel_file(family)
    glue = ("\n\ndef forward(module, x):\n    return layer_norm(x, module.weight, module.bias, module.eps)\n"
            if family == "layer_norm" else
            "\n\ndef forward(module, x, residual):\n    return linear_add_layer_norm(x, residual, module.dw, module.db, "
            "module.weight, module.bias, module.eps)\n")
    be = get_backend("mps-emu")
    forward = load_forward(text + glue, kernels_only(runtime_library(be, declared_source(text))))
    torch.manual_seed(0)
    ok = []
    for D in (37, 64, 264):
        ln = _layer_norm(FP32, D)
        x = torch.randn(7, D)
        big = torch.finfo(torch.float32).max / 4
        x[0, :5], x[1, :5], x[2], x[3, ::2] = big, -big, 2.75, 1e30
        x[4], x[5], x[6] = 1e20, -3e30, 5e14  # constant rows over 2^48
        view = SimpleNamespace(weight=ln.weight.detach(), bias=ln.bias.detach(), eps=ln.eps,
                               dw=torch.eye(D), db=torch.zeros(D))
        want = torch.nn.functional.layer_norm(x.double(), (D,), view.weight.double(), view.bias.double(), ln.eps)
        with torch.no_grad():
            got = forward(view, x) if family == "layer_norm" else forward(view, x, torch.zeros_like(x))
        ok.append(bool(torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)))
    assert all(ok) != broken, ok


# ---------------------------------------------------------------- the Mac's command, smoke-run on the emulator

@pytest.mark.slow
@pytest.mark.needs_cxx
def test_benchmark_script_runs_on_the_emulator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import library_mps
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "cache"))
    assert library_mps.main(["--device", "cpu", "--backend", "mps-emu", "--small", "--dtypes", "fp32,bf16",
                             "--only", "NewGELU"]) == 0
    out = capsys.readouterr().out
    assert out.count("NewGELUActivation") == 2 and "every case proven correct" in out
