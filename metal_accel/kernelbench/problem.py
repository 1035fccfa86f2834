"""One `metal-accel bench` problem: its candidates, its size, and its measurement.

`run_problem` optimizes the problem's model with the candidates, checks the optimized output
against eager on inputs it never saw, then times eager, `torch.compile` and the optimized model in
one interleaved loop on the same fresh inputs, with the device synchronized around each call.

Candidates for a problem are read by a `dir:` provider under the problem's own names
(`<root>/<backend>/L<level>_<id>_<name>.py`, then `<root>/<backend>/<name>.py`, and folders of
those names), since every KernelBench model class is called `Model`.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..api import explain, optimize
from ..backends import get_backend
from ..backends.timing import TimingRejected, time_call
from ..candidates.directory import DirectoryProvider
from ..core.provider import ProposedText, SynthesisRequest
from ..proof.prove import backend_timer, float64_reference
from ..proof.speed import cache_flusher
from ..proof.validate import Mismatch, spot_check
from ..runtime.dispatch import eager_forward, eager_only
from .problems import Problem
from .result import Row

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


# ---------------------------------------------------------------- sizes

def _shapes(problem: Problem) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Inputs and outputs of the problem on the meta device (no memory, no compute)."""
    module = problem.load()
    with torch.device("meta"):
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).eval()
        inputs = [a for a in module.get_inputs()]
        out = model(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [t for t in inputs if isinstance(t, torch.Tensor)], [t for t in outs if isinstance(t, torch.Tensor)]


def fit_batch(problem: Problem, max_tensor_mb: float | None) -> tuple[int | None, int | None]:
    """(original, used) `batch_size` so that no input or output exceeds MAX_TENSOR_MB (halving it)."""
    module = problem.load()  # cached per process: remember the problem's own batch size the first time
    original = module.__dict__.setdefault("_metal_accel_batch_size", getattr(module, "batch_size", None))
    if not isinstance(original, int):
        return original, original
    module.batch_size = original
    if max_tensor_mb is None:
        return original, original
    batch = original
    while True:
        module.batch_size = batch
        largest = largest_tensor_mb(problem)
        if largest is None:  # the problem's shapes are tied to its batch size: keep the last that worked
            module.batch_size = batch * 2 if batch != original else original
            return original, module.batch_size
        if largest <= max_tensor_mb or batch == 1:
            return original, batch
        batch = max(1, batch // 2)


MODEL_COPIES = 3   # the model's weights, and its float64 reference's (twice the bytes); compile's twin shares them
WORKER_COPIES = 2  # a kernel candidate's worker holds its own copy, and another passes through the pipe
MEMORY_SHARE = 0.75  # of the device memory, for the weights' copies; the rest for activations and the runtime


def state_mb(problem: Problem) -> float | None:
    """MB of the problem model's parameters and buffers, built on the meta device (None: unknown)."""
    module = problem.load()
    try:
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
    except Exception:
        return None
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())) / 1e6


def device_memory_mb(device: str) -> float:
    """The memory of DEVICE (the first GPU for "cuda", physical memory otherwise), in MB."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 1e6
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): no limit
        return math.inf


def too_heavy(problem: Problem, device: str, kernels: bool = True) -> str | None:
    """Why the problem's weights are too large for the bench on DEVICE, or None. KERNELS: whether a kernel
    candidate may run (in a worker, with its own copy of the weights)."""
    copies = MODEL_COPIES + (WORKER_COPIES if kernels else 0)
    weights, limit = state_mb(problem), device_memory_mb(device) * MEMORY_SHARE / copies
    if weights is None or weights <= limit:
        return None
    return (f"its parameters and buffers ({weights:.0f} MB) exceed {limit:.0f} MB: the bench would hold "
            f"{copies} copies of them{' (a kernel candidate runs in a worker)' if kernels else ''} "
            f"in {MEMORY_SHARE:.0%} of the {device} memory")


def largest_tensor_mb(problem: Problem) -> float | None:
    """The largest input or output of the problem at its current batch_size, in MB (None: unknown)."""
    try:
        ins, outs = _shapes(problem)
    except Exception:  # some problems cannot run on the meta device: measured for real instead
        return None
    return max((t.numel() * t.element_size() for t in ins + outs), default=0) / 1e6


# ---------------------------------------------------------------- measurement

def side_by_side(fns: dict[str, Callable[..., Any]], input_sets: list[tuple], sync: Callable[[], None],
                 timer: Callable[..., tuple[float, Any]] | None, budget_s: float, min_reps: int = 10,
                 max_reps: int = 300) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin (rotating order) on rotating inputs."""
    timer = timer or time_call
    names = list(fns)
    for args in input_sets[:2]:
        for n in names:
            fns[n](*args)
    times: dict[str, list[float]] = {n: [] for n in names}
    start, rep = time.perf_counter(), 0
    while rep < max_reps and (rep < min_reps or time.perf_counter() - start < budget_s):
        args = input_sets[rep % len(input_sets)]
        order = names[rep % len(names):] + names[:rep % len(names)]
        for n in order:
            for _ in range(4):
                try:
                    times[n].append(timer(fns[n], args, {}, sync)[0])
                    break
                except TimingRejected:
                    continue
        rep += 1
    return {n: statistics.median(t) if t else float("nan") for n, t in times.items()}


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
    largest = largest_tensor_mb(problem)
    skip = None
    if max_tensor_mb is not None and largest is not None and largest > max_tensor_mb:
        skip = (f"a {largest:.0f} MB tensor exceeds --max-tensor-mb {max_tensor_mb:g}, and "
                f"{'batch_size 1 is the smallest' if row.batch == 1 else 'the problem has no batch_size to shrink'}")
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
    compiled = None
    if with_compile:
        shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
        twin = copy.deepcopy(model, shared)  # its own modules, the same weights: inference never writes them
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
    row.candidate_correct = _candidate_correct(row)
    with torch.inference_mode():
        out = model(*sets[2])
        with eager_only():
            expect = model(*sets[2])
    try:  # the proof's rule: eager's tolerance, or as close to the float64 result as eager is
        with torch.inference_mode():
            spot_check([(tuple(sets[2]), {})], float64_reference(model, eager_forward(model)))(out, expect, "optimized", 0)
        row.output_ok = True
    except Mismatch as exc:
        row.output_ok, row.reason = False, _mismatch_reason(model, sets[2], expect, report, exc)

    def eager(*a: Any) -> Any:
        with eager_only():
            return model(*a)

    fns: dict[str, Callable[..., Any]] = {"eager": eager, "optimized": model}
    if compiled is not None:
        fns["compile"] = compiled
    timer = backend_timer(be)
    if flush:  # evict L2 before every timed call (cold-cache timing)
        flusher, base = cache_flusher(device), timer or time_call
        timer = lambda fn, a, k, s: (flusher(), base(fn, a, k, s))[1]  # noqa: E731
    with torch.inference_mode():
        med = side_by_side(fns, sets, be.synchronize, timer, budget_s)
    step.done("side-by-side timing")
    row.eager_us, row.kernel_us = med["eager"] * 1e6, med["optimized"] * 1e6
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
