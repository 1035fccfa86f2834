"""Metal backend ("mps"): Metal Shading Language kernels on PyTorch's MPS device.

`lib = MpsBackend().compile(SOURCE)` then `lib.kernel(*args, threads=..., group_size=..., arg_casts=...)`,
the call of `torch.mps.compile_shader`: argument i binds buffer index i; a tensor binds its storage
from its storage offset (strides are not applied); a Python int binds 8 bytes (int64), a float 4
bytes (float32), a list of numbers an array of those, unless `arg_casts` says otherwise; `threads`
is the grid in threads (default: the first tensor's numel), `group_size` the threadgroup (default
min(threads, max) in 1-D, (max, 1, 1) in 2-D/3-D). Geometry is normalized and checked for both
launchers (mps_launch.py), exactly as the MSL emulator (mps_emu.py) does: a threadgroup larger than
the pipeline's maxTotalThreadsPerThreadgroup is a KernelLaunchError, never clamped.

Two launchers behind that call:
- `metal_accel._mps_ext` (csrc/mps/metal_launcher.mm), when it was built (setup.py, macOS only):
  MTLLibrary and pipeline-state caches, encoding on PyTorch's current MPS stream with that stream's
  own command encoder, MSL 3.1 with safe math on every macOS (a kernel compiles the same on 14 and 15);
- `torch.mps.compile_shader` (public from PyTorch 2.7) otherwise; PyTorch picks the MSL version
  from the OS (3.1 on macOS 14, 3.2 on 15, 4.0 on 26) and compiles in safe math mode.
METAL_ACCEL_MPS_LAUNCHER=compile_shader|ext forces one. Libraries are cached in this process by
source hash; neither launcher keeps compiled code on disk (compile_shader has no such cache), so
each process compiles a source once, in tens of milliseconds.

Launch arguments and geometry live in mps_launch.py, kernels, libraries and the two launchers in
mps_library.py; this module picks the launcher, caches libraries, times calls and describes the device.

UNVERIFIED ON REAL HARDWARE until tests/test_mps_backend.py has run on a Mac (docs/metal.md).
"""
from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...core import config
from ...core.errors import BackendUnavailableError, CompileError
from ..base import BackendDefaults, Environment, os_description, torch_major_minor
from ..timing import TimingRejected, time_call
from .launch import (
    MAX_BUFFER_INDEX,
    MAX_SET_BYTES,
    ascii_source,
    kernel_names_in,
    launch_geometry,
    pack_arguments,
    pack_scalar,
)
from .library import (
    EXT_MSL_VERSION,
    ExtensionLauncher,
    MpsKernel,
    MpsLibrary,
    ShaderLauncher,
)
from .written import written_buffers

__all__ = ["EXT_MSL_VERSION", "MAX_BUFFER_INDEX", "MAX_SET_BYTES", "ExtensionLauncher", "MpsBackend", "MpsKernel",
           "MpsLibrary", "ShaderLauncher", "ascii_source", "chip_name", "clear_memory_cache", "describe",
           "event_checked_timer", "extension", "gpu_cores", "kernel_names_in", "launch_geometry", "launcher",
           "pack_arguments", "pack_scalar"]

compile_count = 0  # source compilations in this process (tests read it)


# ---------------------------------------------------------------- launcher choice

@functools.cache
def extension() -> Any:
    """torch.ops.metal_accel_ext when metal_accel._mps_ext is built and loads; else None."""
    try:
        from ... import _mps_ext
    except (ImportError, OSError):  # not built, or built against another torch
        return None
    return torch.ops.metal_accel_ext


def _compile_shader() -> Callable[[str], Any] | None:
    mps = getattr(torch, "mps", None)
    return getattr(mps, "compile_shader", None)


def launcher() -> ShaderLauncher | ExtensionLauncher | None:
    """The launcher this process uses (METAL_ACCEL_MPS_LAUNCHER=ext|compile_shader forces one)."""
    want = config.current().mps_launcher
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
    synchronization, and the sample raises TimingRejected (proof.speed.compare_speed retries it).
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
class MpsBackend(BackendDefaults):
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
                written = written_buffers(source)
                for name, kernel in kernels.items():
                    kernel.written = written.get(name)
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


@functools.cache
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
