"""Prove one candidate on this device: static checks, isolated compile and validation, then timing."""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch
from torch.func import functional_call

from ..backends.base import Backend
from ..core.candidate import Candidate, declared_constant
from ..core.errors import MetalAccelError
from ..core.provider import Evaluation
from ..core.specs import InputSpec, call_signature
from ..core.verdict import Verdict
from ..runtime.capture import ModuleCall
from ..runtime.dispatch import Dispatcher, dispatcher_of, eager_forward, eager_only
from ..runtime.graph import GraphedOp
from ..runtime.native_policy import is_package_candidate, op_variant, runs_in_process, runtime_library
from ..runtime.ops import kernel_op
from ..sandbox.host import check_host_code, load_forward
from ..sandbox.kernel_source import check_kernel_source
from .perturb import PERTURBED_DISTS, perturbed_values, swapped_state
from .soak import soak
from .speed import DEFAULT_MARGIN, BenchResult, cache_flusher, compare_speed
from .testdata import kv_sweep_specs, make_inputs, rope_sweep_specs, rows_sweep_specs, sweep_specs
from .validate import (
    Judge,
    RunTrials,
    Trial,
    TrialPlan,
    ValidationResult,
    run_and_judge,
    run_trial,
    spec_bytes,
    spot_check,
    tensors_of,
    trial_batches,
    trial_plan,
)
from .worker import DEFAULT_TIMEOUT_S, WorkerFailure, shared_worker, tensors_to

log = logging.getLogger(__name__)


@dataclass
class ProofSettings:
    margin: float = DEFAULT_MARGIN
    bench_budget_s: float = 1.0
    timeout_s: float = DEFAULT_TIMEOUT_S   # compile + validation in the worker
    isolate: bool = True                    # False only for trusted, in-process candidates (tests)
    flush_cache: bool = False               # evict caches before every timed call (cold-cache timing)
    sweep: bool = True                      # SHAPE_GENERIC = True candidates also tried on other batch sizes
    graph_launch: bool = True               # CUDA: also time the kernel replayed as a CUDA graph; keep the faster


def kernels_only(lib: Any) -> SimpleNamespace:
    """What host code sees as `lib`: the compiled kernels and nothing else of the library object."""
    return SimpleNamespace(**{name: getattr(lib, name) for name in lib.kernel_names})


def device_of(call: ModuleCall) -> torch.device:
    for t in (*call.args, *call.kwargs.values()):
        if isinstance(t, torch.Tensor):
            return t.device
    for p in call.module.parameters():
        return p.device
    return torch.device("cpu")


def _cpu(value: Any) -> Any:
    return tensors_to(value, "cpu")  # containers too: a structured call's tensors cross the pipe on the CPU


def float64_reference(module: torch.nn.Module, original: Callable[..., Any]) -> Callable[..., Any]:
    """The eager forward with floating parameters and buffers in float64 (inputs are cast by judge)."""
    def ref64(*args: Any, **kwargs: Any) -> Any:
        tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        up = {k: v.detach().double() if v.is_floating_point() else v for k, v in tensors.items()}
        with eager_only():
            return functional_call(module, up, args, kwargs)
    return ref64


def prove(call: ModuleCall, key: str, cand: Candidate, backend: Backend, settings: ProofSettings) -> Evaluation:
    """Everything one candidate must survive before it may run; never raises for a bad candidate."""
    env = backend.environment()
    timings: dict[str, float] = {}

    def reject(reason: str, bench: BenchResult | None = None) -> Evaluation:
        log.info("metal_accel: %s: rejected %s: %s", call.name, cand.origin, reason)
        details: dict[str, Any] = {"timings": timings}
        if bench:
            details["bench"] = bench.to_dict()
        v = Verdict(env, False, reason, cand.digest, bench.speedup if bench else None,
                    bench.eager_us if bench else None, bench.kernel_us if bench else None, details)
        return Evaluation(cand, v, bench=bench)

    try:
        check_host_code(cand.code)
    except MetalAccelError as exc:
        return reject(f"sandbox: {exc}")
    try:
        check_kernel_source(cand.source, backend.language)
    except MetalAccelError as exc:
        return reject(f"source check: {exc}")
    assert call.spec is not None and call.output_spec is not None
    module = call.module
    disp = dispatcher_of(module)
    original = eager_forward(module)
    layout = disp.layout if disp else Dispatcher(module, original).layout
    device = device_of(call)
    plan = trial_plan(call.spec)
    sweep: dict[str, Any] = {}
    if settings.sweep and declares_shape_generic(cand.code):
        swept, skipped = shape_sweep(call.spec, declared_shape_generic(cand.code))
        for alt in swept:
            plan += trial_plan(alt, ("normal", "uniform"))
        sweep = {"sweep": {"batches": [lead_size(s) for s in swept], "too_large": [lead_size(s) for s in skipped],
                           "shapes": [list(s.tensor_specs()[0].shape) for s in swept]}}
        if skipped:
            log.info("metal_accel: %s: shape-generic sweep leaves out batch sizes %s (inputs over %d MB)",
                     call.name, sweep["sweep"]["too_large"], sweep_limit(call.spec) >> 20)

    def run_trials(trials: list[Trial]) -> list[dict[str, Any]] | str:
        """The candidate's results on TRIALS, the module's tensors as they are now, or why it failed to run."""
        state = layout.gather()
        if settings.isolate:
            req = {"backend": backend.name, "device": str(device), "code": cand.code, "source": cand.source,
                   "static": layout.static, "slots": layout.tensor_slots, "state": [_cpu(t) for t in state],
                   "trials": [{"args": [_cpu(a) for a in t.args], "kwargs": {k: _cpu(v) for k, v in t.kwargs.items()}}
                              for t in trials]}
            try:
                reply = shared_worker().request(req, settings.timeout_s)
            except WorkerFailure as exc:
                return f"isolated run {exc}"
            if not reply["ok"]:
                if reply.get("stage") == "confine":
                    return reply["error"]
                stage = "compile error" if reply.get("stage") == "compile" else "failed in the worker"
                return f"{stage}: {reply['error']}"
            timings["compile_s"] = timings.get("compile_s", 0.0) + float(reply.get("compile_s", 0.0))
            return reply["results"]
        try:
            lib = backend.compile(cand.source)
        except MetalAccelError as exc:
            return f"compile error: {exc}"
        poisoned = load_forward(cand.code, kernels_only(lib), poison=True)
        with torch.inference_mode():
            return [run_trial(lambda *a, **k: poisoned(layout.view(state), *a, **k), t.args, t.kwargs,
                              state, repeat=(i == 0), sync=backend.synchronize) for i, t in enumerate(trials)]

    t0 = time.perf_counter()
    if settings.isolate:
        built = build_here(backend, cand.source)
        if built:
            return reject(built)
    # the worker gets copies of the inputs; an in-process candidate gets the trial's own, so references need theirs
    copies = not settings.isolate
    with torch.inference_mode():
        result = streamed_proof(plan, device, run_trials, module, original, layout.gather(), copies)
    timings["proof_s"] = time.perf_counter() - t0  # the trials: compile (if not cached), runs and judging
    log.info("metal_accel: %s: %s: proof of %d trials took %.1f s", call.name, cand.origin, len(plan),
             timings["proof_s"])
    if isinstance(result, str):
        return reject(result)
    if not result.ok:
        return reject(f"incorrect: {result.reason}")
    inputs = timing_inputs(call, device) if measures_speed(backend) else []
    if settings.isolate and inputs:
        t1 = time.perf_counter()
        soaked = soak(cand, backend, device, layout, inputs, float64_reference(module, original), original, settings,
                      result.precision)
        timings["soak_s"] = time.perf_counter() - t1
        log.info("metal_accel: %s: %s: soak took %.1f s", call.name, cand.origin, timings["soak_s"])
        if soaked:
            return reject(soaked)
    own = is_package_candidate(cand, module, call.spec, backend.name)  # once: it generates the library's proposal
    try:
        lib = runtime_library(backend, cand.source, trusted=runs_in_process(cand, module, call.spec, backend, own))
    except MetalAccelError as exc:
        return reject(f"compile error: {exc}")
    op = kernel_op(key, cand.digest, lambda: load_forward(cand.code, kernels_only(lib), zeroed=not own), call.spec,
                   call.output_spec, module, backend.device_type, op_variant(lib),
                   protect=not own)
    if not measures_speed(backend):
        reason = (f"correct on {backend.name} ({result.reason}); speed not measured: an emulated device's timings "
                  "say nothing about the real one, which proves speed itself before it installs this kernel")
        details = {"timings": timings, "validation": _validation_details(result), **sweep,
                   "speed_gate": f"skipped: {backend.name} does not measure speed"}
        log.info("metal_accel: %s: %s passed validation on %s (no speed gate)", call.name, cand.origin, backend.name)
        return Evaluation(cand, Verdict(env, True, reason, cand.digest, None, None, None, details), op)
    t2 = time.perf_counter()

    check = spot_check(inputs, float64_reference(module, original), result.precision)
    flush = cache_flusher(device) if settings.flush_cache else None

    def timed(candidate_op: Any) -> BenchResult:
        probe = Dispatcher(module, original, strict=True)
        probe.honor_bypass = False
        probe.add(call.spec.signature(), candidate_op)
        with torch.inference_mode(), eager_only():
            return compare_speed(original, probe, inputs, backend.synchronize, margin=settings.margin,
                                 budget_s=settings.bench_budget_s, check=check, flush=flush,
                                 timer=backend_timer(backend))
    try:
        bench = timed(op)
    except Exception as exc:
        return reject(f"failed while timed: {type(exc).__name__}: {exc}")
    launch: dict[str, Any] = {}
    installed: Any = op
    if settings.graph_launch and backend.device_type == "cuda":
        graphed, graph_bench, launch = graph_alternative(op, module, call, timed)
        if graph_bench is not None and graph_bench.accepted and \
                (not bench.accepted or graph_bench.speedup > bench.speedup):
            launch.update(launch="cuda-graph", direct_launch=bench.reason, direct_bench=bench.to_dict())
            bench, installed = graph_bench, graphed
    timings["bench_s"] = time.perf_counter() - t2
    log.info("metal_accel: %s: %s: speed gate took %.1f s", call.name, cand.origin, timings["bench_s"])
    if not bench.accepted:
        return reject(rejection_reason(bench, launch), bench)
    reason = bench.reason + (", replayed as a CUDA graph" if launch.get("launch") == "cuda-graph" else "")
    details = {"bench": bench.to_dict(), "timings": timings, "validation": _validation_details(result), **sweep,
               **launch}
    v = Verdict(env, True, reason, cand.digest, bench.speedup, bench.eager_us, bench.kernel_us, details)
    log.info("metal_accel: %s: accepted %s: %s", call.name, cand.origin, reason)
    return Evaluation(cand, v, installed, bench)


def build_here(backend: Backend, source: str) -> str:
    """Compile SOURCE here, before the worker runs it: the worker only loads artifacts from the build directory
    (read-only to it, and it may not start a compiler). '' when built (or already on disk), else why not.
    A backend's `build` compiles and checks without loading; where there is none, `compile` also loads."""
    try:
        backend.build(source)
    except MetalAccelError as exc:
        return f"compile error: {exc}"
    return ""


TRIAL_BATCH_BYTES = 256 << 20  # a proof makes, runs and judges as many trials at a time as fit in this


def streamed_proof(plan: TrialPlan, device: torch.device, run_trials: RunTrials, module: torch.nn.Module,
                   original: Callable[..., Any], state: list[torch.Tensor], copies: bool,
                   max_bytes: int | None = None) -> ValidationResult | str:
    """The proof of one candidate: the PLAN's trials, a batch at a time (RUN_TRIALS gives the candidate's results
    on the module's state as it is when called, or why it could not run: a str), judged against eager; a
    degenerate problem then gets a second round with random module state (perturb.py), whose results decide."""
    def reference(*args: Any, **kwargs: Any) -> Any:
        with eager_only():
            return original(*args, **kwargs)
    ref64 = float64_reference(module, original)
    max_bytes = max_bytes or TRIAL_BATCH_BYTES
    first = run_and_judge(trial_batches(plan, device, copies=copies, max_bytes=max_bytes), run_trials,
                          Judge(reference, ref64))
    if isinstance(first, str) or not first.degenerate:
        return first
    if not any(t.is_floating_point() and t.numel() for t in state):
        return first
    values = perturbed_values(state, secrets.randbits(62))
    with swapped_state(state, values):
        second = run_and_judge(trial_batches(trial_plan(plan[0][0], PERTURBED_DISTS), device, copies=copies,
                                             max_bytes=max_bytes), run_trials, Judge(reference, ref64))
    if isinstance(second, str):
        return ValidationResult(False, f"with random module state: {second}", first.trials, precision=first.precision)
    if second.ok or second.degenerate:
        reason = (f"{first.reason.split(':')[0]} at the module's own state; with random parameters and buffers: "
                  + (second.reason if second.ok else "still degenerate, so no kernel can be proven correct"))
        return ValidationResult(second.ok, reason, first.trials + second.trials, second.max_abs_err,
                                second.max_norm_err, second.mismatch_fraction, second.details, not second.ok,
                                second.precision)
    return ValidationResult(False, f"with random module state: {second.reason}", first.trials + second.trials,
                            second.max_abs_err, second.max_norm_err, second.mismatch_fraction,
                            precision=second.precision)


def sweep_limit(spec: InputSpec) -> int:
    """The most input bytes a sweep variant may take: the call's own, or one trial batch if that is more."""
    return max(spec_bytes(spec), TRIAL_BATCH_BYTES)


def shape_sweep(spec: InputSpec, kind: Any = True) -> tuple[list[InputSpec], list[InputSpec]]:
    """The variants of SPEC a shape-generic candidate is also proven on (other batch sizes; for KIND "rows",
    other leading dimensions: testdata.rows_sweep_specs; for "kv", other batches and kv lengths), and those left out because their inputs exceed
    sweep_limit: a 1 GB call is not also proven on a 3 GB batch."""
    limit = sweep_limit(spec)
    variants = rows_sweep_specs(spec) if kind == "rows" else kv_sweep_specs(spec) if kind == "kv" else \
        rope_sweep_specs(spec) if kind == "rope" else sweep_specs(spec)
    return [v for v in variants if spec_bytes(v) <= limit], [v for v in variants if spec_bytes(v) > limit]


def lead_size(spec: InputSpec) -> int:
    return spec.tensor_specs()[0].shape[0]


TIMING_SETS = 8           # input sets the speed gate cycles through, so no call reuses the last one's inputs
TIMING_BYTES = 1 << 30    # ...fewer (two at least) where eight would take more memory than this


def timing_set_count(call: ModuleCall) -> int:
    nbytes = sum(t.numel() * t.element_size() for t in tensors_of(call.args, call.kwargs))
    return max(2, min(TIMING_SETS, TIMING_BYTES // max(nbytes, 1)))


def timing_inputs(call: ModuleCall, device: torch.device) -> list[tuple[tuple, dict]]:
    """The input sets the speed gate times on: copies of the call's own example inputs, the values the
    user runs, since speed can depend on them (eager's ELU skips expm1 where every input is positive:
    4x faster than a kernel that always computes it on KernelBench's all-positive inputs, 2x slower on
    normal ones); fresh normal inputs where the example does not match the spec. Eight sets, or as many
    as fit in TIMING_BYTES (two at least): large inputs defeat the caches on their own."""
    sets = timing_set_count(call)
    if call_signature(call.args, call.kwargs) == call.spec.signature():
        def copy(v: Any) -> Any:
            return v.detach().clone() if isinstance(v, torch.Tensor) else v
        return [(tuple(copy(a) for a in call.args), {k: copy(v) for k, v in call.kwargs.items()})
                for _ in range(sets)]
    gen = torch.Generator().manual_seed(secrets.randbits(62))
    return [make_inputs(call.spec, "normal", gen, device) for _ in range(sets)]


def graph_alternative(op: Any, module: torch.nn.Module, call: ModuleCall,
                      timed: Callable[[Any], BenchResult]) -> tuple[Any, BenchResult | None, dict[str, Any]]:
    """The proven kernel's op replayed as a CUDA graph, timed like the op itself: where the host's time
    per call exceeds the GPU's (Python, one launch per kernel), a replay is one launch. A capture or
    run failure only takes the alternative away; its reason is kept in the verdict's details."""
    graphed = GraphedOp(op, module)
    try:
        with torch.inference_mode():
            graphed(tuple(call.args), dict(call.kwargs), [])
        bench = timed(graphed)
    except Exception as exc:
        return graphed, None, {"graph_launch": f"not possible: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return graphed, bench, {"graph_launch": bench.reason, "graph_bench": bench.to_dict()}


def rejection_reason(bench: BenchResult, launch: dict[str, Any]) -> str:
    """Why a correct kernel was not installed: its direct launch's verdict, and the graph replay's where one
    was timed."""
    tried = launch.get("graph_launch")
    return f"{bench.reason}; replayed as a CUDA graph: {tried}" if tried else bench.reason


def measures_speed(backend: Backend) -> bool:
    """False for emulated devices (`measures_speed = False`, e.g. mps-emu): their verdicts are correctness only."""
    return backend.measures_speed


def backend_timer(backend: Backend) -> Any:
    """The backend's own bench timer (CUDA: events checked against the wall clock), else None."""
    return backend.timer()


def declared_shape_generic(code: str) -> Any:
    """The candidate's top-level `SHAPE_GENERIC = ...` value (its last assignment: the library's glue comes last):
    True (any batch size), "rows" (any leading dimensions of its one input: the kernel library's), "kv" (any batch
    and kv length of an attention call: library/hf_attention.py), or None."""
    return declared_constant(code, "SHAPE_GENERIC")


def declares_shape_generic(code: str) -> bool:
    """True when the candidate's block declares SHAPE_GENERIC = True, "rows" or "kv"."""
    return declared_shape_generic(code) in (True, "rows", "kv", "rope")


def _validation_details(result: ValidationResult) -> dict[str, Any]:
    """The verdict's record of the proof: trials, worst errors, the precision rule and any in-place input."""
    return {"trials": result.trials, "max_abs_err": result.max_abs_err, "max_norm_err": result.max_norm_err,
            **{k: result.details[k] for k in ("precision", "inplace") if k in result.details}}
