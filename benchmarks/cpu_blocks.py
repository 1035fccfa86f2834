"""Eager vs optimized on the CPU, side by side: each shipped kernel, and the quickstart model end to end.

    python benchmarks/cpu_blocks.py [--no-write]

Uses only the shipped cache (an empty temporary user cache), so it measures what a new user gets.
Writes its run to docs/results/ (render docs/benchmarks.md with `python -m benchmarks.render`).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    args = parser.parse_args()
    os.environ["METAL_ACCEL_USER_CACHE"] = tempfile.mkdtemp(prefix="metal_accel_bench_")
    import torch

    import metal_accel
    from metal_accel.proof.speed import compare_speed
    from metal_accel.demo import DEFAULT_BATCH, DEFAULT_SEQ, build_demo_model, demo_inputs
    from metal_accel.proof.testdata import make_inputs

    def pure(m):
        def run(*a):
            with metal_accel.eager():  # `import metal_accel` may have patched the classes
                return m(*a)
        return run

    model = build_demo_model().eval()
    eager = copy.deepcopy(model)
    (ids,) = demo_inputs(DEFAULT_BATCH, DEFAULT_SEQ)
    metal_accel.optimize(model, (ids,), backend="cpu", progress=False)
    report = metal_accel.explain(model)
    modules = dict(model.named_modules())
    gen = torch.Generator().manual_seed(0)
    rows = ["| module | class | input | eager µs | optimized µs | speedup | pairs |", "|---|---|---|---|---|---|---|"]
    for rep in report.kernels:
        module = modules[rep.name]
        disp = module.__dict__["forward"]
        op = next(iter(disp.table.values()))
        inputs = [make_inputs(op.spec, "normal", gen, "cpu") for _ in range(4)]
        with torch.inference_mode():
            r = compare_speed(pure(disp.original), disp, inputs, margin=0.0, min_reps=200, budget_s=2.0)
        rows.append(f"| {rep.name} | {rep.module_class.rsplit('.', 1)[-1]} | {rep.spec} | {r.eager_us:.1f} | "
                    f"{r.kernel_us:.1f} | {r.speedup:.2f}x | {r.reps} |")
    with torch.inference_mode():
        e2e = compare_speed(pure(eager), model, [((ids,), {})], margin=0.0, min_reps=100, budget_s=5.0)
        miss_model = build_demo_model().eval()
        miss_eager = copy.deepcopy(miss_model)
        metal_accel.optimize(miss_model, (ids,), backend="cpu", progress=False)
        (other,) = demo_inputs(DEFAULT_BATCH + 1, DEFAULT_SEQ - 8)  # a shape no cached kernel covers
        miss = compare_speed(pure(miss_eager), miss_model, [((other,), {})], margin=0.0, min_reps=100, budget_s=5.0)
    n_disp = sum(1 for m in miss_model.modules() if "forward" in m.__dict__)
    body = "\n".join(rows) + "\n\n" + "\n".join([
        "| model | eager µs | optimized µs | speedup | pairs |", "|---|---|---|---|---|",
        f"| quickstart TinyLlama, input {tuple(ids.shape)}, {len(report.kernels)} kernels | {e2e.eager_us:.0f} | "
        f"{e2e.kernel_us:.0f} | {e2e.speedup:.2f}x | {e2e.reps} |",
        f"| same model, input {tuple(other.shape)}: every call misses ({n_disp} dispatchers) and runs eager | "
        f"{miss.eager_us:.0f} | {miss.kernel_us:.0f} | {miss.speedup:.3f}x | {miss.reps} |",
    ]) + ("\n\nPer-kernel rows time the module's eager forward against the installed dispatcher (spec lookup, "
          "custom op, host code, kernel) on fresh inputs; medians of interleaved pairs.\n")
    print(body)
    if not args.no_write:
        from results import from_markdown, record, today
        record("cpu_blocks", f"cpu_{today()}", "python benchmarks/cpu_blocks.py", from_markdown(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
