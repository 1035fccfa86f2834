"""Rebuild the cache shipped in the package: prove the candidates in kernels_src/ on this machine.

    python scripts/build_shipped_cache.py [--backend cpu] [--shapes 1x32 4x64]
    python scripts/build_shipped_cache.py --backend cuda [--report blocks.json]   # metal_accel/blocks.py
    python scripts/build_shipped_cache.py --backend mps-emu [--report metal.json]  # Metal, on the MSL emulator
    python scripts/build_shipped_cache.py --backend mps                            # Metal, on a Mac

Every entry is produced by the pipeline itself (sandbox, compile, validate, benchmark), never by
hand: the demo model (CUDA: the blocks of metal_accel/blocks.py) is optimized with kernels_src/<backend> as the only provider and an empty
user cache, and the accepted entries, with their verdicts for this machine, are copied into
metal_accel/kernels_cache/<backend>/.

Metal (kernels_src/mps/, the demo and metal_accel.blocks.metal_blocks) goes to kernels_cache/mps/ either
way. On the emulator (`--backend mps-emu`) the pipeline proves correctness only (no speed gate), and
each accepted entry is re-keyed for the real "mps" backend carrying just that correctness verdict
(metal_accel/retarget.py): every Mac proves speed itself before it installs one. On a Mac
(`--backend mps`) entries get that Mac's full verdicts. Verdicts of the same kernel from the other
route, already in kernels_cache/mps/, are kept.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _build_blocks(args: argparse.Namespace, device: str, source: Path, blocks: list | None = None) -> None:
    import json

    import torch

    import metal_accel
    from metal_accel.blocks import shipped_blocks

    rows = []
    for name, module, make_inputs in (shipped_blocks(device) if blocks is None else blocks):
        inputs = make_inputs()
        metal_accel.optimize(module, inputs, backend=args.backend, providers=[f"dir:{source}"], bench_budget_s=2.0)
        rep = metal_accel.explain(module)
        print(f"== {name}\n{rep}")
        top = rep.modules[0]
        rows.append({"block": name, "status": top.status, "reason": top.reason, "eager_us": top.eager_us,
                     "kernel_us": top.kernel_us, "speedup": top.speedup, "rejected": top.rejected})
        del module, inputs
        torch.cuda.empty_cache() if device == "cuda" else None
    if args.report:
        Path(args.report).write_text(json.dumps(rows, indent=1))


def _write_metal(entry, previous: dict, out_dir: Path) -> None:
    """An accepted Metal entry into kernels_cache/mps/: emulator entries re-keyed for "mps" (correctness
    verdict only), and the verdicts of the same kernel from the other route kept."""
    from metal_accel.store.retarget import for_real_device

    entry = for_real_device(entry) if entry.backend == "mps-emu" else entry
    old = previous.get(entry.key)
    if old is not None and old.candidate is not None and old.candidate.digest == entry.candidate.digest:
        entry.verdicts = {**old.verdicts, **entry.verdicts}
    _write_claims(entry, out_dir)


def _write_claims(entry, out_dir: Path) -> None:
    """ENTRY into OUT_DIR with its verdicts' seals removed: what ships is a claim, proven on each user's device."""
    import json

    from metal_accel.store.index import atomic_write
    for v in entry.verdicts.values():
        v.seal = ""
    atomic_write(out_dir / f"{entry.key}.json", json.dumps(entry.to_dict(), indent=1, sort_keys=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--shapes", nargs="+", default=None, help="BATCHxSEQ input shapes (default: the demo's)")
    parser.add_argument("--report", default=None, help="write a JSON summary of every block's verdict here (cuda)")
    args = parser.parse_args()
    metal = args.backend in ("mps", "mps-emu")
    out_dir = ROOT / "metal_accel" / "kernels_cache" / ("mps" if metal else args.backend)
    source = ROOT / "kernels_src" / ("mps" if args.backend == "mps-emu" else "")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["METAL_ACCEL_USER_CACHE"] = tmp
        # a throwaway verdict key: shipped verdicts are claims everywhere, the builder's machine included
        os.environ["METAL_ACCEL_CONFIG_DIR"] = os.path.join(tmp, "config")
        # The shipped cache holds kernels only: whether torch.compile wins is decided on each
        # user's machine (its inductor output and timings are local), not shipped.
        os.environ["METAL_ACCEL_COMPILE"] = "0"
        import torch
        import metal_accel
        from metal_accel.store import cache as cache_mod
        from metal_accel.demo import DEFAULT_BATCH, DEFAULT_SEQ, build_demo_model, demo_inputs

        previous = {e.key: e for e in cache_mod.CacheDir(out_dir.parent, writable=False, name="old").entries(
            out_dir.name)} if metal else {}
        for old in out_dir.glob("*.json"):
            old.unlink()
        device = {"cpu": "cpu", "cuda": "cuda", "mps": "mps", "mps-emu": "cpu"}[args.backend]
        shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else [(DEFAULT_BATCH, DEFAULT_SEQ)]
        if args.backend == "cuda":  # the common model blocks of metal_accel/blocks.py, at their shipped shapes
            shapes = []
            _build_blocks(args, device, ROOT / "kernels_src")
        if metal:  # the common model blocks at their Metal shapes, then the demo
            from metal_accel.blocks import metal_blocks
            _build_blocks(args, device, source, metal_blocks(device))
        for batch, seq in shapes:
            model = build_demo_model().to(device).eval()
            (ids,) = demo_inputs(batch=batch, seq=seq)
            metal_accel.optimize(model, (ids.to(device),), backend=args.backend,
                                 providers=[f"dir:{source}"], bench_budget_s=2.0)
            print(metal_accel.explain(model))
        out_dir.mkdir(parents=True, exist_ok=True)
        kept = 0
        for entry in cache_mod.user_cache().entries(args.backend):
            if entry.candidate is not None and any(v.accepted for v in entry.verdicts.values()):
                if not metal:
                    _write_claims(entry, out_dir)
                else:
                    _write_metal(entry, previous, out_dir)
                kept += 1
        from metal_accel.store.index import write_index
        write_index(out_dir.parent)  # lets `import metal_accel` know what the shipped cache covers
        print(f"{kept} accepted entries written to {out_dir.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
