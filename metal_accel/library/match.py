"""Which library family a module call belongs to: its traced computation against each family's reference.

A call matches when its positional tensor arguments (no keywords) are the family's inputs (x, or x and a residual
of x's leading shape), the module's tensors can be bound to a family's arguments (families.py), and the module's own
forward and the family's reference, traced on the call's inputs (trace.py), are the same computation. The answer
depends only on the classes and plain configs of the module and its submodules, its tensors' shapes and dtypes, and
each input's dtype, rank and device (and whether the inputs share their leading dimensions), so it is remembered per
process by those.
"""
from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.keys import class_path
from ..runtime.dispatch import eager_forward, eager_only
from .families import FAMILIES, Arg, Family, attribute, module_tensors
from .known import learn
from .trace import TraceError, canonical_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Match:
    family: str
    arguments: tuple[Arg, ...]

    def glue(self) -> str:
        """The candidate's forward: the family's host function called with the call's inputs and this module's own
        attributes (and, for a family with prepared arguments, the candidate's prepare() of them)."""
        fam = FAMILIES[self.family]
        inputs = list(fam.inputs)
        parts = [f"{_access(value)}" if kind in ("tensor", "attr") else repr(value) for kind, value in self.arguments]
        generic = ("SHAPE_GENERIC = \"rows\"  # any leading dimensions of the inputs: proven on several, one verdict for all"
                   if fam.shape_generic == "rows" else
                   f"SHAPE_GENERIC = {fam.shape_generic!r}  # proven on other batch sizes too")
        if not fam.prepared:
            return (f"\n\n{generic}\n\n\ndef forward(module, {', '.join(inputs)}):\n"
                    f"    return {self.family}({', '.join(inputs + parts)})\n")
        head, tail = parts[:fam.prepared], parts[fam.prepared:]
        return (f"\n\n{generic}\n\n\ndef prepare(module):\n    return {self.family}_prepare({', '.join(head)})\n"
                f"\n\ndef forward(module, {', '.join(inputs)}, *, prepared):\n"
                f"    return {self.family}({', '.join(inputs + ['prepared'] + tail)})\n")


def _access(path: str) -> str:
    """Host code reaching the module's attribute at dotted PATH: module.conv.weight, module[0].weight."""
    return "module" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in path.split("."))


_memo: dict[str, Match | None] = {}
_OP = re.compile(r"= ([\w.]+)\(")
_lock = threading.Lock()


def _memo_key(module: nn.Module, inputs: tuple[torch.Tensor, ...], tensors: dict[str, torch.Tensor]) -> str:
    tree = [[path, class_path(type(sub)), id(type(sub)),
             sorted((k, _describe(v)) for k, v in vars(sub).items() if not k.startswith("_"))]
            for path, sub in module.named_modules(remove_duplicate=False)]
    described = [[str(t.dtype), t.dim(), t.device.type] for t in inputs]
    if len(inputs) > 1:  # a residual of x's rows and one that broadcasts are other calls
        described.append(_same_rows(inputs))
    return json.dumps([json.loads(json.dumps(tree, default=repr)),
                       sorted((p, list(t.shape), str(t.dtype)) for p, t in tensors.items()),
                       described if len(inputs) > 1 else described[0]], sort_keys=True)


def _same_rows(inputs: tuple[torch.Tensor, ...]) -> bool:
    """Every input has the first's leading dimensions (the rows a multi-input family's kernel walks together)."""
    return all(t.shape[:-1] == inputs[0].shape[:-1] for t in inputs)


def _describe(value: Any) -> Any:
    """An attribute as the memo key sees it: plain values as they are, anything else (a function the forward
    calls, an object) by its type and name, so that two modules that may compute differently never share."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (tuple, list)):
        return [_describe(v) for v in value]
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"<{getattr(value, '__module__', type(value).__module__)}.{name} {id(value) if callable(value) else ''}>"


def match_call(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> Match | None:
    """The library family of MODULE(*ARGS, **KWARGS) and how its attributes bind, or None."""
    if kwargs or not args or any(type(a) is not torch.Tensor or a.dim() < 1 for a in args):
        return None
    inputs = tuple(args)
    tensors = module_tensors(module)
    key = _memo_key(module, inputs, tensors)
    with _lock:
        if key in _memo:
            return _memo[key]
    found = _find(module, inputs, tensors)
    with _lock:
        _memo[key] = found
    return found


def _find(module: nn.Module, inputs: tuple[torch.Tensor, ...], tensors: dict[str, torch.Tensor]) -> Match | None:
    if len(inputs) > 1 and not _same_rows(inputs):
        return None
    candidates = [(fam, b) for fam in FAMILIES.values() if len(fam.inputs) == len(inputs)
                  for b in fam.bindings(module, tensors)]
    if not candidates:
        return None
    forward = eager_forward(module)

    def own(*ts: torch.Tensor) -> torch.Tensor:
        with eager_only():
            return forward(*ts)
    try:
        mine = canonical_trace(own, list(inputs), tensors)
    except TraceError as exc:
        log.debug("metal_accel: library: %s not traced: %s", type(module).__name__, exc)
        return None
    ops = _ops(mine)
    unlike: set[tuple] = set()  # (family, non-tensor arguments) whose reference runs other ops than the module
    for fam, binding in candidates:
        # which tensor or float attribute goes where changes no op of the references (only their arguments): one
        # trace with other ops rules out the bindings that differ from it only there
        shape = (fam.name, tuple(a if a[0] == "literal" else repr(attribute(module, a[1])) for a in binding
                                 if a[0] == "literal" or a[0] == "attr" and type(attribute(module, a[1])) is not float))
        if shape in unlike:
            continue
        text = _reference_text(fam, binding, module, inputs, tensors)
        if text == mine:
            log.info("metal_accel: library: %s computes %s", class_path(type(module)), fam.name)
            if type(module).__module__ != nn.Sequential.__module__:  # a container's children decide, not its class
                learn(class_path(type(module)), fam.name)
            return Match(fam.name, binding)
        if text is not None and _ops(text) != ops:
            unlike.add(shape)
    return None


def _ops(text: str) -> list[str]:
    return _OP.findall(text)


def _reference_text(fam: Family, binding: tuple[Arg, ...], module: nn.Module, inputs: tuple[torch.Tensor, ...],
                    tensors: dict[str, torch.Tensor]) -> str | None:
    values: list[Any] = []
    for kind, value in binding:
        if kind == "tensor":
            values.append(tensors[value])
        elif kind == "attr":
            values.append(attribute(module, value))
        else:
            values.append(value)
    try:
        return canonical_trace(lambda *ts: fam.reference(*ts, *values), list(inputs), tensors)
    except TraceError:
        return None


def clear_memo() -> None:
    with _lock:
        _memo.clear()
