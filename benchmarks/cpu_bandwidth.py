"""Memory-bound CPU kernels against a plain read of the same input, side by side.

    python benchmarks/cpu_bandwidth.py [--keys L1_45] [--mb 1100] [--rounds 40] [--problems PATH] [--no-write]

For each KernelBench problem named (its CPU candidate in benchmarks/candidates/cpu), at the batch whose
largest tensor is at most --mb MB: eager, torch.compile (inductor, default mode), the candidate's kernel
and `torch.sum` over the inputs (every input byte read once, nothing written: the read ceiling of this
machine) are timed in interleaved rounds on two alternating input sets, in rotating order. The table gives
medians and GB/s over the least bytes each must move (inputs and output). Outputs are checked against eager
first (torch.testing.assert_close); the pipeline's full proof runs in `metal-accel bench`. Writes its run to
docs/results/cpu_bandwidth/ (then `python -m benchmarks.render`).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "benchmarks" / "candidates" / "cpu"
DEFAULT_PROBLEMS = ROOT.parent / "shared" / "kernelbench" / "problems.jsonl"


def kernel_forward(path: Path, model: torch.nn.Module) -> Callable[..., Any]:
    """The candidate's host forward on MODEL's tensors, its kernels compiled (no proof: checked below)."""
    from metal_accel.backends import get_backend
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.runtime.ops import ModuleLayout
    from metal_accel.proof.prove import kernels_only
    from metal_accel.sandbox.host import load_forward
    cand = parse_candidate(path.read_text(), "cpu", str(path))
    forward = load_forward(cand.code, kernels_only(get_backend("cpu").compile(cand.source)))
    layout = ModuleLayout(model)
    view = layout.view(layout.gather())
    return lambda *args: forward(view, *args)


def interleaved(fns: dict[str, Callable[..., Any]], input_sets: list[tuple], rounds: int) -> dict[str, float]:
    """Median seconds per call of each function: one call each per round, order rotating, inputs alternating."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for args in input_sets:
        for n in names:
            fns[n](*args)
    for r in range(rounds):
        args = input_sets[r % len(input_sets)]
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            fns[n](*args)
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def measure(problem: Any, mb: float, rounds: int) -> dict[str, Any]:
    from metal_accel.kernelbench.problem import fit_batch, problem_key, tensor_bytes
    key = problem_key(problem)
    path = next(iter(sorted(CANDIDATES.glob(f"{key}*.py"))), None)
    if path is None:
        sys.exit(f"{key}: no CPU candidate in {CANDIDATES}")
    _, batch = fit_batch(problem, mb)
    model, inputs = problem.instantiate("cpu", 0)
    sets = [inputs, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in problem.load().get_inputs())]
    with torch.inference_mode():
        kernel = kernel_forward(path, model)
        compiled = torch.compile(model)
        expect = model(*inputs)
        torch.testing.assert_close(kernel(*inputs), expect, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(compiled(*inputs), expect, rtol=1e-4, atol=1e-5)
        read = lambda *args: [torch.sum(a) for a in args if isinstance(a, torch.Tensor)]  # noqa: E731
        med = interleaved({"eager": model, "torch.compile": compiled, "kernel": kernel, "read": read}, sets, rounds)
    moved = tensor_bytes(inputs) + tensor_bytes(expect)
    read_bytes = tensor_bytes(inputs)
    return {"key": key, "batch": batch, "mbytes": moved / 1e6, "rounds": rounds,
            "us": {n: s * 1e6 for n, s in med.items()},
            "gbs": {n: (read_bytes if n == "read" else moved) / s / 1e9 for n, s in med.items()}}


def table(rows: list[dict[str, Any]]) -> str:
    names = ("eager", "torch.compile", "kernel", "read")
    lines = ["| problem | batch | MB moved | " + " | ".join(f"{n} µs (GB/s)" for n in names)
             + " | kernel vs torch.compile | kernel vs read |", "|" + "---|" * (len(names) + 5)]
    for r in rows:
        cells = [f"{r['us'][n]:.0f} ({r['gbs'][n]:.1f})" for n in names]
        lines.append(f"| {r['key']} | {r['batch']} | {r['mbytes']:.0f} | " + " | ".join(cells)
                     + f" | {r['us']['torch.compile'] / r['us']['kernel']:.2f}x"
                     f" | {r['gbs']['kernel'] / r['gbs']['read']:.0%} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", nargs="+", default=["L1_45"], help="problems, e.g. L1_45 (level and id)")
    ap.add_argument("--mb", type=float, default=1100.0, help="largest tensor at most this many MB (batch halved)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--problems", default=str(DEFAULT_PROBLEMS))
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args()
    from metal_accel.kernelbench.problems import load_problems
    from metal_accel.kernelbench.problem import problem_key
    problems = {problem_key(p).split("_", 2)[0] + "_" + problem_key(p).split("_", 2)[1]: p
                for p in load_problems(args.problems)}
    unknown = [k for k in args.keys if k not in problems]
    if unknown:
        sys.exit(f"unknown problems: {', '.join(unknown)}")
    rows = []
    for key in args.keys:
        rows.append(measure(problems[key], args.mb, args.rounds))
        print(f"{key}: " + ", ".join(f"{n} {us / 1e3:.1f} ms" for n, us in rows[-1]["us"].items()), flush=True)
    text = table(rows)
    print(text)
    if not args.no_write:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from results import from_markdown, record, today
        command = (f"python benchmarks/cpu_bandwidth.py --keys {' '.join(args.keys)} --mb {args.mb:g} "
                   f"--rounds {args.rounds}")
        body = ("Medians of interleaved rounds (one call of each per round, order rotating, two input sets "
                "alternating). `read` is `torch.sum` over the inputs: every input byte read once, the read ceiling "
                "a kernel that must read them all can approach; its GB/s counts the inputs only.\n\n" + text)
        record("cpu_bandwidth", f"cpu_{today()}", command, from_markdown(body))


if __name__ == "__main__":
    main()
