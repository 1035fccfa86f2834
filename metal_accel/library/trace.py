"""What a module computes, as text: its forward traced to ATen ops on fake tensors, written canonically.

Two modules compute the same thing when their canonical traces are equal, whatever their classes are
called and however their code is spelled: transformers' LlamaRMSNorm, Qwen2RMSNorm and MistralRMSNorm
trace to one text, as does a user's own RMSNorm written the same way. The trace runs under
make_fx(tracing_mode="symbolic") with the module's parameters as constants: dimensions tied to the
parameters are concrete, the others (batch, sequence) stay symbols, so one text covers every batch size
and sequence length. Canonical form: placeholders and the parameters by their role, symbols renamed in
order of appearance, shape arithmetic and no-op nodes (eval-mode dropout, aliases) left out, a view's
target shape taken from its result, and the arguments of commutative ops sorted.
"""
from __future__ import annotations

import contextlib
import logging
import operator
import re
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default}
_IDENTITY = {aten.alias.default, aten.detach.default, aten.clone.default, aten.contiguous.default,
             aten.lift_fresh_copy.default}
_COMMUTATIVE = {aten.add.Tensor, aten.mul.Tensor, aten.maximum.default, aten.minimum.default}
_SYMBOL = re.compile(r"\bs\d+\b")


class TraceError(Exception):
    """The function could not be traced (data-dependent control flow, an op without a fake kernel, ...)."""


def canonical_trace(fn: Callable[..., Any], inputs: Sequence[torch.Tensor],
                    named: dict[str, torch.Tensor] | None = None) -> str:
    """FN(*INPUTS) traced and written canonically. NAMED: name -> tensor, for tensors FN closes over (a module's
    parameters), so they read as their name rather than as anonymous constants."""
    try:  # fresh tensors of the inputs' layout, outside inference mode and autograd: only their specs matter
        with torch.inference_mode(False), torch.no_grad(), _quiet_fake_tensors():
            fresh = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in inputs]
            gm = make_fx(fn, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*fresh)
    except Exception as exc:  # any failure means: no canonical form, so no match
        raise TraceError(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    return _canonical(gm, named or {})


@contextlib.contextmanager
def _quiet_fake_tensors() -> Iterator[None]:
    """A binding that does not fit fails inside the fake-tensor kernels, which log the traceback as an
    error before raising; here a failed trace is an answer (no match), not something to show the user."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _canonical(gm: torch.fx.GraphModule, named: dict[str, torch.Tensor]) -> str:
    names: dict[torch.fx.Node, str] = {}
    lines: list[str] = []
    n_inputs = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            names[node] = f"in{n_inputs}"
            n_inputs += 1
            lines.append(f"{names[node]}: {_meta(node)}")
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            role = _role(value, named) if isinstance(value, torch.Tensor) else None
            names[node] = role or f"const{len(names)}"
            if role is None:  # a constant the code made (a table, a mask): its value decides
                lines.append(f"{names[node]} = {_tensor_text(value)}")
        elif node.op == "call_function":
            if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) \
                    and node.args[0] in names and isinstance(node.args[0].meta.get("val"), (tuple, list)):
                names[node] = f"{names[node.args[0]]}[{node.args[1]}]"  # one result of a multi-output op
                continue
            if _is_shape_arithmetic(node):
                continue
            if node.target in _IDENTITY or _is_noop_dropout(node):
                names[node] = _name(node.args[0], names)
                continue
            args = [_arg(a, names) for a in node.args]
            target = str(node.target)
            if node.target in _VIEWS:  # however the shape was spelled, the result's shape is what counts
                args = args[:1] + [_shape_of(node)]
                target = "view" if node.target is not aten.expand.default else target
            if node.target in _COMMUTATIVE and len(args) == 2 and not node.kwargs:
                args = sorted(args)
            kwargs = ", ".join(f"{k}={_arg(v, names)}" for k, v in sorted(node.kwargs.items()))
            names[node] = f"v{len(lines)}"
            lines.append(f"{names[node]} = {target}({', '.join(args)}{', ' + kwargs if kwargs else ''}): "
                         f"{_meta(node)}")
        elif node.op == "output":
            lines.append(f"return {_arg(node.args[0], names)}")
        else:
            raise TraceError(f"unexpected node {node.op}")
    return _rename_symbols("\n".join(lines))


def _role(value: torch.Tensor, named: dict[str, torch.Tensor]) -> str | None:
    """The name of the NAMED tensor VALUE is (make_fx may hold a parameter as another tensor object over the same
    storage: the same data pointer, shape, strides and dtype)."""
    for name, t in named.items():
        if t is value or (t.data_ptr() == value.data_ptr() and t.shape == value.shape
                          and t.stride() == value.stride() and t.dtype == value.dtype):
            return name
    return None


def _is_shape_arithmetic(node: torch.fx.Node) -> bool:
    target = node.target
    if target is aten.sym_size.int or target is aten.sym_stride.int or target is aten.sym_numel.default:
        return True
    return getattr(target, "__module__", None) in ("_operator", "operator") or target in vars(operator).values() \
        or "sym_" in getattr(target, "__name__", "")


def _is_noop_dropout(node: torch.fx.Node) -> bool:
    return node.target is aten.dropout.default and len(node.args) >= 3 and node.args[2] is False


def _name(a: Any, names: dict[torch.fx.Node, str]) -> str:
    return names[a] if isinstance(a, torch.fx.Node) and a in names else _arg(a, names)


def _arg(a: Any, names: dict[torch.fx.Node, str]) -> str:
    if isinstance(a, torch.fx.Node):
        if a in names:
            return names[a]
        return _value_text(a.meta.get("val"))  # shape arithmetic: its symbolic value
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg(x, names) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner})"
    if isinstance(a, float):
        return repr(a)
    if isinstance(a, torch.dtype):
        return str(a)
    return _value_text(a)


def _value_text(v: Any) -> str:
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return str(v.node.expr) if hasattr(v, "node") else str(v)
    return repr(v)


def _shape_of(node: torch.fx.Node) -> str:
    val = node.meta.get("val")
    return "[" + ", ".join(_value_text(d) for d in val.shape) + "]" if isinstance(val, torch.Tensor) else "?"


def _meta(node: torch.fx.Node) -> str:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return f"{str(val.dtype).replace('torch.', '')}{_shape_of(node)}"
    if isinstance(val, (tuple, list)):
        return "(" + ", ".join(f"{str(v.dtype).replace('torch.', '')}" if isinstance(v, torch.Tensor) else
                               _value_text(v) for v in val) + ")"
    return _value_text(val)


def _tensor_text(t: torch.Tensor) -> str:
    head = f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
    if t.numel() <= 64 and t.device.type != "meta":
        return head + repr(t.detach().cpu().flatten().tolist())
    return head + f"~{float(t.detach().double().sum()):.6g}"


def _rename_symbols(text: str) -> str:
    seen: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        return seen.setdefault(m.group(0), f"S{len(seen)}")
    return _SYMBOL.sub(sub, text)
