"""Launch arguments of the Metal backend, pure Python: geometry, scalar bytes, kernel names.

The convention is that of `torch.mps.compile_shader`: argument i binds buffer index i; a tensor binds
its storage from its storage offset; a Python int binds 8 bytes (int64), a float 4 bytes (float32), a
list of numbers an array of those, unless `arg_casts` says otherwise. `launch_geometry` normalizes
and checks `threads` / `group_size` for both launchers (mps_library.py), exactly as the MSL emulator
does: a threadgroup larger than the pipeline's maximum is a KernelLaunchError, never clamped.
"""
from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from typing import Any

import torch

from ...core.errors import KernelLaunchError

MAX_BUFFER_INDEX = 31         # Metal's buffer argument table
MAX_SET_BYTES = 4096          # setBytes: limit
_CASTS = {"fp16": "e", "bf16": "bf", "int32": "i", "int16": "h", "int8": "b", "uint8": "B"}


def grid_dims(value: Any, what: str, kernel: str) -> list[int]:
    try:
        vals = [int(value.__index__())] if hasattr(value, "__index__") else [int(v.__index__()) for v in value]
    except (TypeError, AttributeError):
        raise KernelLaunchError(f"kernel {kernel}: {what} must be an int or a list of 1 to 3 ints, got {value!r}") from None
    if not 1 <= len(vals) <= 3 or any(v < 0 for v in vals):
        raise KernelLaunchError(f"kernel {kernel}: {what} must be 1 to 3 non-negative ints, got {value!r}")
    return vals


def launch_geometry(kernel: str, threads: Any, group_size: Any, default_threads: int | None,
                    max_threads: int) -> tuple[list[int], list[int]] | None:
    """(grid, threadgroup) in threads, as compile_shader computes them; None when the grid is empty.

    Raises KernelLaunchError for what compile_shader rejects or Metal would clamp: an undefined grid,
    mismatched dimensions, a zero-sized or too large threadgroup, a dimension of 2**32 or more.
    """
    if threads is None and default_threads is None:
        raise KernelLaunchError(f"kernel {kernel}: the number of threads is undefined; pass threads=")
    grid = grid_dims(threads if threads is not None else default_threads, "threads", kernel)
    if group_size is None:
        group = [min(grid[0], max_threads)] if len(grid) == 1 else [max_threads] + [1] * (len(grid) - 1)
    else:
        group = grid_dims(group_size, "group_size", kernel)
        if len(group) != len(grid):
            raise KernelLaunchError(f"kernel {kernel}: threads and group_size must have the same number of "
                                    f"dimensions, got {grid} and {group}")
    if 0 in grid:
        return None
    if 0 in group:
        raise KernelLaunchError(f"kernel {kernel}: group_size {group} has a zero dimension")
    total = 1
    for g in group:
        total *= g
    if total > max_threads:
        raise KernelLaunchError(f"kernel {kernel}: threadgroup size {group} exceeds the {max_threads}-thread limit "
                                "(the pipeline's maxTotalThreadsPerThreadgroup)")
    if any(v >= 2 ** 32 for v in grid):
        raise KernelLaunchError(f"kernel {kernel}: threads {grid}: each dimension must be below 2**32")
    return grid, group


def pack_scalar(kernel: str, index: int, value: Any, cast: str | None) -> bytes:
    """The bytes compile_shader's setBytes binds for a Python number or list of numbers."""
    where = f"kernel {kernel}, argument {index}"
    vals = list(value) if isinstance(value, (list, tuple)) else [value]
    if not vals:
        raise KernelLaunchError(f"{where}: an empty list cannot be a kernel argument")
    if any(isinstance(v, torch.Tensor) for v in vals):
        raise KernelLaunchError(f"{where}: lists of tensors (argument buffers) are not supported")
    is_int = isinstance(vals[0], int)  # bool is an int, as in pybind11
    if not all(isinstance(v, (int, float)) for v in vals) or (is_int and any(isinstance(v, float) for v in vals)):
        raise KernelLaunchError(f"{where}: unsupported argument {value!r}; pass tensors, Python ints or floats, "
                                "or lists of ints or of floats")
    if cast is None:
        code = "q" if is_int else "f"
    elif cast in _CASTS:
        code = _CASTS[cast]
    else:
        raise KernelLaunchError(f"{where}: unsupported cast {cast!r}; known: {', '.join(_CASTS)}")
    if code == "bf":
        return torch.tensor([float(v) for v in vals], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    nums = [int(v) if code in "qihbB" else float(v) for v in vals]
    if code in "ihbB":  # static_cast in compile_shader: wrap, as C++ does
        bits = {"i": 32, "h": 16, "b": 8, "B": 8}[code]
        nums = [n & ((1 << bits) - 1) for n in nums]
        code = {"i": "I", "h": "H", "b": "B", "B": "B"}[code]
    try:
        return struct.pack(f"<{len(nums)}{code}", *nums)
    except (struct.error, OverflowError) as e:
        raise KernelLaunchError(f"{where}: {value!r} does not fit the {cast or 'int64'} binding: {e}") from None


def _cast_for(arg_casts: Any, i: int, kernel: str) -> str | None:
    if arg_casts is None or isinstance(arg_casts, str):
        return arg_casts
    if isinstance(arg_casts, dict):
        return arg_casts.get(i)
    raise KernelLaunchError(f"kernel {kernel}: arg_casts must be a str or a dict {{index: cast}}")


_KERNEL_NAME = re.compile(r"\bkernel\s+void\s+(\w+)\s*\(|\[\[\s*kernel\s*\]\]\s*void\s+(\w+)\s*\(")
_HOST_NAME = re.compile(r"\[\[\s*host_name\s*\(\s*\"(\w+)\"\s*\)\s*\]\]")


def kernel_names_in(source: str) -> list[str]:
    """Kernel function names declared in an MSL source (used when the library cannot list them)."""
    names = [a or b for a, b in _KERNEL_NAME.findall(source)]
    return list(dict.fromkeys(names + _HOST_NAME.findall(source)))


def ascii_source(source: str) -> str:
    """compile_shader reads sources as ASCII: other characters (in comments, in practice) become '?'."""
    return source if source.isascii() else source.encode("ascii", "replace").decode("ascii")


def pack_arguments(kernel: str, args: Sequence[Any], arg_casts: Any
                   ) -> tuple[list[torch.Tensor], list[int], torch.Tensor, list[int], list[int], list[int]]:
    """Split launch arguments into tensors with their buffer indices and one byte blob of scalars."""
    buffers, buffer_index, scalar_index, offsets, sizes = [], [], [], [], []
    blob = bytearray()
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            buffers.append(a)
            buffer_index.append(i)
            continue
        data = pack_scalar(kernel, i, a, _cast_for(arg_casts, i, kernel))
        if len(data) > MAX_SET_BYTES:
            raise KernelLaunchError(f"kernel {kernel}, argument {i}: {len(data)} bytes; setBytes takes at most "
                                    f"{MAX_SET_BYTES} (pass a tensor instead)")
        scalar_index.append(i)
        offsets.append(len(blob))
        sizes.append(len(data))
        blob += data
        blob += bytes(-len(blob) % 16)  # keep every value 16-byte aligned in the blob
    blob_t = torch.frombuffer(blob, dtype=torch.uint8).clone() if blob else torch.zeros(1, dtype=torch.uint8)
    return buffers, buffer_index, blob_t, scalar_index, offsets, sizes
