"""NVRTC for the CUDA backend: compile options, targets, cache keys and the compile call itself.

Nothing here needs a GPU (NVRTC compiles for any architecture), so all of it runs in CI.
"""
from __future__ import annotations

import functools
import hashlib
import io
import re
import sys
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ...core import config
from ...core.errors import CompileError, KernelLaunchError
from ...sandbox.binary_check import BinaryCheckError

MAX_DIAGNOSTICS = 4000
BASE_OPTIONS = ("-std=c++17",)  # no --use_fast_math: approximate exp/tanh and flushed denormals change results

compile_count = 0  # NVRTC invocations in this process (tests read it)


@functools.cache
def _bindings() -> tuple[Any, Any]:
    from cuda.bindings import (  # cuda-python >= 12.6 (module path of cuda-bindings)
        driver,
        nvrtc,
    )
    return nvrtc, driver


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings (err, *values) tuple; raise on error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise KernelLaunchError(f"{what} failed: {name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


@functools.cache
def nvrtc_version() -> str:
    nvrtc, _ = _bindings()
    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"{major}.{minor}"


@functools.cache
def supported_archs() -> tuple[int, ...]:
    nvrtc, _ = _bindings()
    return tuple(int(a) for a in _check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


def nvrtc_available() -> bool:
    try:
        nvrtc_version()
        return True
    except Exception:
        return False


def target_for(capability: tuple[int, int], supported: tuple[int, ...]) -> tuple[str, bool]:
    """(NVRTC --gpu-architecture value, True for a cubin / False for PTX the driver JIT-compiles)."""
    cc = capability[0] * 10 + capability[1]
    if cc in supported:
        return f"sm_{cc}", True
    older = [a for a in supported if a <= cc]
    if not older:
        raise CompileError(f"NVRTC supports {supported}, nothing for this GPU (compute capability {cc})")
    return f"compute_{max(older)}", False


@functools.cache
def toolkit_include_dirs() -> tuple[str, ...]:
    """Where cuda_fp16.h and friends are: CUDA_HOME/CUDA_PATH, /usr/local/cuda, or the nvidia pip wheels."""
    roots = [config.current().cuda_home, "/usr/local/cuda"]
    candidates = [Path(r) / "include" for r in roots if r]
    for entry in sys.path:
        nv = Path(entry) / "nvidia"
        if nv.is_dir():
            candidates += [nv / "cu13" / "include", nv / "cuda_runtime" / "include", nv / "cuda_nvrtc" / "include"]
    for inc in candidates:
        if (inc / "cuda_fp16.h").is_file():
            return tuple(str(p) for p in (inc, inc / "cccl") if p.is_dir())
    return ()


def nvrtc_options(arch: str, include_dirs: tuple[str, ...] = ()) -> list[str]:
    """The NVRTC command line for one compile (part of the cache key)."""
    shim = config.include_dir() / "cuda_nvrtc"
    return [f"--gpu-architecture={arch}", *BASE_OPTIONS, f"-I{shim}", *(f"-I{d}" for d in include_dirs)]


def _header_digest() -> str:
    h = hashlib.sha256()
    for header in sorted((config.include_dir() / "cuda_nvrtc").iterdir()):
        h.update(header.name.encode() + b"\0" + header.read_bytes())
    return h.hexdigest()


def cache_key(source: str, arch: str, version: str, options: list[str], headers: str = "") -> str:
    """Content key of a compiled artifact: source, target, NVRTC version, options and shim headers.

    Include paths enter by name only; the toolkit headers are part of what the NVRTC version names.
    """
    blob = "\0".join([source, arch, version, " ".join(options), headers])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def nvrtc_compile(source: str, arch: str, options: list[str], cubin: bool) -> bytes:
    """Compile SOURCE with NVRTC; the cubin (or PTX) bytes, or CompileError with the log."""
    global compile_count
    nvrtc, _ = _bindings()
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []), "nvrtcCreateProgram")
    try:
        compile_count += 1
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # Output buffers must be mutable: NVRTC writes into them. The `b" " * size` of NVRTC's own
        # examples hands it CPython's cached one-byte b" " when the log is empty (size 1), and the
        # interpreter's b" " becomes b"\x00" for good (torch.load then reads every dimension of 32 as 0).
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        text = bytes(log).decode(errors="replace").rstrip("\x00 \n")
        if int(err) != 0:
            if len(text) > MAX_DIAGNOSTICS:
                text = text[:MAX_DIAGNOSTICS] + f"\n... ({len(text) - MAX_DIAGNOSTICS} more characters)"
            raise CompileError(f"NVRTC {nvrtc_version()} compilation for {arch} failed:\n{text}")
        get_size, get = (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if cubin else \
            (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        n = _check(get_size(prog), "nvrtc get size")
        buf = bytearray(n)
        _check(get(prog, buf), "nvrtc get code")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)




_PTX_GLOBAL_VAR = re.compile(r"^[ \t]*(?:\.(?:visible|extern|weak|common)[ \t]+)*\.global[ \t]+[^\n;]*?([\w$]+)"
                             r"[ \t]*(?:\[[^\n;]*\])?[ \t]*(?:=[^;]*)?;", re.M)


# Static members of the toolkit's own headers (libcu++'s integral_constant<...>::value, numeric_limits<...>
# members, cooperative_groups' tables): NVRTC emits them as module-scope globals, but no kernel names them as
# storage (the kernel's own globals are refused by the source check, in any namespace).
_TOOLKIT_NAMESPACE = re.compile(r"(?:4cuda3std|4cuda|18cooperative_groups|6nvcuda)\d|\d+__nv_")
_INTERNAL_PREFIX = re.compile(r"_ZN(\d+)_INTERNAL_")  # an anonymous namespace of the translation unit


def _toolkit_owned(name: str) -> bool:
    """Whether a mangled module global belongs to a toolkit header's namespace (possibly inside the
    translation unit's anonymous namespace, where NVRTC puts header internals)."""
    if not name.startswith("_ZN"):
        return False
    pos = 3
    m = _INTERNAL_PREFIX.match(name)
    if m:
        pos = m.end(1) + int(m.group(1))
    return _TOOLKIT_NAMESPACE.match(name, pos) is not None


def device_state(code: bytes, cubin: bool) -> str | None:
    """Why a compiled CUDA module could keep state between launches (a module-scope variable in the global
    state space: `.global` in PTX, a .nv.global* section in a cubin, other than the toolkit headers' own
    static members), or None. Constant and shared memory are not state a kernel can keep: the first is
    read-only on the device, the second lives per block."""
    if not cubin:
        for m in _PTX_GLOBAL_VAR.finditer(code.decode(errors="replace")):
            if not _toolkit_owned(m.group(1)):
                return f"the PTX declares the device global variable {m.group(1)}"
        return None
    try:
        elf = ELFFile(io.BytesIO(code))
        names = {i: s.name for i, s in enumerate(elf.iter_sections())}
        sized = {n: s["sh_size"] for n, s in ((s.name, s) for s in elf.iter_sections()) if n.startswith(".nv.global")}
        owned: dict[str, int] = {}
        for sec in elf.iter_sections():
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                where = names.get(sym["st_shndx"]) if isinstance(sym["st_shndx"], int) else None
                if where is None or where not in sized or sym.name == where or sym["st_info"]["type"] == "STT_SECTION":
                    continue
                if not _toolkit_owned(sym.name):
                    return f"the cubin holds the device global variable {sym.name} (section {where})"
                owned[where] = owned.get(where, 0) + 1
        for where, size in sized.items():
            if size and not owned.get(where):
                return f"the cubin holds section {where} ({size} bytes of device global variables)"
    except ELFError as e:
        return f"the cubin is not a readable ELF file ({e})"
    return None


def check_device_state(code: bytes, cubin: bool) -> None:
    """Raise BinaryCheckError if the compiled module could keep state between launches."""
    why = device_state(code, cubin)
    if why:
        raise BinaryCheckError(f"{why}, where a kernel could keep state between calls; kernels must be stateless")
