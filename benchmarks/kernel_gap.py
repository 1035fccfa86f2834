"""Where a kernel candidate's time goes: GPU work against host time, plain launch against a CUDA graph.

    python benchmarks/kernel_gap.py --level 2 --ids 31 32 17 [--json out.json]

Per KernelBench problem with a candidate under benchmarks/candidates/cuda (the first one found), timed
side by side in one round-robin loop (one call between device synchronizations, CUDA events checked
against the wall clock, as the bench times):
  eager          the problem's model
  eager_graph    that eager forward captured into a CUDA graph (GraphedOp: inputs copied in, outputs cloned)
  kernel         the candidate installed on a copy of the model (dispatcher + custom op), no speed gate
  kernel_graph   the candidate's op replayed as a CUDA graph (GraphedOp)
and, from torch.profiler, the GPU time per call of eager's and the kernel's device work (`*_gpu_us`), with
their four longest GPU kernels (`*_top`).
The timed minus the GPU time is what the host adds; the graph variants show how much of it a replay removes.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from metal_accel.backends import get_backend  # noqa: E402
from metal_accel.runtime.graph import GraphedOp  # noqa: E402
from metal_accel.core.candidate import parse_candidate  # noqa: E402
from metal_accel.runtime.capture import capture  # noqa: E402
from metal_accel.runtime.dispatch import eager_forward, eager_only, install  # noqa: E402
from metal_accel.core.keys import entry_key, module_fingerprint  # noqa: E402
from metal_accel.runtime.ops import kernel_op  # noqa: E402
from metal_accel.kernelbench.problems import load_problems  # noqa: E402
from metal_accel.proof.prove import backend_timer, kernels_only  # noqa: E402
from metal_accel.sandbox.host import load_forward  # noqa: E402
from metal_accel.kernelbench.problem import ProblemProvider, fit_batch, input_sets, problem_key, side_by_side  # noqa: E402


class EagerOp:
    """The module's own forward with the op signature GraphedOp wraps."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.name = "eager"
        self._forward = eager_forward(module)

    def __call__(self, args: tuple, kwargs: dict, state: list[torch.Tensor]) -> Any:
        return self._forward(*args, **kwargs)


def gpu_us(fn: Callable[..., Any], args: tuple, calls: int = 20) -> tuple[float, str]:
    """Device time per call summed over the GPU kernels and copies torch.profiler sees, and the top
    four of them (name and microseconds per call)."""
    from torch.profiler import ProfilerActivity, profile
    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
    top = "; ".join(f"{e.key[:60]} {e.self_device_time_total / calls:.1f}" for e in events[:4])
    return sum(e.self_device_time_total for e in events) / calls, top


def variants(problem: Any, model: torch.nn.Module, inputs: tuple) -> dict[str, Callable[..., Any]]:
    backend = get_backend("cuda")
    files = ProblemProvider(ROOT / "benchmarks" / "candidates", problem, model).files("cuda")
    if not files:
        raise LookupError("no CUDA candidate")
    cand = parse_candidate(files[0].read_text(), "cuda", f"dir:{files[0]}")
    call = next(c for c in capture(model, inputs) if c.module is model)
    assert call.spec is not None and call.output_spec is not None
    key = entry_key(module_fingerprint(model), call.spec, "cuda")
    lib = backend.compile(cand.source)
    op = kernel_op(key, cand.digest, lambda: load_forward(cand.code, kernels_only(lib)), call.spec,
                   call.output_spec, model, "cuda")
    installed = copy.deepcopy(model)
    install(installed, call.spec.signature(), op)
    gmodel = copy.deepcopy(model)
    kgraph = GraphedOp(op, gmodel)
    emodel = copy.deepcopy(model)
    egraph = GraphedOp(EagerOp(emodel), emodel)

    def eager(*a: Any) -> Any:
        with eager_only():
            return model(*a)
    return {"eager": eager,
            "eager_graph": lambda *a: egraph(a, {}, []),
            "kernel": installed,
            "kernel_graph": lambda *a: kgraph(a, {}, [])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=str(ROOT / ".kb" / "problems.jsonl"))
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--ids", type=int, nargs="+", required=True)
    ap.add_argument("--max-tensor-mb", type=float, default=68.0)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per problem")
    ap.add_argument("--json")
    args = ap.parse_args()
    be = get_backend("cuda")
    rows = []
    for p in load_problems(Path(args.problems), levels=[args.level]):
        if p.problem_id not in args.ids:
            continue
        _, batch = fit_batch(p, args.max_tensor_mb)
        model, inputs = p.instantiate("cuda", 0)
        try:
            fns = variants(p, model, inputs)
            sets = input_sets(p, inputs, "cuda")
            with torch.inference_mode():
                med = side_by_side(fns, sets, be.synchronize, backend_timer(be), args.budget)
                row: dict[str, Any] = {"problem": problem_key(p), "batch": batch,
                                       **{f"{k}_us": round(v * 1e6, 1) for k, v in med.items()}}
                for name in ("eager", "kernel"):
                    total, top = gpu_us(fns[name], inputs)
                    row[f"{name}_gpu_us"], row[f"{name}_top"] = round(total, 1), top
        except Exception as exc:  # one problem's failure is a row, not the end of the run
            row = {"problem": problem_key(p), "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        print(f"{row['problem']:<55} " + " ".join(f"{k}={v}" for k, v in row.items() if k not in ("problem",)),
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": be.environment().device_name, "torch": torch.__version__,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
