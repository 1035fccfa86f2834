"""Rotary position embeddings applied to q and k, as HF transformers' `apply_rotary_pos_emb` computes them, with
the library's kernels.

The function is a module-level function of each modeling file (modeling_llama, modeling_qwen2, ...), called by
the attention modules the library cannot replace (they update a Cache). optimize() puts a `RotaryRouter` in
place of the function in the modeling modules of the model's classes (as Liger-Kernel does by hand for named
architectures): each call whose form a kernel may serve (q [B, Hq, S, D] and k [B, Hkv, S, D] of one dtype,
cos and sin [B or 1, S, D], `unsqueeze_dim` 1) goes to the kernel proven for its signature; any other call,
and every call while tracing, compiling or recording autograd, to the model's own function. What is proven
is `RotaryApply`, a module whose forward is that very function: a model whose function of this name computes
something else (partial rotary, another layout) fails the proof and keeps its own. SHAPE_GENERIC = "rope":
one proof serves every batch size and sequence length (prefill and each decode step) of a signature.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import sys
import threading
from typing import Any, Callable

import torch
from torch import nn

from ..backends.base import Backend
from ..core import config as settings
from ..core import pyast
from ..report import ModuleReport
from ..runtime import dispatch
from . import routing
from .routing import WrapperProvider, prove_module_call, run_op

log = logging.getLogger(__name__)
FAMILY = "rotary"
FUNCTION = "apply_rotary_pos_emb"
GLUE = ("\n\nSHAPE_GENERIC = \"rope\"  # any batch and sequence length: proven on several, one verdict for all\n"
        "\n\ndef forward(module, q, k, cos, sin):\n"
        f"    return {FAMILY}(q, k, cos, sin, module.unsqueeze_dim)\n")
_originals: dict[str, Callable[..., Any]] = {}  # "module.function" -> the function a router replaced


def original(name: str) -> Callable[..., Any]:
    """The model's own function NAME ("package.module.function"): the one a router replaced in this process, else
    the module's attribute (a proof worker imports the module afresh, unpatched)."""
    fn = _originals.get(name)
    if fn is None:
        module, _, attr = name.rpartition(".")
        fn = getattr(importlib.import_module(module), attr)
    return fn


def _source_sha(fn: Callable[..., Any]) -> str:
    try:
        return hashlib.sha256(pyast.getsource(fn).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return ""


class RotaryApply(nn.Module):
    """A modeling module's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim): what the kernels are proven
    against. Its configuration names the function and hashes its source, so each model's function is its own key."""

    def __init__(self, function: str, unsqueeze_dim: int = 1) -> None:
        super().__init__()
        self.function = function
        self.function_sha = _source_sha(original(function))
        self.unsqueeze_dim = int(unsqueeze_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_embed, k_embed = original(self.function)(q, k, cos, sin, unsqueeze_dim=self.unsqueeze_dim)
        return q_embed, k_embed


def RotaryProvider() -> WrapperProvider:  # noqa: N802 (a provider, made like a class)
    """Proposes the backend's rotary kernel file for a call of RotaryApply, where one ships for its dtype."""
    return WrapperProvider(FAMILY, RotaryApply, lambda request: GLUE)


def ships_for(backend: str) -> tuple[str, ...]:
    """The dtypes the rotary kernel of BACKEND serves (empty when none ships)."""
    return routing.ships_for(backend, FAMILY)


def signature(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any) -> tuple | None:
    """The route key of a call a kernel may serve, or None when only the model's function may compute it."""
    if dispatch.bypass or unsqueeze_dim != 1 or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None
    tensors = (q, k, cos, sin)
    if any(type(t) is not torch.Tensor for t in tensors) or [t.dim() for t in tensors] != [4, 4, 3, 3]:
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    B, Hq, S, D = q.shape
    if k.shape[0] != B or k.shape[2] != S or k.shape[3] != D or cos.shape != sin.shape or cos.shape[1:] != (S, D) \
            or cos.shape[0] not in (1, B) or D % 2 or S == 0 or B == 0:
        return None
    if any(t.dtype != q.dtype or t.device != q.device for t in tensors):
        return None
    return (q.device, q.dtype, Hq, k.shape[1], D, cos.shape[0] == B and B > 1,
            tuple(t.is_contiguous() for t in tensors))


Run = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Any]


class RotaryRouter:
    """Calls of one modeling module's apply_rotary_pos_emb to proven kernels by signature, the rest to the function.
    A signature seen for the first time is proven then (once per process; the cache keeps the verdict)."""

    def __init__(self, function: str, backend: Backend) -> None:
        self.function, self.backend = function, backend
        self.settings = settings.current()  # optimize()'s, in force when it attached: lazy proofs use them too
        self.routes: dict[tuple, Run | None] = {}
        self.reports: list[ModuleReport] = []
        self.hits = 0
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = original(self.function)
        # HF's form only: (q, k, cos, sin) and at most unsqueeze_dim by name; an older signature (position_ids),
        # arguments by name or anything else is the function's, called exactly as the model called it
        if len(args) != 4 or set(kwargs) - {"unsqueeze_dim"}:
            return fn(*args, **kwargs)
        q, k, cos, sin = args
        sig = signature(q, k, cos, sin, kwargs.get("unsqueeze_dim", 1))
        run = None
        if sig is not None:
            run = self.routes[sig] if sig in self.routes else self.decide(q, k, cos, sin, sig)
        if run is not None:
            try:
                out = run(q, k, cos, sin)
                self.hits += 1
                return out
            except Exception as exc:  # switched off for good; the function answers from here on
                log.warning("metal_accel: rotary kernel failed (%s: %s); %s answers from now on",
                            type(exc).__name__, exc, self.function)
                self.routes[sig] = None
        return fn(*args, **kwargs)

    def decide(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sig: tuple) -> Run | None:
        """Prove (or find in the cache) the kernel for this signature; remember the answer."""
        with self._lock:
            if sig in self.routes:
                return self.routes[sig]
            label = f"rotary[q {'x'.join(map(str, q.shape))}, k heads {k.shape[1]}]"
            # the backend optimize() attached with, or the one of the device the call runs on (a model moved)
            backend = self.backend if q.device.type == self.backend.device_type else None
            if backend is not None and str(q.dtype).replace("torch.", "") not in ships_for(backend.name):
                self.routes[sig] = None  # no kernel for this dtype (the float64 runs of a whole-model check)
                return None
            try:
                with settings.using(self.settings):
                    op, rep = prove_module_call(RotaryApply(self.function), (q, k, cos, sin), RotaryProvider(),
                                                label, backend)
            except Exception as exc:  # never a wrong answer: the model's function
                log.warning("metal_accel: rotary not proven: %s: %s", type(exc).__name__, exc)
                op, rep = None, None
            if rep is not None:
                self.reports.append(rep)
            run = None if op is None else (lambda q, k, c, s, op=op: run_op(op, (q, k, c, s)))
            self.routes[sig] = run
        return run


_ATTACHED = "_metal_accel_rotary"  # model attribute: the names of the functions attach() routed for it
_routers: dict[str, RotaryRouter] = {}  # "module.function" -> its router while some optimized model uses it
_users: dict[str, set[int]] = {}  # "module.function" -> ids of the models attached to it


def _modeling_functions(model: nn.Module) -> list[str]:
    """'module.apply_rotary_pos_emb' of each module of the model's classes whose global of that name is a plain
    function (its own, or one it imported from another modeling file: the name its attention code calls)."""
    names = []
    for module_name in sorted({type(m).__module__ for m in model.modules()}):
        module = sys.modules.get(module_name)
        fn = getattr(module, FUNCTION, None) if module is not None else None
        if isinstance(fn, RotaryRouter) or (inspect.isfunction(fn) and hf_form(fn)):
            names.append(f"{module_name}.{FUNCTION}")
    return names


def hf_form(fn: Callable[..., Any]) -> bool:
    """Whether FN takes HF's arguments: four required positional ones (q, k, cos, sin), an `unsqueeze_dim`, and
    nothing else without a default. Other functions of the same name (GPT-J's `(tensor, sin, cos)`, one rotating
    a single tensor) are never routed: a router in their place would change how the model calls them."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    return (len(required) == 4 and all(p.kind in positional for p in required)
            and params[:4] == required and any(p.name == "unsqueeze_dim" for p in params))


def attach(model: nn.Module, backend: Backend) -> str:
    """Route the rotary function of the model's modeling modules through proven kernels on BACKEND; a line for the
    report ('' when the model has no such function, no kernel ships or the library is off)."""
    if not settings.current().library or not ships_for(backend.name):
        return ""
    param = next(model.parameters(), None)  # a model of a dtype no kernel serves is left alone
    if param is not None and str(param.dtype).replace("torch.", "") not in ships_for(backend.name):
        return ""
    names = _modeling_functions(model)
    for name in names:
        module_name = name.rpartition(".")[0]
        module = sys.modules[module_name]
        if not isinstance(getattr(module, FUNCTION), RotaryRouter):
            _originals[name] = getattr(module, FUNCTION)
            _routers[name] = RotaryRouter(name, backend)
            setattr(module, FUNCTION, _routers[name])
        else:  # the latest optimize()'s settings and backend decide the signatures not yet seen
            router = getattr(module, FUNCTION)
            router.settings, router.backend = settings.current(), backend
        _users.setdefault(name, set()).add(id(model))
    if not names:
        return ""
    object.__setattr__(model, _ATTACHED, names)
    return "rotary: " + ", ".join(names) + " -> metal_accel (kernels proven per signature at first call)"


def detach(model: nn.Module) -> None:
    """Put the original functions back once no optimized model uses them (restore())."""
    for name in model.__dict__.pop(_ATTACHED, []):
        users = _users.get(name, set())
        users.discard(id(model))
        if users:
            continue
        _put_back(name)


def detach_all() -> None:
    """Put every routed function back, whichever models still use it (tests, a process shutting the library off)."""
    for name in list(_originals):
        _put_back(name)
    _users.clear()


def _put_back(name: str) -> None:
    """The original function of NAME ('module.function') in its module again; its router forgotten."""
    module = sys.modules.get(name.rpartition(".")[0])
    fn = _originals.pop(name, None)
    router = _routers.pop(name, None)
    if module is not None and fn is not None and getattr(module, FUNCTION, None) is router:
        setattr(module, FUNCTION, fn)  # (not where someone else has put another function there since)


DECISION = "rotary decision: "  # the prefix of explain()'s notes about signatures decided since optimize()


def decisions(model: nn.Module) -> list[str]:
    """One line per signature the routers of MODEL's functions decided: what runs it, and why."""
    lines = []
    for name in model.__dict__.get(_ATTACHED, []):
        router = _routers.get(name)
        for rep in router.reports if router is not None else []:
            runs = "kernel" if rep.status == "kernel" else "the model's function"
            lines.append(f"{DECISION}{rep.name} ({rep.spec}): {runs}: {rep.reason}")
    return lines
