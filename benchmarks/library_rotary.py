"""Rotary embeddings: the library's rotary kernel against HF transformers' apply_rotary_pos_emb (Llama's), at
Llama-3.2-1B heads (32 query heads, 8 kv heads, head size 64), q and k laid out as HF's attention makes them.

    python benchmarks/library_rotary.py [--device cuda] [--dtypes fp32,bf16] [--shapes 1x1,4x1,1x128,4x512]
                                        [--record RUN]

Per dtype and (batch x positions), from an empty user cache: the pipeline's own decision for the call
(`library/routing.prove_module_call`: proof on this device with the "rope" sweep, then the speed gate, which
times the function against the kernel in interleaved pairs), as the router makes it at a model's first call of
that signature; a prefill verdict serves later prefill shapes of the signature (shape-generic), a decode step
(one position) is decided apart. Then, where the kernel was proven, the function and the kernel's op timed side
by side on the same inputs (median per-call time of interleaved rounds of 20 calls). `--record RUN` writes
docs/results/library/RUN.json (render with `python -m benchmarks.render`). Needs transformers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
HQ, HKV, D = 32, 8, 64
FUNCTION = "transformers.models.llama.modeling_llama.apply_rotary_pos_emb"


def side_by_side(a: Callable[[], Any], b: Callable[[], Any], sync: Callable[[], None], rounds: int = 30,
                 calls: int = 20) -> tuple[float, float]:
    """Median µs per call of A and of B, rounds interleaved (A first in even rounds, B first in odd ones)."""
    times: dict[int, list[float]] = {0: [], 1: []}
    for fn in (a, b):
        for _ in range(3):
            fn()
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            fn = (a, b)[i]
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            times[i].append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--shapes", default="1x1,4x1,1x128,4x512", help="batch x positions, comma-separated")
    ap.add_argument("--record", default="", help="write docs/results/library/RUN.json")
    args = ap.parse_args()
    os.environ.setdefault("METAL_ACCEL_USER_CACHE", tempfile.mkdtemp(prefix="rotary_bench_cache_"))
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers.models.llama import modeling_llama

    from metal_accel.backends import backend_for_device
    from metal_accel.library import rotary

    torch.manual_seed(0)
    backend = backend_for_device(args.device)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cases: list[dict[str, Any]] = []
    print(f"device: {backend.environment().device_name}")
    for short in args.dtypes.split(","):
        dtype = getattr(torch, DTYPES[short])
        for shape in args.shapes.split(","):
            B, S = map(int, shape.split("x"))
            q = torch.randn(B, S, HQ, D, dtype=dtype, device=device).transpose(1, 2)
            k = torch.randn(B, S, HKV, D, dtype=dtype, device=device).transpose(1, 2)
            c, s = torch.randn(1, S, D, dtype=dtype, device=device), torch.randn(1, S, D, dtype=dtype, device=device)
            t0 = time.perf_counter()
            op, rep = rotary.prove_module_call(rotary.RotaryApply(FUNCTION), (q, k, c, s), rotary.RotaryProvider(),
                                               f"rotary {shape}", backend)
            case: dict[str, Any] = {
                "class": "apply_rotary_pos_emb (Llama)", "family": "rotary", "dtype": short, "shape": [B, HQ, S, D],
                "status": rep.status, "proven": rep.status == "kernel" or any("not faster" in r for r in rep.rejected),
                "speedup": rep.speedup, "eager_us": rep.eager_us, "kernel_us": rep.kernel_us, "reason": rep.reason,
                "decide_s": round(time.perf_counter() - t0, 2)}
            if op is not None:
                with torch.inference_mode():
                    f_us, k_us = side_by_side(lambda: modeling_llama.apply_rotary_pos_emb(q, k, c, s),
                                              lambda: rotary.run_op(op, (q, k, c, s)), sync)
                case.update(direct_function_us=round(f_us, 2), direct_kernel_us=round(k_us, 2))
            cases.append(case)
            print(f"{short} {shape:>6}: {rep.status:6s} {rep.reason[:100]}"
                  + (f"  direct {case['direct_function_us']:.1f} / {case['direct_kernel_us']:.1f} us" if op else ""))
    if args.record:
        from benchmarks import results
        gpu = f"{backend.environment().device_name}; " if device.type != "cpu" else ""
        results.record("library", args.record, "python benchmarks/library_rotary.py " + " ".join(sys.argv[1:]),
                       {"cases": cases}, machine_text=gpu + results.machine())


if __name__ == "__main__":
    main()
