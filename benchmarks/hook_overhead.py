"""What auto-instrumentation and the optimize() dispatcher cost on calls that have no kernel.

    python benchmarks/hook_overhead.py [--no-write]

Times a trivial module's forward (so the overhead is not hidden behind real work) in blocks,
alternating unpatched and patched blocks, and reports the median per-call difference.
Writes its run to docs/results/ (render docs/benchmarks.md with `python -m benchmarks.render`).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))


class Tiny(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def per_call_us(fn, x, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn(x)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    from metal_accel.auto import hook
    from metal_accel.runtime.dispatch import Dispatcher
    from metal_accel.core.keys import class_path, class_source_sha

    hook.deactivate()
    module = Tiny()
    x = torch.randn(8, 16)
    plan = hook.ClassPlan(class_path(Tiny), class_source_sha(Tiny), {(4, 4)})  # a kernel exists for another shape
    rows = {}
    with torch.inference_mode():
        base, auto = [], []
        for _ in range(args.blocks):
            base.append(per_call_us(module, x, args.calls))
            hook.patch_class(Tiny, plan)
            auto.append(per_call_us(module, x, args.calls))
            hook.deactivate()
        rows["auto-instrumented class, shape with no kernel (prefilter)"] = (base, auto)
        # a shape that does have cache entries, but not for this instance's signature: the dispatcher path
        plan_hit = hook.ClassPlan(class_path(Tiny), class_source_sha(Tiny), {tuple(x.shape)})
        base, auto = [], []
        for _ in range(args.blocks):
            base.append(per_call_us(module, x, args.calls))
            hook.patch_class(Tiny, plan_hit)
            auto.append(per_call_us(module, x, args.calls))
            module.__dict__.pop("_metal_accel_auto", None)
            hook.deactivate()
        rows["auto-instrumented class, cached shape, signature resolved to eager"] = (base, auto)
        base, disp = [], []
        for _ in range(args.blocks):
            base.append(per_call_us(module, x, args.calls))
            d = Dispatcher(module, Tiny.forward.__get__(module))
            d.add((((4, 4), (4, 1), torch.float32, "cpu"),), None)  # type: ignore[arg-type]  # a kernel for another shape
            module.forward = d
            disp.append(per_call_us(module, x, args.calls))
            del module.forward
        rows["optimize() dispatcher, call signature with no kernel"] = (base, disp)
    lines = ["| path | unpatched µs/call | patched µs/call | overhead µs/call (median of per-block differences) |",
             "|---|---|---|---|"]
    for name, (b, p) in rows.items():
        diff = statistics.median(pi - bi for bi, pi in zip(b, p))
        lines.append(f"| {name} | {statistics.median(b):.2f} | {statistics.median(p):.2f} | {diff:.2f} |")
    body = "\n".join(lines) + (f"\n\n{args.blocks} blocks of {args.calls} calls each, patched and unpatched blocks "
                               "alternating, under torch.inference_mode(); the module's forward returns its input, "
                               "so the numbers are the cost of nn.Module.__call__ plus ours. Target (issue 7): "
                               "at most 2 µs per call on the miss path.\n")
    print(body)
    if not args.no_write:
        from results import from_markdown, record, today
        record("dispatch_cost", f"hook_{today()}", "python benchmarks/hook_overhead.py", from_markdown(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
