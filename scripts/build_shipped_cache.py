"""Rebuild the cache shipped in the package: prove the candidates in kernels_src/ on this machine.

    python scripts/build_shipped_cache.py [--backend cpu] [--shapes 1x32 4x64]

Every entry is produced by the pipeline itself (sandbox, compile, validate, benchmark), never by
hand: the demo model is optimized with kernels_src/<backend> as the only provider and an empty
user cache, and the accepted entries, with their verdicts for this machine, are copied into
metal_accel/kernels_cache/<backend>/.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--shapes", nargs="+", default=None, help="BATCHxSEQ input shapes (default: the demo's)")
    args = parser.parse_args()
    out_dir = ROOT / "metal_accel" / "kernels_cache" / args.backend
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["METAL_ACCEL_USER_CACHE"] = tmp
        import torch
        import metal_accel
        from metal_accel import cache as cache_mod
        from metal_accel.demo import DEFAULT_BATCH, DEFAULT_SEQ, build_demo_model, demo_inputs

        for old in out_dir.glob("*.json"):
            old.unlink()
        device = {"cpu": "cpu", "cuda": "cuda", "mps": "mps", "mps-emu": "cpu"}[args.backend]
        shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else [(DEFAULT_BATCH, DEFAULT_SEQ)]
        for batch, seq in shapes:
            model = build_demo_model().to(device).eval()
            (ids,) = demo_inputs(batch=batch, seq=seq)
            metal_accel.optimize(model, (ids.to(device),), backend=args.backend,
                                 providers=[f"dir:{ROOT / 'kernels_src'}"], bench_budget_s=2.0)
            print(metal_accel.explain(model))
        out_dir.mkdir(parents=True, exist_ok=True)
        kept = 0
        for entry in cache_mod.user_cache().entries(args.backend):
            if entry.candidate is not None and any(v.accepted for v in entry.verdicts.values()):
                shutil.copy(cache_mod.user_cache().path_for(args.backend, entry.key), out_dir / f"{entry.key}.json")
                kept += 1
        print(f"{kept} accepted entries written to {out_dir.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
