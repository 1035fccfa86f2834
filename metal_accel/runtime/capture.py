"""Capture: run the example inputs with forward hooks and record every module call."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..core.specs import InputSpec, OutputSpec, UnsupportedCall, call_signature
from .dispatch import eager_only

MAX_COMPOSITE_MODULES = 16  # a composite with more descendants than this gets no LLM kernel (torch.compile only)
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


@dataclass
class ModuleCall:
    """One (module, input spec) seen during capture, with the example tensors of its first call."""

    name: str
    module: nn.Module
    spec: InputSpec | None
    output_spec: OutputSpec | None
    args: tuple
    kwargs: dict[str, Any]
    calls: int = 0
    eager_s: float = 0.0           # inclusive wall time summed over calls
    unsupported: str = ""          # why it cannot get a kernel, if it cannot
    compile_only: str = ""         # why LLM kernels are not asked for (torch.compile may still win)
    children: list[str] = field(default_factory=list)

    @property
    def replaceable(self) -> bool:
        return not self.unsupported


def replaceability(module: nn.Module) -> str:
    """'' when the module may run something other than its eager forward, else the reason it may not."""
    if isinstance(module, _CONTAINERS):
        return "container module"
    if module._forward_hooks or module._forward_pre_hooks:
        return "module has its own forward hooks"
    return ""


def llm_limit(module: nn.Module) -> str:
    """'' when an LLM may be asked for this module's kernel, else why not (too large for one prompt)."""
    n_desc = sum(1 for _ in module.modules()) - 1
    if n_desc > MAX_COMPOSITE_MODULES:
        return f"composite of {n_desc} modules (LLM limit {MAX_COMPOSITE_MODULES})"
    return ""


def _detach_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


def capture(model: nn.Module, args: tuple, kwargs: dict[str, Any] | None = None, *,
            warmup: int = 1, runs: int = 1, sync: Callable[[], None] = lambda: None) -> list[ModuleCall]:
    """Run `model(*args, **kwargs)` with hooks; return the calls, hottest (inclusive time) first.

    After `warmup` plain runs, one run records the calls and `runs` more time them (inclusive
    wall time, hooks' own cost included: an ordering estimate; benchmarks measure precisely).
    """
    kwargs = kwargs or {}
    names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}
    reasons = {id(m): replaceability(m) for m in model.modules()}  # before our own hooks exist
    limits = {id(m): llm_limit(m) for m in model.modules()}
    records: dict[tuple, ModuleCall] = {}
    stack: list[tuple[int, tuple, dict, float]] = []
    recording = timing = False

    def pre_hook(module: nn.Module, m_args: tuple, m_kwargs: dict) -> None:
        sync()
        stack.append((id(module), m_args, m_kwargs, time.perf_counter()))

    def post_hook(module: nn.Module, m_args: tuple, m_kwargs: dict, out: Any) -> None:
        sync()
        mid, a, kw, t0 = stack.pop()
        elapsed = time.perf_counter() - t0
        if not recording:
            return
        try:
            sig = (mid, call_signature(a, kw))
        except TypeError:
            sig = (mid, id(a))
        rec = records.get(sig)
        if rec is None:
            rec = _new_record(names.get(mid, type(module).__name__), module, reasons.get(mid, ""), a, kw, out)
            rec.compile_only = limits.get(mid, "")
            records[sig] = rec
        if timing:  # the first recorded run builds the records, whose cost would pollute the times
            rec.calls += 1
            rec.eager_s += elapsed

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
        handles.append(module.register_forward_hook(post_hook, with_kwargs=True))
    try:
        # eager_only: capture sees the model's true structure and eager times, even where a class
        # is auto-instrumented or a module already runs a kernel
        with torch.inference_mode(), eager_only():
            for _ in range(warmup):
                model(*args, **kwargs)
            recording = True
            model(*args, **kwargs)
            timing = True
            for _ in range(runs):
                model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    calls = sorted(records.values(), key=lambda r: r.eager_s, reverse=True)
    by_module = {id(r.module): r.name for r in calls}
    for r in calls:
        r.children = [by_module[id(c)] for c in r.module.modules() if c is not r.module and id(c) in by_module]
    return calls


def _new_record(name: str, module: nn.Module, reason: str, args: tuple, kwargs: dict, out: Any) -> ModuleCall:
    spec = output_spec = None
    try:
        spec = InputSpec.of(args, kwargs)
        output_spec = OutputSpec.of(out)
    except UnsupportedCall as exc:
        reason = reason or str(exc)
    return ModuleCall(name=name, module=module, spec=spec, output_spec=output_spec,
                      args=tuple(_detach_copy(a) for a in args),
                      kwargs={k: _detach_copy(v) for k, v in kwargs.items()}, unsupported=reason)
