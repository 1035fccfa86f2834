"""The pure-Python half of the CUDA backend: kernel signatures, argument binding, launch dimensions.

Nothing here touches a GPU, so all of it is tested in CI: `parse_cuda_kernels` reads the
`extern "C" __global__ void name(...)` kernels of a source; `bind_arguments` turns the Python
arguments of `lib.name(*args)` into the C values cuLaunchKernel copies; `launch_dims` turns the
`threads=..., group_size=...` convention (or an explicit grid/block) into grid and block, and
`cooperative_dims` sizes the grid of a cooperative launch to what the device holds at once.
"""
from __future__ import annotations

import ctypes
import re
import struct
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ...core.errors import CompileError, KernelLaunchError
from ..cpu.signature import _clean, _first_declarator, extern_c_declarations
from ..cpu.signature import scalar_converter as _scalar_converter
from ..protected import checking_writes

_F16, _BF16 = torch.float16, torch.bfloat16
# pointer base type -> (tensor dtypes it accepts, required byte alignment of the data pointer)
POINTER_TYPES: dict[str, tuple[tuple[torch.dtype, ...], int]] = {
    "float": ((torch.float32,), 4), "float2": ((torch.float32,), 8), "float4": ((torch.float32,), 16),
    "double": ((torch.float64,), 8), "double2": ((torch.float64,), 16),
    "__half": ((_F16,), 2), "half": ((_F16,), 2), "__half2": ((_F16,), 4), "half2": ((_F16,), 4),
    "__nv_bfloat16": ((_BF16,), 2), "nv_bfloat16": ((_BF16,), 2), "__nv_bfloat162": ((_BF16,), 4),
    "nv_bfloat162": ((_BF16,), 4),
    "int8_t": ((torch.int8,), 1), "signed char": ((torch.int8,), 1), "char": ((torch.int8, torch.uint8, torch.bool), 1),
    "uint8_t": ((torch.uint8, torch.bool), 1), "unsigned char": ((torch.uint8, torch.bool), 1),
    "bool": ((torch.bool,), 1),
    "int16_t": ((torch.int16,), 2), "short": ((torch.int16,), 2),
    "uint16_t": ((_F16, _BF16, torch.int16), 2), "unsigned short": ((_F16, _BF16, torch.int16), 2),
    "int": ((torch.int32,), 4), "int32_t": ((torch.int32,), 4),
    "unsigned int": ((torch.int32, getattr(torch, "uint32", torch.int32)), 4),
    "uint32_t": ((torch.int32, getattr(torch, "uint32", torch.int32)), 4),
    "int2": ((torch.int32,), 8), "int4": ((torch.int32,), 16),
    "long long": ((torch.int64,), 8), "int64_t": ((torch.int64,), 8), "long": ((torch.int64,), 8),
    "unsigned long long": ((torch.int64, getattr(torch, "uint64", torch.int64)), 8),
    "uint64_t": ((torch.int64, getattr(torch, "uint64", torch.int64)), 8),
}
# scalar type -> (ctypes type, is_integer, min, max)
SCALAR_TYPES: dict[str, tuple[Any, bool, int, int]] = {
    "float": (ctypes.c_float, False, 0, 0), "double": (ctypes.c_double, False, 0, 0),
    "bool": (ctypes.c_bool, True, 0, 1),
    "char": (ctypes.c_int8, True, -128, 127), "signed char": (ctypes.c_int8, True, -128, 127),
    "int8_t": (ctypes.c_int8, True, -128, 127),
    "unsigned char": (ctypes.c_uint8, True, 0, 255), "uint8_t": (ctypes.c_uint8, True, 0, 255),
    "short": (ctypes.c_int16, True, -2**15, 2**15 - 1), "int16_t": (ctypes.c_int16, True, -2**15, 2**15 - 1),
    "unsigned short": (ctypes.c_uint16, True, 0, 2**16 - 1), "uint16_t": (ctypes.c_uint16, True, 0, 2**16 - 1),
    "int": (ctypes.c_int32, True, -2**31, 2**31 - 1), "int32_t": (ctypes.c_int32, True, -2**31, 2**31 - 1),
    "unsigned int": (ctypes.c_uint32, True, 0, 2**32 - 1), "uint32_t": (ctypes.c_uint32, True, 0, 2**32 - 1),
    "long long": (ctypes.c_int64, True, -2**63, 2**63 - 1), "int64_t": (ctypes.c_int64, True, -2**63, 2**63 - 1),
    "long": (ctypes.c_int64, True, -2**63, 2**63 - 1),
    "unsigned long long": (ctypes.c_uint64, True, 0, 2**64 - 1), "uint64_t": (ctypes.c_uint64, True, 0, 2**64 - 1),
    "size_t": (ctypes.c_uint64, True, 0, 2**64 - 1), "unsigned long": (ctypes.c_uint64, True, 0, 2**64 - 1),
}
_ALIASES = {"unsigned": "unsigned int", "signed": "int", "signed int": "int", "long int": "long",
            "long long int": "long long", "unsigned long long int": "unsigned long long",
            "short int": "short", "unsigned short int": "unsigned short", "unsigned long int": "unsigned long",
            "std::int64_t": "int64_t", "std::size_t": "size_t"}
_QUALIFIERS = {"__restrict__", "__restrict", "restrict", "volatile", "__grid_constant__", "struct"}
_DECORATIONS = re.compile(r"__launch_bounds__\s*\([^()]*\)|__cluster_dims__\s*\([^()]*\)|__maxnreg__\s*\([^()]*\)"
                          r"|\b(?:__global__|__noinline__|__forceinline__|static|inline)\b")
_HEADER = re.compile(r"^(?P<ret>[\w\s]*?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<params>[^()]*)\)[\w\s]*$", re.S)

MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)


@dataclass(frozen=True)
class CudaParam:
    """One parameter of a CUDA kernel."""

    name: str
    base_type: str
    is_pointer: bool
    is_const: bool

    def __str__(self) -> str:
        return f"{'const ' if self.is_const else ''}{self.base_type}{'*' if self.is_pointer else ''} {self.name}"


def _parse_param(func: str, index: int, text: str) -> CudaParam:
    tokens = re.findall(r"[A-Za-z_]\w*(?:::\w+)*|\*|&|\[[^\]]*\]", text)
    words = [w for w in tokens if w not in _QUALIFIERS]
    is_const = "const" in words[:_first_declarator(words)]  # the pointee's: `float* const out` is written
    words = [w for w in words if w != "const"]
    if "&" in words:
        raise CompileError(f"kernel {func}: parameter {text.strip()!r}: references are not supported")
    stars = sum(w == "*" or w.startswith("[") for w in words)
    names = [w.replace("std::", "") for w in words if w != "*" and not w.startswith("[")]
    known = set(POINTER_TYPES) | set(SCALAR_TYPES) | set(_ALIASES)
    if len(names) > 1 and " ".join(names) not in known:
        name, base = names[-1], " ".join(names[:-1])
    else:
        name, base = f"arg{index}", " ".join(names)
    base = _ALIASES.get(base, base)
    ok = (stars == 1 and base in POINTER_TYPES) or (stars == 0 and base in SCALAR_TYPES)
    if not ok:
        raise CompileError(
            f"kernel {func}: parameter {index} {text.strip()!r} has an unsupported type; pointers may be to "
            f"{', '.join(POINTER_TYPES)}; scalars may be {', '.join(SCALAR_TYPES)}")
    return CudaParam(name, base, stars == 1, is_const)


def parse_cuda_kernels(source: str) -> dict[str, list[CudaParam]]:
    """The `extern "C" __global__` kernels of SOURCE with their parameters, in source order.

    Device helpers (`__device__`), templates and host code are skipped; a kernel must be
    `extern "C"` (unmangled, so it can be looked up by name) and return void.
    """
    headers = extern_c_declarations(_clean(source))
    kernels: dict[str, list[CudaParam]] = {}
    for header in headers:
        header = " ".join(header.split())
        if not re.search(r"\b__global__\b", header):
            continue  # __device__ helpers, variables, typedefs
        header = " ".join(_DECORATIONS.sub(" ", header).split())
        m = _HEADER.match(header)
        if m is None:
            raise CompileError(f"cannot parse kernel declaration {header!r}")
        name, ret = m["name"], " ".join(m["ret"].replace("extern", "").split())
        if ret != "void":
            raise CompileError(f"kernel {name} returns {ret or '?'!r}; __global__ kernels must return void")
        raw = m["params"].split(",") if m["params"].strip() not in ("", "void") else []
        kernels.setdefault(name, [_parse_param(name, i, p) for i, p in enumerate(raw)])
    return kernels


# ---------------------------------------------------------------- launch dimensions

Dims = tuple[int, int, int]


def _dims(value: Any, what: str, kernel: str) -> Dims:
    vals = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(vals) <= 3:
        raise KernelLaunchError(f"kernel {kernel}: {what} must have 1 to 3 dimensions, got {len(vals)}")
    out = []
    for v in vals:
        if isinstance(v, torch.Tensor) and v.dim() == 0:
            v = v.item()
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise KernelLaunchError(f"kernel {kernel}: {what} must be integers, got {value!r}")
        out.append(int(v.__index__()))
    if any(v < 0 for v in out):
        raise KernelLaunchError(f"kernel {kernel}: {what} must not be negative, got {value!r}")
    return tuple((out + [1, 1])[:3])  # type: ignore[return-value]


def launch_dims(kernel: str, *, threads: Any = None, group_size: Any = None, grid: Any = None,
                block: Any = None) -> tuple[Dims, Dims] | None:
    """(grid, block) for a launch, or None when there is nothing to run (zero threads or blocks).

    Either `threads` (total threads per dimension) with `group_size` (threads per block, default
    256 in x), grid = ceil(threads / group_size) per dimension; or an explicit `grid` and `block`.
    """
    if threads is not None and grid is not None:
        raise KernelLaunchError(f"kernel {kernel}: give threads=/group_size= or grid=/block=, not both")
    if threads is None and grid is None:
        raise KernelLaunchError(f"kernel {kernel}: launch needs threads=N (and group_size=) or grid= and block=")
    if threads is not None:
        t = _dims(threads, "threads", kernel)
        g = _dims(group_size if group_size is not None else min(256, max(t[0], 1)), "group_size", kernel)
        if group_size is None and len(tuple(threads) if isinstance(threads, (tuple, list)) else (threads,)) > 1:
            raise KernelLaunchError(f"kernel {kernel}: multi-dimensional threads need an explicit group_size")
        if block is not None:
            raise KernelLaunchError(f"kernel {kernel}: block= goes with grid=; with threads= use group_size=")
        if any(b == 0 for b in g):
            raise KernelLaunchError(f"kernel {kernel}: group_size must be positive, got {group_size!r}")
        grid_d: Dims = tuple(-(-n // b) for n, b in zip(t, g))  # type: ignore[assignment]
        block_d = g
    else:
        if block is None:
            raise KernelLaunchError(f"kernel {kernel}: grid= needs block=")
        if group_size is not None:
            raise KernelLaunchError(f"kernel {kernel}: group_size= goes with threads=; with grid= use block=")
        grid_d, block_d = _dims(grid, "grid", kernel), _dims(block, "block", kernel)
        if any(b == 0 for b in block_d):
            raise KernelLaunchError(f"kernel {kernel}: block must be positive, got {block!r}")
    if block_d[0] * block_d[1] * block_d[2] > MAX_BLOCK_THREADS or any(b > m for b, m in zip(block_d, MAX_BLOCK)):
        raise KernelLaunchError(f"kernel {kernel}: block {block_d} exceeds the limits (at most {MAX_BLOCK_THREADS} "
                                f"threads, dimensions at most {MAX_BLOCK})")
    if any(g > m for g, m in zip(grid_d, MAX_GRID)):
        raise KernelLaunchError(f"kernel {kernel}: grid {grid_d} exceeds the limits {MAX_GRID}")
    if any(g == 0 for g in grid_d):
        return None
    return grid_d, block_d


def cooperative_dims(kernel: str, *, threads: Any = None, group_size: Any = None, grid: Any = None,
                     block: Any = None, resident: Callable[[int], int]) -> tuple[Dims, Dims] | None:
    """(grid, block) of a cooperative launch (`cooperative=True`), or None when there is nothing to run.

    `block` is required; `grid` as given, or without it every block the device holds at once:
    `resident(threads_per_block)` (blocks per multiprocessor x multiprocessors), in x.
    """
    if threads is not None or group_size is not None:
        raise KernelLaunchError(f"kernel {kernel}: a cooperative launch takes block= (and optionally grid=), "
                                "not threads=/group_size=")
    if block is None:
        raise KernelLaunchError(f"kernel {kernel}: a cooperative launch needs block=")
    if grid is not None:
        return launch_dims(kernel, grid=grid, block=block)
    dims = launch_dims(kernel, grid=1, block=block)
    assert dims is not None
    block_d = dims[1]
    blocks = int(resident(block_d[0] * block_d[1] * block_d[2]))
    if blocks < 1:
        raise KernelLaunchError(f"kernel {kernel}: not one block of {block_d} fits on a multiprocessor with this "
                                "shared memory and these registers; a cooperative launch needs one")
    return (min(blocks, MAX_GRID[0]), 1, 1), block_d


# ---------------------------------------------------------------- argument binding

def pointer_converter(kernel: str, i: int, p: CudaParam, device_type: str = "cuda") -> Callable[[Any], int]:
    """A function from a tensor argument to its device address, checking dtype, device, layout, alignment."""
    dtypes, align = POINTER_TYPES[p.base_type]
    where = f"kernel {kernel}, argument {i} ({p})"
    tensor = torch.Tensor
    vector = align > dtypes[0].itemsize  # float4*, __half2*, ...: whole vectors only

    def fail(x: Any) -> None:
        if not isinstance(x, tensor):
            raise KernelLaunchError(f"{where}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in dtypes:
            raise KernelLaunchError(f"{where}: expected a tensor of dtype {' or '.join(map(str, dtypes))}, got {x.dtype}")
        if x.device.type != device_type:
            raise KernelLaunchError(f"{where}: tensor is on {x.device}; CUDA kernels need {device_type} tensors")
        if not x.is_contiguous():
            raise KernelLaunchError(f"{where}: tensor is not contiguous; call .contiguous() first")
        if x.data_ptr() % align:
            raise KernelLaunchError(f"{where}: data pointer is not {align}-byte aligned (a view with an offset?)")
        raise KernelLaunchError(f"{where}: {x.numel()} elements do not fill whole {p.base_type} vectors")

    def convert(x: Any) -> int:
        if isinstance(x, tensor) and x.dtype in dtypes and x.device.type == device_type and x.is_contiguous():
            ptr = x.data_ptr()
            if not ptr % align and not (vector and x.numel() * x.element_size() % align):
                return ptr
        fail(x)
        raise AssertionError  # unreachable

    if device_type == "cuda":  # the hot path: no device object
        def convert_cuda(x: Any) -> int:
            if isinstance(x, tensor) and x.is_cuda and x.dtype in dtypes and x.is_contiguous():
                ptr = x.data_ptr()
                if not ptr % align and not (vector and x.numel() * x.element_size() % align):
                    return ptr
            fail(x)
            raise AssertionError  # unreachable
        return checking_writes(convert_cuda, where, p.is_const)
    return checking_writes(convert, where, p.is_const)


def scalar_converter(kernel: str, i: int, p: CudaParam) -> Callable[[Any], Any]:
    """A function from a Python number (or 0-dim tensor) to the kernel's C scalar value."""
    return _scalar_converter(kernel, i, p, SCALAR_TYPES)


class ArgBinder:
    """Converts `lib.k(*args)` arguments into the void** array cuLaunchKernel copies from.

    The values are packed with one precompiled `struct` call into a buffer per thread (reused
    call after call; the driver copies the parameters when the launch is enqueued) laid out with
    C's native alignment, and the array of pointers into it is built once, so binding costs one
    conversion per argument and a single pack.
    """

    def __init__(self, kernel: str, params: Sequence[CudaParam], device_type: str = "cuda") -> None:
        self.kernel = kernel
        self.params = list(params)
        self.signature = f"{kernel}({', '.join(map(str, params))})"
        self._convs = [pointer_converter(kernel, i, p, device_type) if p.is_pointer else scalar_converter(kernel, i, p)
                       for i, p in enumerate(params)]
        # struct codes of ctypes types are their native C layouts ("P" void*, "f" float, "q"/"l" int64, ...)
        codes = ["P" if p.is_pointer else SCALAR_TYPES[p.base_type][0]._type_ for p in params]
        self._format = struct.Struct("@" + "".join(codes))
        self._offsets = [struct.calcsize("@" + "".join(codes[:i + 1])) - struct.calcsize("@" + c)
                         for i, c in enumerate(codes)]
        self._pointer_idx = [i for i, p in enumerate(params) if p.is_pointer]
        self._local = threading.local()

    def values(self, args: Sequence[Any]) -> list[Any]:
        """The converted Python values (device addresses for tensors), checked against the signature."""
        if len(args) != len(self._convs):
            raise KernelLaunchError(f"kernel {self.signature} takes {len(self.params)} arguments, got {len(args)}")
        return [c(a) for c, a in zip(self._convs, args)]

    def device(self, args: Sequence[Any]) -> int | None:
        """The CUDA device index of the tensor arguments (None without tensors); they must agree."""
        devs = {args[i].get_device() for i in self._pointer_idx}
        if len(devs) > 1:
            raise KernelLaunchError(f"kernel {self.kernel}: tensors on several devices {sorted(devs)}")
        return devs.pop() if devs else None

    def _buffers(self) -> tuple[Any, Any, int]:
        st = getattr(self._local, "st", None)
        if st is None:
            buf = ctypes.create_string_buffer(max(self._format.size, 1))
            base = ctypes.addressof(buf)
            arr = (ctypes.c_void_p * max(len(self._offsets), 1))(*[base + off for off in self._offsets])
            st = self._local.st = (buf, arr, ctypes.addressof(arr))
        return st

    def pack(self, values: Sequence[Any]) -> tuple[int, Any]:
        """(address of the void** array, its keep-alive) holding VALUES; valid until the next pack on this thread."""
        st = self._buffers()
        self._format.pack_into(st[0], 0, *values)
        return st[2], st

    def bind(self, args: Sequence[Any]) -> int:
        """`values` then `pack` in one step (the launch hot path): the address of the void** array."""
        return self.pack(self.values(args))[0]
