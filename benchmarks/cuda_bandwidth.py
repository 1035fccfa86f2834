"""DRAM bandwidth reached by the memory-bound CUDA kernels, against a device-to-device copy in the same run.

    python benchmarks/cuda_bandwidth.py [--mb 512] [--json out.json] [--problems .kb/problems.jsonl] [--only L1_41 ...]
        [--variant L1_23_Softmax=path/to/other_kernel.py ...]

Kernels: the shipped blocks (kernels_src/cuda) and the level-1 KernelBench candidates
(benchmarks/candidates/cuda/L1_*), each at a size where its largest tensor is about --mb MB (the
KernelBench problems: batch_size halved from KernelBench's until it fits). Every kernel's output is
checked against eager first (torch.testing.assert_close); the pipeline's full proof runs in `bench`.

Times are of many back-to-back calls between two CUDA events, so the host's per-call cost overlaps
with the GPU's work: this is the kernels' throughput, not the latency of one call (bench measures that).
Bytes are the minimum a kernel must move: every input, output and parameter once.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from metal_accel.kernelbench.problem import tensor_bytes as nbytes

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "benchmarks" / "candidates" / "cuda"
BLOCK_SOURCES = ROOT / "kernels_src" / "cuda"
LEVEL1 = ("L1_23_Softmax", "L1_24_LogSoftmax", "L1_25_Swish", "L1_30_Softsign", "L1_36_RMSNorm_",
          "L1_38_L1Norm_", "L1_40_LayerNorm", "L1_41_Max_Pooling_1D", "L1_42_Max_Pooling_2D",
          "L1_44_Average_Pooling_1D", "L1_88_MinGPTNewGelu", "L1_89_cumsum", "L1_91_cumsum_reverse",
          "L1_92_cumsum_exclusive", "L1_93_masked_cumsum", "L1_94_MSELoss", "L1_96_HuberLoss", "L1_98_KLDivLoss",
          "L1_99_TripletMarginLoss")
BLOCKS = ("RMSNorm", "LayerNorm", "BiasGelu", "Softmax", "SiluMul", "Rotary")


def per_call_s(fn: Callable[[], Any], min_s: float = 0.2) -> float:
    """Seconds per call over back-to-back calls (at least 10, about min_s in all)."""
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


def copy_bandwidth(mb: float) -> float:
    """Bytes per second of dst.copy_(src) (read + write) for a tensor of `mb` MB."""
    src = torch.empty(int(mb * 1e6) // 4, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes(src) / per_call_s(lambda: dst.copy_(src))


def kernel_forward(path: Path) -> Callable[..., Any]:
    """A candidate file's host forward, with its kernels compiled (no proof: checked against eager below)."""
    from metal_accel.backends import get_backend
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.proof.prove import kernels_only
    from metal_accel.sandbox.host import load_forward
    cand = parse_candidate(path.read_text(), "cuda", str(path))
    return load_forward(cand.code, kernels_only(get_backend("cuda").compile(cand.source)))


def level1_cases(problems: Path, mb: float) -> list[tuple[str, torch.nn.Module, tuple, Path]]:
    from metal_accel.kernelbench.problems import load_problems
    from metal_accel.kernelbench.problem import fit_batch, problem_key
    cases = []
    for p in load_problems(problems, levels=[1]):
        key = problem_key(p)
        if key not in LEVEL1:
            continue
        _, batch = fit_batch(p, mb)
        model, inputs = p.instantiate("cuda", 0)
        cases.append((f"{key} (batch {batch})", model, inputs, CANDIDATES / f"{key}.py"))
    return cases


def block_cases(mb: float) -> list[tuple[str, torch.nn.Module, tuple, Path]]:
    from metal_accel import blocks
    rows = max(1, int(mb * 1e6 / 4 / 4096))
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).cuda()
    hidden = max(1, int(mb * 1e6 / 4 / 11008))
    seq = max(1, int(mb * 1e6 / 4 / (32 * 128)))
    made = {
        "RMSNorm": (blocks._randomize(blocks.RMSNorm(4096)), (randn(rows, 4096),), f"{rows}x4096"),
        "LayerNorm": (blocks._randomize(blocks.LayerNorm(4096)), (randn(rows, 4096),), f"{rows}x4096"),
        "BiasGelu": (blocks._randomize(blocks.BiasGelu(4096)), (randn(rows, 4096),), f"{rows}x4096"),
        "Softmax": (blocks.Softmax(), (randn(rows, 4096),), f"{rows}x4096"),
        "SiluMul": (blocks.SiluMul(), (randn(hidden, 11008), randn(hidden, 11008)), f"{hidden}x11008"),
        "Rotary": (blocks.Rotary(), (randn(1, 32, seq, 128), randn(seq, 128), randn(seq, 128)), f"1x32x{seq}x128"),
    }
    return [(f"{name} {made[name][2]}", made[name][0].cuda().eval(), made[name][1], BLOCK_SOURCES / f"{name}.py")
            for name in BLOCKS]


def measure(name: str, model: torch.nn.Module, inputs: tuple, path: Path, copy_bps: float) -> dict[str, Any]:
    from metal_accel.runtime.ops import ModuleLayout
    forward = kernel_forward(path)
    layout = ModuleLayout(model)
    view = layout.view(layout.gather())
    with torch.inference_mode():
        expect = model(*inputs)
        got = forward(view, *inputs)
        torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-5)
        moved = nbytes(inputs) + nbytes(expect) + sum(nbytes(t) for t in model.state_dict().values())
        eager_s = per_call_s(lambda: model(*inputs))
        kernel_s = per_call_s(lambda: forward(view, *inputs))
    row = {"kernel": name, "file": str(path.relative_to(ROOT)), "mbytes": moved / 1e6,
           "eager_us": eager_s * 1e6, "kernel_us": kernel_s * 1e6,
           "eager_gbs": moved / eager_s / 1e9, "kernel_gbs": moved / kernel_s / 1e9,
           "eager_frac": moved / eager_s / copy_bps, "kernel_frac": moved / kernel_s / copy_bps}
    del expect, got
    return row


def with_variants(cases: list[tuple[str, torch.nn.Module, tuple, Path]],
                  variants: list[str]) -> list[tuple[str, torch.nn.Module, tuple, Path]]:
    """Each case followed by its variants (NAME=FILE: the case named NAME... run with FILE's kernel)."""
    pairs = [spec.partition("=") for spec in variants]
    bad = [key for key, sep, _ in pairs if not sep]
    if bad:
        sys.exit(f"--variant takes NAME=FILE, got {bad[0]!r}")
    out = []
    for name, model, inputs, path in cases:
        out.append((name, model, inputs, path))
        out += [(f"{name} [{Path(file).stem}]", model, inputs, Path(file).resolve())
                for key, _, file in pairs if name.startswith(key)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=512.0, help="size of each case's largest tensor, MB")
    ap.add_argument("--problems", default=str(ROOT / ".kb" / "problems.jsonl"))
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", nargs="*", default=[], help="time only the kernels whose name contains one of these")
    ap.add_argument("--variant", nargs="*", default=[], metavar="NAME=FILE",
                    help="also time FILE (a candidate file) on the case whose name starts with NAME, side by side")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_bandwidth.py needs a CUDA GPU")
    copy_bps = copy_bandwidth(args.mb)
    print(f"{torch.cuda.get_device_name()}: device-to-device copy of {args.mb:g} MB: {copy_bps / 1e9:.0f} GB/s")
    print("| kernel | MB moved | eager us | kernel us | eager % of copy | kernel % of copy |")
    print("|---|---|---|---|---|---|")
    rows = []
    cases = block_cases(args.mb)
    if Path(args.problems).is_file():
        cases += level1_cases(Path(args.problems), args.mb)
    if args.only:
        cases = [c for c in cases if any(word in c[0] for word in args.only)]
    cases = with_variants(cases, args.variant)
    for name, model, inputs, path in cases:
        try:
            row = measure(name, model, inputs, path, copy_bps)
        except Exception as exc:  # one broken case is reported, the others still run
            row = {"kernel": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"| {name} | error: {row['error']} |||||", flush=True)
        else:
            print(f"| {name} | {row['mbytes']:.0f} | {row['eager_us']:.1f} | {row['kernel_us']:.1f} | "
                  f"{100 * row['eager_frac']:.0f}% | {100 * row['kernel_frac']:.0f}% |", flush=True)
        rows.append(row)
        del model, inputs
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "mb": args.mb,
                                               "copy_gbs": copy_bps / 1e9, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
