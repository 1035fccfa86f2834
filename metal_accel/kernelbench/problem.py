"""One `metal-accel bench` problem: its candidates, its size, and its measurement.

`run_problem` skips a problem over `--max-tensor-mb` or too heavy for the device (sizes.py),
optimizes the problem's model with the candidates, checks the optimized output against eager on
inputs it never saw, then times eager, a second copy of eager (the self-noise), `torch.compile` and
the optimized model in balanced rounds on the same fresh inputs (timing.py), with the device
synchronized around each call. The row counts what runs in the whole captured subtree.

Candidates for a problem are read by a `dir:` provider under the problem's own names
(`<root>/<backend>/L<level>_<id>_<name>.py`, then `<root>/<backend>/<name>.py`, and folders of
those names), since every KernelBench model class is called `Model`.
"""
from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..api import explain, optimize
from ..backends import get_backend
from ..backends.timing import time_call
from ..candidates.directory import DirectoryProvider
from ..core import config
from ..core.provider import ProposedText, SynthesisRequest
from ..proof.precision import recorded_call, rule_for
from ..proof.prove import backend_timer, float64_reference
from ..proof.speed import cache_flusher
from ..proof.validate import Mismatch, spot_check
from ..runtime.dispatch import eager_forward, eager_only
from .problems import Problem
from .result import Row, call_counts
from .sizes import fit_batch, largest_tensor_mb, over_cap, state_mb, too_heavy
from .timing import interleave, median, self_noise, side_by_side

__all__ = ["ProblemProvider", "fit_batch", "input_sets", "largest_tensor_mb", "problem_key", "run_problem",
           "side_by_side", "state_mb", "tensor_bytes", "too_heavy"]

log = logging.getLogger(__name__)


def problem_key(p: Problem) -> str:
    return f"L{p.level}_{p.problem_id}_{p.name}" if p.level is not None else p.name


class ProblemProvider:
    """A `dir:` provider that knows the problem's names for its root model (class `Model`)."""

    def __init__(self, root: str | Path, problem: Problem, model: torch.nn.Module) -> None:
        self.inner = DirectoryProvider(root)
        self.name = f"dir:{root}"
        self.names = [problem_key(problem), problem.name]
        self.model = model

    def files(self, backend: str) -> list[Path]:
        seen: list[Path] = []
        for n in self.names:
            seen += [f for f in self.inner.files_for(n, backend) if f not in seen]
        return seen

    def propose(self, request: SynthesisRequest) -> list[ProposedText]:
        if request.module is not self.model:
            return self.inner.propose(request)
        return [ProposedText(f.read_text(), f"dir:{f}") for f in self.files(request.backend)]


# ---------------------------------------------------------------- measurement

def input_sets(problem: Problem, inputs: tuple, device: torch.device | str, fresh: int = 2) -> list[tuple]:
    """INPUTS and FRESH more input sets from the problem's `get_inputs()`, on DEVICE."""
    module = problem.load()
    return [inputs] + [tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in module.get_inputs())
                       for _ in range(fresh)]


def _flops(model: torch.nn.Module, inputs: tuple) -> float:
    from torch.utils.flop_counter import FlopCounterMode
    try:
        with FlopCounterMode(display=False) as counter, torch.inference_mode():
            model(*inputs)
        return float(counter.get_total_flops())
    except Exception:
        return float("nan")


def tensor_bytes(values: Any) -> int:
    """Bytes of the tensors in VALUES (a tensor, or a flat tuple or list of arguments)."""
    vals = values if isinstance(values, (tuple, list)) else (values,)
    return sum(v.numel() * v.element_size() for v in vals if isinstance(v, torch.Tensor))


def run_problem(problem: Problem, providers: Sequence[str], *, backend: str = "cuda", device: str = "cuda",
                max_tensor_mb: float | None = None, budget_s: float = 1.0, bench_budget_s: float = 1.0,
                flush: bool = False, with_compile: bool = True, dram_bw: float | None = None,
                seed: int = 0, timeout_s: float = 120.0, compile_candidate: bool = False) -> Row:
    """One problem: optimize with the candidates, then eager / compile / optimized side by side."""
    row = Row(problem_key(problem), problem.level, problem.problem_id, problem.name)
    t_start = time.perf_counter()
    be = get_backend(backend)
    row.batch_original, row.batch = fit_batch(problem, max_tensor_mb)
    skip = over_cap(problem, max_tensor_mb, row.batch, row.batch_original)
    skip = skip or too_heavy(problem, device, kernels=_kernels_may_come(problem, providers, backend))
    if skip is not None:
        row.status, row.reason = "skipped", skip
        row.seconds = time.perf_counter() - t_start
        return row
    step = _Steps(row.key)
    model, inputs = problem.instantiate(device, seed)
    provs = [ProblemProvider(p.partition(":")[2] if p.startswith("dir:") else p, problem, model) for p in providers]
    row.attempted = any(p.files(backend) for p in provs)
    sets = input_sets(problem, inputs, device)
    row.flops = _flops(model, inputs)
    with torch.inference_mode():
        ref = model(*sets[1])
    state = model.state_dict().values()
    step.done("model, inputs and an eager reference")
    row.min_bytes = float(tensor_bytes(inputs) + tensor_bytes(ref) + sum(tensor_bytes(t) for t in state))
    # eager as the user had it, twice (the second gives the measurement's own noise): copies of the model
    # called directly, never optimized, so the optimized model is not compared with eager plus a wrapper
    plain, plain_again = _twin(model), _twin(model)
    compiled = None
    if with_compile:
        twin = _twin(model)
        compiled = torch.compile(twin)
        t0 = time.perf_counter()
        with torch.inference_mode():
            compiled(*inputs)
        be.synchronize()
        row.compile_s = time.perf_counter() - t0
        step.done("torch.compile's first call")
    # torch.compile as a candidate, or not
    optimize(model, inputs, backend=backend, providers=provs, progress=False, bench_budget_s=bench_budget_s,
             timeout_s=timeout_s, compile=compile_candidate)
    step.done("the pipeline (capture, proofs, speed gates)")
    report = explain(model)
    root = next((m for m in report.modules if m.name == type(model).__name__), None)
    if root is not None:
        row.status, row.reason, row.rejected = root.status, root.reason, list(root.rejected)
        row.outpaced = list(root.outpaced)
        row.pipeline_speedup, row.winner = root.speedup, root.source if root.status != "eager" else ""
    row.calls = call_counts(report.modules)
    row.candidate_correct = _candidate_correct(row)
    with torch.inference_mode():
        out = model(*sets[2])
        with eager_only():
            expect, ops = recorded_call(model, tuple(sets[2]), {})
    # the proof's rule (the run's precision setting, eager's reduced-precision flags for the ops it ran):
    # eager's tolerance, or as close to the float64 result as eager is
    rule = rule_for(ops, config.current().precision)
    try:
        with torch.inference_mode():
            spot_check([(tuple(sets[2]), {})], float64_reference(model, eager_forward(model)),
                       rule)(out, expect, "optimized", 0)
        row.output_ok = True
    except Mismatch as exc:
        row.output_ok, row.reason = False, _mismatch_reason(model, sets[2], expect, report, exc)

    fns: dict[str, Callable[..., Any]] = {"eager": plain, "eager_again": plain_again, "optimized": model}
    if compiled is not None:
        fns["compile"] = compiled
    timer = backend_timer(be)
    if flush:  # evict L2 before every timed call (cold-cache timing)
        flusher, base = cache_flusher(device), timer or time_call
        timer = lambda fn, a, k, s: (flusher(), base(fn, a, k, s))[1]  # noqa: E731
    with torch.inference_mode():
        samples = interleave(fns, sets, be.synchronize, timer, budget_s)
    step.done("side-by-side timing")
    med = {n: median(t) for n, t in samples.items()}
    row.samples = min(len(t) for t in samples.values())
    row.eager_us, row.kernel_us = med["eager"] * 1e6, med["optimized"] * 1e6
    row.eager_again_us, row.self_noise = med["eager_again"] * 1e6, self_noise(med["eager"], med["eager_again"])
    row.vs_eager = med["eager"] / med["optimized"]
    if compiled is not None:
        row.compile_us = med["compile"] * 1e6
        row.vs_compile = med["compile"] / med["optimized"]
    intensity = (row.flops or 0.0) / row.min_bytes if row.min_bytes else 0.0
    row.memory_bound = not math.isnan(intensity) and intensity < 10.0
    row.bandwidth_gbs = row.min_bytes / med["optimized"] / 1e9
    if dram_bw:
        row.bandwidth_frac = row.min_bytes / med["optimized"] / dram_bw
    row.seconds = time.perf_counter() - t_start
    return row


def _twin(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of MODEL with its own modules and the same weights (inference never writes them)."""
    return copy.deepcopy(model, {id(t): t for t in (*model.parameters(), *model.buffers())})


class _Steps:
    """Logs each step of one problem's run with its duration (seen with `metal-accel -v bench`)."""

    def __init__(self, key: str) -> None:
        self.key, self.t = key, time.perf_counter()

    def done(self, what: str) -> None:
        now = time.perf_counter()
        log.info("metal_accel: %s: %s took %.1f s", self.key, what, now - self.t)
        self.t = now


def _kernels_may_come(problem: Problem, providers: Sequence[str], backend: str) -> bool:
    """Whether a kernel candidate may be proposed: any provider other than a directory, or a directory
    with files for this problem."""
    names = (problem_key(problem), problem.name)
    return any(not p.startswith("dir:") or any(DirectoryProvider(p.partition(":")[2]).files_for(n, backend)
                                               for n in names) for p in providers)


def _candidate_correct(row: Row) -> bool | None:
    """Whether a candidate of ours (not the built-in torch.compile) passed validation."""
    if row.status == "kernel":
        return True
    if not row.attempted:
        return None
    if any(not r.startswith("builtin:") for r in row.outpaced):
        return True  # passed validation and the speed gate, then lost to torch.compile
    reasons = " ".join(r for r in row.rejected if not r.startswith("builtin:"))
    if any(w in reasons for w in ("not faster", "within noise", "unreliable timing")) and not any(
            w in reasons for w in ("incorrect", "compile error", "failed", "sandbox", "source check", "crashed")):
        return True
    return False


def _mismatch_reason(model: Any, inputs: tuple, expect: Any, report: Any, exc: Exception) -> str:
    """Why the optimized model's output differs from eager: eager's own irreproducibility, or which modules
    run something other than eager (each proven alone; an ill-conditioned composite can still drift)."""
    with torch.inference_mode(), eager_only():
        again = model(*inputs)
    firsts = expect if isinstance(expect, (tuple, list)) else (expect,)
    seconds = again if isinstance(again, (tuple, list)) else (again,)
    if not all(torch.equal(a, b) for a, b in zip(firsts, seconds)):
        return f"eager itself is not reproducible here (two eager runs differ), so the optimized output cannot be checked: {exc}"
    changed = [f"{m.name} ({m.status})" for m in report.modules if m.status != "eager"]
    return f"optimized output differs from eager ({', '.join(changed) or 'no module'} not eager): {exc}"
