"""The host-code sandbox: checked code loaded into a restricted namespace.

Host code (the `forward` of a candidate) comes from LLMs and downloaded caches, so it is
untrusted. `check_host_code` (sandbox_check.py) rejects anything outside a small whitelist of
Python (sandbox_rules.py); the namespace from `build_namespace` exposes only whitelisted
torch/math functions through plain proxy objects, as a second line of defence against a construct
the check missed. `load_forward` does both and returns the block's forward().
"""
from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import torch

from .sandbox_check import check_host_code, parse_and_check, strip_annotations
from .sandbox_rules import (
    BUILTINS_ALLOWED,
    FORBIDDEN_NAMES,
    MATH_ALLOWED,
    TENSOR_ATTRS,
    TENSOR_METHODS,
    TORCH_ALLOWED,
)

__all__ = ["BUILTINS_ALLOWED", "FORBIDDEN_NAMES", "MATH_ALLOWED", "TENSOR_ATTRS", "TENSOR_METHODS",
           "TORCH_ALLOWED", "build_namespace", "check_host_code", "load_forward"]


def _poison_fill(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN (floating/complex), dtype max (integers) or True (bool)."""
    try:
        with torch.no_grad():  # requires_grad=True leaves refuse in-place fills otherwise
            if t.dtype == torch.bool:
                t.fill_(True)
            elif t.dtype.is_floating_point or t.dtype.is_complex:
                t.fill_(float("nan"))
            else:
                t.fill_(torch.iinfo(t.dtype).max)
    except (TypeError, RuntimeError):  # quantized and other exotic dtypes: leave as allocated
        pass
    return t


def _poisoned(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def alloc(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _poison_fill(fn(*args, **kwargs))
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


def build_namespace(lib: Any, *, poison: bool = False) -> dict[str, Any]:
    """Globals for host code: allowed builtins and whitelist-only proxies of torch, F and math."""
    def resolve_torch(path: str) -> Any:
        obj: Any = torch
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        if poison and path in ("torch.empty", "torch.empty_like", "torch.empty_strided"):
            return _poisoned(obj)
        return obj

    torch_proxy = _proxy_tree(TORCH_ALLOWED, resolve_torch)
    math_proxy = _proxy_tree(MATH_ALLOWED, lambda p: getattr(math, p.split(".", 1)[1]))
    return {"__builtins__": dict(BUILTINS_ALLOWED), "torch": torch_proxy,
            "F": torch_proxy.nn.functional, "math": math_proxy, "lib": lib}


def load_forward(candidate_code: str, lib: Any, *, poison: bool = False) -> Callable[..., Any]:
    """Check the host code, run it in the restricted namespace and return its forward()."""
    tree = strip_annotations(parse_and_check(candidate_code))
    ns = build_namespace(lib, poison=poison)
    exec(compile(tree, "<candidate>", "exec"), ns)  # checked code, restricted globals
    return ns["forward"]
