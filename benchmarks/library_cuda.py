"""Prove and time the shipped library's CUDA kernels (metal_accel/library/kernels/cuda/) on the real transformers
modules they serve, and measure the DRAM bandwidth the memory-bound ones reach against a copy.

    python benchmarks/library_cuda.py [--json out.json] [--deadline 240] [--only LlamaMLP,LayerNorm]
        [--dtypes fp32,bf16]
    python benchmarks/library_cuda.py --only ConvBnAct --no-bandwidth   # the CNN layers (conv_bn_act) alone

Each case is one module and input: optimize(backend="cuda") from an empty user cache, with the library as the
only provider, so the real matcher binds the module to its family, generates the glue, and the pipeline proves
(on several leading shapes: the glue says SHAPE_GENERIC = "rows"; conv_bn_act's, on other batch sizes) and times the shipped kernel against eager.
Per case the JSON holds the pipeline's verdict and per-call times (eager_us, kernel_us: latency of one call, as the
pipeline decides), a second check of the installed module on another number of rows, and throughput times of
eager and the kernel's forward called directly, back to back between two CUDA events (tp_eager_us, tp_kernel_us).
Modules called with a residual (BertSelfOutput, BertOutput: `module(hidden_states, input_tensor)`) get both
inputs, the residual of the output's width. The bandwidth rows time rms_norm, layer_norm and gelu_tanh at a large
shape (--rows x --width) against dst.copy_(src) of the input's size in the same run: bytes moved are the input,
output and weights once. Cases run in priority order and stop at --deadline seconds (what ran is written after
every case). Needs a CUDA GPU and transformers (the ConvBnAct cases build torchvision's Conv2dNormActivation
computation by hand: no torchvision needed).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def cases() -> list[tuple[str, str, Callable[[], Any], tuple[int, ...], tuple[int, ...]]]:
    """(label, dtype, make() -> module, input shape, second shape) in priority order: each family in bf16 first."""
    import torch
    from transformers import BertConfig, GPT2Config, LlamaConfig, T5Config, ViTConfig
    from transformers.activations import NewGELUActivation
    from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput, BertSelfOutput
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    from transformers.models.t5.modeling_t5 import T5DenseGatedActDense
    from transformers.models.vit.modeling_vit import ViTMLP

    llama = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4)

    def rms(weight_dtype: Any = None) -> Callable[[], Any]:
        def make() -> Any:
            m = LlamaRMSNorm(2048, eps=1e-6)
            with torch.no_grad():
                m.weight.normal_(1.0, 0.5)
            m.weight_dtype = weight_dtype  # read below (no attribute of the module's computation)
            return m
        return make

    def odd_rms() -> Any:
        m = LlamaRMSNorm(1001, eps=1e-5)
        with torch.no_grad():
            m.weight.normal_(1.0, 0.5)
        return m

    def vit(act: str) -> Callable[[], Any]:
        return lambda: ViTMLP(ViTConfig(hidden_size=768, intermediate_size=3072, hidden_act=act))

    def ln(width: int) -> Callable[[], Any]:
        def make() -> Any:
            m = torch.nn.LayerNorm(width, eps=1e-5)
            with torch.no_grad():  # nn.LayerNorm starts at ones and zeros: give weight and bias values to apply
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_(0.0, 0.3)
            return m
        return make

    def bert_out(cls: Any, hidden: int, inner: int) -> Callable[[], Any]:
        def make() -> Any:
            m = cls(BertConfig(hidden_size=hidden, intermediate_size=inner, num_attention_heads=hidden // 64))
            with torch.no_grad():
                m.LayerNorm.weight.normal_(1.0, 0.3)
                m.LayerNorm.bias.normal_(0.0, 0.3)
            m.residual_of = m.dense.in_features  # read below: called as m(x of this width, residual)
            return m
        return make

    gpt2 = lambda: GPT2MLP(3072, GPT2Config(n_embd=768, n_head=12))
    bert = lambda: BertIntermediate(BertConfig(hidden_size=768, intermediate_size=3072, hidden_act="gelu"))
    t5 = lambda: T5DenseGatedActDense(T5Config(d_model=512, d_ff=1024, dense_act_fn="gelu_new", dropout_rate=0.0))
    prefill, decode = (1, 512, 2048), (1, 1, 2048)
    out: list[tuple[str, str, Callable[[], Any], tuple[int, ...], tuple[int, ...]]] = []
    first = [("LlamaRMSNorm prefill", rms(), prefill, (3, 5, 2048)),
             ("LlamaMLP prefill", lambda: LlamaMLP(llama), prefill, (2, 3, 2048)),
             ("NewGELUActivation", NewGELUActivation, (8, 512, 3072), (3, 7, 3072)),
             ("GPT2MLP", gpt2, (8, 128, 768), (1, 3, 768)),
             ("BertIntermediate", bert, (8, 128, 768), (1, 3, 768)),
             ("ViTMLP gelu", vit("gelu"), (8, 197, 768), (1, 5, 768)),
             # layer_norm and linear_add_layer_norm (`--only LayerNorm` runs just these): BERT-base and a 1B-class width
             ("LayerNorm 768", ln(768), (8, 128, 768), (1, 3, 768)),
             ("LayerNorm 2048", ln(2048), (1, 512, 2048), (3, 5, 2048)),
             ("BertSelfOutput (add+LayerNorm) 768", bert_out(BertSelfOutput, 768, 3072), (8, 128, 768), (1, 3, 768)),
             ("BertOutput (add+LayerNorm) 768", bert_out(BertOutput, 768, 3072), (8, 128, 768), (1, 3, 768)),
             ("BertSelfOutput (add+LayerNorm) 2048", bert_out(BertSelfOutput, 2048, 8192), (1, 512, 2048),
              (3, 5, 2048))]
    for dtype in ("bf16", "fp32", "fp16"):
        out += [(label, dtype, make, shape, second) for label, make, shape, second in first]
    for dtype in ("bf16", "fp16", "fp32"):  # CNN layers: torchvision's Conv2dNormActivation computation
        out += [(label, dtype, make, shape, second) for label, make, shape, second in conv_cases()]
    if os.environ.get("LIBRARY_CUDA_SKIP"):  # labels@dtype already measured, e.g. by an earlier run
        done = set(os.environ["LIBRARY_CUDA_SKIP"].split(","))
        out = [c for c in out if f"{c[0]}@{c[1]}" not in done]
    out += [("LlamaRMSNorm decode", "bf16", rms(), decode, (1, 1, 2048)),
            ("LlamaMLP decode", "bf16", lambda: LlamaMLP(llama), decode, (1, 1, 2048)),
            ("LayerNorm decode", "bf16", ln(2048), decode, (1, 1, 2048)),
            ("BertSelfOutput (add+LayerNorm) decode", "bf16", bert_out(BertSelfOutput, 2048, 8192), decode,
             (1, 1, 2048)),
            ("LayerNorm width 1001", "fp32", ln(1001), (2, 7, 1001), (1, 1, 1001)),
            ("LlamaRMSNorm width 1001", "fp32", odd_rms, (2, 7, 1001), (1, 1, 1001)),
            ("NewGELUActivation odd", "fp16", NewGELUActivation, (3, 7, 1001), (1, 1, 1001)),
            ("LlamaRMSNorm fp32 weight", "bf16", rms(torch.float32), prefill, (2, 3, 2048)),
            ("T5DenseGatedActDense gelu_new", "fp32", t5, (4, 128, 512), (1, 3, 512)),
            ("ViTMLP gelu_pytorch_tanh", "bf16", vit("gelu_pytorch_tanh"), (8, 197, 768), (1, 5, 768)),
            ("ViTMLP relu", "fp16", vit("relu"), (8, 197, 768), (1, 5, 768))]
    return out


def conv_block(cin: int, cout: int, k: int, stride: int, groups: int, act: str, channels_last: bool = False
               ) -> Callable[[], Any]:
    """Sequential(Conv2d, BatchNorm2d[, act]) as torchvision's Conv2dNormActivation builds it (no torchvision
    needed), BatchNorm with random statistics; CHANNELS_LAST: module and input in that memory format."""
    import torch
    from torch import nn

    def make() -> Any:
        acts = {"relu": lambda: nn.ReLU(inplace=True), "hardswish": lambda: nn.Hardswish(inplace=True),
                "silu": lambda: nn.SiLU(inplace=True), "none": None}
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01)] + ([acts[act]()] if acts[act] else [])
        m = nn.Sequential(*layers)
        with torch.no_grad():
            m[1].running_var.uniform_(0.3, 2.0)
            m[1].running_mean.normal_(0.0, 0.5)
            m[1].weight.normal_(1.0, 0.3)
            m[1].bias.normal_(0.0, 0.3)
        if channels_last:
            m.channels_last = True  # read by run_case (no attribute of the module's computation)
        return m
    return make


def conv_cases() -> list[tuple[str, Callable[[], Any], tuple[int, ...], tuple[int, ...]]]:
    """MobileNetV3-Large's, EfficientNet-B0's and ResNet-50's Conv-BN-act layers at 224x224, batch 32 (and 1)."""
    return [("ConvBnAct mnv3 stem hswish", conv_block(3, 16, 3, 2, 1, "hardswish"), (32, 3, 224, 224), (1, 3, 224, 224)),
            ("ConvBnAct mnv3 expand 1x1 relu", conv_block(24, 72, 1, 1, 1, "relu"), (32, 24, 56, 56), (3, 24, 56, 56)),
            ("ConvBnAct mnv3 dw 3x3 relu", conv_block(72, 72, 3, 1, 72, "relu"), (32, 72, 56, 56), (1, 72, 56, 56)),
            ("ConvBnAct mnv3 dw 5x5 s2 hswish", conv_block(240, 240, 5, 2, 240, "hardswish"), (32, 240, 28, 28),
             (1, 240, 28, 28)),
            ("ConvBnAct mnv3 project 1x1", conv_block(240, 40, 1, 1, 1, "none"), (32, 240, 14, 14), (1, 240, 14, 14)),
            ("ConvBnAct effnet expand silu", conv_block(40, 240, 1, 1, 1, "silu"), (32, 40, 28, 28), (1, 40, 28, 28)),
            ("ConvBnAct resnet50 3x3 relu", conv_block(64, 64, 3, 1, 1, "relu"), (32, 64, 56, 56), (1, 64, 56, 56)),
            ("ConvBnAct resnet50 1x1 relu", conv_block(256, 128, 1, 1, 1, "relu"), (32, 256, 56, 56), (1, 256, 56, 56)),
            ("ConvBnAct resnet50 3x3 relu NHWC", conv_block(64, 64, 3, 1, 1, "relu", True), (32, 64, 56, 56),
             (1, 64, 56, 56)),
            ("ConvBnAct resnet50 l4 3x3 relu", conv_block(512, 512, 3, 1, 1, "relu"), (32, 512, 7, 7), (1, 512, 7, 7))]


def per_call_s(fn: Callable[[], Any], min_s: float = 0.05) -> float:
    """Seconds per call over back-to-back calls between two CUDA events (at least 10, about min_s in all)."""
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    reps = max(10, int(min_s / max(start.elapsed_time(end) / 1e3, 1e-6)))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def eager(module: Any) -> Callable[[Any], Any]:
    """MODULE's own eager forward: `import metal_accel` patches the library's classes, so a plain call may run
    the library's kernel (proven at that call) rather than eager."""
    import metal_accel

    def call(*t: Any) -> Any:
        with metal_accel.eager():
            return module(*t)
    return call


def rel_err(got: Any, want: Any) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def kernel_forward(module: Any, *x: Any) -> tuple[Callable[..., Any], str]:
    """The library's kernel for MODULE's call on X (its inputs) as the pipeline builds it (kernel file + the
    matcher's glue), compiled and loaded without a proof, as a function of the inputs; and the family's name."""
    from metal_accel.backends import get_backend
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.library.match import match_call
    from metal_accel.library.provider import kernel_file
    from metal_accel.proof.prove import kernels_only
    from metal_accel.runtime.ops import ModuleLayout
    from metal_accel.sandbox.host import load_forward
    found = match_call(module, x, {})
    if found is None:
        raise LookupError(f"{type(module).__name__} matched no family")
    text, _ = kernel_file("cuda", found.family)
    cand = parse_candidate(text + found.glue(), "cuda", f"library:{found.family}")
    forward = load_forward(cand.code, kernels_only(get_backend("cuda").compile(cand.source)))
    layout = ModuleLayout(module)
    view = layout.view(layout.gather())
    return (lambda *t: forward(view, *t)), found.family


def rms_sweep(module: Any, x: Any, want: Any, moved: int, copy_gbs: float) -> dict[str, float]:
    """rms_norm's vector kernel launched directly with 32..1024 threads a row: fraction of the copy's bandwidth."""
    import torch

    from metal_accel.backends import get_backend
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.library.kernels.cuda.rms_norm import ROW_PACKS
    from metal_accel.library.provider import kernel_file
    text, _ = kernel_file("cuda", "rms_norm")
    lib = get_backend("cuda").compile(parse_candidate(text + "\n\ndef forward(module, x):\n    return x\n", "cuda").source)
    kernel = lib.rms_vec_f32 if x.dtype == torch.float32 else lib.rms_vec_bf16
    rows, D = x.shape
    packs = D // (16 // x.element_size())
    y = torch.empty_like(x)
    out = {}
    for tpr in (32, 64, 128, 256, 512, 1024):
        if ROW_PACKS * tpr < packs:  # wider rows take the wide kernel
            continue
        rpb = max(1, 256 // tpr)
        launch = lambda: kernel(x, module.weight, y, rows, D, float(module.variance_epsilon),
                                grid=((rows + rpb - 1) // rpb,), block=(tpr, rpb))
        launch()
        if rel_err(y, want) > 1e-2:
            out[str(tpr)] = -1.0
            continue
        out[str(tpr)] = moved / per_call_s(launch, 0.1) / 1e9 / copy_gbs
    print(f"  rms_norm {x.dtype} threads a row -> fraction of copy: "
          + ", ".join(f"{k}: {v:.2f}" for k, v in out.items()), flush=True)
    return out


def bandwidth(rows: int, width: int) -> list[dict[str, Any]]:
    """rms_norm, layer_norm and gelu_tanh at ROWS x WIDTH (fp32, bf16) against a copy of the input's size."""
    import torch
    from transformers.activations import NewGELUActivation
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, width, device="cuda", dtype=dtype)
        dst = torch.empty_like(x)
        copy_s = per_call_s(lambda: dst.copy_(x), 0.2)
        copy_bytes = 2 * x.numel() * x.element_size()
        layer = torch.nn.LayerNorm(width).to("cuda", dtype)
        for label, module in (("rms_norm", LlamaRMSNorm(width).to("cuda", dtype)), ("layer_norm", layer),
                              ("gelu_tanh", NewGELUActivation())):
            module.eval()
            try:
                fn, _ = kernel_forward(module, x)
                ref = eager(module)
                with torch.inference_mode():
                    want = ref(x)
                    got = fn(x)
                    moved = 2 * x.numel() * x.element_size() + sum(p.numel() * p.element_size()
                                                                   for p in module.parameters())
                    eager_s = per_call_s(lambda: ref(x), 0.2)
                    kernel_s = per_call_s(lambda: fn(x), 0.2)
                row = {"kernel": label, "dtype": str(dtype).removeprefix("torch."), "shape": [rows, width],
                       "err": rel_err(got, want), "mbytes": moved / 1e6, "copy_gbs": copy_bytes / copy_s / 1e9,
                       "eager_us": eager_s * 1e6, "kernel_us": kernel_s * 1e6,
                       "eager_gbs": moved / eager_s / 1e9, "kernel_gbs": moved / kernel_s / 1e9}
                row["eager_frac"] = row["eager_gbs"] / row["copy_gbs"]
                row["kernel_frac"] = row["kernel_gbs"] / row["copy_gbs"]
                if label == "rms_norm":
                    row["threads_per_row"] = rms_sweep(module, x, want, moved, row["copy_gbs"])
                print(f"bandwidth {label} {row['dtype']} {rows}x{width}: copy {row['copy_gbs']:.0f} GB/s, kernel "
                      f"{row['kernel_gbs']:.0f} GB/s ({100 * row['kernel_frac']:.0f}%), eager {row['eager_gbs']:.0f} "
                      f"GB/s ({100 * row['eager_frac']:.0f}%), err {row['err']:.1e}", flush=True)
            except Exception as exc:  # one broken case is reported, the others still run
                row = {"kernel": label, "dtype": str(dtype), "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                print(f"bandwidth {label}: {row['error']}", flush=True)
            out.append(row)
    return out


def run_case(label: str, dtype_name: str, make: Callable[[], Any], shape: tuple[int, ...],
             second: tuple[int, ...], work: Path) -> dict[str, Any]:
    import torch

    import metal_accel
    dtype = getattr(torch, DTYPES[dtype_name])
    torch.manual_seed(0)
    module = make()
    weight_dtype = module.__dict__.pop("weight_dtype", None) or dtype
    fmt = torch.channels_last if module.__dict__.pop("channels_last", False) else torch.contiguous_format
    residual_of = module.__dict__.pop("residual_of", None)
    module = module.to("cuda", weight_dtype).to(memory_format=fmt).eval()

    def draw(s: tuple[int, ...]) -> tuple[Any, ...]:
        if residual_of is None:
            return (torch.randn(s, device="cuda", dtype=dtype).contiguous(memory_format=fmt),)
        return (torch.randn(*s[:-1], residual_of, device="cuda", dtype=dtype),
                torch.randn(s, device="cuda", dtype=dtype))
    x, x2 = draw(shape), draw(second)
    cls = type(module).__name__
    row: dict[str, Any] = {"case": label, "class": cls, "dtype": dtype_name, "shape": list(shape)}
    fn, row["family"] = kernel_forward(module, *x)  # outside inference mode: the matcher traces the module
    ref = eager(module)
    with torch.inference_mode():
        want2 = ref(*x2)
        direct_err = max(rel_err(fn(*x), ref(*x)), rel_err(fn(*x2), want2))
        row["tp_eager_us"] = per_call_s(lambda: ref(*x)) * 1e6
        row["tp_kernel_us"] = per_call_s(lambda: fn(*x)) * 1e6
    row["direct_err"] = direct_err
    os.environ["METAL_ACCEL_USER_CACHE"] = str(work / f"user_{label.replace(' ', '_')}_{dtype_name}")
    t0 = time.perf_counter()
    metal_accel.optimize(module, x, backend="cuda", compile=False, end_to_end=False, bench_budget_s=0.25,
                         progress=False)
    row["optimize_s"] = time.perf_counter() - t0
    reps = [m for m in metal_accel.explain(module).modules if m.module_class.endswith(cls)]
    if not reps:
        row["status"] = "no report"
        return row
    rep = reps[0]
    row.update(status=rep.status, source=rep.source, reason=rep.reason[:300], eager_us=rep.eager_us,
               kernel_us=rep.kernel_us, speedup=rep.speedup, rejected=[r[:400] for r in rep.rejected])
    # a candidate is timed only once proven correct: kernel_us set means proven; status "kernel" means also faster
    row["proven"] = rep.kernel_us is not None
    row["faster"] = rep.status == "kernel"
    with torch.inference_mode():
        row["installed_err_second_shape"] = rel_err(module(*x2), want2)
    return row


def machine() -> str:
    from metal_accel.backends.cuda.backend import describe
    d = describe()
    return (f"{d.get('gpu')} (compute capability {d.get('capability')}, {d.get('sms')} SMs, {d.get('memory_gib')} GiB), "
            f"driver {d.get('driver')} (CUDA {d.get('driver_cuda')}), torch {d.get('torch')}, NVRTC {d.get('nvrtc')} "
            f"via cuda-bindings {d.get('cuda_bindings')}; the device tool's nvidia-h100-x1 machine")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default="library_cuda.json")
    parser.add_argument("--deadline", type=float, default=240.0, help="seconds after which no case starts")
    parser.add_argument("--only", default="", help="run the cases whose label contains one of these (comma-separated)")
    parser.add_argument("--dtypes", default="fp32,fp16,bf16")
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--no-bandwidth", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="metal_accel_library_cuda_"))
    os.environ.setdefault("METAL_ACCEL_BUILD_DIR", str(work / "build"))  # each source compiled once for all cases
    os.environ["METAL_ACCEL_USER_CACHE"] = str(work / "user")
    import torch
    if not torch.cuda.is_available():
        sys.exit("library_cuda.py needs a CUDA GPU")
    result: dict[str, Any] = {"command": "python benchmarks/library_cuda.py " + " ".join(argv or sys.argv[1:]),
                              "machine": machine(), "date": datetime.date.today().isoformat(),
                              "bandwidth": [], "cases": []}

    def save() -> None:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if not args.no_bandwidth:
        result["bandwidth"] = bandwidth(args.rows, args.width)
        save()
    wanted = set(args.dtypes.split(","))
    print(f"{'case':<38} {'dtype':<5} {'status':<7} {'eager us':>9} {'kernel us':>10} {'speedup':>8} "
          f"{'tp eager':>9} {'tp kernel':>10} {'err':>8}  reason", flush=True)
    for label, dtype_name, make, shape, second in cases():
        if (args.only and not any(o and o in label for o in args.only.split(","))) or dtype_name not in wanted:
            continue
        if time.perf_counter() - start > args.deadline:
            result["cases"].append({"case": label, "dtype": dtype_name, "status": "not run (deadline)"})
            continue
        try:
            row = run_case(label, dtype_name, make, shape, second, work)
        except Exception as exc:  # one broken case is reported, the others still run
            row = {"case": label, "dtype": dtype_name, "status": "error",
                   "error": f"{type(exc).__name__}: {str(exc)[:600]}"}

        def f(v: Any, spec: str = ".1f") -> str:
            return "-" if v is None else format(v, spec)
        print(f"{label:<38} {dtype_name:<5} {row.get('status', '?'):<7} {f(row.get('eager_us')):>9} "
              f"{f(row.get('kernel_us')):>10} {f(row.get('speedup'), '.2f'):>8} {f(row.get('tp_eager_us')):>9} "
              f"{f(row.get('tp_kernel_us')):>10} {f(row.get('installed_err_second_shape'), '.1e'):>8}  "
              f"{(row.get('reason') or row.get('error') or '')[:120]}", flush=True)
        for r in row.get("rejected") or []:
            print(f"{'':<38} rejected: {r[:300]}", flush=True)
        result["cases"].append(row)
        save()
        torch.cuda.empty_cache()
    ran = [c for c in result["cases"] if "proven" in c]
    bad = [c for c in ran if not c["proven"]]
    slow = [(c["case"], c["dtype"]) for c in ran if c["proven"] and not c["faster"]]
    print(f"{len(ran)} case(s) ran, {len(bad)} not proven: {[(c['case'], c['dtype']) for c in bad]}; "
          f"proven but not faster (eager kept): {slow}")
    save()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
