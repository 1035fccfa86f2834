"""CPU backend: C++ kernels compiled into shared objects and called through ctypes."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ...core import config
from ...core.errors import BackendUnavailableError, CompileError, KernelLaunchError
from ...sandbox.binary_allow import CPU as CPU_POLICY
from ...sandbox.binary_check import Baseline
from ...sandbox.kernel_source import HEADERS
from ..artifact import baseline, check_and_place, ensure_artifact
from ..base import (
    BackendDefaults,
    BoundKernels,
    Environment,
    os_description,
    torch_major_minor,
)
from ..native_build import compile_shared
from ..protected import checking_writes
from .signature import (
    POINTER_DTYPES,
    SCALAR_TYPES,
    CParam,
    parse_extern_c,
    scalar_converter,
)

COMPILE_TIMEOUT_S = 120

compile_count = 0  # compiler invocations in this process (tests read it)

# ---------------------------------------------------------------- binding

def _pointer_converter(kernel: str, i: int, p: CParam) -> Callable[[Any], int]:
    dtypes = POINTER_DTYPES[p.base_type]
    first = dtypes[0]
    tensor = torch.Tensor
    where = f"kernel {kernel}, argument {i} ({p})"

    def fail(x: Any) -> None:
        if not isinstance(x, tensor):
            raise KernelLaunchError(f"{where}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in dtypes:
            raise KernelLaunchError(f"{where}: expected a tensor of dtype {' or '.join(map(str, dtypes))}, got {x.dtype}")
        if not x.is_cpu:
            raise KernelLaunchError(f"{where}: tensor is on {x.device}, the CPU backend needs CPU tensors")
        raise KernelLaunchError(f"{where}: tensor is not contiguous; call .contiguous() first")

    def convert(x: Any) -> int:
        if isinstance(x, tensor) and (x.dtype is first or x.dtype in dtypes) and x.is_cpu and x.is_contiguous():
            return x.data_ptr()
        fail(x)
        raise AssertionError  # unreachable

    return checking_writes(convert, where, p.is_const)


def _bind(kernel: str, fn: Any, params: list[CParam]) -> Callable[..., None]:
    fn.argtypes = [ctypes.c_void_p if p.is_pointer else SCALAR_TYPES[p.base_type][0] for p in params]
    fn.restype = None
    convs = [(_pointer_converter if p.is_pointer else scalar_converter)(kernel, i, p) for i, p in enumerate(params)]
    arity = len(params)
    signature = f"{kernel}({', '.join(map(str, params))})"

    def launch(*args: Any, **launch_options: Any) -> None:
        if launch_options:
            raise KernelLaunchError(f"kernel {kernel}: launch options {sorted(launch_options)} are GPU-only; "
                                    "CPU kernels take no keyword arguments (parallelise with OpenMP instead)")
        if len(args) != arity:
            raise KernelLaunchError(f"kernel {signature} takes {arity} arguments, got {len(args)}")
        fn(*[c(a) for c, a in zip(convs, args)])

    launch.__name__ = kernel
    launch.__doc__ = signature
    return launch


class CpuLibrary(BoundKernels):
    """A loaded shared object; `lib.<kernel>(*args)` calls one extern "C" kernel."""

    def __init__(self, path: Path, signatures: dict[str, list[CParam]], compiled_now: bool) -> None:
        try:
            self._dll = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
            fns = {name: getattr(self._dll, name) for name in signatures}
        except (OSError, AttributeError) as e:
            raise CompileError(f"cannot load compiled kernel library {path.name}: {str(e).replace(str(path), path.name)}") from e
        self.path = path
        self.signatures = signatures
        self.compiled_now = compiled_now
        self.kernel_names = tuple(signatures)
        self._install_kernels({n: _bind(n, fns[n], ps) for n, ps in signatures.items()})

    def __repr__(self) -> str:
        return f"CpuLibrary({self.path.name}, kernels={self.kernel_names})"


# ---------------------------------------------------------------- compiling

def artifact_path(directory: Path, content: str, cxx: str | None) -> Path:
    """Where the shared object for `content` built by `cxx` lives. With no compiler, an existing
    build of the same content by any compiler will do; if there is none, the backend is unavailable."""
    if cxx is None:
        built = sorted(directory.glob(f"{content}-*.so"), key=lambda p: p.stat().st_mtime)
        if not built:
            raise BackendUnavailableError("no C++ compiler found (set CXX or install g++/clang++)")
        return built[-1]
    tool = hashlib.sha256(_compiler_identity(cxx).encode()).hexdigest()[:16]
    return directory / f"{content}-{tool}.so"


def find_compiler() -> str | None:
    """Path of the C++ compiler: $CXX, else c++, g++ or clang++ on PATH."""
    override = config.current().cxx
    if override:
        return shutil.which(override)
    return next((p for p in map(shutil.which, ("c++", "g++", "clang++")) if p), None)


@functools.cache
def _compiler_identity(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"{cxx} {out.splitlines()[0] if out else ''}"


@functools.cache
def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def cpu_name() -> str:
    """Marketing name of this machine's CPU."""
    if sys.platform == "darwin":
        return _sysctl("machdep.cpu.brand_string") or platform.processor() or platform.machine()
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


@functools.cache
def _cpu_identity() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    if sys.platform == "darwin":
        return f"{cpu_name()} {platform.machine()} {_sysctl('machdep.cpu.features')}"
    info = _cpuinfo()
    return f"{cpu_name()} {platform.machine()} {info.get('flags') or info.get('Features', '')}"


@functools.cache
def compile_flags() -> tuple[str, ...]:
    """The compiler flags of every CPU kernel. -fno-trapping-math lets GCC turn the selects of
    ma_vecmath.h into vector blends on ISAs without masked ops (AVX2), -fno-math-errno lets it inline
    sqrtf as a vector instruction; no result changes (kernels read neither FP flags nor errno)."""
    arch = "-mcpu=native" if sys.platform == "darwin" and platform.machine() == "arm64" else "-march=native"
    return ("-O3", "-fno-trapping-math", "-fno-math-errno", arch, "-std=c++17", "-shared", "-fPIC",
            f"-I{config.include_dir()}", *openmp_flags())


@functools.cache
def openmp_flags() -> tuple[str, ...]:
    """-fopenmp where the compiler has it; Apple clang needs Homebrew's libomp, else no OpenMP."""
    if sys.platform != "darwin":
        return ("-fopenmp",)
    for prefix in ("/opt/homebrew/opt/libomp", "/usr/local/opt/libomp"):
        if Path(prefix, "include", "omp.h").exists():
            return ("-Xpreprocessor", "-fopenmp", f"-I{prefix}/include", f"-L{prefix}/lib", "-lomp")
    return ()


def _include_digest() -> str:
    h = hashlib.sha256()
    for header in sorted(config.include_dir().glob("*.h")):
        h.update(header.name.encode() + b"\0" + header.read_bytes())
    return h.hexdigest()


_loaded: dict[Path, CpuLibrary] = {}


def clear_memory_cache() -> None:
    """Forget libraries loaded in this process (the disk cache stays)."""
    _loaded.clear()


def _run_compiler(cxx: str, source: str, out: Path) -> None:
    """Compile SOURCE in a scratch directory next to OUT, check the headers it opened and the library it
    made, then place it at OUT with its build record."""
    global compile_count
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.stem + "."))
    try:
        (work / "kernel.cpp").write_text(source)
        compile_count += 1
        built = compile_shared(cxx, compile_flags(), work, "kernel.cpp", COMPILE_TIMEOUT_S, config.include_dir(),
                               HEADERS["c++"])
        check_and_place(built, out, CPU_POLICY, _baseline(cxx))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _baseline(cxx: str | None) -> Baseline | None:
    return None if cxx is None else baseline(cxx, compile_flags(), str(config.include_dir()))


@dataclass(frozen=True)
class CpuBackend(BackendDefaults):
    """Kernels in C++ (OpenMP allowed), run on the host CPU."""

    name: str = "cpu"
    device_type: str = "cpu"
    language: str = "c++"

    def is_available(self) -> bool:
        return find_compiler() is not None

    def environment(self) -> Environment:
        return _environment()

    def synchronize(self) -> None:
        pass

    def prepare(self) -> None:
        """Run now what building needs a process for (the compiler's identity, the toolchain baseline of the
        binary check), so a confined process that may not start a compiler can still find and check artifacts."""
        cxx = find_compiler()
        if cxx is not None:
            _compiler_identity(cxx)
            _baseline(cxx)
        _cpu_identity()

    def build(self, source: str) -> Path:
        """Compile and check SOURCE into build_dir()/cpu/<key>.so (or find it there), without loading it."""
        return self._artifact(source)[0]

    def compile(self, source: str) -> CpuLibrary:
        """Compile SOURCE into build_dir()/cpu/<key>.so, or load it from there if already built."""
        path, signatures, compiled_now = self._artifact(source)
        if path not in _loaded:
            _loaded[path] = CpuLibrary(path, signatures, compiled_now)
        return _loaded[path]

    def _artifact(self, source: str) -> tuple[Path, dict[str, list[CParam]], bool]:
        signatures = parse_extern_c(source)
        if not signatures:
            raise CompileError('no extern "C" kernel found; declare kernels as extern "C" void name(...)')
        cxx = find_compiler()
        # content key: everything the code depends on except the compiler
        content = hashlib.sha256("\0".join([source, " ".join(compile_flags()), _cpu_identity(), _include_digest()])
                                 .encode()).hexdigest()[:32]
        path = artifact_path(config.build_dir() / "cpu", content, cxx)
        if path in _loaded:
            return path, signatures, False
        build = (lambda: _run_compiler(cxx, source, path)) if cxx is not None else None
        return path, signatures, ensure_artifact(path, build, CPU_POLICY, _baseline(cxx))


@functools.cache
def _environment() -> Environment:
    return Environment(backend="cpu", device_name=cpu_name(), os=os_description(), torch=torch_major_minor())
