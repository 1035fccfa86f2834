"""The host-code sandbox: checked code loaded into a restricted namespace.

Host code (the `forward` of a candidate) comes from LLMs and downloaded caches, so it is
untrusted. `check_host_code` (sandbox_check.py) rejects anything outside a small whitelist of
Python (sandbox_rules.py); the namespace from `build_namespace` exposes only whitelisted
torch/math functions through plain proxy objects, as a second line of defence against a construct
the check missed. `load_forward` does both and returns the block's forward(). In a proof its
allocations are fenced and filled like stale memory (trial_buffers.py); in production they are plain.
"""
from __future__ import annotations

import functools
import math
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..core import pyast
from ..proof.trial_buffers import current as current_call
from ..proof.trial_buffers import proof_allocation, proof_initialized
from .host_check import check_host_code, parse_and_check, strip_annotations
from .host_rules import (
    BUILTINS_ALLOWED,
    FORBIDDEN_NAMES,
    MATH_ALLOWED,
    TENSOR_ATTRS,
    TENSOR_METHODS,
    TORCH_ALLOWED,
)

__all__ = ["BUILTINS_ALLOWED", "FORBIDDEN_NAMES", "MATH_ALLOWED", "TENSOR_ATTRS", "TENSOR_METHODS",
           "TORCH_ALLOWED", "build_namespace", "check_host_code", "load_forward"]


_UNINITIALIZED = frozenset(("torch.empty", "torch.empty_like", "torch.empty_strided"))
_INITIALIZED = frozenset(("torch.zeros", "torch.zeros_like", "torch.ones", "torch.ones_like", "torch.full",
                          "torch.full_like", "torch.arange"))


def _proof_allocator(fn: Callable[..., torch.Tensor], initialized: bool, zeroed: bool = False
                     ) -> Callable[..., torch.Tensor]:
    """FN as proof calls see it: a fenced buffer, filled by the call's fill where FN leaves it uninitialized
    (trial_buffers.py); ZEROED: the "plain" fill is zeros, as production's zeroed allocations are."""
    wrap = proof_initialized if initialized else proof_allocation

    def alloc(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = wrap(fn(*args, **kwargs))
        if zeroed:
            bufs = current_call()
            if bufs is not None and bufs.fill == "plain":
                _zero_cpu(t)
        return t
    alloc.__name__ = fn.__name__
    return alloc


def _proxy_tree(paths: frozenset[str], resolve: Callable[[str], Any]) -> types.SimpleNamespace:
    """A SimpleNamespace tree holding exactly `paths` (first component dropped)."""
    root = types.SimpleNamespace()
    for path in sorted(paths):
        parts = path.split(".")[1:]
        node = root
        for part in parts[:-1]:
            if not hasattr(node, part):
                setattr(node, part, types.SimpleNamespace())
            node = getattr(node, part)
        setattr(node, parts[-1], resolve(path))
    return root


def _zero_cpu(t: torch.Tensor) -> torch.Tensor:
    """T zeroed when it is CPU memory. On a GPU, host code that reads an allocation's values pays a device sync
    on every call, which the speed gate charges for, and a fill would cost a kernel launch per allocation."""
    if t.device.type == "cpu":
        with torch.no_grad():  # a leaf made with requires_grad=True may be filled too
            t.zero_()
    return t


def _zeroing(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """FN whose CPU memory is zero: what the allocator hands back holds no earlier call's values."""
    def alloc(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _zero_cpu(fn(*args, **kwargs))
    alloc.__name__ = fn.__name__
    return alloc


def build_namespace(lib: Any, *, proof: bool = False, poison: bool = False, zeroed: bool = True) -> dict[str, Any]:
    """Globals for host code: allowed builtins and whitelist-only proxies of torch, F and math.

    With PROOF (POISON is its former name), the allocation functions give the buffers of a proof call:
    fenced by guard regions and filled like stale memory, per call (trial_buffers.py). Without it they are
    the torch functions, as in production. ZEROED (host code that is not the package's own): torch.empty and
    its kind give zeroed CPU memory, in production and as a proof's "plain" fill, so host code cannot keep state
    from call to call in the blocks the allocator hands back (a red-team pass kept a call counter there); the
    package's own host code gets them plain: no fill, no cost."""
    proof = proof or poison

    def resolve_torch(path: str) -> Any:
        obj: Any = torch
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        if proof and (path in _UNINITIALIZED or path in _INITIALIZED):
            return _proof_allocator(obj, path in _INITIALIZED, zeroed and path in _UNINITIALIZED)
        if zeroed and path in _UNINITIALIZED:
            return _zeroing(obj)
        return obj

    torch_proxy = _proxy_tree(TORCH_ALLOWED, resolve_torch)
    math_proxy = _proxy_tree(MATH_ALLOWED, lambda p: getattr(math, p.split(".", 1)[1]))
    return {"__builtins__": dict(BUILTINS_ALLOWED), "torch": torch_proxy,
            "F": torch_proxy.nn.functional, "math": math_proxy, "lib": lib}


def load_forward(candidate_code: str, lib: Any, *, proof: bool = False, poison: bool = False, zeroed: bool = True
                 ) -> Callable[..., Any]:
    """Check the host code, run it in the restricted namespace and return its forward(); PROOF (or its
    former name POISON): allocations give proof buffers, ZEROED: uninitialized ones are zeroed (see
    build_namespace; False only for the package's own host code). A block that defines prepare(module) gets a
    PreparedForward: the same call, with prepare's tensors made once per module state."""
    ns = build_namespace(lib, proof=proof or poison, zeroed=zeroed)
    exec(_checked_code(candidate_code), ns)  # checked code, restricted globals
    if "prepare" in ns:
        return PreparedForward(ns["forward"], ns["prepare"], proof=proof or poison)
    return ns["forward"]


@functools.lru_cache(maxsize=512)
def _checked_code(candidate_code: str) -> types.CodeType:
    """The host code checked and compiled, once per text in a process (an 8-layer model's cached kernels load
    the same few texts dozens of times); a code object is immutable, each load runs it in a fresh namespace."""
    return pyast.compile_tree(strip_annotations(parse_and_check(candidate_code)), "<candidate>")


class PreparedForward:
    """forward(module, *args) of a block with prepare(module): what prepare derives from the module's state (BN
    folded into conv weights) is made once and passed to every call as forward's `prepared`, in a proof as in
    production. A state is the tensors of the module view (their identities and version counters): a reassigned
    or updated tensor prepares again, and an entry goes when one of its tensors is freed. In a proof, every call
    must leave the prepared tensors as prepare made them (a kernel that writes into them is rejected)."""

    def __init__(self, forward: Callable[..., Any], prepare: Callable[[Any], Any], *, proof: bool = False) -> None:
        self._forward = forward
        self._prepare = prepare
        self._proof = proof
        self._entries: dict[tuple[int, ...], tuple[tuple[int, ...] | None, Any, Any]] = {}
        self.prepares = 0  # how many times prepare ran (tests)

    def __call__(self, module: Any, *args: Any, **kwargs: Any) -> Any:
        value, pristine = self.prepared(module)
        out = self._forward(module, *args, prepared=value, **kwargs)
        if pristine is not None and not _same_tensors(value, pristine):
            raise RuntimeError("the call changed the tensors its prepare() made")
        return out

    def prepared(self, module: Any) -> tuple[Any, Any]:
        """(prepare(module) for the module's current state, its copy in a proof or None)."""
        state = module.__dict__.get("_state")
        if state is None:
            state = view_tensors(module)
        key = tuple(map(id, state))
        versions = _versions(state)
        entry = self._entries.get(key)
        if entry is not None and versions is not None and entry[0] == versions:
            return _resolve(entry[1], state), entry[2]
        with torch.no_grad():
            value = self._prepare(module)
            pristine = _clone_tensors(value) if self._proof else None
        self.prepares += 1
        if entry is None:
            for t in state:  # the entry holds no tensor of the module: it goes with the first of them freed
                weakref.finalize(t, self._entries.pop, key, None)
        self._entries[key] = (versions, _hold(value, {id(t): i for i, t in enumerate(state)}), pristine)
        return value, pristine


class _Slot(int):
    """A prepared value that is one of the module's own tensors, kept as its index in the state (not held)."""


def _hold(value: Any, slots: dict[int, int]) -> Any:
    if isinstance(value, torch.Tensor):
        return _Slot(slots[id(value)]) if id(value) in slots else value
    return tuple(_hold(v, slots) for v in value) if isinstance(value, (tuple, list)) else value


def _resolve(held: Any, state: list[torch.Tensor]) -> Any:
    if type(held) is tuple:
        return tuple(_resolve(v, state) for v in held)
    return state[held] if type(held) is _Slot else held


def view_tensors(view: Any) -> list[torch.Tensor]:
    """The tensors a module view holds, its children's included, in a fixed order."""
    out: list[torch.Tensor] = []
    for _, v in sorted((k, v) for k, v in vars(view).items() if not k.startswith("_")):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif hasattr(v, "__dict__") and not callable(v):
            out.extend(view_tensors(v))
    return out


def _versions(state: list[torch.Tensor]) -> tuple[int, ...] | None:
    """The tensors' version counters; None where one has none (an inference tensor): prepare on every call."""
    try:
        return tuple(t._version for t in state)
    except RuntimeError:
        return None


def _clone_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    return tuple(_clone_tensors(v) for v in value) if isinstance(value, (tuple, list)) else value


def _same_tensors(value: Any, pristine: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.shape == pristine.shape and value.dtype == pristine.dtype and torch.equal(
            value.reshape(-1).view(torch.uint8), pristine.reshape(-1).view(torch.uint8))
    if isinstance(value, (tuple, list)):
        return all(_same_tensors(v, p) for v, p in zip(value, pristine))
    return True
