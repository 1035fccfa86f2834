"""Prove and time the shipped library's Metal kernels (metal_accel/library/kernels/mps/) on the real transformers
modules they serve: eager vs kernel, per module, shape and dtype.

    python benchmarks/library_mps.py                                  # on a Mac: proves and times on MPS
    python benchmarks/library_mps.py --device cpu --backend mps-emu --small --dtypes fp32   # smoke run, any OS

Each module is optimize()d alone, from an empty temporary user cache, with the library's kernel file plus the
glue the library appends as its only candidate (a `dir:` provider), so what runs is exactly the shipped kernel.
On MPS the proof measures eager and the kernel on the device and keeps the kernel only where it is correct and
faster; the table prints those timings. The emulator (mps-emu) proves correctness only: its rows say so and
carry no time. Needs `transformers`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "metal_accel" / "library" / "kernels" / "mps"
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _modules() -> list[tuple[str, str, str, Callable[[bool], Any], Callable[[bool], tuple[int, ...]]]]:
    """(label, family, glue body, make(small) -> module, shape(small) -> input shape, or the shapes of x and the
    residual for a two-input family) for every case."""
    from transformers import BertConfig, GPT2Config, LlamaConfig
    from transformers.activations import NewGELUActivation
    import torch
    from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput, BertSelfOutput
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    def llama(small: bool) -> LlamaConfig:  # a 1B-class Llama (TinyLlama's widths) or a toy one
        h, i = (64, 100) if small else (2048, 5632)
        return LlamaConfig(hidden_size=h, intermediate_size=i, num_attention_heads=1 if small else 32,
                           num_key_value_heads=1 if small else 4)

    def rows(small: bool, prefill: bool, width: int) -> tuple[int, ...]:
        return (1, (7 if small else 512) if prefill else 1, width)

    def layer_norm(width: int) -> Any:
        m = torch.nn.LayerNorm(width)
        with torch.no_grad():  # nn.LayerNorm starts at ones and zeros: give weight and bias values to apply
            m.weight.normal_(1.0, 0.3)
            m.bias.normal_(0.0, 0.3)
        return m

    def bert(cls: Any, small: bool) -> Any:
        return cls(BertConfig(hidden_size=40 if small else 768, intermediate_size=100 if small else 3072,
                              num_attention_heads=1 if small else 12))

    def residual(small: bool, inner: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        lead = (2, 7) if small else (8, 128)
        return (*lead, inner), (*lead, 40 if small else 768)

    add_ln = ("return linear_add_layer_norm(x, residual, module.dense.weight, module.dense.bias, "
              "module.LayerNorm.weight, module.LayerNorm.bias, module.LayerNorm.eps)")
    norm = "return rms_norm(x, module.weight, module.variance_epsilon)"
    mlp = ("return gated_mlp(x, module.gate_proj.weight, module.up_proj.weight, module.down_proj.weight, "
           "'silu')")
    return [
        ("LlamaRMSNorm prefill", "rms_norm", norm, lambda s: LlamaRMSNorm(llama(s).hidden_size),
         lambda s: rows(s, True, llama(s).hidden_size)),
        ("LlamaRMSNorm decode", "rms_norm", norm, lambda s: LlamaRMSNorm(llama(s).hidden_size),
         lambda s: rows(s, False, llama(s).hidden_size)),
        ("Qwen2RMSNorm prefill", "rms_norm", norm, lambda s: Qwen2RMSNorm(72 if s else 1536),
         lambda s: rows(s, True, 72 if s else 1536)),
        ("LlamaMLP prefill", "gated_mlp", mlp, lambda s: LlamaMLP(llama(s)),
         lambda s: rows(s, True, llama(s).hidden_size)),
        ("LlamaMLP decode", "gated_mlp", mlp, lambda s: LlamaMLP(llama(s)),
         lambda s: rows(s, False, llama(s).hidden_size)),
        ("NewGELUActivation", "gelu_tanh", "return gelu_tanh(x)", lambda s: NewGELUActivation(),
         lambda s: rows(s, True, 100 if s else 3072)),
        ("GPT2MLP", "gpt2_mlp",
         "return gpt2_mlp(x, module.c_fc.weight, module.c_fc.bias, module.c_proj.weight, module.c_proj.bias)",
         lambda s: GPT2MLP(4 * (40 if s else 768), GPT2Config(n_embd=40 if s else 768, n_head=1 if s else 12)),
         lambda s: rows(s, True, 40 if s else 768)),
        ("BertIntermediate", "linear_gelu",
         "return linear_gelu(x, module.dense.weight, module.dense.bias, 'none')",
         lambda s: BertIntermediate(BertConfig(hidden_size=40 if s else 768, intermediate_size=100 if s else 3072,
                                               num_attention_heads=1 if s else 12, hidden_act="gelu")),
         lambda s: (2, 7, 40) if s else (8, 128, 768)),
        ("LayerNorm", "layer_norm", "return layer_norm(x, module.weight, module.bias, module.eps)",
         lambda s: layer_norm(72 if s else 768), lambda s: (2, 7, 72) if s else (8, 128, 768)),
        ("LayerNorm 2048", "layer_norm", "return layer_norm(x, module.weight, module.bias, module.eps)",
         lambda s: layer_norm(64 if s else 2048), lambda s: rows(s, True, 64 if s else 2048)),
        ("BertSelfOutput", "linear_add_layer_norm", add_ln, lambda s: bert(BertSelfOutput, s),
         lambda s: residual(s, 40 if s else 768)),
        ("BertOutput", "linear_add_layer_norm", add_ln, lambda s: bert(BertOutput, s),
         lambda s: residual(s, 100 if s else 3072)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="mps", help="where modules and inputs live (default mps)")
    parser.add_argument("--backend", default=None, help="default: the device's (mps); mps-emu for the emulator")
    parser.add_argument("--dtypes", default="fp32,fp16,bf16", help="comma-separated of fp32, fp16, bf16")
    parser.add_argument("--small", action="store_true", help="toy widths and 7 tokens (for the emulator)")
    parser.add_argument("--only", default="", help="run the cases whose label contains this")
    args = parser.parse_args(argv)
    os.environ.setdefault("METAL_ACCEL_USER_CACHE", tempfile.mkdtemp(prefix="metal_accel_library_mps_"))
    import torch

    import metal_accel
    from metal_accel.backends import get_backend

    backend = args.backend or ("mps" if args.device == "mps" else None)
    if backend is None:
        parser.error("--backend is needed off MPS (e.g. --device cpu --backend mps-emu)")
    timed = get_backend(backend).measures_speed  # the emulator's timings are the CPU's: none are printed
    cand_dir = Path(tempfile.mkdtemp(prefix="metal_accel_library_cands_"))
    os.environ.setdefault("METAL_ACCEL_BUILD_DIR", str(cand_dir / "build"))  # one build for all cases
    print(f"backend {backend} on {args.device}; candidates from {KERNELS}")
    print(f"{'module':<22} {'input':<22} {'dtype':<9} {'status':<7} {'eager us':>9} {'kernel us':>10} "
          f"{'speedup':>8}  reason")
    failures = 0
    for label, family, glue, make, shape_of in _modules():
        if args.only and args.only not in label:
            continue
        for name in args.dtypes.split(","):
            dtype = getattr(torch, DTYPES[name.strip()])
            torch.manual_seed(0)
            module = make(args.small).to(args.device, dtype).eval()
            shape = shape_of(args.small)
            shapes = shape if isinstance(shape[0], tuple) else (shape,)  # x, or x and the residual
            xs = tuple(torch.randn(sh, device=args.device, dtype=dtype) for sh in shapes)
            x = xs[0]
            cls = type(module).__name__
            case = cand_dir / f"{label.replace(' ', '_')}-{name}"
            (case / backend).mkdir(parents=True)
            text = (KERNELS / f"{family}.py").read_text()
            inputs = "x, residual" if len(xs) == 2 else "x"
            (case / backend / f"{cls}.py").write_text(f"{text}\n\ndef forward(module, {inputs}):\n    {glue}\n")
            os.environ["METAL_ACCEL_USER_CACHE"] = str(case / "user_cache")  # each case proven afresh
            metal_accel.optimize(module, xs, backend=backend, providers=[f"dir:{case}"], progress=False)
            (rep,) = [m for m in metal_accel.explain(module).modules if m.module_class.endswith(cls)]
            correct = rep.status == "kernel" or rep.kernel_us is not None  # timed only once proven correct
            failures += 0 if correct else 1

            def us(v: float | None) -> str:
                return "-" if v is None else f"{v:.1f}"
            speed = "-" if rep.speedup is None else f"{rep.speedup:.2f}x"
            print(f"{label:<22} {str(tuple(x.shape)):<22} {name:<9} {rep.status:<7} {us(rep.eager_us if timed else None):>9} "
                  f"{us(rep.kernel_us):>10} {speed:>8}  {rep.reason[:90]}")
            for r in rep.rejected:
                print(f"{'':<22} rejected: {r[:200]}")
    print(f"{failures} case(s) not proven correct" if failures else "every case proven correct")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
