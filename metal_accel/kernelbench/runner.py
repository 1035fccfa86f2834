"""`metal-accel bench`: KernelBench-format problems through the real pipeline, side by side.

For each problem: the eager model, a second copy of eager (the measurement's self-noise),
`torch.compile` (inductor, default mode) and the model after `optimize()` (the accepted kernel, or
eager where every candidate was rejected) are timed in balanced rounds (each contender right after
each other equally often) on the same fresh inputs, with the device synchronized around each call.
The optimized model's output is checked against eager on inputs it never saw. Results go to JSON,
markdown and (with matplotlib) a PNG.

Each problem runs in problem.py (sizes in sizes.py, timing in timing.py), rows and summaries are in
result.py, and the outputs are written by report.py.
"""
from __future__ import annotations

import fnmatch
import os
import statistics
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..backends import get_backend
from ..backends.cuda.backend import describe
from ..candidates.directory import DirectoryProvider
from .problem import ProblemProvider, fit_batch, problem_key, run_problem, side_by_side
from .problems import Problem, load_problems
from .result import ATTEMPT_SPEEDUP, Row, SuiteResult

__all__ = ["ATTEMPT_SPEEDUP", "ProblemProvider", "Row", "SuiteResult", "fit_batch", "measure_dram_bandwidth",
           "problem_key", "run_problem", "run_suite", "select", "side_by_side", "warm_compile"]


def select(problems: list[Problem], patterns: Sequence[str] | None) -> list[Problem]:
    """Problems whose key, name or id matches one of PATTERNS (globs; 'L2_12' or '12' select by id)."""
    if not patterns:
        return problems
    out = []
    for p in problems:
        names = [problem_key(p), p.name, str(p.problem_id), f"L{p.level}_{p.problem_id}"]
        if any(fnmatch.fnmatch(n, pat) for n in names for pat in patterns):
            out.append(p)
    return out


def measure_dram_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy rate (bytes read + written per second), median of REPS copies."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    times = []
    for i in range(reps + 3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(times)


# ---------------------------------------------------------------- the suite

def warm_compile(problems: Sequence[Problem], jobs: int, max_tensor_mb: float | None, source: str) -> None:
    """Fill inductor's caches for the problems in JOBS parallel processes (compile time is not measured)."""
    keys = [problem_key(p) for p in problems]
    shards = [keys[i::jobs] for i in range(jobs)]
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "2"}
    procs = [subprocess.Popen([sys.executable, "-m", "metal_accel.kernelbench.runner", "--warm", source, str(max_tensor_mb or 0),
                               *shard], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for shard in shards if shard]
    for p in procs:
        p.wait()


def _warm_main(source: str, max_mb: str, keys: list[str]) -> None:
    cap = float(max_mb) or None
    for p in load_problems(source):
        if problem_key(p) not in keys:
            continue
        try:
            fit_batch(p, cap)
            model, inputs = p.instantiate("cuda")
            with torch.inference_mode():
                torch.compile(model)(*inputs)
            torch.cuda.synchronize()
        except Exception:
            pass
        torch._dynamo.reset()


def run_suite(source: str | Path, providers: Sequence[str], *, backend: str = "cuda", levels: Sequence[int] = (),
              patterns: Sequence[str] = (), attempted_only: bool = False, max_tensor_mb: float | None = None,
              budget_s: float = 1.0, bench_budget_s: float = 1.0, flush: bool = False, with_compile: bool = True,
              compile_jobs: int = 0, progress: bool = True, command: str = "", timeout_s: float = 120.0,
              compile_candidate: bool = False,
              on_row: Callable[[Row], None] | None = None) -> SuiteResult:
    from tqdm.auto import tqdm
    problems = select(load_problems(source, levels=levels or None), patterns)
    dirs = [p.partition(":")[2] if p.startswith("dir:") else p for p in providers]
    if attempted_only:
        problems = [p for p in problems if any(DirectoryProvider(d).files_for(n, backend)
                                               for d in dirs for n in (problem_key(p), p.name))]
    be = get_backend(backend)
    env: dict[str, Any] = {"backend": backend, **be.environment().to_dict()}
    dram = None
    if backend == "cuda":
        env.update(describe())
        dram = measure_dram_bandwidth()
    if with_compile and compile_jobs > 0:
        warm_compile(problems, compile_jobs, max_tensor_mb, str(source))
    rows = []
    for p in tqdm(problems, desc="bench", unit="problem", disable=not progress):
        try:
            row = run_problem(p, providers, backend=backend, device=be.device_type, max_tensor_mb=max_tensor_mb,
                              budget_s=budget_s, bench_budget_s=bench_budget_s, flush=flush,
                              with_compile=with_compile, dram_bw=dram, timeout_s=timeout_s,
                              compile_candidate=compile_candidate)
        except KeyboardInterrupt:  # out of time: keep what was measured
            break
        except Exception as exc:
            row = Row(problem_key(p), p.level, p.problem_id, p.name, status="error",
                      reason=f"{type(exc).__name__}: {exc}"[:400])
            row.rejected = traceback.format_exc(limit=3).splitlines()[-3:]
        rows.append(row)
        if on_row:
            on_row(row)
        torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return SuiteResult(rows, env, dram, command)


if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[1] == "--warm":
    _warm_main(sys.argv[2], sys.argv[3], sys.argv[4:])
