"""How large a bench problem is: its largest input or output tensor, and its weights.

Sizes come from the meta device (no memory, no compute). A problem the meta device cannot run (its
`forward` reads a value, its `__init__` fills weights from data) is measured for real on the CPU
instead: its inputs from `get_inputs()` (on meta where that works), then, when they fit, one forward
on the CPU for the outputs; its weights built on the CPU. This is what the run itself would allocate.
A size that cannot be measured either way is None with the reason, and the bench skips the problem
rather than run it over a cap it cannot check.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from .problems import Problem


@dataclass(frozen=True)
class Size:
    """The largest input or output tensor, in MB (None: unknown), and how it was found."""
    mb: float | None
    how: str  # "meta", "cpu" (measured for real), "cpu inputs" (an input alone is over the cap), or why unknown


def _tensors(values: Any) -> list[torch.Tensor]:
    vals = list(values) if isinstance(values, (tuple, list)) else [values]
    return [v for v in vals if isinstance(v, torch.Tensor)]


def _largest(tensors: list[torch.Tensor]) -> float:
    return max((t.numel() * t.element_size() for t in tensors), default=0) / 1e6


def _on_meta(problem: Problem) -> float:
    module = problem.load()
    with torch.device("meta"):
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).eval()
        inputs = list(module.get_inputs())
        out = model(*inputs)
    return _largest(_tensors(inputs) + _tensors(out))


def _for_real(problem: Problem, cap: float | None) -> Size:
    """Inputs (on meta where `get_inputs` allows, else on the CPU); outputs from one CPU forward, unless an
    input alone already exceeds CAP."""
    module = problem.load()
    try:
        with torch.device("meta"):
            inputs = _tensors(list(module.get_inputs()))
    except Exception:
        inputs = None
    try:
        if inputs is None:
            torch.manual_seed(0)
            inputs = _tensors(list(module.get_inputs()))
        largest_in = _largest(inputs)
        if cap is not None and largest_in > cap:
            return Size(largest_in, "cpu inputs")
        model, real_inputs = problem.instantiate("cpu")
        with torch.inference_mode():
            out = model(*real_inputs)
        return Size(max(largest_in, _largest(_tensors(real_inputs) + _tensors(out))), "cpu")
    except Exception as exc:
        return Size(None, f"{type(exc).__name__}: {exc}"[:200])


def _sizes_key(module: Any) -> tuple:
    """The problem's module-level settings (batch_size, dims), which decide its tensor sizes."""
    out = []
    for k, v in sorted(vars(module).items()):
        if not k.startswith("_") and isinstance(v, (bool, int, float, str, tuple)):
            try:
                hash(v)
            except TypeError:
                continue
            out.append((k, v))
    return tuple(out)


def largest_tensor(problem: Problem, cap: float | None = None) -> Size:
    """The largest input or output of the problem at its current sizes (on meta, else for real on the CPU,
    remembered per value of the problem's module-level sizes). CAP: stop at the inputs when one exceeds it."""
    try:
        return Size(_on_meta(problem), "meta")
    except Exception as exc:
        meta_error = f"{type(exc).__name__}: {str(exc)[:120]}"
    module = problem.load()
    memo: dict[Any, Size] = module.__dict__.setdefault("_metal_accel_sizes", {})
    key = _sizes_key(module)
    known = memo.get(key)
    if known is not None and (known.how != "cpu inputs" or (cap is not None and known.mb > cap)):
        return known
    size = _for_real(problem, cap)
    if size.mb is None:
        size = Size(None, f"on the meta device: {meta_error}; on the CPU: {size.how}")
    memo[key] = size
    return size


def largest_tensor_mb(problem: Problem) -> float | None:
    """The largest input or output of the problem at its current batch_size, in MB (None: unknown)."""
    return largest_tensor(problem).mb


def fit_batch(problem: Problem, max_tensor_mb: float | None) -> tuple[int | None, int | None]:
    """(original, used) `batch_size` so that no input or output exceeds MAX_TENSOR_MB (halving it)."""
    module = problem.load()  # cached per process: remember the problem's own batch size the first time
    original = module.__dict__.setdefault("_metal_accel_batch_size", getattr(module, "batch_size", None))
    if not isinstance(original, int):
        return original, original
    module.batch_size = original
    if max_tensor_mb is None:
        return original, original
    batch = original
    while True:
        module.batch_size = batch
        largest = largest_tensor(problem, max_tensor_mb).mb
        if largest is None:  # the problem's shapes are tied to its batch size: keep the last that worked
            module.batch_size = batch * 2 if batch != original else original
            return original, module.batch_size
        if largest <= max_tensor_mb or batch == 1:
            return original, batch
        batch = max(1, batch // 2)


def over_cap(problem: Problem, max_tensor_mb: float | None, batch: int | None, original: int | None) -> str | None:
    """Why the problem at its current batch_size breaks MAX_TENSOR_MB (or cannot be checked against it), or None."""
    if max_tensor_mb is None:
        return None
    size = largest_tensor(problem, max_tensor_mb)
    if size.mb is None:
        return f"its tensor sizes could not be measured, so --max-tensor-mb {max_tensor_mb:g} cannot be enforced ({size.how})"
    if size.mb <= max_tensor_mb:
        return None
    why = ("batch_size 1 is the smallest" if batch == 1 else
           "the problem has no batch_size to shrink" if not isinstance(original, int) else
           "its shapes do not allow a smaller batch_size")
    return f"a {size.mb:.0f} MB tensor exceeds --max-tensor-mb {max_tensor_mb:g} (measured {_HOW[size.how]}), and {why}"


_HOW = {"meta": "on the meta device", "cpu": "for real on the CPU", "cpu inputs": "from its inputs"}

MODEL_COPIES = 3   # the model's weights, and its float64 reference's (twice the bytes); compile's twin shares them
WORKER_COPIES = 2  # a kernel candidate's worker holds its own copy, and another passes through the pipe
MEMORY_SHARE = 0.75  # of the device memory, for the weights' copies; the rest for activations and the runtime


def _state(model: torch.nn.Module) -> float:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())) / 1e6


def state_mb(problem: Problem) -> float | None:
    """MB of the problem model's parameters and buffers, built on the meta device, else for real on the CPU
    (None: it cannot be built)."""
    module = problem.load()
    try:
        with torch.device("meta"):
            return _state(module.Model(*module.get_init_inputs()))
    except Exception:
        pass
    try:
        torch.manual_seed(0)
        return _state(module.Model(*module.get_init_inputs()))
    except Exception:
        return None


def device_memory_mb(device: str) -> float:
    """The memory of DEVICE (the first GPU for "cuda", physical memory otherwise), in MB."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 1e6
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): no limit
        return math.inf


def too_heavy(problem: Problem, device: str, kernels: bool = True) -> str | None:
    """Why the problem's weights are too large for the bench on DEVICE, or None. KERNELS: whether a kernel
    candidate may run (in a worker, with its own copy of the weights)."""
    copies = MODEL_COPIES + (WORKER_COPIES if kernels else 0)
    weights, limit = state_mb(problem), device_memory_mb(device) * MEMORY_SHARE / copies
    if weights is None:  # it cannot be built at all: instantiating it fails with the problem's own error
        return None
    if weights <= limit:
        return None
    return (f"its parameters and buffers ({weights:.0f} MB) exceed {limit:.0f} MB: the bench would hold "
            f"{copies} copies of them{' (a kernel candidate runs in a worker)' if kernels else ''} "
            f"in {MEMORY_SHARE:.0%} of the {device} memory")
