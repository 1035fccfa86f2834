"""Where the installed torch.compile loses time against compiling the whole model.

    python benchmarks/compile_gap.py --problems .kb/problems.jsonl --level 2 --ids 25 32 34 [--json out.json]

Per KernelBench problem, timed side by side in one round-robin loop on the same inputs (one call
between device synchronizations, the backend's timer): eager; `torch.compile(model)` (what bench's
compile column times); the pipeline's CompiledOp called directly; the same op replayed as a CUDA
graph (GraphedOp, CUDA only); and the model after `optimize()` with only the built-in candidates,
whichever of them won. The differences locate the gap: op vs whole (the compiled function itself),
installed vs op (the dispatcher), graph vs whole (host time a replay removes).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import metal_accel  # noqa: E402
from metal_accel.backends import get_backend  # noqa: E402
from metal_accel.candidates.compile import CompiledOp  # noqa: E402
from metal_accel.runtime.dispatch import eager_only  # noqa: E402
from metal_accel.kernelbench.problems import load_problems  # noqa: E402
from metal_accel.proof.prove import backend_timer  # noqa: E402
from metal_accel.kernelbench.problem import fit_batch, input_sets, problem_key, side_by_side  # noqa: E402


def variants(model: torch.nn.Module, inputs: tuple, backend: str) -> tuple[dict[str, Callable[..., Any]], str]:
    """The callables to time, and what `optimize()` installed."""
    def eager(*a: Any) -> Any:
        with eager_only():
            return model(*a)

    fns: dict[str, Callable[..., Any]] = {"eager": eager, "whole": torch.compile(copy.deepcopy(model))}
    op = CompiledOp(copy.deepcopy(model), "compile_gap_op")
    fns["op"] = lambda *a: op(a, {}, [])
    if backend == "cuda":
        from metal_accel.runtime.graph import GraphedOp
        gmodel = copy.deepcopy(model)
        graphed = GraphedOp(CompiledOp(gmodel, "compile_gap_graph"), gmodel)
        fns["graph"] = lambda *a: graphed(a, {}, [])
    installed = copy.deepcopy(model)
    os.environ["METAL_ACCEL_COMPILE"] = "1"
    metal_accel.optimize(installed, inputs, backend=backend, providers=[], progress=False)
    status = metal_accel.explain(installed).modules[0].status
    fns["installed"] = installed
    return fns, status


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=str(ROOT / ".kb" / "problems.jsonl"))
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--ids", type=int, nargs="+", required=True)
    ap.add_argument("--backend", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-tensor-mb", type=float, default=64.0)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per problem")
    ap.add_argument("--json")
    args = ap.parse_args()
    be = get_backend(args.backend)
    device = "cuda" if args.backend == "cuda" else "cpu"
    rows = []
    for p in load_problems(Path(args.problems), levels=[args.level]):
        if p.problem_id not in args.ids:
            continue
        _, batch = fit_batch(p, args.max_tensor_mb)
        model, inputs = p.instantiate(device, 0)
        sets = input_sets(p, inputs, device)
        fns, status = variants(model, inputs, args.backend)
        with torch.inference_mode():
            med = side_by_side(fns, sets, be.synchronize, backend_timer(be), args.budget)
        row = {"problem": problem_key(p), "batch": batch, "installed_status": status,
               **{f"{k}_us": round(v * 1e6, 1) for k, v in med.items()}}
        rows.append(row)
        print(f"{row['problem']:<60} " + " ".join(f"{k}={v}" for k, v in row.items() if k.endswith("_us"))
              + f" installed={status}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": be.environment().device_name, "torch": torch.__version__,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
