"""Shipped CPU library kernels (metal_accel/library/kernels/cpu) against the real modules' eager forward.

    METAL_ACCEL_TRUST_NATIVE=1 python benchmarks/library_cpu.py [--out library_cpu.json] [--family rms_norm ...]
        [--hidden 256 ...] [--seq 128 ...] [--dtype float32 bfloat16] [--budget 2.0] [--threads N] [--batch 1 ...]

Each family's kernel file plus the glue the library appends is compiled and run in process (as a shipped
kernel runs), on a transformers module at realistic shapes; eager and kernel are timed in interleaved
pairs on rotating inputs (proof/speed.compare_speed, margin 0: the figures, not a verdict). Outputs are
checked against eager first. Writes JSON: command, machine, date, and per case eager/kernel us and ratio.
Not rendered into docs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's metal_accel, not an installed one
KERNELS = ROOT / "metal_accel" / "library" / "kernels" / "cpu"

# family -> the glue the library appends for the modules benchmarked here
GLUE = {
    "rms_norm": "def forward(module, x):\n    return rms_norm(x, module.weight, module.variance_epsilon)\n",
    "gated_mlp": ("def forward(module, x):\n    return gated_mlp(x, module.gate_proj.weight, module.up_proj.weight, "
                  "module.down_proj.weight, ACT)\n"),
    "gelu_tanh": "def forward(module, x):\n    return gelu_tanh(x)\n",
    "gpt2_mlp": ("def forward(module, x):\n    return gpt2_mlp(x, module.c_fc.weight, module.c_fc.bias, "
                 "module.c_proj.weight, module.c_proj.bias)\n"),
    "linear_gelu": ("def forward(module, x):\n    return linear_gelu(x, module.dense.weight, module.dense.bias, "
                    "'none')\n"),
    "layer_norm": "def forward(module, x):\n    return layer_norm(x, module.weight, module.bias, module.eps)\n",
    "linear_add_layer_norm": ("def forward(module, x, residual):\n    return linear_add_layer_norm(x, residual, "
                              "module.dense.weight, module.dense.bias, module.LayerNorm.weight, module.LayerNorm.bias, "
                              "module.LayerNorm.eps)\n"),
}
# families whose call takes a residual of the output's width besides x (the module's second argument)
RESIDUAL = {"linear_add_layer_norm"}

# realistic sizes per family: a prefill of 128 tokens; MLPs also one decode token (GEMV-bound)
HIDDEN = {"rms_norm": [256, 1024, 2048], "gated_mlp": [256, 512, 1024], "gelu_tanh": [1024, 4096, 8192],
          "gpt2_mlp": [256, 512, 1024], "linear_gelu": [256, 512, 1024], "layer_norm": [768, 2048],
          "linear_add_layer_norm": [768, 2048]}
SEQ = {"rms_norm": [1, 128], "gated_mlp": [1, 128], "gelu_tanh": [128], "gpt2_mlp": [1, 128], "linear_gelu": [1, 128],
       "layer_norm": [1, 128], "linear_add_layer_norm": [1, 128]}

# conv_bn_act: (label, in, out, kernel, stride, groups, activation, input H = W) of MobileNetV3-Large's,
# EfficientNet-B0's and ResNet-50's Conv-BN-act layers at 224x224; its glue is the library's own (match_call)
CONV_CASES = [("mnv3 stem", 3, 16, 3, 2, 1, "hardswish", 224), ("mnv3 expand 1x1", 24, 72, 1, 1, 1, "relu", 56),
              ("mnv3 dw 3x3", 72, 72, 3, 1, 72, "relu", 56), ("mnv3 dw 5x5 s2", 240, 240, 5, 2, 240, "hardswish", 28),
              ("mnv3 project 1x1", 240, 40, 1, 1, 1, "none", 14), ("effnet expand 1x1", 40, 240, 1, 1, 1, "silu", 28),
              ("resnet50 3x3", 64, 64, 3, 1, 1, "relu", 56), ("resnet50 1x1", 256, 128, 1, 1, 1, "relu", 56),
              ("resnet50 3x3 l3", 256, 256, 3, 1, 1, "relu", 14)]


def modules(family: str, hidden: int, dtype: Any) -> list[tuple[str, Any, str]]:
    """(label, module, glue) for FAMILY at hidden size HIDDEN."""
    import torch
    from transformers import BertConfig, GPT2Config, LlamaConfig
    from transformers.activations import GELUTanh, NewGELUActivation
    from transformers.models.bert.modeling_bert import BertIntermediate
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    torch.manual_seed(0)
    glue = GLUE[family]
    if family == "rms_norm":
        m = LlamaRMSNorm(hidden)
        with torch.no_grad():
            m.weight.normal_(1.0, 0.1)
        out = [("LlamaRMSNorm", m, glue)]
    elif family == "gated_mlp":
        out = []
        for act, name in (("silu", "silu"), ("gelu_pytorch_tanh", "gelu_tanh")):
            cfg = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, hidden_act=act)
            out.append((f"LlamaMLP[{act}]", LlamaMLP(cfg), glue.replace("ACT", repr(name))))
    elif family == "gelu_tanh":
        out = [("NewGELUActivation", NewGELUActivation(), glue), ("GELUTanh", GELUTanh(), glue)]
    elif family == "gpt2_mlp":
        cfg = GPT2Config(n_embd=hidden)
        out = [("GPT2MLP", GPT2MLP(4 * hidden, cfg), glue)]
    elif family == "layer_norm":
        m = torch.nn.LayerNorm(hidden)
        with torch.no_grad():
            m.weight.normal_(1.0, 0.1)
            m.bias.normal_(0.0, 0.1)
        out = [("LayerNorm", m, glue)]
    elif family == "linear_add_layer_norm":
        from transformers.models.bert.modeling_bert import BertOutput, BertSelfOutput
        cfg = BertConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=1)
        out = [("BertSelfOutput", BertSelfOutput(cfg), glue), ("BertOutput", BertOutput(cfg), glue)]
    else:
        out = []
        for act, approximate in (("gelu", "none"), ("gelu_pytorch_tanh", "tanh")):
            cfg = BertConfig(hidden_size=hidden, intermediate_size=4 * hidden, hidden_act=act)
            out.append((f"BertIntermediate[{act}]", BertIntermediate(cfg), glue.replace("'none'", repr(approximate))))
    return [(label, m.eval().to(dtype), g) for label, m, g in out]


def conv_modules(dtype: Any) -> list[tuple[str, Any, tuple[int, ...]]]:
    """(label, Sequential(Conv2d, BatchNorm2d[, act]) as torchvision's Conv2dNormActivation, input shape after the
    batch) for CONV_CASES, BatchNorm with random statistics."""
    import torch
    from torch import nn

    acts = {"relu": lambda: nn.ReLU(inplace=True), "hardswish": lambda: nn.Hardswish(inplace=True),
            "silu": lambda: nn.SiLU(inplace=True), "none": None}
    torch.manual_seed(0)
    out = []
    for label, cin, cout, k, stride, groups, act, hw in CONV_CASES:
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01)] + ([acts[act]()] if acts[act] else [])
        m = nn.Sequential(*layers)
        with torch.no_grad():
            m[1].running_var.uniform_(0.3, 2.0)
            m[1].running_mean.normal_(0.0, 0.5)
            m[1].weight.normal_(1.0, 0.3)
            m[1].bias.normal_(0.0, 0.3)
        out.append((f"{label}[{act}]", m.eval().to(dtype), (cin, hw, hw)))
    return out


def library_glue(module: Any, inputs: tuple) -> str:
    """The glue the library itself generates for MODULE on INPUTS (its match, by traced computation)."""
    from metal_accel.library.match import match_call
    found = match_call(module, tuple(inputs), {})
    if found is None:
        raise SystemExit(f"{type(module).__name__} did not match a library family")
    return found.glue()


def kernel_forward(family: str, glue: str) -> Callable[..., Any]:
    """forward(module, x[, residual]) of the family's kernel file with GLUE, compiled and loaded in this process."""
    from metal_accel.backends import get_backend
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.sandbox.host import load_forward

    cand = parse_candidate((KERNELS / f"{family}.py").read_text() + "\n\n" + glue, "cpu", family)
    return load_forward(cand.code, get_backend("cpu").compile(cand.source))


def bench_case(family: str, label: str, module: Any, glue: str, shape: tuple[int, ...], dtype: Any,
               budget_s: float) -> dict[str, Any]:
    import torch

    import metal_accel
    from metal_accel.proof.speed import compare_speed

    from metal_accel.runtime.ops import ModuleLayout

    gen = torch.Generator().manual_seed(1)
    width = module.dense.in_features if family in RESIDUAL else shape[-1]  # BertOutput: x is the intermediate's

    def draw() -> tuple:
        x = torch.randn(*shape[:-1], width, generator=gen).to(dtype)
        return (x, torch.randn(shape, generator=gen).to(dtype)) if family in RESIDUAL else (x,)
    inputs = [(draw(), {}) for _ in range(4)]
    fwd = kernel_forward(family, glue or library_glue(module, inputs[0][0]))
    layout = ModuleLayout(module)
    view = layout.view(layout.gather())  # what an installed kernel's host code gets as `module` (kept while unchanged)

    def eager(*xs: Any) -> Any:
        with metal_accel.eager():
            return module(*xs)

    def kernel(*xs: Any) -> Any:
        return fwd(view, *xs)

    with torch.inference_mode():
        xs, _ = inputs[0]
        ref, got = eager(*xs), kernel(*xs)
        err = ((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
        t0 = time.perf_counter()
        for _ in range(3):
            eager(*xs)
        per_call = (time.perf_counter() - t0) / 3
        pairs = int(max(30, min(200, budget_s / (2 * per_call))))  # slow calls (big GEMMs): fewer pairs
        r = compare_speed(eager, kernel, inputs, margin=0.0, min_reps=pairs, max_reps=2000, budget_s=budget_s)
    row = {"family": family, "module": label, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
           "eager_us": round(r.eager_us, 2), "kernel_us": round(r.kernel_us, 2),
           "ratio": round(r.eager_us / r.kernel_us, 3), "pairs": r.reps, "rel_err_vs_eager": err}
    print(f"{family:12s} {label:28s} {str(tuple(shape)):16s} {row['dtype']:9s} eager {r.eager_us:9.1f} us  "
          f"kernel {r.kernel_us:9.1f} us  {row['ratio']:.2f}x  ({r.reps} pairs, rel err {err:.1e})", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="library_cpu.json")
    parser.add_argument("--family", nargs="*", default=[*GLUE, "conv_bn_act"])
    parser.add_argument("--batch", nargs="*", type=int, default=[1], help="conv_bn_act's batch sizes")
    parser.add_argument("--hidden", nargs="*", type=int, default=None,
                        help="hidden sizes (default per family: HIDDEN; gelu_tanh's is the MLP's 4 * hidden)")
    parser.add_argument("--seq", nargs="*", type=int, default=None, help="sequence lengths (default per family: SEQ)")
    parser.add_argument("--dtype", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing per case")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (kernels share torch's OpenMP runtime, so theirs too)")
    args = parser.parse_args()
    os.environ.setdefault("METAL_ACCEL_USER_CACHE", tempfile.mkdtemp(prefix="metal_accel_libbench_"))
    if os.environ.get("METAL_ACCEL_TRUST_NATIVE") != "1":
        print("note: METAL_ACCEL_TRUST_NATIVE is not 1; kernels are loaded in process here regardless")
    import torch

    from metal_accel.backends.cpu.backend import cpu_name

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for family in args.family:
        if family == "conv_bn_act":
            for dname in args.dtype:
                for label, module, chw in conv_modules(getattr(torch, dname)):
                    for batch in args.batch:
                        rows.append(bench_case(family, label, module, "", (batch, *chw), getattr(torch, dname),
                                               args.budget))
            continue
        for hidden in args.hidden or HIDDEN[family]:
            for dname in args.dtype:
                dtype = getattr(torch, dname)
                for label, module, glue in modules(family, hidden, dtype):
                    for seq in args.seq or SEQ[family]:
                        rows.append(bench_case(family, label, module, glue, (1, seq, hidden), dtype, args.budget))
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                          "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
