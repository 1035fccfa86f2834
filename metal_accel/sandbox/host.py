"""The host-code sandbox: checked code loaded into a restricted namespace.

Host code (the `forward` of a candidate) comes from LLMs and downloaded caches, so it is
untrusted. `check_host_code` (sandbox_check.py) rejects anything outside a small whitelist of
Python (sandbox_rules.py); the namespace from `build_namespace` exposes only whitelisted
torch/math functions through plain proxy objects, as a second line of defence against a construct
the check missed. `load_forward` does both and returns the block's forward(). In a proof its
allocations are fenced and filled like stale memory (trial_buffers.py); in production they are plain.
"""
from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import torch

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


def _proof_allocator(fn: Callable[..., torch.Tensor], initialized: bool) -> Callable[..., torch.Tensor]:
    """FN as proof calls see it: a fenced buffer, filled by the call's fill where FN leaves it uninitialized
    (trial_buffers.py)."""
    wrap = proof_initialized if initialized else proof_allocation

    def alloc(*args: Any, **kwargs: Any) -> torch.Tensor:
        return wrap(fn(*args, **kwargs))
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


def build_namespace(lib: Any, *, proof: bool = False, poison: bool = False) -> dict[str, Any]:
    """Globals for host code: allowed builtins and whitelist-only proxies of torch, F and math.

    With PROOF (POISON is its former name), the allocation functions give the buffers of a proof call:
    fenced by guard regions and filled like stale memory, per call (trial_buffers.py). Without it they are
    plain torch functions, as in production: no fill, no cost."""
    proof = proof or poison

    def resolve_torch(path: str) -> Any:
        obj: Any = torch
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        if proof and (path in _UNINITIALIZED or path in _INITIALIZED):
            return _proof_allocator(obj, path in _INITIALIZED)
        return obj

    torch_proxy = _proxy_tree(TORCH_ALLOWED, resolve_torch)
    math_proxy = _proxy_tree(MATH_ALLOWED, lambda p: getattr(math, p.split(".", 1)[1]))
    return {"__builtins__": dict(BUILTINS_ALLOWED), "torch": torch_proxy,
            "F": torch_proxy.nn.functional, "math": math_proxy, "lib": lib}


def load_forward(candidate_code: str, lib: Any, *, proof: bool = False, poison: bool = False
                 ) -> Callable[..., Any]:
    """Check the host code, run it in the restricted namespace and return its forward(); PROOF (or its
    former name POISON): allocations give proof buffers (see build_namespace)."""
    tree = strip_annotations(parse_and_check(candidate_code))
    ns = build_namespace(lib, proof=proof or poison)
    exec(compile(tree, "<candidate>", "exec"), ns)  # checked code, restricted globals
    return ns["forward"]
