"""Metal backend ("mps"): Metal Shading Language kernels on PyTorch's MPS device.

`lib = MpsBackend().compile(SOURCE)` then `lib.kernel(*args, threads=..., group_size=..., arg_casts=...)`,
the call of `torch.mps.compile_shader`: argument i binds buffer index i; a tensor binds its storage
from its storage offset (strides are not applied); a Python int binds 8 bytes (int64), a float 4
bytes (float32), a list of numbers an array of those, unless `arg_casts` says otherwise; `threads`
is the grid in threads (default: the first tensor's numel), `group_size` the threadgroup (default
min(threads, max) in 1-D, (max, 1, 1) in 2-D/3-D). Geometry is normalized and checked here, for both
launchers, exactly as the MSL emulator (mps_emu.py) does: a threadgroup larger than the pipeline's
maxTotalThreadsPerThreadgroup is a KernelLaunchError, never clamped.

Two launchers behind that call:
- `metal_accel._mps_ext` (csrc/mps/metal_launcher.mm), when it was built (setup.py, macOS only):
  MTLLibrary and pipeline-state caches, encoding on PyTorch's current MPS stream with that stream's
  own command encoder, MSL 3.1 with safe math on every macOS (a kernel compiles the same on 14 and 15);
- `torch.mps.compile_shader` (public from PyTorch 2.7) otherwise; PyTorch picks the MSL version
  from the OS (3.1 on macOS 14, 3.2 on 15, 4.0 on 26) and compiles in safe math mode.
METAL_ACCEL_MPS_LAUNCHER=compile_shader|ext forces one. Libraries are cached in this process by
source hash; neither launcher keeps compiled code on disk (compile_shader has no such cache), so
each process compiles a source once, in tens of milliseconds.

UNVERIFIED ON REAL HARDWARE until tests/test_mps_backend.py has run on a Mac (docs/metal.md).
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..bench import TimingRejected, time_call
from ..errors import BackendUnavailableError, CompileError, KernelLaunchError
from .base import Environment, os_description, torch_major_minor

EXT_MSL_VERSION = "3.1"       # what metal_launcher.mm compiles with, on every macOS
MAX_BUFFER_INDEX = 31         # Metal's buffer argument table
MAX_SET_BYTES = 4096          # setBytes: limit
_CASTS = {"fp16": "e", "bf16": "bf", "int32": "i", "int16": "h", "int8": "b", "uint8": "B"}

compile_count = 0  # source compilations in this process (tests read it)


# ---------------------------------------------------------------- launch arguments (pure Python)

def _dims(value: Any, what: str, kernel: str) -> list[int]:
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
    grid = _dims(threads if threads is not None else default_threads, "threads", kernel)
    if group_size is None:
        group = [min(grid[0], max_threads)] if len(grid) == 1 else [max_threads] + [1] * (len(grid) - 1)
    else:
        group = _dims(group_size, "group_size", kernel)
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


# ---------------------------------------------------------------- kernels and libraries

class MpsKernel:
    """One kernel of an MpsLibrary: `kernel(*args, threads=..., group_size=..., arg_casts=...)`."""

    def __init__(self, name: str, max_threads: int, execution_width: int, device_type: str,
                 run: Callable[[tuple, list[int], list[int], Any], None]) -> None:
        self.__name__ = name
        self.max_threads_per_threadgroup = int(max_threads)
        self.thread_execution_width = int(execution_width)
        self._device_type = device_type
        self._run = run

    def __call__(self, *args: Any, threads: Any = None, group_size: Any = None, arg_casts: Any = None) -> None:
        name = self.__name__
        if len(args) > MAX_BUFFER_INDEX:
            raise KernelLaunchError(f"kernel {name}: {len(args)} arguments; Metal binds at most {MAX_BUFFER_INDEX}")
        first_numel = None
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.device.type != self._device_type:
                    raise KernelLaunchError(f"kernel {name}, argument {i}: tensor is on {a.device}; the mps backend "
                                            f"runs on {self._device_type} tensors")
                if first_numel is None:
                    first_numel = a.numel()
        geometry = launch_geometry(name, threads, group_size, first_numel, self.max_threads_per_threadgroup)
        if geometry is not None:
            self._run(args, geometry[0], geometry[1], arg_casts)

    def __repr__(self) -> str:
        return f"<Metal kernel {self.__name__} (max {self.max_threads_per_threadgroup} threads per threadgroup)>"


class MpsLibrary:
    """Compiled MSL source: `lib.<kernel>(*args, threads=..., group_size=...)`."""

    def __init__(self, kernels: dict[str, MpsKernel], launcher: str, key: str) -> None:
        object.__setattr__(self, "kernel_names", tuple(kernels))
        object.__setattr__(self, "launcher", launcher)
        object.__setattr__(self, "key", key)
        for name, k in kernels.items():
            object.__setattr__(self, name, k)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"no kernel {name!r} in this library; kernels: {', '.join(self.kernel_names) or 'none'}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("MpsLibrary is read-only")

    def __dir__(self) -> list[str]:
        return list(self.kernel_names)

    def __repr__(self) -> str:
        return f"MpsLibrary({self.launcher}, kernels={self.kernel_names})"


# ---------------------------------------------------------------- launchers

class ShaderLauncher:
    """torch.mps.compile_shader: PyTorch compiles, binds and encodes."""

    name = "compile_shader"

    def __init__(self, compile_shader: Callable[[str], Any]) -> None:
        self._compile = compile_shader

    def build(self, key: str, source: str, device_type: str) -> dict[str, MpsKernel]:
        try:
            lib = self._compile(ascii_source(source))
        except (SyntaxError, RuntimeError, ValueError) as exc:  # c10::SyntaxError is Python's SyntaxError
            raise CompileError(f"Metal compilation failed (torch.mps.compile_shader):\n{_message(exc)}") from None
        names = [n for n in dir(lib) if not n.startswith("_")] or kernel_names_in(source)
        kernels = {}
        for name in names:
            try:
                fn = getattr(lib, name)
                max_threads, width = int(fn.max_threads_per_threadgroup), int(fn.thread_execution_width)
            except (AttributeError, RuntimeError) as exc:
                raise CompileError(f"kernel {name}: no compute pipeline: {_message(exc)}") from None
            kernels[name] = MpsKernel(name, max_threads, width, device_type, self._runner(name, fn))
        return kernels

    @staticmethod
    def _runner(name: str, fn: Any) -> Callable[[tuple, list[int], list[int], Any], None]:
        def run(args: tuple, grid: list[int], group: list[int], arg_casts: Any) -> None:
            try:
                fn(*args, threads=grid, group_size=group, arg_casts=arg_casts)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise KernelLaunchError(f"kernel {name}: {_message(exc)}") from None
        return run


class ExtensionLauncher:
    """metal_accel._mps_ext: our launcher on PyTorch's current MPS stream (csrc/mps/metal_launcher.mm)."""

    name = "metal_accel._mps_ext"

    def __init__(self, ops: Any) -> None:
        self._ops = ops

    def build(self, key: str, source: str, device_type: str) -> dict[str, MpsKernel]:
        try:
            listed = self._ops.compile_library(key, ascii_source(source))
        except RuntimeError as exc:
            raise CompileError(f"Metal compilation failed (metal_accel._mps_ext, MSL {EXT_MSL_VERSION}):\n"
                               f"{_message(exc)}") from None
        kernels = {}
        for name in [n for n in listed.split("\n") if n]:
            try:
                max_threads, width, _ = self._ops.kernel_info(key, name)
            except RuntimeError as exc:
                raise CompileError(f"kernel {name}: no compute pipeline: {_message(exc)}") from None
            kernels[name] = MpsKernel(name, max_threads, width, device_type, self._runner(key, name))
        return kernels

    def _runner(self, key: str, name: str) -> Callable[[tuple, list[int], list[int], Any], None]:
        launch = self._ops.launch

        def run(args: tuple, grid: list[int], group: list[int], arg_casts: Any) -> None:
            buffers, buffer_index, blob, scalar_index, offsets, sizes = pack_arguments(name, args, arg_casts)
            try:
                launch(key, name, buffers, buffer_index, blob, scalar_index, offsets, sizes, grid, group)
            except RuntimeError as exc:
                raise KernelLaunchError(f"kernel {name}: {_message(exc)}") from None
        return run


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


def _message(exc: BaseException) -> str:
    text = str(exc.msg) if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    return text.strip() or type(exc).__name__


@functools.cache
def extension() -> Any:
    """torch.ops.metal_accel_ext when metal_accel._mps_ext is built and loads; else None."""
    try:
        from .. import _mps_ext  # noqa: F401  (registers the ops with TORCH_LIBRARY)
    except (ImportError, OSError):  # not built, or built against another torch
        return None
    return torch.ops.metal_accel_ext


def _compile_shader() -> Callable[[str], Any] | None:
    mps = getattr(torch, "mps", None)
    return getattr(mps, "compile_shader", None)


def launcher() -> ShaderLauncher | ExtensionLauncher | None:
    """The launcher this process uses (METAL_ACCEL_MPS_LAUNCHER=ext|compile_shader forces one)."""
    want = os.environ.get("METAL_ACCEL_MPS_LAUNCHER", "auto")
    ext = extension() if want in ("auto", "ext") else None
    if ext is not None:
        return ExtensionLauncher(ext)
    shader = _compile_shader() if want in ("auto", "compile_shader") else None
    return ShaderLauncher(shader) if shader is not None else None


# ---------------------------------------------------------------- timing

def event_checked_timer(tolerance_s: float = 100e-6, rel_tol: float = 0.1) -> Callable[..., tuple[float, Any]]:
    """A bench timer: the wall time of the call between device synchronizations, checked by MPS events.

    The wall time is what the user pays: MPS encodes on the CPU and commits command buffers lazily,
    so the GPU-side event span can leave out the encoding that dominates small calls. Events serve
    as the check: a GPU span longer than the wall span around it means work escaped the
    synchronization, and the sample raises TimingRejected (bench.compare_speed retries it).
    """
    def timer(fn: Callable[..., Any], args: tuple, kwargs: dict, sync: Callable[[], None]) -> tuple[float, Any]:
        from torch.mps.event import Event
        start, end = Event(enable_timing=True), Event(enable_timing=True)
        sync()
        t0 = time.perf_counter()
        start.record()
        out = fn(*args, **kwargs)
        end.record()
        sync()
        wall = time.perf_counter() - t0
        gpu = start.elapsed_time(end) / 1e3
        if not 0 <= gpu <= wall * (1 + rel_tol) + tolerance_s:  # event times are taken by listener callbacks
            raise TimingRejected(f"MPS events {gpu * 1e6:.1f} us vs wall {wall * 1e6:.1f} us")
        return wall, out
    return timer


def _has_events() -> bool:
    try:
        from torch.mps.event import Event  # noqa: F401
        return True
    except ImportError:
        return False


# ---------------------------------------------------------------- the backend

_libraries: dict[str, MpsLibrary] = {}
_lock = threading.Lock()


def clear_memory_cache() -> None:
    """Forget compiled libraries (the extension keeps its own MTLLibrary cache for the process)."""
    _libraries.clear()


@dataclass(frozen=True)
class MpsBackend:
    """Metal Shading Language kernels on Apple GPUs (PyTorch's MPS device)."""

    name: str = "mps"
    device_type: str = "mps"
    language: str = "msl"

    def is_available(self) -> bool:
        mps = getattr(torch.backends, "mps", None)
        return bool(mps and mps.is_available()) and launcher() is not None

    def environment(self) -> Environment:
        found = launcher()
        return _environment(found.name if found else "no launcher")

    def synchronize(self) -> None:
        torch.mps.synchronize()

    def timer(self) -> Callable[..., tuple[float, Any]]:
        return event_checked_timer() if _has_events() else time_call

    def compile(self, source: str) -> MpsLibrary:
        """Compile SOURCE (cached in this process by its sha256 and the launcher); CompileError with Metal's message."""
        global compile_count
        if not isinstance(source, str) or not source.strip():
            raise CompileError("empty kernel source")
        found = launcher()
        if found is None:
            raise BackendUnavailableError("no Metal launcher: needs torch.mps.compile_shader (PyTorch >= 2.7) "
                                          "or the metal_accel._mps_ext extension (pip install on macOS)")
        key = hashlib.sha256(f"{found.name}\0{source}".encode()).hexdigest()[:32]
        lib = _libraries.get(key)
        if lib is not None:
            return lib
        with _lock:
            lib = _libraries.get(key)
            if lib is None:
                compile_count += 1
                kernels = found.build(key, source, self.device_type)
                if not kernels:
                    raise CompileError("no kernel found; declare kernels as `kernel void name(...)`")
                lib = _libraries[key] = MpsLibrary(kernels, found.name, key)
        return lib


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def chip_name() -> str:
    """The Apple chip (e.g. "Apple M2 Pro"): sysctl's brand string, else the MTLDevice name."""
    name = _sysctl("machdep.cpu.brand_string") if sys.platform == "darwin" else ""
    if not name:
        try:
            name = torch.backends.mps.get_name()  # MTLDevice.name (PyTorch >= 2.8)
        except (AttributeError, RuntimeError):
            ext = extension()
            name = ext.device_name() if ext is not None else ""
    return name or "Apple GPU"


def gpu_cores() -> int | None:
    try:
        return int(torch.backends.mps.get_core_count())
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=None)
def _environment(launcher_name: str) -> Environment:
    cores = gpu_cores()
    desc = f"{chip_name()}{f', {cores} GPU cores' if cores else ''}, via {launcher_name}"
    return Environment(backend="mps", device_name=desc, os=os_description(), torch=torch_major_minor())


def describe() -> dict[str, str]:
    """Launchers, language version and device, for reports and `metal-accel doctor`."""
    found = launcher()
    out = {"torch": torch.__version__, "compile_shader": "yes" if _compile_shader() else "no (PyTorch < 2.7)",
           "extension": "built" if extension() is not None else "not built",
           "launcher": found.name if found else "none",
           "msl": EXT_MSL_VERSION if isinstance(found, ExtensionLauncher) else "PyTorch's choice for this macOS",
           "timer": "wall clock checked by MPS events" if _has_events() else "wall clock"}
    mps = getattr(torch.backends, "mps", None)
    if mps and mps.is_available():
        out.update(chip=chip_name(), gpu_cores=str(gpu_cores() or "?"), os=os_description())
    return out
