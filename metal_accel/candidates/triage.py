"""Which built-in candidates are worth proving for a call: torch.compile of one library call is that call.

A module whose forward runs one compute operator that inductor hands back to a library (Linear's matmul,
a convolution, an embedding lookup, attention, eval-mode dropout) is already one kernel in eager: compiled,
it runs the same library call behind a guard check. Proving it costs seconds of dynamo and inductor per
module and a speed gate (on a 4-layer Llama, 6 of its 10 compile proofs). Pointwise operators and
reductions are still tried: inductor writes its own kernel for those and sometimes beats eager's. Views and
metadata operators do not count.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime.dispatch import eager_only

# operators that only describe or alias memory: no work to fuse
_NO_WORK = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "slice",
    "select", "as_strided", "alias", "detach", "lift_fresh", "empty", "empty_like", "empty_strided", "clone",
    "contiguous", "_to_copy", "unbind", "split", "split_with_sizes", "chunk", "sym_size", "sym_stride", "size",
    "stride", "dim", "numel", "is_contiguous", "_reshape_alias", "view_as",
}


# compute operators inductor lowers to the same library call eager makes (default options)
_LIBRARY_CALLS = {
    "linear", "addmm", "mm", "bmm", "matmul", "baddbmm", "embedding", "convolution", "_convolution", "conv1d",
    "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "dropout",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
}


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        if name not in _NO_WORK:
            self.ops.append(f"aten.{name}")
        return func(*args, **(kwargs or {}))


def compute_ops(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> list[str]:
    """The compute operators one eager call of MODULE runs (each dispatcher below it off)."""
    copy = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))  # in-place modules
    counter = _Counter()
    with torch.inference_mode(), eager_only(), counter:
        module(*copy[0], **copy[1])
    return counter.ops


def compile_not_worth_it(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> str:
    """Why torch.compile is not tried for this call ('' when it is)."""
    try:
        ops = compute_ops(module, args, kwargs)
    except Exception:  # an op a dispatch mode cannot see through: let the proof decide
        return ""
    if not ops:
        return "torch.compile not tried: eager runs no compute operator"
    if len(ops) == 1 and ops[0].removeprefix("aten.") in _LIBRARY_CALLS:
        return f"torch.compile not tried: eager is one library call ({ops[0]}), which the compiled code makes too"
    return ""
