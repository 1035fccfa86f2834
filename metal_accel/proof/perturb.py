"""A second round of proof for degenerate problems, with the module's state replaced by random values.

Some modules compute something close to a trivial answer with the state they were built with: an eval-mode
BatchNorm with fresh running statistics (mean 0, variance 1, weight 1, bias 0) returns its input to within
float32 rounding, so a candidate that copies its input would pass every trial and the proof alone cannot tell
a kernel from a copy. A kernel (or a torch.compile) reads the module's parameters and buffers at run time,
so running the trials again with those tensors set to random values (in place, restored afterwards) shows
whether it computes the module's function or only its value at this one state.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

PERTURBED_DISTS = ("normal", "uniform")  # the trials of the perturbed round


def perturbed_values(state: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Random replacements for STATE: floating tensors get new values of a similar scale (a tensor with no
    negative entry, such as a running variance, stays positive); other tensors keep their values."""
    gen = torch.Generator().manual_seed(seed)
    by_tensor: dict[int, torch.Tensor] = {}  # a tensor listed twice (tied weights) gets one value
    for t in state:
        if id(t) not in by_tensor:
            by_tensor[id(t)] = _replacement(t, gen)
    return [by_tensor[id(t)] for t in state]


def _replacement(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if not t.is_floating_point() or not t.numel():
        return t.detach().clone()
    ref = t.detach().to("cpu", torch.float32)
    scale = float(ref.abs().mean()) or 1.0
    if bool((ref >= 0).all()) and bool((ref > 0).any()):
        new = ref * torch.empty(ref.shape).uniform_(0.5, 2.0, generator=gen) + 0.1 * scale
    else:
        new = ref + scale * torch.randn(ref.shape, generator=gen)
    return new.to(t.device, t.dtype)


@contextmanager
def swapped_state(state: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> Iterator[None]:
    """STATE holds VALUES (copied in place, so anything holding these tensors sees them) until the block
    ends; the original values are restored even when the block raises."""
    saved = [t.detach().clone() for t in state]
    try:
        _copy_into(state, values)
        yield
    finally:
        _copy_into(state, saved)


def _copy_into(state: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    with torch.inference_mode(), torch.no_grad():  # both: parameters that need grad, and inference tensors
        for t, v in zip(state, values):
            t.copy_(v)
