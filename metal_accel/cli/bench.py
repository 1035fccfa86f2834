"""`metal-accel bench SUITE`: KernelBench-format problems through the pipeline, eager / torch.compile /
optimized side by side in balanced rounds, with eager timed against itself for the self-noise
(logic in kernelbench/)."""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    """Register the `bench` subcommand on the CLI's subparsers."""
    p = sub.add_parser("bench", help="benchmark KernelBench-format problems: eager vs torch.compile vs optimized",
                       description="Optimize each problem's Model on its get_inputs() with the given providers, then time "
                       "eager, torch.compile (inductor, default mode) and the optimized model side by side, in balanced rounds "
                       "with eager also timed against a second copy of itself (the self-noise). SUITE is a "
                       ".py file, a directory of them, or a JSON-lines file (e.g. KernelBench's problems.jsonl).")
    p.add_argument("suite", help="problem .py file, directory, or .jsonl file")
    p.add_argument("--backend", default="cuda", help="backend (default: cuda)")
    p.add_argument("--provider", action="append", default=[], help="candidate provider, e.g. dir:benchmarks/candidates "
                   "(repeatable); candidates are looked up as <dir>/<backend>/L<level>_<id>_<name>.py or <name>.py")
    p.add_argument("--level", type=int, nargs="+", default=[], help="only these levels")
    p.add_argument("--problems", nargs="+", default=[], help="problem ids, keys or globs (e.g. 12 'L2_*' '*Conv2d*')")
    p.add_argument("--attempted-only", action="store_true", help="skip problems no provider has a candidate for")
    p.add_argument("--max-tensor-mb", type=float, default=None, help="halve batch_size until no input or output "
                   "tensor exceeds this many MB, measured on the meta device or, where a problem cannot run there, for "
                   "real on the CPU; a problem still over it, or whose sizes cannot be measured, is skipped "
                   "(default: the problems' own sizes)")
    p.add_argument("--budget", type=float, default=1.0, help="seconds of side-by-side timing per problem")
    p.add_argument("--bench-budget", type=float, default=1.0, help="seconds of the pipeline's A/B timing per candidate")
    p.add_argument("--flush", action="store_true", help="evict the GPU L2 / CPU caches before every timed call")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out of the side-by-side timing")
    p.add_argument("--compile-candidate", action="store_true", help="let the pipeline also try torch.compile as a "
                   "candidate (off by default: the bench measures the kernels against compile, side by side)")
    p.add_argument("--compile-jobs", type=int, default=0, help="warm inductor's caches in this many parallel processes first")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a candidate's isolated compile and "
                   "validation may take")
    p.add_argument("--out", default="bench_out", help="output directory for suite.json, suite.md, suite.png")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..kernelbench.report import markdown, write_outputs
    from ..kernelbench.result import calls_text
    from ..kernelbench.runner import run_suite

    partial = Path(args.out) / "suite.partial.jsonl"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    partial.write_text("")

    def show(row: Any) -> None:
        import dataclasses
        import json
        with partial.open("a") as f:  # survives a run that is cut off
            f.write(json.dumps(dataclasses.asdict(row), default=str) + "\n")
        if args.no_progress:
            noise = f", self-noise {100 * row.self_noise:.1f}%" if row.self_noise is not None else ""
            calls = f" ({calls_text(row.calls)})" if row.calls else ""
            print(f"{row.key}: {row.status}{calls} {row.vs_eager or 0:.2f}x eager, {row.vs_compile or 0:.2f}x "
                  f"compile{noise}; {row.reason[:120]}", flush=True)

    res = run_suite(args.suite, args.provider, backend=args.backend, levels=args.level, patterns=args.problems,
                    attempted_only=args.attempted_only, max_tensor_mb=args.max_tensor_mb, budget_s=args.budget,
                    bench_budget_s=args.bench_budget, flush=args.flush, with_compile=not args.no_compile,
                    compile_jobs=args.compile_jobs, progress=not args.no_progress,
                    command="metal-accel " + shlex.join(sys.argv[1:]), on_row=show, timeout_s=args.timeout,
                    compile_candidate=args.compile_candidate)
    paths = write_outputs(res, args.out)
    print(markdown(res))
    print("wrote " + ", ".join(map(str, paths)))
    return 0
