"""Quickstart: optimize a small Llama-style model with whatever backend is present.

    python examples/quickstart.py [--candidates DIR] [--batch B] [--seq S]

With no LLM configured it uses the kernels shipped in metal_accel/kernels_cache (each proven on
this device before it runs, unless it was proven on the same kind of device already). It checks
the optimized model against eager, prints what ran where and why, and the end-to-end speedup.
"""
from __future__ import annotations

import argparse
import copy
import logging

import torch

import metal_accel
from metal_accel.proof.speed import compare_speed
from metal_accel.demo import DEFAULT_BATCH, DEFAULT_SEQ, build_demo_model, demo_inputs


def pick_device() -> torch.device:
    if torch.cuda.is_available() and "cuda" in metal_accel.available_backends():
        return torch.device("cuda")
    if torch.backends.mps.is_available() and "mps" in metal_accel.available_backends():
        return torch.device("mps")
    return torch.device("cpu")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", help="a directory of candidate kernels (provider dir:PATH)")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--seq", type=int, default=DEFAULT_SEQ)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")

    device = pick_device()
    model = build_demo_model().to(device).eval()
    eager_model = copy.deepcopy(model)
    (ids,) = demo_inputs(batch=args.batch, seq=args.seq)
    ids = ids.to(device)
    print(f"model: {type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; "
          f"input {tuple(ids.shape)} on {device}")

    providers = [f"dir:{args.candidates}"] if args.candidates else []
    metal_accel.optimize(model, (ids,), providers=providers)
    print(metal_accel.explain(model))

    def eager(*a):
        with metal_accel.eager():  # no kernels at all: `import metal_accel` may have patched classes
            return eager_model(*a)

    with torch.inference_mode():
        for seed in range(3):
            (check_ids,) = demo_inputs(batch=args.batch, seq=args.seq, seed=100 + seed)
            check_ids = check_ids.to(device)
            torch.testing.assert_close(model(check_ids), eager(check_ids))
    print("outputs match eager on 3 fresh inputs")

    sync = torch.cuda.synchronize if device.type == "cuda" else (
        torch.mps.synchronize if device.type == "mps" else (lambda: None))
    with torch.inference_mode():
        result = compare_speed(eager, model, [((ids,), {})], sync, min_reps=50, budget_s=3.0)
    print(f"end to end: eager {result.eager_us:.0f} us, optimized {result.kernel_us:.0f} us per forward "
          f"-> {result.speedup:.2f}x (median of {result.reps} interleaved pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
