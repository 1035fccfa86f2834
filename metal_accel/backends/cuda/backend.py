"""CUDA backend: CUDA C++ compiled at run time with NVRTC, launched on PyTorch's current stream.

NVRTC and the driver API are reached through NVIDIA's `cuda-python` bindings (`cuda.bindings`),
which the GPU image ships and which need nothing compiled on install; CuPy's RawModule would also
do, but it launches with CuPy arrays and streams, where tensors and PyTorch's stream are what we
hold. Compiled artifacts (cubin for the device's architecture, PTX when NVRTC is older than the
GPU) are cached on disk by sha256 of source, architecture, NVRTC version, options and headers, so a
warm start compiles nothing. Launch convention: `lib.k(*args, threads=N, group_size=G)` (grid =
ceil(threads / group), 1 to 3 dimensions) or `lib.k(*args, grid=..., block=...)`, either with
`shared_mem=bytes` of dynamic shared memory; `lib.k(*args, block=..., cooperative=True)` is a
cooperative launch (grid-wide sync) on as many blocks as the device holds at once.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import filelock
import torch

from ...core import config
from ...core.errors import BackendUnavailableError, CompileError, KernelLaunchError
from ...store import attest
from ..base import (
    BackendDefaults,
    BoundKernels,
    Environment,
    os_description,
    torch_major_minor,
)
from ..timing import TimingRejected
from .nvrtc import (
    _bindings,
    _check,
    _header_digest,
    cache_key,
    check_device_state,
    nvrtc_available,
    nvrtc_compile,
    nvrtc_options,
    nvrtc_version,
    supported_archs,
    target_for,
    toolkit_include_dirs,
)
from .signature import (
    ArgBinder,
    CudaParam,
    cooperative_dims,
    launch_dims,
    parse_cuda_kernels,
)

LOCK_TIMEOUT_S = 600
DEFAULT_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in (cuFuncSetAttribute)


# ---------------------------------------------------------------- loaded code and launches

class _Loaded:
    """One artifact loaded into one device's primary context: its module and functions."""

    def __init__(self, image: bytes, device: int, names: tuple[str, ...]) -> None:
        _, driver = _bindings()
        torch.cuda.init()
        with torch.cuda.device(device):
            torch.cuda.current_stream()  # make sure the runtime made the primary context current
            self.ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
            if int(self.ctx) == 0:
                dev = _check(driver.cuDeviceGet(device), "cuDeviceGet")
                self.ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
                _check(driver.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            try:
                self.module = _check(driver.cuModuleLoadData(image), "cuModuleLoadData")
            except KernelLaunchError as exc:
                raise CompileError(f"the driver could not load the compiled kernels: {exc}") from None
            self.functions = {n: _check(driver.cuModuleGetFunction(self.module, n.encode()), f"cuModuleGetFunction({n})")
                              for n in names}
        self.handles = {n: int(f) for n, f in self.functions.items()}  # raw CUfunction pointers for ctypes
        self.ctx_handle = int(self.ctx)
        self.device = device
        self.smem_optin: dict[str, int] = {}
        self.resident: dict[tuple[str, int, int], int] = {}

    def ensure_smem(self, name: str, nbytes: Any) -> None:
        """Check a launch's `shared_mem` and opt kernel NAME in above the default 48 KB."""
        if type(nbytes) is not int or nbytes < 0:
            raise KernelLaunchError(f"kernel {name}: shared_mem must be a non-negative int, got {nbytes!r}")
        if nbytes <= max(DEFAULT_SMEM_LIMIT, self.smem_optin.get(name, 0)):
            return
        _, driver = _bindings()
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        try:
            _check(driver.cuFuncSetAttribute(self.functions[name], attr, nbytes), "cuFuncSetAttribute")
        except KernelLaunchError as exc:
            raise KernelLaunchError(f"kernel {name}: {nbytes} bytes of dynamic shared memory: {exc}") from None
        self.smem_optin[name] = nbytes

    def resident_blocks(self, name: str, threads: int, shared_mem: int) -> int:
        """Blocks of kernel NAME (THREADS each, SHARED_MEM dynamic bytes) the device runs at once."""
        key = (name, threads, shared_mem)
        got = self.resident.get(key)
        if got is None:
            _, driver = _bindings()
            with torch.cuda.device(self.device):  # the query runs in the current context
                per_sm = _check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.functions[name], threads,
                                                                                   shared_mem),
                                "cuOccupancyMaxActiveBlocksPerMultiprocessor")
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            got = self.resident[key] = int(per_sm) * sms
        return got


CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720


@functools.cache
def _libcuda() -> tuple[Callable[..., int], Callable[..., int], Callable[..., int]]:
    """cuLaunchKernel, cuCtxSetCurrent and cuLaunchCooperativeKernel of the driver, called through ctypes.

    Launches go through ctypes rather than cuda.bindings' wrapper: its argument conversion costs
    several microseconds a launch, which is the whole budget of a small fused kernel.
    """
    lib = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    launch = lib.cuLaunchKernel
    u = ctypes.c_uint
    launch.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    set_ctx = lib.cuCtxSetCurrent
    set_ctx.argtypes = [ctypes.c_void_p]
    set_ctx.restype = ctypes.c_int
    coop = lib.cuLaunchCooperativeKernel  # cuLaunchKernel's arguments without the trailing `extra`
    coop.argtypes = launch.argtypes[:-1]
    coop.restype = ctypes.c_int
    return launch, set_ctx, coop


def _raw_stream() -> Callable[[int], int]:
    """device index -> PyTorch's current cudaStream_t on it, as an int."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


class CudaLibrary(BoundKernels):
    """Compiled CUDA kernels; `lib.<kernel>(*args, threads=..., group_size=...)` launches one."""

    def __init__(self, image: bytes, signatures: dict[str, list[CudaParam]], path: Path, compiled_now: bool) -> None:
        self.image = image
        self.path = path
        self.signatures = signatures
        self.compiled_now = compiled_now
        self.kernel_names = tuple(signatures)
        self._loaded: dict[int, _Loaded] = {}
        self._lock = threading.Lock()
        self._install_kernels({n: self._launcher(n, ps) for n, ps in signatures.items()})

    def loaded(self, device: int) -> _Loaded:
        got = self._loaded.get(device)
        if got is None:
            with self._lock:
                got = self._loaded.get(device)
                if got is None:
                    got = self._loaded[device] = _Loaded(self.image, device, self.kernel_names)
        return got

    def _launcher(self, name: str, params: list[CudaParam]) -> Callable[..., None]:
        binder = ArgBinder(name, params)
        raw_stream = _raw_stream()
        dims_cache: dict[Any, Any] = {}
        loaded = self._loaded
        # one visible GPU: every CUDA tensor is on device 0 (the converters check is_cuda)
        single_device = torch.cuda.is_available() and torch.cuda.device_count() == 1

        def launch(*args: Any, threads: Any = None, group_size: Any = None, grid: Any = None, block: Any = None,
                   shared_mem: int = 0, cooperative: bool = False) -> None:
            if cooperative:
                return launch_cooperative(args, threads, group_size, grid, block, shared_mem)
            key = (threads, group_size, grid, block)
            try:
                dims = dims_cache[key]
            except (KeyError, TypeError):  # TypeError: an unhashable argument (a list): no caching
                dims = launch_dims(name, threads=threads, group_size=group_size, grid=grid, block=block)
                if len(dims_cache) < 4096:
                    try:
                        dims_cache[key] = dims
                    except TypeError:
                        pass
            params_addr = binder.bind(args)  # converts and checks every argument, then packs
            if dims is None:
                return  # nothing to do (an empty tensor)
            if single_device:
                device = 0
            else:
                device = binder.device(args)
                if device is None:
                    device = torch.cuda.current_device()
            mod = loaded.get(device) or self.loaded(device)
            if shared_mem:
                mod.ensure_smem(name, shared_mem)
            (gx, gy, gz), (bx, by, bz) = dims
            cu_launch, set_ctx, _ = _libcuda()  # cached: loaded on the first launch, not at compile time
            fn = mod.handles[name]
            stream = raw_stream(device)
            err = cu_launch(fn, gx, gy, gz, bx, by, bz, shared_mem, stream, params_addr, None)
            if err == CUDA_ERROR_INVALID_CONTEXT:  # a thread on which the runtime never made the context current
                set_ctx(mod.ctx_handle)
                err = cu_launch(fn, gx, gy, gz, bx, by, bz, shared_mem, stream, params_addr, None)
            if err:
                raise KernelLaunchError(f"kernel {name}: launch with grid {dims[0]}, block {dims[1]}, "
                                        f"shared_mem {shared_mem} failed: CUresult {err}")

        def launch_cooperative(args: tuple, threads: Any, group_size: Any, grid: Any, block: Any,
                               shared_mem: int) -> None:
            params_addr = binder.bind(args)
            device = 0 if single_device else binder.device(args)
            if device is None:
                device = torch.cuda.current_device()
            mod = loaded.get(device) or self.loaded(device)
            mod.ensure_smem(name, shared_mem)  # before the occupancy query, which counts it
            dims = cooperative_dims(name, threads=threads, group_size=group_size, grid=grid, block=block,
                                    resident=lambda n: mod.resident_blocks(name, n, shared_mem))
            if dims is None:
                return
            (gx, gy, gz), (bx, by, bz) = dims
            _, set_ctx, coop = _libcuda()
            fn, stream = mod.handles[name], raw_stream(device)
            err = coop(fn, gx, gy, gz, bx, by, bz, shared_mem, stream, params_addr)
            if err == CUDA_ERROR_INVALID_CONTEXT:
                set_ctx(mod.ctx_handle)
                err = coop(fn, gx, gy, gz, bx, by, bz, shared_mem, stream, params_addr)
            if err == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
                most = mod.resident_blocks(name, bx * by * bz, shared_mem)
                raise KernelLaunchError(f"kernel {name}: cooperative grid {dims[0]} is larger than the {most} blocks of "
                                        f"{dims[1]} with shared_mem {shared_mem} the device holds at once; "
                                        "leave out grid= to get that many")
            if err:
                raise KernelLaunchError(f"kernel {name}: cooperative launch with grid {dims[0]}, block {dims[1]}, "
                                        f"shared_mem {shared_mem} failed: CUresult {err}")

        launch.__name__ = name
        launch.__doc__ = binder.signature
        return launch

    def __repr__(self) -> str:
        return f"CudaLibrary({self.path.name}, kernels={self.kernel_names})"


# ---------------------------------------------------------------- timing

def event_timer(abs_tol_s: float = 50e-6, rel_tol: float = 0.25) -> Callable[..., tuple[float, Any]]:
    """A bench timer: the call's time from CUDA events on the current stream, checked against the wall.

    The device is synchronized before and after (all streams). Events cannot see work the call
    puts on other streams, and the wall clock sees host stalls the GPU does not: when the event
    time exceeds the wall time, or the wall time exceeds it by more than `abs_tol_s + rel_tol x
    event`, the sample raises TimingRejected (proof.speed.compare_speed retries it).
    """
    def timer(fn: Callable[..., Any], args: tuple, kwargs: dict, sync: Callable[[], None]) -> tuple[float, Any]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        sync()
        t0 = time.perf_counter()
        start.record()
        out = fn(*args, **kwargs)
        end.record()
        sync()
        wall = time.perf_counter() - t0
        event = start.elapsed_time(end) / 1e3
        if not timings_agree(event, wall, abs_tol_s, rel_tol):
            raise TimingRejected(f"event {event * 1e6:.1f} us vs wall {wall * 1e6:.1f} us")
        return event, out
    return timer


def timings_agree(event_s: float, wall_s: float, abs_tol_s: float = 50e-6, rel_tol: float = 0.25) -> bool:
    """Whether a CUDA-event time is consistent with the wall-clock time around the same call."""
    if not event_s > 0:
        return False
    return event_s <= wall_s * 1.02 + 5e-6 and wall_s - event_s <= abs_tol_s + rel_tol * event_s


# ---------------------------------------------------------------- the backend

_libraries: dict[str, CudaLibrary] = {}


def clear_memory_cache() -> None:
    """Forget libraries loaded in this process (the disk cache stays)."""
    _libraries.clear()


def _seal_path(path: Path) -> Path:
    return path.with_name(path.name + ".seal")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sealed(path: Path, code: bytes | None = None) -> bool:
    """PATH exists and is the module this user's library compiled (its seal, store/attest.py, names its bytes): a
    module swapped in the build directory with its seal file is compiled anew. True without a key here (the
    confined worker loads what its caller compiled and checked)."""
    try:
        data = path.read_bytes() if code is None else code
        mark = _seal_path(path).read_text() if _seal_path(path).exists() else ""
    except OSError:
        return False
    return attest.artifact_sealed(path.name, _sha256(data), mark)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)


@dataclass(frozen=True)
class CudaBackend(BackendDefaults):
    """CUDA C++ kernels compiled with NVRTC for the current NVIDIA GPU."""

    name: str = "cuda"
    device_type: str = "cuda"
    language: str = "cuda"

    def is_available(self) -> bool:
        return torch.cuda.is_available() and nvrtc_available()

    def environment(self) -> Environment:
        return _environment(torch.cuda.current_device())

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def timer(self) -> Callable[..., tuple[float, Any]]:
        return event_timer()

    def target(self, device: int | None = None) -> tuple[str, bool]:
        dev = torch.cuda.current_device() if device is None else device
        return target_for(torch.cuda.get_device_capability(dev), supported_archs())

    def compile(self, source: str) -> CudaLibrary:
        """Compile SOURCE into build_dir()/cuda/<key>.cubin (or .ptx), or load it from there."""
        signatures = parse_cuda_kernels(source)
        if not signatures:
            raise CompileError('no kernel found; declare kernels as extern "C" __global__ void name(...)')
        if not nvrtc_available():
            raise BackendUnavailableError("NVRTC is not available (pip install cuda-python / nvidia-cuda-nvrtc)")
        arch, cubin = self.target()
        options = nvrtc_options(arch, toolkit_include_dirs())
        key = cache_key(source, arch, nvrtc_version(), options, _header_digest())
        directory = config.build_dir() / "cuda"
        path = directory / f"{key}.{'cubin' if cubin else 'ptx'}"
        lib = _libraries.get(str(path))
        if lib is not None:
            return lib
        compiled_now = False
        if not _sealed(path):
            directory.mkdir(parents=True, exist_ok=True)
            with filelock.FileLock(str(path.with_suffix(".lock")), timeout=LOCK_TIMEOUT_S):
                if not _sealed(path):  # missing, or not the module this user's library compiled: compiled anew
                    code = nvrtc_compile(source, arch, options, cubin)
                    check_device_state(code, cubin)
                    _write_atomic(_seal_path(path), attest.seal_artifact(path.name, _sha256(code)).encode())
                    _write_atomic(path, code)
                    compiled_now = True
        code = path.read_bytes()
        if not compiled_now and not _sealed(path, code):
            raise CompileError(f"the compiled module {path.name} changed on disk while it was loaded; not loaded")
        check_device_state(code, cubin)  # a cached module is checked again before it is loaded
        lib = _libraries[str(path)] = CudaLibrary(code, signatures, path, compiled_now)
        return lib


def driver_version() -> str:
    try:
        _, driver = _bindings()
        v = _check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
        return f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        return "?"


def gpu_driver_release() -> str:
    """The kernel driver's release (e.g. 580.159.04), from /proc or nvidia-smi; '' if unknown."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        for word in text.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=None)
def _environment(device: int) -> Environment:
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    release = ".".join(gpu_driver_release().split(".")[:2]) or driver_version()
    desc = f"{name}, sm_{major}{minor}, driver {release}, CUDA {torch.version.cuda or driver_version()}"
    return Environment(backend="cuda", device_name=desc, os=os_description(), torch=torch_major_minor())


def describe() -> dict[str, str]:
    """GPU, driver, CUDA and toolchain versions, for reports."""
    out = {"os": f"{platform.system()} {platform.release()}", "torch": torch.__version__,
           "torch_cuda": str(torch.version.cuda)}
    try:
        out["nvrtc"] = nvrtc_version()
        import cuda.bindings
        out["cuda_bindings"] = getattr(cuda.bindings, "__version__", "?")
    except Exception as exc:
        out["nvrtc"] = f"unavailable ({type(exc).__name__})"
    if torch.cuda.is_available():
        dev = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(dev)
        out.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sms=str(props.multi_processor_count),
                   memory_gib=f"{props.total_memory / 2**30:.1f}", driver=gpu_driver_release() or driver_version(),
                   driver_cuda=driver_version())
    return out
