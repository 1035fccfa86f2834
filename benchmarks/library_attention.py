"""Decode attention (one query over a KV cache, grouped-query heads): the library's attention_decode kernel against
HF transformers' sdpa_attention_forward, at Llama-3.2-1B shapes (32 query heads, 8 kv heads, head size 64).

    python benchmarks/library_attention.py [--device cuda] [--dtypes bf16,fp16,fp32] [--kv 128,512,1024,4096]
                                           [--batches 1,8] [--json out.json]

Per dtype: first the pipeline's own decision (prove_call: proof on this device at batch 1, kv 512 plus the
shape-generic sweep, then the speed gate, from an empty user cache), then for every (batch, kv length) the
kernel's host forward and sdpa_attention_forward timed back to back on the same inputs (CUDA: CUDA events, the
median of 20 rounds of 50 calls; CPU: the calling thread's CPU time, the best of 20 rounds, since the CPU
machines this runs on are shared), with the largest difference between the two outputs. Needs transformers.
"""
from __future__ import annotations

import argparse
import json
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


def timer(device: str) -> Callable[[Callable[[], Any]], float]:
    import torch

    def cuda_time(fn: Callable[[], Any]) -> float:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        rounds = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                fn()
            end.record()
            end.synchronize()
            rounds.append(start.elapsed_time(end) * 1e3 / 50)
        return statistics.median(rounds)

    def cpu_time(fn: Callable[[], Any]) -> float:
        for _ in range(3):
            fn()
        best = float("inf")
        for _ in range(20):
            t0 = time.thread_time()
            for _ in range(10):
                fn()
            best = min(best, (time.thread_time() - t0) * 1e6 / 10)
        return best
    return cuda_time if device == "cuda" else cpu_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--kv", default="128,512,1024,4096")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    os.environ.setdefault("METAL_ACCEL_USER_CACHE", tempfile.mkdtemp(prefix="attn_bench_cache_"))
    sys.path.insert(0, str(ROOT))
    import torch

    from metal_accel.backends import backend_for_device
    from metal_accel.library.attention import SdpaAttention, direct_forward, prove_call, sdpa_reference
    from metal_accel.runtime.ops import ModuleLayout

    torch.manual_seed(0)
    backend = backend_for_device(args.device)
    device = torch.device(args.device)
    sdpa = sdpa_reference()
    module = SdpaAttention(D ** -0.5, HQ // HKV)
    view = ModuleLayout(module).view([])
    fwd = None
    clock = timer(device.type)
    results: list[dict[str, Any]] = []
    print(f"device: {backend.environment().device_name}")
    for short in args.dtypes.split(","):
        dtype = getattr(torch, DTYPES[short])
        served = ("float32", "bfloat16") if device.type == "cpu" else tuple(DTYPES.values())
        if DTYPES[short] not in served:
            print(f"{short}: no {device.type} kernel")
            continue
        q = torch.randn(1, HQ, 1, D, dtype=dtype, device=device)
        k = torch.randn(1, HKV, 512, D, dtype=dtype, device=device)
        t0 = time.perf_counter()
        run, rep = prove_call(SdpaAttention(D ** -0.5, HQ // HKV), q, k, torch.randn_like(k), None, backend)
        verdict = {"dtype": short, "status": rep.status, "reason": rep.reason, "rejected": rep.rejected,
                   "decide_s": round(time.perf_counter() - t0, 1)}
        print(f"{short}: pipeline at batch 1, kv 512: {rep.status}: {rep.reason} {rep.rejected or ''}")
        results.append(verdict)
        fwd = fwd or direct_forward(backend)  # after the first proof: its worker builds the library first
        for batch in map(int, args.batches.split(",")):
            for kv in map(int, args.kv.split(",")):
                q = torch.randn(batch, HQ, 1, D, dtype=dtype, device=device)
                k = torch.randn(batch, HKV, kv, D, dtype=dtype, device=device)
                v = torch.randn(batch, HKV, kv, D, dtype=dtype, device=device)
                with torch.inference_mode():
                    ref = sdpa(module, q, k, v, None, scaling=module.scaling)[0]
                    out = fwd(view, q, k, v)
                    err = float((out.float() - ref.float()).abs().max())
                    eager_us = clock(lambda: sdpa(module, q, k, v, None, scaling=module.scaling))
                    kernel_us = clock(lambda: fwd(view, q, k, v))
                row = {"dtype": short, "batch": batch, "kv": kv, "sdpa_us": round(eager_us, 2),
                       "kernel_us": round(kernel_us, 2), "speedup": round(eager_us / kernel_us, 3),
                       "max_abs_diff": err}
                results.append(row)
                print(f"{short} batch {batch} kv {kv:5d}: sdpa {eager_us:9.1f} us  kernel {kernel_us:9.1f} us  "
                      f"{eager_us / kernel_us:5.2f}x  max |diff| {err:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": backend.environment().device_name, "results": results},
                                              indent=1))


if __name__ == "__main__":
    main()
