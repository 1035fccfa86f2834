"""The shipped CPU kernel library (metal_accel/library/kernels/cpu/<family>.py) on the real transformers modules.

Each family's file, with the glue the library appends, goes through the real pipeline as a `dir:` candidate
for the module's class: optimize() must judge it correct (the proof's trials against eager and float64) at
every shape and dtype served. Speed is not asserted (a busy 2-core machine proves nothing about speed):
a kernel the proof found correct but not faster counts as proven. A deliberately wrong variant of each
file must be rejected as incorrect, so these tests can fail. Speed figures: benchmarks/library_cpu.py.
Every optimize() here compiles and proves (5-15 s on 2 busy cores): all but the static checks are slow.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import metal_accel
from metal_accel.backends.cpu.signature import parse_extern_c
from metal_accel.core.candidate import parse_candidate
from metal_accel.sandbox.host import check_host_code
from metal_accel.sandbox.kernel_source import check_kernel_source

KERNELS = Path(__file__).resolve().parent.parent / "metal_accel" / "library" / "kernels" / "cpu"
FAMILIES = ("rms_norm", "gated_mlp", "gelu_tanh", "gpt2_mlp", "linear_gelu", "layer_norm", "linear_add_layer_norm")
# verdict reasons of a candidate that passed the correctness proof and lost only on speed (proof/speed.py)
SPEED_ONLY = ("not faster", "within noise", "unreliable timing")
GLUE_RMS = "def forward(module, x):\n    return rms_norm(x, module.weight, module.variance_epsilon)\n"


def kernel_file(family: str) -> str:
    return (KERNELS / f"{family}.py").read_text()


def mutate(text: str, old: str, new: str) -> str:
    """TEXT with OLD replaced once (the wrong variants; fails loudly when the file no longer has OLD)."""
    assert text.count(old) >= 1, f"{old!r} not in the kernel file"
    return text.replace(old, new, 1)


def prove(tmp_path: Path, module: torch.nn.Module, x: torch.Tensor | tuple[torch.Tensor, ...], text: str,
          glue: str) -> metal_accel.ModuleReport:
    """optimize() MODULE on X (one input, or a tuple of them) with TEXT + GLUE as the only candidate; the module's
    report."""
    folder = tmp_path / "cands" / "cpu"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{type(module).__name__}.py").write_text(text + "\n\n" + glue)
    metal_accel.optimize(module, x if isinstance(x, tuple) else (x,), providers=[f"dir:{tmp_path / 'cands'}"],
                         end_to_end=False, bench_budget_s=0.1, progress=False, strict=True)
    return next(m for m in metal_accel.explain(module).modules if m.name == type(module).__name__)


def judged_correct(rep: metal_accel.ModuleReport) -> bool:
    """The candidate passed the correctness proof: installed, or rejected on speed alone."""
    if rep.status == "kernel":
        return True
    return bool(rep.rejected) and all(r.split(": ", 1)[-1].startswith(SPEED_ONLY) for r in rep.rejected)


def assert_proven(rep: metal_accel.ModuleReport) -> None:
    assert judged_correct(rep), f"{rep.status}: {rep.reason}; rejected: {rep.rejected}"


def assert_rejected_as_wrong(rep: metal_accel.ModuleReport) -> None:
    assert rep.status == "eager" and any("incorrect" in r for r in rep.rejected), (rep.reason, rep.rejected)


def make_input(shape: tuple[int, ...], dtype: torch.dtype, contiguous: bool = True) -> torch.Tensor:
    torch.manual_seed(0)
    if contiguous:
        return torch.randn(shape).to(dtype)
    # the same shape as a transposed view: the last dim is not the contiguous one
    return torch.randn(*shape[:-2], shape[-1], shape[-2]).to(dtype).transpose(-1, -2)


# (shape, contiguous): one row, a small batch, a prefill, an odd hidden size, a non-contiguous view
SHAPES = [((1, 1, 256), True), ((2, 7, 256), True), ((1, 128, 256), True), ((2, 5, 100), True),
          ((2, 9, 72), False)]
SHAPE_IDS = ["1x1", "2x7", "1x128", "odd100", "noncontig72"]


# ------------------------------------------------------------------ static checks (fast)

@pytest.mark.parametrize("family", [f for f in FAMILIES if (KERNELS / f"{f}.py").exists()])
def test_kernel_file_format(family):
    text = kernel_file(family)
    cand = parse_candidate(text + "\n\ndef forward(module, x, *inputs):\n    return x\n", "cpu", family)
    check_host_code(cand.code)
    check_kernel_source(cand.source, "c++")
    assert parse_extern_c(cand.source)
    assert f"\ndef {family}(" in text and "\ndef forward(" not in text
    assert text.startswith('"""')


# ------------------------------------------------------------------ rms_norm

def _rms_module(cls_name: str, hidden: int, dtype: torch.dtype) -> torch.nn.Module:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.mistral.modeling_mistral import MistralRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    cls = {"LlamaRMSNorm": LlamaRMSNorm, "Qwen2RMSNorm": Qwen2RMSNorm, "MistralRMSNorm": MistralRMSNorm}[cls_name]
    m = cls(hidden, eps=1e-5)
    with torch.no_grad():
        m.weight.normal_(1.0, 0.2)
    return m.eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, contiguous", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("cls_name", ["LlamaRMSNorm"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_rms_norm_proven(tmp_path, cls_name, shape, contiguous, dtype):
    m = _rms_module(cls_name, shape[-1], dtype)
    assert_proven(prove(tmp_path, m, make_input(shape, dtype, contiguous), kernel_file("rms_norm"), GLUE_RMS))


@pytest.mark.parametrize("cls_name", ["Qwen2RMSNorm", "MistralRMSNorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_rms_norm_other_classes(tmp_path, cls_name, dtype):
    m = _rms_module(cls_name, 100, dtype)
    assert_proven(prove(tmp_path, m, make_input((2, 7, 100), dtype), kernel_file("rms_norm"), GLUE_RMS))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_rms_norm_bf16_input_float32_weight(tmp_path):
    m = _rms_module("LlamaRMSNorm", 96, torch.float32)
    assert_proven(prove(tmp_path, m, make_input((2, 7, 96), torch.bfloat16), kernel_file("rms_norm"), GLUE_RMS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_rms_norm_wrong_variant_rejected(tmp_path, dtype):
    wrong = mutate(kernel_file("rms_norm"), "ss / (float)dim + eps", "ss / (float)(dim - 16) + eps")
    m = _rms_module("LlamaRMSNorm", 256, dtype)
    assert_rejected_as_wrong(prove(tmp_path, m, make_input((2, 7, 256), dtype), wrong, GLUE_RMS))


# ------------------------------------------------------------------ gated_mlp

GATED_ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}  # HF hidden_act -> family act


def _gated_glue(hidden_act: str) -> str:
    return ("def forward(module, x):\n    return gated_mlp(x, module.gate_proj.weight, module.up_proj.weight, "
            f"module.down_proj.weight, {GATED_ACTS[hidden_act]!r})\n")


def _gated_module(kind: str, hidden: int, dtype: torch.dtype, hidden_act: str = "silu") -> torch.nn.Module:
    from transformers import GemmaConfig, LlamaConfig, Qwen2Config
    from transformers.models.gemma.modeling_gemma import GemmaMLP
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    torch.manual_seed(0)
    inter = 2 * hidden + 6  # not a multiple of 16: the vector loops' tails run
    heads = {"num_attention_heads": 1, "num_key_value_heads": 1}  # any hidden size passes the config's checks
    if kind == "GemmaMLP":
        m = GemmaMLP(GemmaConfig(hidden_size=hidden, intermediate_size=inter, hidden_activation=hidden_act, **heads))
    elif kind == "Qwen2MLP":
        m = Qwen2MLP(Qwen2Config(hidden_size=hidden, intermediate_size=inter, hidden_act=hidden_act, **heads))
    else:
        m = LlamaMLP(LlamaConfig(hidden_size=hidden, intermediate_size=inter, hidden_act=hidden_act, **heads))
    return m.eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, contiguous", SHAPES, ids=SHAPE_IDS)
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gated_mlp_silu_proven(tmp_path, shape, contiguous, dtype):
    m = _gated_module("LlamaMLP", shape[-1], dtype)
    x = make_input(shape, dtype, contiguous)
    assert_proven(prove(tmp_path, m, x, kernel_file("gated_mlp"), _gated_glue("silu")))


@pytest.mark.parametrize("kind, hidden_act", [("GemmaMLP", "gelu_pytorch_tanh"), ("LlamaMLP", "gelu_pytorch_tanh"),
                                              ("LlamaMLP", "gelu"), ("Qwen2MLP", "silu")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, contiguous", [SHAPES[3], SHAPES[4]], ids=["odd100", "noncontig72"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gated_mlp_other_acts_proven(tmp_path, kind, hidden_act, shape, contiguous, dtype):
    m = _gated_module(kind, shape[-1], dtype, hidden_act)
    x = make_input(shape, dtype, contiguous)
    assert_proven(prove(tmp_path, m, x, kernel_file("gated_mlp"), _gated_glue(hidden_act)))


@pytest.mark.parametrize("hidden_act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gated_mlp_wrong_variant_rejected(tmp_path, hidden_act):
    text = kernel_file("gated_mlp")
    wrong = mutate(mutate(text, "out[i] = a * u[i];", "out[i] = a * u[i] + (i % 64 == 5 ? a : 0.0f);"),
                   "kappa = 0.044715f", "kappa = 0.0447f")
    m = _gated_module("LlamaMLP", 256, torch.float32, hidden_act)
    x = make_input((2, 7, 256), torch.float32)
    assert_rejected_as_wrong(prove(tmp_path, m, x, wrong, _gated_glue(hidden_act)))


# ------------------------------------------------------------------ gelu_tanh

GLUE_GELU_TANH = "def forward(module, x):\n    return gelu_tanh(x)\n"


def _gelu_tanh_module(cls_name: str) -> torch.nn.Module:
    from transformers.activations import GELUTanh, NewGELUActivation

    if cls_name == "GELU":
        return torch.nn.GELU(approximate="tanh").eval()
    return {"NewGELUActivation": NewGELUActivation, "GELUTanh": GELUTanh}[cls_name]().eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, contiguous", SHAPES, ids=SHAPE_IDS)
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gelu_tanh_proven(tmp_path, shape, contiguous, dtype):
    m = _gelu_tanh_module("NewGELUActivation")
    assert_proven(prove(tmp_path, m, make_input(shape, dtype, contiguous), kernel_file("gelu_tanh"), GLUE_GELU_TANH))


@pytest.mark.parametrize("cls_name", ["GELUTanh", "GELU"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gelu_tanh_other_classes(tmp_path, cls_name, dtype):
    m = _gelu_tanh_module(cls_name)
    x = make_input((2, 9, 1000), dtype)
    assert_proven(prove(tmp_path, m, x, kernel_file("gelu_tanh"), GLUE_GELU_TANH))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gelu_tanh_wrong_variant_rejected(tmp_path):
    wrong = mutate(kernel_file("gelu_tanh"), "KAPPA = 0.044715f", "KAPPA = 0.0447f")
    m = _gelu_tanh_module("NewGELUActivation")
    x = make_input((2, 7, 256), torch.float32)
    assert_rejected_as_wrong(prove(tmp_path, m, x, wrong, GLUE_GELU_TANH))


# ------------------------------------------------------------------ gpt2_mlp

GLUE_GPT2 = ("def forward(module, x):\n    return gpt2_mlp(x, module.c_fc.weight, module.c_fc.bias, "
             "module.c_proj.weight, module.c_proj.bias)\n")


def _gpt2_module(hidden: int, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    torch.manual_seed(0)
    m = GPT2MLP(4 * hidden + 4, GPT2Config(n_embd=hidden, n_head=1))
    with torch.no_grad():  # GPT-2 initializes with std 0.02 and zero biases: give the biases values to add
        for p in m.parameters():
            p.normal_(0.0, 0.5 if p.ndim == 1 else 0.05)
    return m.eval().to(dtype)


def _gpt2_input(shape: tuple[int, ...], dtype: torch.dtype, contiguous: bool) -> torch.Tensor:
    if contiguous:
        return make_input(shape, dtype)
    # Conv1D views its input as [-1, hidden], which a transposed view refuses in eager: rows with a stride instead
    rows = 1
    for s in shape[:-1]:
        rows *= s
    torch.manual_seed(0)
    return torch.randn(rows, 2 * shape[-1]).to(dtype)[:, :shape[-1]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, contiguous", SHAPES, ids=SHAPE_IDS)
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gpt2_mlp_proven(tmp_path, shape, contiguous, dtype):
    m = _gpt2_module(shape[-1], dtype)
    assert_proven(prove(tmp_path, m, _gpt2_input(shape, dtype, contiguous), kernel_file("gpt2_mlp"), GLUE_GPT2))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_gpt2_mlp_wrong_variant_rejected(tmp_path):
    wrong = mutate(kernel_file("gpt2_mlp"), "KAPPA = 0.044715f", "KAPPA = 0.0447f")
    m = _gpt2_module(256, torch.float32)
    assert_rejected_as_wrong(prove(tmp_path, m, make_input((2, 7, 256), torch.float32), wrong, GLUE_GPT2))


# ------------------------------------------------------------------ linear_gelu

def _linear_gelu_glue(approximate: str) -> str:
    return ("def forward(module, x):\n    return linear_gelu(x, module.dense.weight, module.dense.bias, "
            f"{approximate!r})\n")


def _intermediate_module(kind: str, hidden: int, dtype: torch.dtype, hidden_act: str = "gelu") -> torch.nn.Module:
    from transformers import BertConfig, RobertaConfig
    from transformers.models.bert.modeling_bert import BertIntermediate
    from transformers.models.roberta.modeling_roberta import RobertaIntermediate

    torch.manual_seed(0)
    kw = {"hidden_size": hidden, "intermediate_size": 4 * hidden + 4, "num_attention_heads": 1,
          "hidden_act": hidden_act}
    m = BertIntermediate(BertConfig(**kw)) if kind == "BertIntermediate" else RobertaIntermediate(RobertaConfig(**kw))
    with torch.no_grad():
        m.dense.weight.normal_(0.0, 0.05)
        m.dense.bias.normal_(0.0, 0.5)
    return m.eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, contiguous", SHAPES, ids=SHAPE_IDS)
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_linear_gelu_proven(tmp_path, shape, contiguous, dtype):
    m = _intermediate_module("BertIntermediate", shape[-1], dtype)
    x = make_input(shape, dtype, contiguous)
    assert_proven(prove(tmp_path, m, x, kernel_file("linear_gelu"), _linear_gelu_glue("none")))


@pytest.mark.parametrize("kind, hidden_act, approximate", [("BertIntermediate", "gelu_pytorch_tanh", "tanh"),
                                                           ("RobertaIntermediate", "gelu", "none")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_linear_gelu_other_modules(tmp_path, kind, hidden_act, approximate, dtype):
    m = _intermediate_module(kind, 100, dtype, hidden_act)
    x = make_input((2, 9, 100), dtype, contiguous=False)
    assert_proven(prove(tmp_path, m, x, kernel_file("linear_gelu"), _linear_gelu_glue(approximate)))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_linear_gelu_wrong_variant_rejected(tmp_path):
    wrong = mutate(kernel_file("linear_gelu"), "kappa = 0.044715f", "kappa = 0.0447f")
    m = _intermediate_module("BertIntermediate", 256, torch.float32, "gelu_pytorch_tanh")
    x = make_input((2, 7, 256), torch.float32)
    assert_rejected_as_wrong(prove(tmp_path, m, x, wrong, _linear_gelu_glue("tanh")))


# ------------------------------------------------------------------ layer_norm

GLUE_LN = "def forward(module, x):\n    return layer_norm(x, module.weight, module.bias, module.eps)\n"


def _layer_norm(hidden: int, dtype: torch.dtype, param_dtype: torch.dtype | None = None) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.LayerNorm(hidden, eps=1e-5)
    with torch.no_grad():  # nn.LayerNorm starts at ones and zeros: give weight and bias values to apply
        m.weight.normal_(1.0, 0.3)
        m.bias.normal_(0.0, 0.3)
    return m.eval().to(param_dtype or dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, contiguous", SHAPES, ids=SHAPE_IDS)
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_layer_norm_proven(tmp_path, shape, contiguous, dtype):
    m = _layer_norm(shape[-1], dtype)
    assert_proven(prove(tmp_path, m, make_input(shape, dtype, contiguous), kernel_file("layer_norm"), GLUE_LN))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_layer_norm_gpt2_ln_and_float32_params_on_bf16(tmp_path):
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    ln = GPT2Block(GPT2Config(n_embd=96, n_head=4)).ln_2.eval()
    with torch.no_grad():
        ln.weight.normal_(1.0, 0.3)
    assert_proven(prove(tmp_path, ln, make_input((2, 7, 96), torch.float32), kernel_file("layer_norm"), GLUE_LN))
    m = _layer_norm(96, torch.bfloat16, torch.float32)  # eager's mixed-dtype LayerNorm: output in x's dtype
    assert_proven(prove(tmp_path, m, make_input((2, 7, 96), torch.bfloat16), kernel_file("layer_norm"), GLUE_LN))


@pytest.mark.needs_cxx
def test_layer_norm_is_exact_on_constant_rows_at_vits_eps():
    """eps 1e-6 (timm's ViT and DeiT, torchvision's ConvNeXt): a constant row's answer is the bias. Eager's
    x * rstd + (-mean * rstd), contracted by the compiler into one FMA, left -mean * rstd's rounding times 1e3
    (1e-4 off), so the proof's structured rows rejected the kernel on every such LayerNorm."""
    from metal_accel.backends import get_backend
    from metal_accel.sandbox.host import load_forward
    dim = 192
    m = torch.nn.LayerNorm(dim, eps=1e-6).eval()
    with torch.no_grad():
        m.weight.normal_(1.0, 0.3)
        m.bias.normal_(0.0, 0.3)
    x = torch.full((4, dim), 0.375)  # constants whose row sums are exact (the proof's all-equal rows are such)
    x[1], x[2], x[3] = -17.25, 3.0, 0.0
    cand = parse_candidate(kernel_file("layer_norm") + "\n\n" + GLUE_LN, "cpu", "layer_norm")
    forward = load_forward(cand.code, get_backend("cpu").compile(cand.source))
    with torch.inference_mode():
        got = forward(m, x)
    torch.testing.assert_close(got, m.bias.detach().expand(4, dim), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_layer_norm_wrong_variant_rejected(tmp_path, dtype):
    wrong = mutate(kernel_file("layer_norm"), "q / (float)dim + eps", "q / (float)(dim - 16) + eps")
    m = _layer_norm(256, dtype)
    assert_rejected_as_wrong(prove(tmp_path, m, make_input((2, 7, 256), dtype), wrong, GLUE_LN))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_layer_norm_rows_where_float32_moments_break_down():
    """Rows of huge values (squares overflow float32), constant rows (variance exactly 0) and constant rows of huge
    values (a float mean one ulp off would normalize to +-1; float64 gives the bias): the kernel gives float64's
    answer, in-process (eager's own float32 kernel gives NaN on some of them; a fresh-check's secret draw once
    rejected the Metal kernel on such a row)."""
    from metal_accel.backends import get_backend
    from metal_accel.sandbox.host import load_forward
    cand = parse_candidate(kernel_file("layer_norm") + "\n\n" + GLUE_LN, "cpu", "layer_norm")
    forward = load_forward(cand.code, get_backend("cpu").compile(cand.source))
    for D in (37, 64, 768):
        m = _layer_norm(D, torch.float32)
        x = torch.randn(7, D)
        big = torch.finfo(torch.float32).max / 4
        x[0, :5], x[1, :5], x[2], x[3, ::2] = big, -big, 2.75, 1e30
        x[4], x[5], x[6] = 1e20, -3e30, 5e14  # constant rows over 2^48
        want = torch.nn.functional.layer_norm(x.double(), (D,), m.weight.double(), m.bias.double(), m.eps)
        with torch.inference_mode():
            got = forward(m, x)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ linear_add_layer_norm

GLUE_ADD_LN = ("def forward(module, x, residual):\n    return linear_add_layer_norm(x, residual, module.dense.weight, "
               "module.dense.bias, module.LayerNorm.weight, module.LayerNorm.bias, module.LayerNorm.eps)\n")


def _bert_output(kind: str, hidden: int, dtype: torch.dtype, ln_dtype: torch.dtype | None = None) -> torch.nn.Module:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertOutput, BertSelfOutput

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=hidden, intermediate_size=2 * hidden + 6, num_attention_heads=1)
    m = BertOutput(cfg) if kind == "BertOutput" else BertSelfOutput(cfg)
    with torch.no_grad():
        m.dense.weight.normal_(0.0, 0.05)
        m.dense.bias.normal_(0.0, 0.5)
        m.LayerNorm.weight.normal_(1.0, 0.3)
        m.LayerNorm.bias.normal_(0.0, 0.3)
    m = m.eval().to(dtype)
    m.LayerNorm.to(ln_dtype or dtype)
    return m


def _residual_inputs(kind: str, shape: tuple[int, ...], dtype: torch.dtype,
                     contiguous: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    inner = 2 * shape[-1] + 6 if kind == "BertOutput" else shape[-1]
    x = make_input((*shape[:-1], inner), dtype, contiguous)
    torch.manual_seed(1)
    return x, torch.randn(shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, contiguous", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("kind", ["BertSelfOutput", "BertOutput"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_linear_add_layer_norm_proven(tmp_path, kind, shape, contiguous, dtype):
    if kind == "BertOutput" and shape != SHAPES[1][0]:
        pytest.skip("BertOutput runs the same host code: one shape of it")
    m = _bert_output(kind, shape[-1], dtype)
    inputs = _residual_inputs(kind, shape, dtype, contiguous)
    assert_proven(prove(tmp_path, m, inputs, kernel_file("linear_add_layer_norm"), GLUE_ADD_LN))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_linear_add_layer_norm_float32_norm_on_bf16(tmp_path):
    m = _bert_output("BertSelfOutput", 96, torch.bfloat16, torch.float32)
    inputs = _residual_inputs("BertSelfOutput", (2, 7, 96), torch.bfloat16)
    assert_proven(prove(tmp_path, m, inputs, kernel_file("linear_add_layer_norm"), GLUE_ADD_LN))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_linear_add_layer_norm_wrong_variant_rejected(tmp_path, dtype):
    # the residual left out of the last 1/8 of each row
    wrong = mutate(kernel_file("linear_add_layer_norm"), "st(h, i, ld(h, i) + ld(r, i));",
                   "st(h, i, ld(h, i) + (8 * i < 7 * dim ? ld(r, i) : 0.0f));")
    m = _bert_output("BertSelfOutput", 256, dtype)
    inputs = _residual_inputs("BertSelfOutput", (2, 7, 256), dtype)
    assert_rejected_as_wrong(prove(tmp_path, m, inputs, wrong, GLUE_ADD_LN))


# ------------------------------------------------------------------ dtypes no kernel serves

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
@pytest.mark.needs_cxx
def test_float16_falls_back_to_the_reference(tmp_path, family):
    """float16 runs each file's torch fallback: still judged correct against the module in float16."""
    dtype, hidden = torch.float16, 64
    if family == "rms_norm":
        m, glue = _rms_module("LlamaRMSNorm", hidden, dtype), GLUE_RMS
    elif family == "gated_mlp":
        m, glue = _gated_module("LlamaMLP", hidden, dtype), _gated_glue("silu")
    elif family == "gelu_tanh":
        m, glue = _gelu_tanh_module("NewGELUActivation").to(dtype), GLUE_GELU_TANH
    elif family == "gpt2_mlp":
        m, glue = _gpt2_module(hidden, dtype), GLUE_GPT2
    elif family == "layer_norm":
        m, glue = _layer_norm(hidden, dtype), GLUE_LN
    elif family == "linear_add_layer_norm":
        m = _bert_output("BertSelfOutput", hidden, dtype)
        x, r = make_input((2, 7, hidden), dtype), make_input((2, 7, hidden), dtype) * 0.5
        assert_proven(prove(tmp_path, m, (x, r), kernel_file(family), GLUE_ADD_LN))
        return
    else:
        m, glue = _intermediate_module("BertIntermediate", hidden, dtype), _linear_gelu_glue("none")
    assert_proven(prove(tmp_path, m, make_input((2, 7, hidden), dtype), kernel_file(family), glue))
