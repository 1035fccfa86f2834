"""Tensors no kernel may write: while an installed kernel's host code runs (runtime/ops.KernelOp), the
module's parameters and buffers and the call's inputs are protected, and every backend's launcher refuses
to bind one of them (any byte of its storage, through any view) to a parameter the kernel may write
through (a pointer or reference whose pointee is not const). Host code's in-place rule
(sandbox/host_inplace.py) is static and does not see which of a kernel's parameters are outputs; the
launcher does.

    with ProtectedTensors(state, args):
        ...  # host code; its lib.<kernel>(...) calls run check_writable on their written arguments
"""
from __future__ import annotations

import re
from contextvars import ContextVar, Token
from typing import Any, Callable

import torch
from torch.utils import _pytree

from ..core.errors import KernelLaunchError


class ProtectedTensors:
    """A context in which the tensors of GROUPS (pytrees: lists, tuples, dicts; other leaves are ignored) may
    not be bound where a kernel writes. Their storages' byte ranges are read once, at the first check."""

    __slots__ = ("_groups", "_ranges", "_token")

    def __init__(self, *groups: Any) -> None:
        self._groups = groups
        self._ranges: list[tuple[int, int]] | None = None
        self._token: Token | None = None

    def __enter__(self) -> ProtectedTensors:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _current.reset(self._token)

    def storage_ranges(self) -> list[tuple[int, int]]:
        if self._ranges is None:
            leaves = [t for group in self._groups for t in _leaves(group) if isinstance(t, torch.Tensor)]
            self._ranges = [(start, end) for start, end in map(storage_range, leaves) if end > start]
        return self._ranges


_current: ContextVar[ProtectedTensors | None] = ContextVar("metal_accel_protected_tensors", default=None)


def _leaves(group: Any) -> list[Any]:
    if isinstance(group, (list, tuple)) and all(type(t) is torch.Tensor for t in group):
        return list(group)  # the common case, without walking a pytree
    return _pytree.tree_leaves(group)


def storage_range(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the bytes of T's storage: every view of it reaches into the same range. On MPS a
    storage's pointer names its Metal buffer (no address arithmetic), so its range is that one point."""
    s = t.untyped_storage()
    start = s.data_ptr()
    return start, start + (s.nbytes() if t.device.type != "mps" else 1)


def check_writable(where: str, t: torch.Tensor) -> None:
    """Raise KernelLaunchError when T, bound where the kernel may write, shares storage with a protected tensor."""
    protected = _current.get()
    if protected is None:
        return
    start, end = storage_range(t)
    for lo, hi in protected.storage_ranges():
        if lo < end and start < hi:
            raise KernelLaunchError(
                f"{where}: this tensor shares memory with one of the module's parameters or buffers or with an input "
                "of the call, and the kernel may write through this parameter; host code must pass a tensor it "
                "allocated (write the result into a new tensor, or declare the parameter const if the kernel only "
                "reads it)")


def checking_writes(convert: Callable[[Any], int], where: str, is_const: bool) -> Callable[[Any], int]:
    """A launcher's pointer CONVERT that also refuses a protected tensor where the kernel writes (not IS_CONST)."""
    if is_const:
        return convert

    def convert_written(x: Any) -> int:
        address = convert(x)
        check_writable(where, x)
        return address
    return convert_written


def msl_param_written(p: Any) -> bool:
    """Whether an MSL kernel may write through buffer parameter P (mps_emu.msl_signature.MslParam; None: no
    parameter binds that index): a pointer or reference whose pointee, at any level, is not const
    (`device float* const` is written through; `constant T*` is translated to `const T*`)."""
    if p is None or not (p.is_pointer or p.is_reference):
        return False
    return not all(re.search(r"\bconst\b", level) for level in re.split(r"[*&]", p.cpp_type)[:-1])
