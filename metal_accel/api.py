"""The public entry points: optimize(), restore(), explain()."""
from __future__ import annotations

import logging
import time
from typing import Any, Iterable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from . import config
from .backends import backend_for_device, get_backend
from .backends.base import Backend
from .bench import DEFAULT_MARGIN
from .capture import capture
from .dispatch import dispatcher_of, uninstall
from .errors import MetalAccelError
from .pipeline import Pipeline
from .prove import ProofSettings
from .worker import DEFAULT_TIMEOUT_S
from .report import OptimizeReport
from .synth.base import CandidateProvider
from .synth.models import ModelSpec
from .synth.providers import build_providers
from .synth.settings import SynthSettings

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
             strict: bool = False, margin: float = DEFAULT_MARGIN, progress: bool | None = None,
             bench_budget_s: float = 1.0, timeout_s: float = DEFAULT_TIMEOUT_S, synthesize: bool | None = None,
             models: Sequence[str | ModelSpec] | str | None = None,
             synth_settings: SynthSettings | None = None) -> nn.Module:
    """Swap proven, faster kernels into `model` for the calls that `example_inputs` exercise.

    Returns the same model object, patched in place; `restore(model)` undoes it and
    `explain(model)` returns the report of every decision. Modules without a proven kernel keep
    their eager forward. Errors are logged and fall back to eager unless `strict=True`.
    `providers` supply candidates on a cache miss, e.g. ``["dir:path/to/candidates"]``.
    `synthesize=True` asks LLMs on a cache miss: `models` such as ``["openai:gpt-5",
    "anthropic:claude-sonnet-4-5"]`` (default: METAL_ACCEL_MODELS); `synth_settings` sets samples,
    repair rounds and budgets (see docs/synthesis.md). Naming `models` implies `synthesize`.
    New or foreign candidates compile and run first in a worker process limited to `timeout_s`.
    """
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    restore(model)
    start = time.perf_counter()
    if config.disabled():
        report = OptimizeReport("none", "disabled by METAL_ACCEL_DISABLE")
        object.__setattr__(model, _REPORT_ATTR, report)
        return model
    try:
        be = backend if isinstance(backend, Backend) else \
            get_backend(backend) if backend else backend_for_device(_device_of(model, args))
        settings = ProofSettings(margin=margin, bench_budget_s=bench_budget_s, timeout_s=timeout_s)
        plan = Pipeline(be, build_providers(providers, synthesize=synthesize, models=models, settings=synth_settings,
                                            strict=strict, progress=progress), settings=settings, strict=strict)
        calls = capture(model, args, example_kwargs, sync=be.synchronize)
    except MetalAccelError as exc:
        if strict:
            raise
        log.warning("metal_accel: model left unchanged: %s", exc)
        report = OptimizeReport(str(backend or "auto"), f"unavailable: {exc}")
        object.__setattr__(model, _REPORT_ATTR, report)
        return model
    plan.set_model(model)
    report = OptimizeReport(be.name, be.environment().device_name)
    for call in tqdm(calls, desc="metal_accel", unit="module", disable=None if progress is None else not progress, leave=False):
        report.modules.append(plan.process(call))
    report.elapsed_s = time.perf_counter() - start
    object.__setattr__(model, _REPORT_ATTR, report)
    log.info("metal_accel: %d of %d module calls run kernels", len(report.kernels), len(report.modules))
    return model


def restore(model: nn.Module) -> nn.Module:
    """Put every module's own forward back; the model behaves exactly as before optimize()."""
    for module in model.modules():
        uninstall(module)
    model.__dict__.pop(_REPORT_ATTR, None)
    return model


def explain(model: nn.Module) -> OptimizeReport:
    """The report of the last optimize(model): every captured call, kernel or eager, and why.

    Kernels switched off at run time (they raised) are reported as eager with the error.
    """
    report: OptimizeReport | None = model.__dict__.get(_REPORT_ATTR)
    if report is None:
        raise MetalAccelError("this model has not been optimized (call metal_accel.optimize first)")
    modules = {name or type(model).__name__: m for name, m in model.named_modules()}
    for m in report.modules:
        disp = dispatcher_of(modules[m.name]) if m.name in modules else None
        if m.status != "eager" and disp is not None and disp.failures and not disp.table:
            m.status, m.reason = "eager", f"{m.status} failed at run time: " + "; ".join(disp.failures.values())
    return report

