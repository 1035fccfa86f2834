"""Capture: run the example inputs with forward hooks and record every module call."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils import _pytree

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
    from_workload: bool = False    # seen only while the user's workload ran (a decode step), not in the example call

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
    """VALUE with every tensor (inside containers too) replaced by a detached copy."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list, dict)) or type(value) in _pytree.SUPPORTED_NODES:
        return _pytree.tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)
    return value


Snapshot = list[tuple[str, Any, list[int]]]


def containers_snapshot(args: tuple, kwargs: dict[str, Any]) -> Snapshot | None:
    """The structure and leaf identities of a call's container arguments (tuples, lists, dicts, pytree
    nodes), to tell after the call whether the module changed one; None when it has none."""
    snap = []
    for name, value in (*((f"#{i}", a) for i, a in enumerate(args)), *kwargs.items()):
        if isinstance(value, torch.Tensor) or not (isinstance(value, (tuple, list, dict))
                                                   or type(value) in _pytree.SUPPORTED_NODES):
            continue
        leaves, tree = _pytree.tree_flatten(value)
        snap.append((name, tree, [id(v) for v in leaves]))
    return snap or None


def changed_container(snap: Snapshot, args: tuple, kwargs: dict[str, Any]) -> str:
    """'' unless the call changed a container argument recorded in SNAP: then why the call stays eager."""
    now = {name: (tree, ids) for name, tree, ids in containers_snapshot(args, kwargs) or ()}
    for name, tree, ids in snap:
        if now.get(name) != (tree, ids):
            return (f"argument {name} is a container the module changes (its structure or items differ after "
                    "the call): a replacement could not reproduce that, the call stays eager")
    return ""


def capture(model: nn.Module, args: tuple, kwargs: dict[str, Any] | None = None, *,
            warmup: int = 1, runs: int = 1, sync: Callable[[], None] = lambda: None,
            workload: Callable[[nn.Module], Any] | None = None) -> list[ModuleCall]:
    """Run `model(*args, **kwargs)` with hooks; return the calls, hottest (inclusive time) first.

    After `warmup` plain runs, one run records the calls and `runs` more time them (inclusive
    wall time, hooks' own cost included: an ordering estimate; benchmarks measure precisely).
    WORKLOAD (the model run as the application runs it, e.g. a short generate()) is captured the same way
    after the example call; of its calls, those whose signature recurs within one run (a decode step's
    layers, every step alike) are kept, and those seen once (shapes that grow every step) are not: no kernel
    decided for them would run again.
    """
    kwargs = kwargs or {}
    calls = _record_calls(model, lambda: model(*args, **kwargs), warmup, runs, sync)
    if workload is not None:
        seen = {(id(c.module), c.spec.key if c.spec else c.name) for c in calls}
        for c in _record_calls(model, lambda: workload(model), 0, 1, sync):
            if c.calls >= 2 and (id(c.module), c.spec.key if c.spec else c.name) not in seen:
                c.from_workload = True
                calls.append(c)
        calls.sort(key=lambda r: r.eager_s, reverse=True)
    by_module = {id(r.module): r.name for r in calls}
    for r in calls:
        r.children = [by_module[id(c)] for c in r.module.modules() if c is not r.module and id(c) in by_module]
    return calls


def _record_calls(model: nn.Module, go: Callable[[], Any], warmup: int, runs: int,
                  sync: Callable[[], None]) -> list[ModuleCall]:
    """The module calls GO makes: `warmup` plain runs, one recording run, `runs` timed runs."""
    names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}
    reasons = {id(m): replaceability(m) for m in model.modules()}  # before our own hooks exist
    limits = {id(m): llm_limit(m) for m in model.modules()}
    records: dict[tuple, ModuleCall] = {}
    stack: list[tuple[int, tuple, dict, Snapshot | None, float]] = []
    recording = timing = False

    def pre_hook(module: nn.Module, m_args: tuple, m_kwargs: dict) -> None:
        sync()
        snap = containers_snapshot(m_args, m_kwargs) if recording else None
        stack.append((id(module), m_args, m_kwargs, snap, time.perf_counter()))

    def post_hook(module: nn.Module, m_args: tuple, m_kwargs: dict, out: Any) -> None:
        sync()
        mid, a, kw, snap, t0 = stack.pop()
        elapsed = time.perf_counter() - t0
        if not recording:
            return
        changed = changed_container(snap, a, kw) if snap else ""
        try:
            sig = (mid, call_signature(a, kw))
        except TypeError:
            sig = (mid, id(a))
        rec = records.get(sig)
        if rec is None:
            rec = _new_record(names.get(mid, type(module).__name__), module, reasons.get(mid, "") or changed,
                              a, kw, out)
            rec.compile_only = limits.get(mid, "")
            records[sig] = rec
        elif changed and not rec.unsupported:
            rec.unsupported = changed
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
                go()
            recording = True
            go()
            timing = True
            for _ in range(runs):
                go()
    finally:
        for h in handles:
            h.remove()
    return sorted(records.values(), key=lambda r: r.eager_s, reverse=True)


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
