"""The whole model under torch.compile, as a model-level candidate beside the per-module choices.

Per-module decisions cannot reach everything: a decoder LM's forward builds a KV cache that its layers
change, so neither the model nor its layers can be replaced call by call, and on the H100 the whole model
compiled ran 1.3-2.8x eager where per-module choices reached 1.0-1.1x. So the end-to-end stage
(model_choice.py) also tries the eager model compiled whole (graph breaks allowed: inductor splits the
forward where it must), checks its outputs against eager's on the example inputs and on a second draw
of inputs like them (every tensor in the outputs, caches included, under the proof's precision rule and,
where the plain check fails, against the model run in float64 as the proof judges a kernel),
and times it in the same rotation; installed only for the example's call signature, where it was proven.
"""
from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn

from .candidates.compile import CompiledOp, CompileTimeout, first_call
from .core import config
from .proof.compare import Mismatch
from .proof.precision import PrecisionRule, recorded_call, rule_for
from .proof.prove import float64_reference
from .proof.testdata import like_example
from .proof.validate import compare_or_float64, to_float64
from .runtime.dispatch import Dispatcher, dispatcher_of, eager_forward, eager_only

log = logging.getLogger(__name__)
NAME = "whole-model torch.compile"
MAX_DEPTH = 6


def output_tensors(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor in an output, in a fixed order: containers, mappings (ModelOutput), and the tensors held
    by other objects (a KV cache's keys and values), a few levels deep. Unlike core/specs.output_tensors
    (pytree nodes only: what a module's op returns), objects are walked too: a model's cache is one."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth >= MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return []
    if isinstance(obj, Mapping):
        items: Any = obj.values()
    elif isinstance(obj, (tuple, list)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = [v for k, v in sorted(vars(obj).items()) if not k.startswith("_")]
    else:
        return []
    return [t for item in items for t in output_tensors(item, depth + 1)]


def _check(got: Any, want: Any, rule: PrecisionRule, where: str, exact: Callable[[], Any]) -> str:
    """'' when every output tensor of GOT matches eager's (WANT) under RULE; where the plain check fails, the
    float64 outputs (EXACT(), computed then) let it pass as the proof does: a deep model's rounding (bf16
    over several layers) differs from eager's everywhere, and only the exact value says which is right.
    The comparison is the proof's own (validate.compare_or_float64); validate.Judge itself is not used: it
    judges a kernel's trial results (flat outputs, strides, fenced buffers, trivial-output gates), where
    here the candidate is torch.compile's and the outputs hold objects (a KV cache) walked by output_tensors."""
    g, w = output_tensors(got), output_tensors(want)
    if len(g) != len(w):
        return f"{where}: {len(g)} output tensors, eager has {len(w)}"
    no64: list[str] = []

    @functools.cache
    def refs64() -> tuple | None:
        try:
            exact_tensors = output_tensors(exact())
        except Exception as exc:  # no float64 run of this model (an op without float64): the plain verdict
            no64.append(type(exc).__name__)
            return None
        return tuple(exact_tensors) if len(exact_tensors) == len(w) else None
    try:
        for i, (a, b) in enumerate(zip(g, w)):
            compare_or_float64(a, b, f"{where}: output tensor {i}", refs64, i, rule)
    except Mismatch as exc:
        return str(exc) + (f" (no float64 reference: {no64[0]})" if no64 else "")
    return ""


def whole_model_op(model: nn.Module, with_kernels: bool = False) -> CompiledOp:
    """The eager model under torch.compile, as the dispatcher calls it (it compiles at its first call); WITH_KERNELS:
    the kernels installed on its modules inside the graph, as the custom ops they are (their fake implementations
    give dynamo the shapes), the rest of the model compiled around them."""
    return CompiledOp(model, "metal_accel_whole_model" + ("_with_kernels" if with_kernels else ""), with_kernels)


def prove_whole_model(model: nn.Module, args: tuple, kwargs: dict[str, Any],
                      device: torch.device, with_kernels: bool = False) -> tuple[CompiledOp | None, str]:
    """The eager model compiled whole (WITH_KERNELS: with its installed kernels in the graph), and '' when its
    outputs match eager's; else (None, why not)."""
    op = whole_model_op(model, with_kernels)
    exact = float64_reference(model, eager_forward(model))
    try:
        first_call(op, args, kwargs, device, config.current().compile_timeout_s)
    except CompileTimeout as exc:
        return None, str(exc)
    except Exception as exc:
        return None, f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    second = like_example(args, kwargs, torch.Generator().manual_seed(0))
    for label, (a, k) in (("example inputs", (args, kwargs)), ("a second draw", second)):
        with torch.inference_mode():
            with eager_only():
                want, ops = recorded_call(model, a, k)
            rule = rule_for(ops, config.current().precision)
            got = op(a, k, [])
        with torch.inference_mode():
            why = _check(got, want, rule, f"incorrect on {label}", lambda: exact(*to_float64(a), **to_float64(k)))
        if why:
            return None, why
    return op, ""


def set_everywhere(model: nn.Module, op: Any) -> None:
    """OP (the model compiled whole) takes every call of MODEL, whatever its signature (None: none)."""
    disp = dispatcher_of(model)
    if disp is None:
        if op is None:
            return
        disp = Dispatcher(model, eager_forward(model))
        model.forward = disp
    disp.fallback = op


def check_on_workload(model: nn.Module, op: Any, workload: Callable[[nn.Module], Any]) -> str:
    """'' when WORKLOAD with OP taking every call of MODEL (decode steps included: their shapes change every step,
    which a per-signature choice cannot follow) gives eager's results under the proof's rule. Else why not.

    Judged call by call on eager's path: each call of MODEL under OP is compared with eager's same call (its
    output tensors, the KV cache's included), and eager's output tensors are handed on in place of OP's (the
    objects OP returns, such as its cache, stay OP's). So a greedy decode follows eager's tokens however OP
    rounds, and every step is checked: comparing only the final tokens would reject any other correct rounding
    where eager's two best logits are nearly tied (common in bf16, and everywhere with random weights) and
    would stop checking at the first token that differs. A workload that calls no module hook (model.forward
    called directly) is judged on its final result alone."""
    eager_calls: list[list[torch.Tensor]] = []  # per call: the tensors it returns directly (logits), cloned
    mine: list[list[torch.Tensor]] = []
    last: dict[str, Any] = {}  # per run: the last call's output, whose cache holds every step's keys and values

    def record(module: nn.Module, args: Any, out: Any) -> None:
        eager_calls.append([t.clone() for t in _direct_tensors(out)])
        last["eager"] = out

    def compare_and_substitute(module: nn.Module, args: Any, out: Any) -> Any:
        mine.append([t.clone() for t in _direct_tensors(out)])
        last["op"] = out
        i = len(mine) - 1
        return _replace_direct(out, (t.clone() for t in eager_calls[i])) if i < len(eager_calls) else out
    with torch.inference_mode():
        handle = model.register_forward_hook(record)
        try:
            with eager_only():
                want, ops = recorded_call(workload, (model,), {})
        finally:
            handle.remove()
        set_everywhere(model, op)
        handle = model.register_forward_hook(compare_and_substitute)
        try:
            got = workload(model)
        except Exception as exc:
            return f"the workload failed under {NAME}: {type(exc).__name__}: {str(exc)[:200]}"
        finally:
            handle.remove()
            set_everywhere(model, None)
    rule = rule_for(ops, config.current().precision)
    if len(mine) != len(eager_calls):
        return f"incorrect on the workload: it called the model {len(mine)} times, under eager {len(eager_calls)}"
    exact_run = functools.cache(lambda: _exact_calls(model, workload, eager_calls))

    def no_exact() -> Any:
        raise NotImplementedError("no float64 run of a workload's result")
    with torch.inference_mode():
        for i, (g, w) in enumerate(zip(mine, eager_calls)):
            why = _check(g, w, rule, f"incorrect on the workload's call {i + 1} of {len(mine)}",
                         lambda i=i: exact_run()[0][i])
            if why:
                return why
        if last:
            why = _check(last["op"], last["eager"], rule, "incorrect on the workload's last call (its cache)",
                         lambda: exact_run()[1])
            if why:
                return why
        return _check(got, want, rule, "incorrect on the workload", no_exact)


def _exact_calls(model: nn.Module, workload: Callable[[nn.Module], Any],
                 eager_calls: list[list[torch.Tensor]]) -> tuple[list[list[torch.Tensor]], Any]:
    """The float64 reference of each call of MODEL in WORKLOAD on eager's path (eager's outputs handed on, as
    check_on_workload does), and the last call's output; raises where the model cannot run in float64."""
    calls: list[list[torch.Tensor]] = []
    last: list[Any] = [None]

    def record(module: nn.Module, args: Any, out: Any) -> Any:
        calls.append([t.clone() for t in _direct_tensors(out)])
        last[0] = out
        i = len(calls) - 1
        return _replace_direct(out, (t.clone() for t in eager_calls[i])) if i < len(eager_calls) else out
    with torch.inference_mode(), _in_float64(model), eager_only():
        handle = model.register_forward_hook(record)
        try:
            workload(model)
        finally:
            handle.remove()
    if len(calls) != len(eager_calls):
        raise RuntimeError(f"the float64 run called the model {len(calls)} times, eager {len(eager_calls)}")
    return calls, last[0]


@contextmanager
def _in_float64(model: nn.Module) -> Iterator[None]:
    """MODEL's floating parameters and buffers as float64 copies inside the block, its own put back after."""
    saved: list[tuple[dict, str, torch.Tensor]] = []
    try:
        for module in model.modules():
            for store in (module._parameters, module._buffers):
                for name, t in list(store.items()):
                    if t is not None and t.is_floating_point():
                        saved.append((store, name, t))
                        up = t.detach().to(torch.float64)
                        store[name] = nn.Parameter(up, requires_grad=False) if isinstance(t, nn.Parameter) else up
        yield
    finally:
        for store, name, t in saved:
            store[name] = t


def _direct_tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors an output holds directly (in tuples, lists and mappings such as a ModelOutput), not those of
    other objects it holds (a KV cache)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in _direct_tensors(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in _direct_tensors(v)]
    return []


def _replace_direct(obj: Any, tensors: Any) -> Any:
    """OBJ with its direct tensors (_direct_tensors' order) taken from the iterator TENSORS; other objects kept."""
    if isinstance(obj, torch.Tensor):
        return next(tensors, obj)
    if isinstance(obj, Mapping):
        values = {k: _replace_direct(v, tensors) for k, v in obj.items()}
        try:
            return type(obj)(**values)
        except TypeError:
            return dict(values)
    if isinstance(obj, (tuple, list)):
        items = [_replace_direct(v, tensors) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj
