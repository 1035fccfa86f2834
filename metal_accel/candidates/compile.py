"""torch.compile as a built-in candidate: judged by the same proof and speed gate as LLM kernels.

The candidate runs no code of its own: it is torch.compile (inductor, default mode, whole
graph, static shapes) of the module's own eager forward; on CUDA a second built-in candidate
replays that compile as a CUDA graph (builtin_graph.py). A compile failure, graph break or failed
capture is a rejection with its reason. Inductor's on-disk caches make a warm start cheap.

The first call, which compiles, runs in a helper thread with a time limit (Settings.compile_timeout_s):
past it the candidate is given up and eager stays. Python cannot stop a thread, so the abandoned compile
runs on in the background: until it ends it holds CPU time, dynamo's compile lock and metal_accel's
eager switch (every dispatcher runs eager meanwhile: correct, not faster), and no other torch.compile
candidate is tried (each is rejected at once, saying why).
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Callable

import torch

from ..backends.base import Backend
from ..core import config
from ..core.candidate import BUILTIN_CODES, Candidate
from ..core.provider import Evaluation
from ..core.specs import InputSpec, OutputSpec
from ..core.verdict import Verdict
from ..proof.prove import (
    ProofSettings,
    backend_timer,
    float64_reference,
    kernels_only,
    prove,
    streamed_proof,
    timing_inputs,
)
from ..proof.speed import compare_speed
from ..proof.validate import Trial, run_trial, spot_check, trial_plan
from ..runtime.capture import ModuleCall
from ..runtime.dispatch import (
    Dispatcher,
    eager_forward,
    eager_only,
    enter_eager,
    exit_eager,
)
from ..runtime.graph import GraphedOp
from ..runtime.native_policy import is_package_candidate, op_variant, runs_in_process, runtime_library
from ..runtime.ops import KernelOp, kernel_op
from ..sandbox.host import load_forward

log = logging.getLogger(__name__)
_ORIGINS = {"inductor": "builtin:torch.compile", "cuda-graph": "builtin:cuda-graph"}
_NO_INDUCTOR = {"mps-emu"}  # emulated devices: compiling the CPU graph would say nothing about them


def compile_candidate(backend: Backend, kind: str = "inductor") -> Candidate:
    return Candidate(code=BUILTIN_CODES[kind], source="", backend=backend.name, origin=_ORIGINS[kind], kind=kind)


def supports_compile(backend: Backend, kind: str = "inductor") -> bool:
    if kind == "cuda-graph" and backend.device_type != "cuda":
        return False
    return backend.name not in _NO_INDUCTOR and backend.device_type in ("cpu", "cuda", "mps")


def builtin_kinds(backend: Backend) -> list[str]:
    """The built-in candidates this backend can run, torch.compile first."""
    return [k for k in BUILTIN_CODES if supports_compile(backend, k)]


def _own_frame(forward: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`forward` behind a function with a code object of its own. Dynamo keeps its compiled graphs
    and its recompile limit per code object; compiling many bound forwards directly shares one
    wrapper frame among them all, and after 8 modules everything falls back to eager."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)
    call.__code__ = call.__code__.replace(co_name=name)
    return call


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (its own counter)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


class CompiledOp:
    """Dispatcher-compatible op: the compiled eager forward, with child dispatchers bypassed.

    Compiled with torch.compile's defaults: `fullgraph=True` and `dynamic=False` each wrap every
    call in a config context (about 4 and 7 us a call on a 2-core Xeon). The candidate still means
    one static graph: the proof rejects a first call that compiles other than exactly one graph,
    and the dispatcher only ever calls it with the one input signature it was proven on.
    """

    def __init__(self, module: torch.nn.Module, name: str, with_kernels: bool = False) -> None:
        self.name = name
        self.with_kernels = with_kernels
        self._fn: Callable[..., Any] = torch.compile(_own_frame(eager_forward(module), name))

    def __call__(self, args: tuple, kwargs: dict, state: list[torch.Tensor]) -> Any:
        if self.with_kernels:  # the children's installed kernels traced into the graph as their custom ops
            return self._fn(*args, **kwargs)
        enter_eager()  # the compiled graph is of pure eager code; children's kernels stay out
        try:
            return self._fn(*args, **kwargs)
        finally:
            exit_eager()


_abandoned: list[threading.Thread] = []  # first compiles given up on that may still be running


class CompileTimeout(Exception):
    """The first compile ran past its limit; its thread was left running."""


def first_call(op: CompiledOp, args: tuple, kwargs: dict, device: torch.device, limit_s: float) -> None:
    """OP's first call (the compile) under inference mode, in a helper thread given LIMIT_S seconds (no limit
    where LIMIT_S <= 0: on this thread); its exception re-raised here. CompileTimeout past the limit."""
    def call() -> None:
        with torch.inference_mode():
            op(args, kwargs, [])
    if limit_s <= 0:
        call()
        return
    failure: list[BaseException] = []

    def run() -> None:
        try:
            if device.type == "cuda":
                with torch.cuda.device(device):
                    call()
            else:
                call()
        except Exception as exc:  # carried to the caller's thread
            failure.append(exc)
    thread = threading.Thread(target=run, name=f"metal_accel-{op.name}", daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        _abandoned.append(thread)
        raise CompileTimeout(f"torch.compile's first call ran past {limit_s:g} s (compile_timeout_s); given up, "
                             "eager stays (the abandoned compile may still run in the background)")
    if failure:
        raise failure[0]


def still_compiling() -> str:
    """Why no torch.compile candidate can be tried now: an abandoned compile still running, else ''."""
    _abandoned[:] = [t for t in _abandoned if t.is_alive()]
    if not _abandoned:
        return ""
    return (f"not tried: an earlier torch.compile given up on ({_abandoned[0].name}) is still running in the "
            "background and holds dynamo's compile lock")


def generated_code(module: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    """The code inductor generates for this call (Triton or C++), as LLM context; '' if unavailable."""
    try:
        from torch._inductor.utils import run_and_get_code
        with torch.inference_mode(), eager_only():
            fn = torch.compile(eager_forward(module), fullgraph=True, dynamic=False)
            _, codes = run_and_get_code(fn, *args, **kwargs)
        return "\n\n".join(codes)
    except Exception as exc:  # the context is optional; a failure here costs the LLM a hint, nothing else
        log.debug("metal_accel: no inductor code: %s", exc)
        return ""


def prove_compiled(call: ModuleCall, key: str, backend: Backend, *, margin: float, budget_s: float,
                   timer: Any = None, kind: str = "inductor") -> Evaluation:
    """Compile (and capture, for "cuda-graph"), validate in-process (torch's compiler is trusted code)
    and time against eager."""
    cand = compile_candidate(backend, kind)
    env = backend.environment()
    assert call.spec is not None

    def reject(reason: str, details: dict[str, Any] | None = None) -> Evaluation:
        log.info("metal_accel: %s: torch.compile rejected: %s", call.name, reason)
        return Evaluation(cand, Verdict(env, False, reason, cand.digest, details=details or {}))

    busy = still_compiling()
    if busy:
        return reject(busy)
    module = call.module
    device = next((a.device for a in (*call.args, *call.kwargs.values()) if isinstance(a, torch.Tensor)),
                  torch.device("cpu"))
    t0 = time.perf_counter()
    compiled = _recently_compiled.get(module, key) if kind == "cuda-graph" else None
    if compiled is None:  # the CUDA-graph candidate replays the code the torch.compile candidate just compiled
        compiled = CompiledOp(module, f"compile_{key[:16]}")
        graphs = compiled_graphs()
        try:
            first_call(compiled, tuple(call.args), dict(call.kwargs), device, config.current().compile_timeout_s)
        except CompileTimeout as exc:
            return reject(str(exc), {"timings": {"compile_s": time.perf_counter() - t0}})
        except Exception as exc:
            broke = "graph break" in str(exc).lower() or "Unsupported" in type(exc).__name__
            return reject(f"torch.compile {'graph break' if broke else 'failed'}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:300]}")
        graphs = compiled_graphs() - graphs
        if graphs != 1:  # several graphs: graph breaks; none: dynamo broke off at the call and ran it eagerly
            return reject(f"torch.compile graph break: the forward compiled into {graphs} graphs, not one")
        _recently_compiled.put(module, key, compiled)
    compile_s = time.perf_counter() - t0
    op: CompiledOp | GraphedOp = compiled
    if kind == "cuda-graph":
        op = GraphedOp(op, module)
        try:
            with torch.inference_mode():
                op(tuple(call.args), dict(call.kwargs), [])
        except Exception as exc:
            return reject(f"CUDA graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    original = eager_forward(module)
    state = [*module.parameters(), *module.buffers()]

    def run_trials(trials: list[Trial]) -> list[dict[str, Any]]:
        return [run_trial(lambda *a, **k: op(a, k, []), t.args, t.kwargs, [], repeat=(i == 0),
                          sync=backend.synchronize) for i, t in enumerate(trials)]
    plan, t0 = trial_plan(call.spec), time.perf_counter()
    with torch.inference_mode():  # torch.compile is trusted code: the references share the trials' inputs
        result = streamed_proof(plan, device, run_trials, module, original, state, copies=False)
    log.info("metal_accel: %s: torch.compile: proof of %d trials took %.1f s", call.name, len(plan),
             time.perf_counter() - t0)
    assert not isinstance(result, str)  # run_trials reports a failing call in its results, never as a str
    validation = {k: result.details[k] for k in ("precision", "inplace") if k in result.details}
    if not result.ok:
        return reject(f"incorrect: {result.reason}",
                      {"validation": {"precision": result.precision.describe()}} if result.precision else None)
    probe = Dispatcher(module, original, strict=True)
    probe.honor_bypass = False
    probe.add(call.spec.signature(), op)  # type: ignore[arg-type]
    inputs, t1 = timing_inputs(call, device), time.perf_counter()
    try:
        with torch.inference_mode(), eager_only():
            bench = compare_speed(original, probe, inputs, backend.synchronize, margin=margin, budget_s=budget_s,
                                  check=spot_check(inputs, float64_reference(module, original), result.precision),
                                  timer=timer)
    except Exception as exc:
        return reject(f"failed while timed: {type(exc).__name__}: {exc}")
    log.info("metal_accel: %s: torch.compile: speed gate took %.1f s", call.name, time.perf_counter() - t1)
    details = {"bench": bench.to_dict(), "timings": {"compile_s": compile_s}, "validation": validation}
    verdict = Verdict(env, bench.accepted, bench.reason, cand.digest, bench.speedup, bench.eager_us,
                      bench.kernel_us, details)
    return Evaluation(cand, verdict, op if bench.accepted else None, bench)  # type: ignore[arg-type]


class _LastCompiled:
    """The last module call compiled as a torch.compile candidate, so that its CUDA-graph candidate, proven next,
    replays that compiled code instead of compiling the same forward again (a second dynamo trace and inductor
    run: 1-4 s for a Llama MLP on an H200). One entry: a module's two built-in candidates are proven back to back."""

    def __init__(self) -> None:
        self._entry: tuple[weakref.ref, str, CompiledOp] | None = None

    def put(self, module: torch.nn.Module, key: str, op: CompiledOp) -> None:
        self._entry = (weakref.ref(module), key, op)

    def get(self, module: torch.nn.Module, key: str) -> CompiledOp | None:
        entry, self._entry = self._entry, None
        if entry is None or entry[0]() is not module or entry[1] != key:
            return None
        return entry[2]


_recently_compiled = _LastCompiled()
SAME_CODE_REJECTIONS = ("incorrect:", "torch.compile graph break", "torch.compile failed", "torch.compile's first call")


def graph_variant_futile(compile_verdict: Verdict) -> str:
    """Why the CUDA-graph candidate need not be proven after the torch.compile candidate's COMPILE_VERDICT, else
    '': replaying the compiled code in a CUDA graph changes its launch, not its results or whether it compiles,
    so only a torch.compile candidate rejected as not faster is worth replaying."""
    reason = compile_verdict.reason
    if compile_verdict.accepted or not reason.startswith(SAME_CODE_REJECTIONS):
        return ""
    return f"not tried: torch.compile's code, which it would replay, was rejected ({reason[:160]})"


def prove_candidate(call: ModuleCall, key: str, cand: Candidate, backend: Backend,
                    settings: ProofSettings) -> Evaluation:
    """Prove any candidate on this device: the built-in torch.compile in this process, a kernel in the worker."""
    if cand.is_builtin:
        return prove_compiled(call, key, backend, margin=settings.margin, budget_s=settings.bench_budget_s,
                              timer=backend_timer(backend), kind=cand.kind)
    return prove(call, key, cand, backend, settings)


def candidate_op(cand: Candidate, key: str, module: torch.nn.Module, spec: InputSpec, output_spec: OutputSpec,
                 backend: Backend, verdict: Verdict | None = None) -> KernelOp | CompiledOp | GraphedOp:
    """The op that runs a candidate whose verdict here is cached: torch.compile (maybe graphed), or the
    kernel, replayed as a CUDA graph where its verdict says that launch won."""
    if cand.is_builtin:
        compiled = CompiledOp(module, f"compile_{key[:16]}")
        return GraphedOp(compiled, module) if cand.kind == "cuda-graph" else compiled
    own = is_package_candidate(cand, module, spec, backend.name)  # once: it generates the library's proposal
    lib = runtime_library(backend, cand.source, trusted=runs_in_process(cand, module, spec, backend, own))
    op = kernel_op(key, cand.digest, lambda: load_forward(cand.code, kernels_only(lib), zeroed=not own), spec,
                   output_spec, module, backend.device_type, op_variant(lib),
                   protect=not own)
    if verdict is not None and verdict.details.get("launch") == "cuda-graph" and backend.device_type == "cuda":
        return GraphedOp(op, module)
    return op
