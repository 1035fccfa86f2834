"""The public entry points: optimize(), restore(), explain(), load_cache()."""
from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from .auto import hook
from .backends import backend_for_device, get_backend
from .backends.base import Backend
from .candidates.compile import supports_compile
from .candidates.providers import build_providers
from .core import config
from .core.candidate import Candidate
from .core.config import Settings
from .core.errors import MetalAccelError
from .core.provider import CandidateProvider, Evaluation
from .core.redact import redact
from .library import hf_attention
from .library import rotary as rotary_mod
from .model_choice import EVERYWHERE, WHOLE, apply_verdict, prove_end_to_end
from .decisions import Deferred, decide_calls
from .pipeline import Pipeline
from .proof.prove import ProofSettings
from .report import OptimizeReport, clock
from .runtime.capture import ModuleCall, capture
from .runtime.dispatch import dispatcher_of, uninstall
from .runtime.model_state import StateGuard
from .store import cache as cache_store
from .store import model_verdicts
from .synth.models import ModelSpec
from .synth.settings import SynthSettings
from .whole_model import prove_whole_model, whole_model_op

log = logging.getLogger(__name__)
_REPORT_ATTR = "_metal_accel_report"


def _device_of(model: nn.Module, args: Sequence[Any]) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def optimize(model: nn.Module, example_inputs: Any, example_kwargs: dict[str, Any] | None = None, *,
             backend: str | Backend | None = None, providers: Iterable[str | CandidateProvider] | None = None,
             synthesize: bool | None = None, models: Sequence[str | ModelSpec] | str | None = None,
             strict: bool = False, progress: bool | None = None, settings: Settings | None = None,
             synth_settings: SynthSettings | None = None, workload: Callable[[nn.Module], Any] | None = None,
             **changes: Any) -> nn.Module:
    """Swap proven, faster kernels into `model` for the calls that `example_inputs` exercise.

    Returns the same model object, patched in place; `restore(model)` undoes it and
    `explain(model)` returns the report of every decision. Modules without a proven kernel keep
    their eager forward. Errors are logged and fall back to eager unless `strict=True`.
    `providers` supply candidates on a cache miss, e.g. ``["dir:path/to/candidates"]``.
    `synthesize=True` asks LLMs on a cache miss: `models` such as ``["openai:gpt-5",
    "anthropic:claude-sonnet-4-5"]`` (default: METAL_ACCEL_MODELS); `synth_settings` sets samples,
    repair rounds and budgets (see docs/synthesis.md). Naming `models` implies `synthesize`.
    Everything else is a setting: `settings` (default: `metal_accel.settings()`, from the environment)
    with `changes` by name, e.g. ``margin=0.1, bench_budget_s=2.0, timeout_s=60, compile=False``
    (core/config.py lists them); they are in force for this call only.
    `workload`: a function that runs the model as the application will, e.g.
    ``lambda m: m.generate(ids, max_new_tokens=8)``; the calls it makes that repeat within it (every decode
    step's) are decided too, and it is what the end-to-end stage times, so decode never gets slower.
    """
    run_settings = (settings or config.current()).with_(**changes)
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    restore(model)
    start = time.perf_counter()
    if run_settings.disabled:
        report = OptimizeReport("none", "disabled by METAL_ACCEL_DISABLE")
        object.__setattr__(model, _REPORT_ATTR, report)
        return model
    guard = StateGuard(model)
    training = guard.training_modules()
    if training:
        warnings.warn(training_warning(training), UserWarning, stacklevel=2)
    guard.eval()  # capture, proofs and timing all see the model as it will run its kernels: in eval mode
    try:
        with config.using(run_settings):
            report = _optimize(model, args, example_kwargs, guard, backend=backend, providers=providers,
                               strict=strict, progress=progress, synthesize=synthesize, models=models,
                               synth_settings=synth_settings, workload=workload)
    finally:
        changes = guard.restore()  # training flags, and any tensor something changed
    for change in changes:
        warnings.warn(f"metal_accel: optimize() changed the model and put it back: {change}", UserWarning,
                      stacklevel=2)
    report.notes += [f"training mode: {training_note(training)}"] if training else []
    report.notes += [f"state restored: {c}" for c in changes]
    report.elapsed_s = time.perf_counter() - start
    object.__setattr__(model, _REPORT_ATTR, report)
    annotate(report, model)
    log.info("metal_accel: %d of %d module calls run kernels", len(report.kernels), len(report.modules))
    return model


def _optimize(model: nn.Module, args: tuple, example_kwargs: dict[str, Any] | None, guard: StateGuard, *,
              backend: str | Backend | None, providers: Iterable[str | CandidateProvider] | None, strict: bool,
              progress: bool | None, synthesize: bool | None, models: Sequence[str | ModelSpec] | str | None,
              synth_settings: SynthSettings | None,
              workload: Callable[[nn.Module], Any] | None = None) -> OptimizeReport:
    """optimize() with the model in eval mode under GUARD: capture, then every captured call decided."""
    try:
        be = backend if isinstance(backend, Backend) else \
            get_backend(backend) if backend else backend_for_device(_device_of(model, args))
        now = config.current()
        settings = ProofSettings(margin=now.margin, bench_budget_s=now.bench_budget_s, timeout_s=now.timeout_s)
        plan = GuardedPipeline(be, build_providers(providers, synthesize=synthesize, models=models,
                                                   settings=synth_settings, strict=strict, progress=progress),
                               settings=settings, strict=strict, guard=guard)
        t0 = time.perf_counter()
        calls = capture(model, args, example_kwargs, sync=be.synchronize, workload=workload)
        captured_s = time.perf_counter() - t0
    except MetalAccelError as exc:
        if strict:
            raise
        log.warning("metal_accel: model left unchanged: %s", exc)
        return OptimizeReport(str(backend or "auto"), f"unavailable: {exc}")
    plan.set_model(model)
    report = OptimizeReport(be.name, be.environment().device_name, stage_s={"capture": captured_s},
                            module_s=plan.stage_s)
    now_calls, later = calls, []
    deferring = workload is not None and now.compile and now.end_to_end and be.measures_speed and supports_compile(be)
    if deferring:
        # the workload's own signatures (decode steps) and the decode attention kernels are decided only if the
        # model compiled whole does not take every call of the workload (model_choice.prove_end_to_end): on
        # every decoder LM of the zoo it did, and their proofs were time spent for nothing
        later = [c for c in calls if c.from_workload and c.replaceable]
        now_calls = [c for c in calls if not any(c is d for d in later)]
    decide_calls(plan, report, now_calls, progress, len(calls))

    def attach_attention() -> None:
        with clock(report.stage_s, "attention kernels"):
            report.notes.extend(_attach_routed(model, be, strict, rotary=False))
    defer_attention = deferring and hf_attention.applies(model)  # others get their report line now
    decide_later = Deferred(plan, report, later, progress, len(calls), attach_attention if defer_attention else None)
    with clock(report.stage_s, "attention kernels"):
        report.notes += _attach_routed(model, be, strict, attention=not defer_attention)
    if not (now.end_to_end and be.measures_speed):  # emulated devices: timings say nothing about the real one
        decide_later()
        return report
    kwargs = dict(example_kwargs or {})
    choices = [(r.name, r.status, r.key) for r in report.modules if r.status != "eager"]
    mkey = model_verdicts.model_key(model, args, kwargs, be.name, choices,
                                    workload=getattr(workload, "__qualname__", "workload") if workload else "")
    cached = model_verdicts.get(be.name, mkey, be.environment()) if mkey else None
    if cached is not None:
        if (cached.end_to_end.get("workload") or {}).get("outcome") != EVERYWHERE:
            decide_later()
        else:
            decide_later.leave(f"{WHOLE} takes every call of the workload (model-level verdict)")
        with clock(report.stage_s, "end-to-end choice (cached verdict)"):
            e2e = apply_verdict(model, args, kwargs, report, cached.outcome, cached.dropped, cached.end_to_end,
                                lambda: whole_model_op(model, bool(cached.end_to_end.get("whole_with_kernels"))))
        report.end_to_end = e2e.to_dict()
        log.info("metal_accel: end to end: %s", e2e.decision)
        return report
    whole, why_not = None, ""
    if now.compile and supports_compile(be) and _whole_not_tried(model, report):
        t0 = time.perf_counter()
        with clock(report.stage_s, WHOLE):
            whole, why_not = prove_whole_model(model, args, kwargs, _device_of(model, args))
        log.info("metal_accel: %s: %s (%.1f s)", WHOLE, "proven" if whole is not None else why_not,
                 time.perf_counter() - t0)
        if why_not:
            report.notes.append(redact(f"{WHOLE} not used: {why_not}"))
    with_kernels = None
    if now.kernels_in_whole and now.compile and supports_compile(be) and _kernels_below(model, report) \
            and whole is not None:
        t0 = time.perf_counter()  # the same, with the installed kernels inside its graph as custom ops
        with clock(report.stage_s, f"{WHOLE} with our kernels inside"):
            with_kernels, why_not = prove_whole_model(model, args, kwargs, _device_of(model, args),
                                                      with_kernels=True)
        log.info("metal_accel: %s with our kernels inside: %s (%.1f s)", WHOLE,
                 "proven" if with_kernels is not None else why_not, time.perf_counter() - t0)
        if why_not:
            report.notes.append(redact(f"{WHOLE} with our kernels inside not used: {why_not}"))
    if whole is None:
        decide_later()  # no model-level candidate can take the workload's calls
    if _composes(model, report) or whole is not None:
        try:
            with clock(report.stage_s, "end-to-end check"):
                e2e = prove_end_to_end(model, args, kwargs, report, be.synchronize,
                                       budget_s=max(1.0, 2 * now.bench_budget_s), whole=whole, workload=workload,
                                       whole_with_kernels=with_kernels, fresh_whole=lambda: whole_model_op(model),
                                       decide_later=decide_later if decide_later.pending else None)
            report.end_to_end = e2e.to_dict() if e2e is not None else None
            if decide_later.elapsed_s:  # decisions made inside the stage are the module decisions' time
                report.stage_s["end-to-end check"] -= decide_later.elapsed_s
        except Exception as exc:  # the choices stay as proven one by one; the report says why
            if strict:
                raise
            report.notes.append(redact(f"end-to-end check not done: {type(exc).__name__}: {exc}"))
            decide_later()
            return report
        if e2e is not None and (e2e.workload or {}).get("outcome") == EVERYWHERE:
            decide_later.leave(f"{WHOLE} takes every call of the workload (decided end to end)")
        if e2e is not None and mkey and e2e.remembered:
            model_verdicts.put(be.name, mkey, be.environment(),
                               model_verdicts.ModelVerdict(e2e.outcome, list(e2e.dropped), e2e.to_dict()))
    decide_later()  # none are left where the end-to-end stage needed them
    return report


def _attach_routed(model: nn.Module, be: Backend, strict: bool, attention: bool = True,
                   rotary: bool = True) -> list[str]:
    """An HF model's sdpa attention and rotary embeddings through the library's proven kernels
    (library/hf_attention.py, library/rotary.py); the report's lines about them, none for other models."""
    lines = []
    for what, attach in (("attention: sdpa kept", hf_attention.attach if attention else None),
                         ("rotary: the model's own kept", rotary_mod.attach if rotary else None)):
        if attach is None:
            continue
        try:
            lines.append(attach(model, be))
        except Exception as exc:  # the model keeps its own
            if strict:
                raise
            lines.append(redact(f"{what} after an internal error: {type(exc).__name__}: {exc}"))
    return [line for line in lines if line]


def _composes(model: nn.Module, report: OptimizeReport) -> bool:
    """Some choice runs below the model's own call: the gate timed each alone, so the whole is worth timing.
    A model whose one choice is its own call was timed whole by its gate already."""
    root = type(model).__name__
    return any(m.name != root for m in report.kernels)


def _kernels_below(model: nn.Module, report: OptimizeReport) -> bool:
    """Some module below the model's own call runs a kernel (a custom op the compiled model can call)."""
    root = type(model).__name__
    return any(m.name != root and m.status == "kernel" for m in report.kernels)


def _whole_not_tried(model: nn.Module, report: OptimizeReport) -> bool:
    """The model's own call is not compiled already, and its compile was not rejected as incorrect: one the
    pipeline rejected only as not faster alone (its gate's margin, timed alone) is worth timing again in the
    end-to-end rotation, against the per-module choices and within the measured noise."""
    root = next((m for m in report.modules if m.name == type(model).__name__), None)
    if root is None:
        return True
    if root.status != "eager":
        return False
    reasons = [r.split(": ", 1)[-1] for r in root.rejected if r.startswith(("builtin:", "inductor", "cuda-graph"))]
    return all(r.startswith("not faster") for r in reasons)


@dataclass
class GuardedPipeline(Pipeline):
    """The pipeline, copying a module's parameters and buffers before the first proof runs on it, so that
    whatever a candidate, a reference or a perturbed trial leaves in them is put back (StateGuard)."""

    guard: StateGuard | None = None

    def evaluate(self, call: ModuleCall, key: str, cand: Candidate) -> Evaluation:
        if self.guard is not None:
            self.guard.protect(call.module)
        return super().evaluate(call, key, cand)


def restore(model: nn.Module) -> nn.Module:
    """Put every module's own forward back; the model behaves exactly as before optimize()."""
    for module in model.modules():
        uninstall(module)
    hf_attention.detach(model)
    rotary_mod.detach(model)
    model.__dict__.pop(_REPORT_ATTR, None)
    return model


def explain(model: nn.Module) -> OptimizeReport:
    """The report of the last optimize(model): every captured call, kernel or eager, and why.

    Kernels switched off at run time (they raised) are reported as eager with the error; kernels that
    run only under conditions the model does not meet now (eval mode, no autograd) carry a note saying so.
    """
    report: OptimizeReport | None = model.__dict__.get(_REPORT_ATTR)
    if report is None:
        raise MetalAccelError("this model has not been optimized (call metal_accel.optimize first)")
    modules = {name or type(model).__name__: m for name, m in model.named_modules()}
    for m in report.modules:
        disp = dispatcher_of(modules[m.name]) if m.name in modules else None
        if m.status != "eager" and disp is not None and disp.failures and not disp.table:
            m.status, m.reason = "eager", f"{m.status} failed at run time: " + redact("; ".join(disp.failures.values()))
    annotate(report, model)
    report.notes = [n for n in report.notes if not n.startswith(rotary_mod.DECISION)] + rotary_mod.decisions(model)
    return report


GRAD_NOTE = "runs only under torch.no_grad() or torch.inference_mode()"


def annotate(report: OptimizeReport, model: nn.Module) -> None:
    """Each installed kernel's conditions the model does not meet now: a module (or a descendant) in
    training mode, parameters that require grad (kernels have no backward, so autograd runs eager)."""
    modules = {name or type(model).__name__: m for name, m in model.named_modules()}
    for m in report.modules:
        module = modules.get(m.name)
        m.notes = []
        if m.status == "eager" or module is None:
            continue
        if any(sub.training for sub in module.modules()):
            m.notes.append("installed for eval mode: runs eager while the module is in training mode "
                           "(call model.eval())")
        if any(p.requires_grad for p in module.parameters()):
            m.notes.append(f"{GRAD_NOTE}: its parameters require grad, and with autograd recording it runs eager")


def training_warning(names: list[str]) -> str:
    return f"metal_accel: optimize() makes kernels for inference: {training_note(names)}"


def training_note(names: list[str]) -> str:
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return (f"{len(names)} module(s) were in training mode ({shown}); they were captured and proven in eval "
            "mode, their training flags were put back, and their kernels run only once they are in eval mode "
            "(model.eval())")


def load_cache(path: str | os.PathLike, sha256: str | None = None) -> Path:
    """Add a read-only kernel cache (a directory or a bundle, e.g. one shipped with an app).

    With `sha256` (the bundle's lock), a bundle whose manifest differs is refused, and the verdicts
    of one that matches count as proof: its kernels run here without being proven again. Without
    it, the cache's verdicts are claims: each kernel is proven on this device before its first use
    (and then remembered, sealed, in the user cache). Only paths the user names are ever loaded:
    CPU and CUDA kernels are native code. Returns the directory used. When `import metal_accel`
    auto-instrumentation is on, the classes the new cache names are patched too.
    """
    p = cache_store.load_cache(path, sha256)
    if hook.is_active():
        try:
            hook.activate()
        except Exception as exc:  # the cache is loaded; only the auto-instrumentation could not follow
            log.warning("metal_accel: could not extend auto-instrumentation to %s: %s", p, exc)
    return p
