"""MSL emulator backend ("mps-emu"): Metal kernels compiled as C++ and run over the grid on the CPU.

`lib = MpsEmuBackend().compile(source)` then `lib.kernel(*args, threads=..., group_size=...)`, the
call of `torch.mps.compile_shader` (PyTorch torch/csrc/mps/Module.cpp, MetalKernelFunction::dispatch):
argument i binds buffer index i; a tensor binds its storage from its storage offset (strides are not
applied), a Python int binds 8 bytes (int64), a float 4 bytes (float32), a list of numbers an array of
those, unless `arg_casts` ("fp16", "bf16", "int32", "int16", "int8", "uint8", or {index: cast}) says
otherwise. `threads` is the grid in threads (an int or 1-3 ints; default: the first tensor's numel);
`group_size` the threadgroup (same number of dims; default min(threads, max) in 1-D, (max, 1, 1) in
2-D/3-D); the last threadgroup of a dimension may be partial. The emulator proves kernels correct on
machines without an Apple GPU; its timings say nothing about Metal's speed.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ...core import config
from ...core.errors import CompileError, KernelLaunchError
from ...sandbox.binary_allow import MPS_EMU as MPS_EMU_POLICY
from ...sandbox.binary_check import Baseline
from ..artifact import baseline, check_and_place, discard, ensure_artifact
from ..base import BackendDefaults, Environment, os_description, torch_major_minor
from ..cpu.backend import (
    _compiler_identity,
    artifact_path,
    cpu_name,
    find_compiler,
    openmp_flags,
)
from ..mps.launch import grid_dims  # the same 1-to-3-dimension rule as compile_shader's
from ..native_build import compile_shared, compiler_env, scrub_diagnostics
from ..protected import check_writable, msl_param_written
from . import msl_sites
from .msl_signature import launcher, threadgroup_slots
from .msl_translate import MslKernel, MslParam, prepare_for_preprocessor, translate, translate_unit

COMPILE_TIMEOUT_S = 180
EMULATOR_HEADERS = frozenset({"msl_emu/metal_stdlib.h"})  # the one header the translator's C++ includes
SIMD_WIDTH = 32
METAL_VERSION = 310  # MSL 3.1: what compile_shader targets on macOS 14
# <metal_stdlib>'s function qualifier, defined for the preprocessor so that `#ifdef METAL_FUNC` sees it
METAL_FUNC = "inline __attribute__((__always_inline__))"
EAGER_MAX_KERNELS = 8  # compile() builds a source with more kernels one kernel at a time, on first use

compile_count = 0  # compiler invocations in this process (tests read it)

_U = {n: (getattr(torch, n),) if hasattr(torch, n) else () for n in ("uint16", "uint32", "uint64")}
# element type -> (tensor dtypes accepted, kind, bytes); kind: f float, bf bfloat, i signed, u unsigned, b bool
_ELEMS: dict[str, tuple[tuple[torch.dtype, ...], str, int]] = {}
for _names, _dts, _kind, _size in (
        (("float",), (torch.float32,), "f", 4), (("half",), (torch.float16,), "f", 2),
        (("bfloat",), (torch.bfloat16,), "bf", 2),
        (("int", "int32_t"), (torch.int32,), "i", 4), (("uint", "uint32_t"), (torch.int32, *_U["uint32"]), "u", 4),
        (("short", "int16_t"), (torch.int16,), "i", 2), (("ushort", "uint16_t"), (torch.int16, *_U["uint16"]), "u", 2),
        (("char", "int8_t"), (torch.int8,), "i", 1), (("uchar", "uint8_t"), (torch.uint8,), "u", 1),
        (("bool",), (torch.bool,), "b", 1), (("long", "int64_t", "ptrdiff_t"), (torch.int64,), "i", 8),
        (("ulong", "uint64_t", "size_t"), (torch.int64, *_U["uint64"]), "u", 8)):
    for _n in _names:
        _ELEMS[_n] = (_dts, _kind, _size)
_ELEM_RE = re.compile(r"(?:atomic<\s*(\w+)\s*>|atomic_(\w+)|vec<\s*(\w+)\s*,\s*([234])\s*>|packed_([a-z]+)([234])|(\w+?)([234])?)")
# arg_casts name -> (struct code, kind, bytes)
_CASTS = {"fp16": ("e", "f", 2), "bf16": ("bf", "bf", 2), "int32": ("i", "i", 4), "int16": ("h", "i", 2),
          "int8": ("b", "i", 1), "uint8": ("B", "u", 1)}


_BYTES = {"char", "uchar", "int8_t", "uint8_t"}


def _element(base_type: str, pointer: bool = False) -> tuple[str, int] | None:
    """(scalar element name, vector width) of a buffer's element type; None for structs, unknowns and byte
    pointers (`device char*` is a byte view of any tensor, as code bases bind them)."""
    if pointer and base_type.replace("metal::", "").strip() in _BYTES:
        return None
    m = _ELEM_RE.fullmatch(base_type.replace("metal::", "").strip())
    if not m:
        return None
    a, b, c, cn, d, dn, e, en = m.groups()
    name, width = (a or b or c or d or e), int(cn or dn or en or 1)
    return (name, width) if name in _ELEMS else None


class LaunchRegion(ctypes.Structure):  # ma_rt::Region (include/msl_emu/shadow.h)
    _fields_ = [("base", ctypes.c_uint64), ("size", ctypes.c_uint64), ("index", ctypes.c_int32),
                ("flags", ctypes.c_int32), ("gran", ctypes.c_int32), ("esize", ctypes.c_int32)]


class LaunchConfig(ctypes.Structure):  # ma_rt::Config
    _fields_ = [("nregions", ctypes.c_uint32), ("nsites", ctypes.c_uint32), ("regions", ctypes.c_void_p),
                ("site_pc", ctypes.c_void_p), ("site_path", ctypes.c_void_p)]


_PATH_WIDTH = msl_sites.MAX_PATH + 1  # kPathWidth in shadow.h
_PLACEHOLDER = re.compile(r"\{(arg|pc):([0-9a-f]+)\}")


def _extent(t: torch.Tensor) -> int:
    """Bytes a kernel may reach from the tensor's data_ptr: up to the end of its last element."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st > 0)) * t.element_size()


class SiteTable:
    """The access sites of a library, as the runtime reads them (sorted offsets, fixed-width paths)."""

    def __init__(self, sites: msl_sites.Sites) -> None:
        self.sites = sites
        pcs = sorted(sites)
        self.n = len(pcs)
        self.pc = (ctypes.c_uint64 * max(1, self.n))(*pcs)
        flat: list[int] = []
        for pc in pcs:
            path = sites[pc][:msl_sites.MAX_PATH]
            flat += [len(path)] + path + [0] * (msl_sites.MAX_PATH - len(path))
        self.path = (ctypes.c_int32 * max(1, len(flat)))(*flat)


class EmuKernel:
    """One kernel of an EmuLibrary; calling it runs the kernel over a grid, like compile_shader's."""

    def __init__(self, k: MslKernel, fn: Any, sites: SiteTable | None = None) -> None:
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
        self._sites = sites or SiteTable({})
        fn.restype = ctypes.c_int
        self._k, self._fn = k, fn
        buffers = [p for p in k.params if p.attribute is None]
        self._nargs = max((p.index for p in buffers if p.index is not None), default=-1) + 1
        self._slots: list[MslParam | None] = [None] * self._nargs
        for p in buffers:
            assert p.index is not None
            self._slots[p.index] = p
        self._elems = [_element(p.base_type, p.is_pointer) if p else None for p in self._slots]
        self._tg = {p.index: p for p in k.params if p.attribute == "threadgroup"}
        self._ntg = threadgroup_slots(k)
        self.__name__ = k.name
        self.__doc__ = f"kernel void {k.name}({', '.join(map(str, k.params))})"

    @property
    def max_threads_per_threadgroup(self) -> int:
        return self._k.max_threads

    @property
    def thread_execution_width(self) -> int:
        return SIMD_WIDTH

    def _where(self, i: int) -> str:
        p = self._slots[i]
        return f"kernel {self._k.name}, argument {i}" + (f" ({p.decl})" if p else " (no parameter has this buffer index)")

    def _writable(self, i: int) -> bool:
        return msl_param_written(self._slots[i])  # T* const is written through

    def _may_write(self, i: int) -> bool:
        """Whether what argument I binds may change by this call: the runtime's writable regions."""
        return self._writable(i)

    def _config(self, regions: list[tuple[int, int, int, bool, int, int]]) -> tuple[LaunchConfig, Any]:
        """The launch's ma_rt::Config: bound buffers (a read-only one that overlaps a written one is
        tracked too: the kernel writes it through the other) and the library's access sites."""
        marked = []
        for base, size, idx, writable, gran, esize in regions:
            if not writable and any(w and b < base + size and base < b + s for b, s, _, w, _, _ in regions):
                writable = True
            marked.append((base, size, idx, writable, gran, esize))
        arr = (LaunchRegion * max(1, len(marked)))(*[LaunchRegion(b, s, i, int(w), g, e) for b, s, i, w, g, e in marked])
        cfg = LaunchConfig(len(marked), self._sites.n, ctypes.addressof(arr), ctypes.addressof(self._sites.pc),
                      ctypes.addressof(self._sites.path))
        return cfg, arr

    def _message(self, text: str) -> str:
        """The runtime's message with `{arg:i}` and `{pc:x}` made names and source lines."""
        def sub(m: re.Match) -> str:
            if m.group(1) == "arg":
                i = int(m.group(2))
                p = self._slots[i] if i < len(self._slots) else None
                return f"{p.name if p else 'buffer'} (argument {i})"
            return msl_sites.where(self._sites.sites, int(m.group(2), 16))
        return _PLACEHOLDER.sub(sub, text)

    def _scalar(self, i: int, value: Any, cast: str | None) -> tuple[ctypes.Array, int, int]:
        """The bytes compile_shader binds for a Python number or list of numbers, checked against the parameter."""
        vals = list(value) if isinstance(value, (list, tuple)) else [value]
        if not vals:
            raise KernelLaunchError(f"{self._where(i)}: an empty list cannot be a kernel argument")
        if any(isinstance(v, torch.Tensor) for v in vals):
            raise KernelLaunchError(f"{self._where(i)}: lists of tensors (argument buffers) are not supported by the emulator")
        is_int = isinstance(vals[0], int)  # bool is an int, as in pybind11
        bad = [v for v in vals if not isinstance(v, int if is_int else (int, float))]
        if bad:
            raise KernelLaunchError(f"{self._where(i)}: unsupported argument {bad[0]!r} ({type(bad[0]).__name__}); pass "
                                    "tensors, Python ints or floats, or lists of them (a list of ints holds only ints)")
        if cast is not None:
            if cast not in _CASTS:
                raise KernelLaunchError(f"{self._where(i)}: unsupported cast {cast!r}; known: {', '.join(_CASTS)}")
            code, kind, size = _CASTS[cast]
        else:
            code, kind, size = ("q", "i", 8) if is_int else ("f", "f", 4)
        nums = [int(v) if is_int else float(v) for v in vals]
        if code == "bf":
            data = torch.tensor(nums, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            try:
                data = struct.pack(f"<{len(nums)}{code}", *[int(v) if code in "ihbBq" else float(v) for v in nums])
            except (struct.error, OverflowError) as e:
                raise KernelLaunchError(f"{self._where(i)}: {vals!r} does not fit the {cast or 'int64'} binding: {e}") from None
        self._check_scalar(i, kind, size, nums, cast)
        buf = (ctypes.c_char * max(64, len(data) + 32))()
        ctypes.memmove(buf, data, len(data))
        return buf, len(data), min(4, max(1, size))

    def _check_scalar(self, i: int, kind: str, size: int, nums: list, cast: str | None) -> None:
        p, el = self._slots[i], self._elems[i]
        if p is None or el is None:
            return  # an unused index, or a struct: nothing to check against
        dts, ekind, esize = _ELEMS[el[0]]
        bound = f"compile_shader binds {'this list' if len(nums) > 1 else repr(nums[0])} as " + (
            f"{cast}" if cast else ("int64 (8 bytes)" if kind == "i" and size == 8 else "float32 (4 bytes)"))
        ints = {"i", "u", "b"}
        same = (kind == ekind or (kind in ints and ekind in ints)) and size == esize
        if same:
            if not p.is_pointer and len(nums) < min(el[1], 3):
                raise KernelLaunchError(f"{self._where(i)}: {bound}; the parameter reads {el[1]} values")
            return
        if kind == "i" and size == 8 and ekind in ints and len(nums) == 1 and el[1] == 1 and not p.is_pointer:
            v = nums[0]
            lo, hi = (0, 1) if ekind == "b" else ((0, 2 ** (8 * esize) - 1) if ekind == "u" else
                                                   (-2 ** (8 * esize - 1), 2 ** (8 * esize - 1) - 1))
            if lo <= v <= hi:
                return  # the kernel reads the low bytes of the int64: the same value
            raise KernelLaunchError(f"{self._where(i)}: {bound}; the parameter reads its low {esize} bytes as "
                                    f"{el[0]}, which cannot hold {v}")
        cast_for = {("f", 2): "fp16", ("bf", 2): "bf16", ("i", 4): "int32", ("u", 4): "int32", ("i", 2): "int16",
                    ("u", 2): "int16", ("i", 1): "int8", ("u", 1): "uint8", ("b", 1): "uint8"}.get((ekind, esize))
        if ekind == "f" and esize == 4:
            hint = " (pass a Python float)"
        elif ekind in ints and kind in ("f", "bf") and not p.is_pointer:
            hint = " (pass a Python int)"
        else:
            hint = f' (pass arg_casts={{{i}: "{cast_for}"}})' if cast_for else ""
        raise KernelLaunchError(f"{self._where(i)}: {bound}, but the kernel reads {el[0]}"
                                f"{'s' if p.is_pointer else ''}: the bits would be misread on the GPU{hint}")

    def _threadgroup_bytes(self, sizes: Any) -> list[int]:
        """The byte sizes of the [[threadgroup(n)]] parameters, from the launch's threadgroup_sizes={n: bytes}."""
        k = self._k
        if not self._tg:
            if sizes:
                raise KernelLaunchError(f"kernel {k.name}: threadgroup_sizes given, but the kernel has no "
                                        "[[threadgroup(n)]] parameter")
            return []
        if not isinstance(sizes, dict):
            need = ", ".join(f"{i}: bytes for {p.decl}" for i, p in sorted(self._tg.items()))
            raise KernelLaunchError(f"kernel {k.name}: its [[threadgroup(n)]] parameters need their sizes: pass "
                                    f"threadgroup_sizes={{{need}}} (torch.mps.compile_shader cannot set them; Metal's "
                                    "host code calls setThreadgroupMemoryLength)")
        out = [0] * self._ntg
        for i, p in self._tg.items():
            v = sizes.get(i)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0 or v % 16:
                raise KernelLaunchError(f"kernel {k.name}: threadgroup_sizes[{i}] (for {p.decl}) must be a positive "
                                        f"multiple of 16 bytes, as Metal requires; got {v!r}")
            out[i] = v
        extra = set(sizes) - set(self._tg)
        if extra:
            raise KernelLaunchError(f"kernel {k.name}: threadgroup_sizes names {sorted(extra)}, which no "
                                    "[[threadgroup(n)]] parameter has")
        return out

    def __call__(self, *args: Any, threads: Any = None, group_size: Any = None, arg_casts: Any = None,
                 error_buf_idx: Any = None, threadgroup_sizes: dict[int, int] | None = None) -> None:
        k = self._k
        tg_bytes = self._threadgroup_bytes(threadgroup_sizes)
        if error_buf_idx is not None:
            raise KernelLaunchError(f"kernel {k.name}: error_buf_idx is not supported by the emulator")
        if len(args) != self._nargs:
            raise KernelLaunchError(f"kernel {k.name} binds {self._nargs} buffer indices (0..{self._nargs - 1}), "
                                    f"got {len(args)} arguments; {self.__doc__}")
        if arg_casts is not None and not isinstance(arg_casts, (str, dict)):
            raise KernelLaunchError(f"kernel {k.name}: arg_casts must be a str or a dict {{index: cast}}")
        ptrs = (ctypes.c_void_p * max(1, len(args)))()
        keep: list[Any] = []
        regions: list[tuple[int, int, int, bool, int, int]] = []  # base, size, index, writable, granule, element bytes
        first_numel = None
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.device.type != "cpu":
                    raise KernelLaunchError(f"{self._where(i)}: tensor is on {a.device}; the MSL emulator runs on "
                                            "CPU tensors")
                el = self._elems[i]
                if el is not None and a.dtype not in _ELEMS[el[0]][0]:
                    want = " or ".join(str(d) for d in _ELEMS[el[0]][0])
                    raise KernelLaunchError(f"{self._where(i)}: expected a tensor of dtype {want}, got {a.dtype}")
                if self._may_write(i):
                    check_writable(self._where(i), a)
                ptrs[i] = a.data_ptr()  # the storage from the tensor's storage offset, as compile_shader binds it
                regions.append((a.data_ptr(), _extent(a), i, self._writable(i), min(4, a.element_size()), a.element_size()))
                if first_numel is None:
                    first_numel = a.numel()
                continue
            cast = arg_casts if isinstance(arg_casts, str) else (arg_casts or {}).get(i)
            buf, nbytes, gran = self._scalar(i, a, cast)
            keep.append(buf)
            ptrs[i] = ctypes.addressof(buf)
            regions.append((ptrs[i], nbytes, i, self._writable(i), gran, gran))
        if threads is None and first_numel is None:
            raise KernelLaunchError(f"kernel {k.name}: the number of threads is undefined; pass threads=")
        grid = grid_dims(threads if threads is not None else first_numel, "threads", k.name)
        mx = k.max_threads
        if group_size is None:
            group = [min(grid[0], mx)] if len(grid) == 1 else [mx] + [1] * (len(grid) - 1)
        else:
            group = grid_dims(group_size, "group_size", k.name)
            if len(group) != len(grid):
                raise KernelLaunchError(f"kernel {k.name}: threads and group_size must have the same number of "
                                        f"dimensions, got {grid} and {group}")
        if 0 in grid:
            return  # an empty grid runs nothing
        if 0 in group:
            raise KernelLaunchError(f"kernel {k.name}: group_size {group} has a zero dimension")
        if group[0] * (group[1] if len(group) > 1 else 1) * (group[2] if len(group) > 2 else 1) > mx:
            raise KernelLaunchError(f"kernel {k.name}: threadgroup size {group} exceeds the {mx}-thread limit")
        if any(v >= 2 ** 32 for v in grid):
            raise KernelLaunchError(f"kernel {k.name}: threads {grid}: each dimension must be below 2**32")
        grid += [1] * (3 - len(grid))
        group += [1] * (3 - len(group))
        dims = (ctypes.c_uint64 * (6 + len(tg_bytes)))(*grid, *group, *tg_bytes)
        err = ctypes.create_string_buffer(1024)
        cfg, keep_regions = self._config(regions)
        if self._fn(ptrs, dims, err, 1024, ctypes.byref(cfg)) != 0:
            raise KernelLaunchError(f"kernel {k.name}: {self._message(err.value.decode(errors='replace'))}")
        del keep_regions

    def __repr__(self) -> str:
        return f"<MSL emulator kernel {self.__doc__}>"


class EmuLibrary:
    """Compiled MSL source: `lib.<kernel>(*args, threads=..., group_size=...)`. A library of many kernels may be
    lazy: each kernel is compiled (or found on disk) when first named."""

    def __init__(self, path: Path | None, kernels: list[MslKernel], compiled_now: bool,
                 lazy: Callable[[MslKernel], Path] | None = None) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_compiled_now", compiled_now)
        object.__setattr__(self, "kernel_names", tuple(k.name for k in kernels))
        object.__setattr__(self, "_lazy", {k.name: k for k in kernels} if lazy else {})
        object.__setattr__(self, "_build_one", lazy)
        object.__setattr__(self, "_dlls", [])
        if lazy is None:
            assert path is not None
            self._load(path, kernels)

    def _load(self, path: Path, kernels: list[MslKernel]) -> None:
        sites_file = path.with_suffix(".sites.json")
        sites = msl_sites.load(sites_file)
        if sites is None:
            sites = msl_sites.build(path)
            try:
                msl_sites.save(sites, sites_file)
            except OSError:
                pass
        table = SiteTable(sites)
        try:
            dll = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
            fns = {k.name: getattr(dll, f"ma_launch_{k.name}") for k in kernels}
        except (OSError, AttributeError) as e:
            raise CompileError(f"cannot load compiled kernel library {path.name}: {str(e).replace(str(path), path.name)}") from e
        self._dlls.append(dll)
        if not self._lazy:
            object.__setattr__(self, "_dll", dll)
        for k in kernels:
            object.__setattr__(self, k.name, EmuKernel(k, fns[k.name], table))

    def __getattr__(self, name: str) -> Any:
        lazy = self.__dict__.get("_lazy", {})
        if name in lazy:
            k = lazy[name]
            self._load(self._build_one(k), [k])
            return self.__dict__[name]
        raise AttributeError(f"no kernel {name!r} in this library; kernels: {', '.join(self.kernel_names) or 'none'}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("EmuLibrary is read-only")

    def __dir__(self) -> list[str]:
        return list(self.kernel_names)

    def __repr__(self) -> str:
        where = self._path.name if self._path else "compiled per kernel"
        return f"EmuLibrary({where}, kernels={self.kernel_names})"


# ---------------------------------------------------------------- compiling

@functools.cache
def _flags() -> tuple[str, ...]:
    # every load and store that reaches memory calls an access check (include/msl_emu/shadow.h); line
    # tables name the sites (msl_sites.py)
    # (GCC's thread-sanitizer instrumentation, whose entry points the emulator's header defines: its runtime,
    # libtsan, is not linked, so the default libraries are named one by one in _LIBS)
    checks = ("-g1", "-fsanitize=thread", "--param", "tsan-instrument-func-entry-exit=0", "-nodefaultlibs")
    return ("-O2", "-std=c++17", "-shared", "-fPIC", "-fno-strict-aliasing", "-fwrapv", "-ffp-contract=off",
            "-fno-math-errno", "-w", f"-I{config.include_dir()}", *checks, *openmp_flags())


_LIBS = ("-lstdc++", "-lm", "-lgomp", "-lgcc_s", "-lc", "-lgcc")


@functools.cache
def _tool_digest() -> str:
    """Everything the compiled code depends on besides the source: headers, front end, flags."""
    h = hashlib.sha256()
    front_end = sorted(Path(__file__).parent.glob("msl_*.py"))  # msl_translate.py and the modules it uses
    for f in sorted((config.include_dir() / "msl_emu").glob("*.h")) + front_end:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(" ".join(_flags() + _LIBS).encode() + str(METAL_VERSION).encode())
    return h.hexdigest()


def _diagnostics(proc: subprocess.CompletedProcess, src: Path, what: str, cxx: str) -> CompileError:
    log = scrub_diagnostics(proc.stderr or proc.stdout, src.parent, (src.name,))
    return CompileError(f"{what} failed ({Path(cxx).name}, exit {proc.returncode}):\n{log}")


def _preprocess(cxx: str, source: str) -> str:
    """SOURCE run through the C preprocessor as Metal's compiler would (MSL 3.1, METAL_FUNC defined)."""
    with tempfile.TemporaryDirectory(prefix="ma-msl-") as d:
        work = Path(d)
        metal = work / "kernel.metal"
        metal.write_text(prepare_for_preprocessor(source), encoding="utf-8")
        try:
            pre = subprocess.run([cxx, "-E", "-x", "c++", "-std=c++17", "-undef", "-nostdinc",
                                  f"-D__METAL_VERSION__={METAL_VERSION}", "-D__METAL__=1", "-D__HAVE_BFLOAT__=1",
                                  f"-DMETAL_FUNC={METAL_FUNC}", metal.name], cwd=work, capture_output=True,
                                 encoding="utf-8", errors="replace", timeout=COMPILE_TIMEOUT_S, env=compiler_env())
        except subprocess.TimeoutExpired:
            raise CompileError(f"preprocessing timed out after {COMPILE_TIMEOUT_S} s") from None
        if pre.returncode != 0:
            raise _diagnostics(pre, metal, "preprocessing", cxx)
        return pre.stdout


_units: dict[str, tuple[str, list[MslKernel]]] = {}  # content key -> translated C++ (no launchers), kernels


def _translation(cxx: str, source: str, constants: dict[Any, Any], content: str) -> tuple[str, list[MslKernel]]:
    if content not in _units:
        body, kernels = translate_unit(_preprocess(cxx, source), function_constants=constants)
        if any(k.name in ("kernel_names",) or k.name.startswith("_") for k in kernels):
            raise CompileError("a kernel may not be named 'kernel_names' or start with '_'")
        _units[content] = (body, kernels)
    return _units[content]


def _compile_unit(cxx: str, cpp_text: str, kernels: list[MslKernel], out: Path) -> None:
    """Compile the translated C++ CPP_TEXT into OUT (+ OUT.json listing KERNELS), binary-checked."""
    global compile_count
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.stem + "."))
    try:
        cpp = work / "kernel.cpp"
        cpp.write_text(cpp_text, encoding="utf-8")
        compile_count += 1
        built = compile_shared(cxx, _flags(), work, cpp.name, COMPILE_TIMEOUT_S, config.include_dir(), EMULATOR_HEADERS,
                               "compiling the translated kernel", _LIBS)
        meta = out.with_suffix(".json")
        (work / "kernels.json").write_text(json.dumps([k.to_dict() for k in kernels]))
        os.replace(work / "kernels.json", meta)
        check_and_place(built, out, MPS_EMU_POLICY, _baseline(cxx))
        msl_sites.save(msl_sites.build(out), out.with_suffix(".sites.json"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# A kernel with nothing of its own: its translation is the emulator runtime plus one launcher, whose load-time
# entries and writable data (they differ between compilers: GCC 13 adds an .init_array entry) are the baseline.
_BASELINE_KERNEL = ("kernel void ma_baseline(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) "
                    "{ x[i] = 0.0f; }\n")


def _baseline(cxx: str | None) -> Baseline | None:
    if cxx is None:
        return None
    return baseline(cxx, _flags(), str(config.include_dir()), translate(_BASELINE_KERNEL)[0], EMULATOR_HEADERS)


_loaded: dict[Path, EmuLibrary] = {}


def clear_memory_cache() -> None:
    """Forget libraries loaded in this process (the disk cache stays)."""
    _loaded.clear()


@dataclass(frozen=True)
class MpsEmuBackend(BackendDefaults):
    """Metal Shading Language kernels, emulated on the CPU (proves correctness, not speed)."""

    name: str = "mps-emu"
    device_type: str = "cpu"
    language: str = "msl"
    measures_speed: bool = False  # prove.py skips the speed gate: emulated timings say nothing about Metal

    def is_available(self) -> bool:
        return sys.platform != "win32" and find_compiler() is not None

    def environment(self) -> Environment:
        return _environment()

    def synchronize(self) -> None:
        pass

    def prepare(self) -> None:
        """Run now what building needs a process for (compiler identity, the binary check's baseline)."""
        cxx = find_compiler()
        if cxx is not None:
            _compiler_identity(cxx)
            _baseline(cxx)

    def build(self, source: str, function_constants: dict[Any, Any] | None = None) -> Path:
        """Translate, compile and check all of SOURCE into build_dir()/mps-emu/<key>.so (or find it), without
        loading it."""
        return self._artifact(source, function_constants, eager=True)[0]

    def compile(self, source: str, function_constants: dict[Any, Any] | None = None) -> EmuLibrary:
        """Compile SOURCE into build_dir()/mps-emu/<key>.so, or load it from there if already built. A source
        with more than EAGER_MAX_KERNELS kernels (templated instantiations count one each) is compiled one
        kernel at a time, when `lib.<kernel>` is first named. FUNCTION_CONSTANTS gives the values of the
        source's function constants ({name or index: bool, int or float}), as a Metal pipeline's
        MTLFunctionConstantValues would; torch.mps.compile_shader has no way to set them."""
        path, kernels, compiled_now = self._artifact(source, function_constants, eager=False)
        if path not in _loaded:
            _loaded[path] = EmuLibrary(path, kernels, compiled_now)
        return _loaded[path]

    def _artifact(self, source: str, constants: dict[Any, Any] | None, eager: bool) -> tuple[Path, list[MslKernel], bool]:
        if not isinstance(source, str) or not source.strip():
            raise CompileError("empty kernel source")
        if constants is not None and not isinstance(constants, dict):
            raise CompileError("function_constants must be a dict {name or index: value}")
        constants = dict(constants or {})
        cxx = find_compiler()
        fc = json.dumps(sorted((str(k), repr(v)) for k, v in constants.items())) if constants else ""
        content = hashlib.sha256(f"{source}\0{_tool_digest()}\0{fc}".encode()).hexdigest()[:32]
        path = artifact_path(config.build_dir() / "mps-emu", content, cxx)
        if path in _loaded:
            return path, [], False
        kernels: list[MslKernel] | None = None
        if path.exists() and not path.with_suffix(".json").exists():
            discard(path)  # a library without its kernel list is half a build
        if not eager and not path.exists() and cxx is not None:
            body, all_kernels = _translation(cxx, source, constants, content)
            if len(all_kernels) > EAGER_MAX_KERNELS:
                lazy_key = path.with_name(path.name + ".lazy")
                if lazy_key not in _loaded:
                    _loaded[lazy_key] = EmuLibrary(None, all_kernels, False, self._kernel_builder(cxx, body, content))
                return lazy_key, all_kernels, False

        def build() -> None:
            nonlocal kernels
            assert cxx is not None
            body, found = _translation(cxx, source, constants, content)
            _compile_unit(cxx, body + "".join(launcher(k) for k in found), found, path)
            kernels = found

        compiled_now = ensure_artifact(path, build if cxx is not None else None, MPS_EMU_POLICY, _baseline(cxx))
        if kernels is None:
            kernels = _read_kernels(path)
        return path, kernels, compiled_now

    @staticmethod
    def _kernel_builder(cxx: str, body: str, content: str) -> Callable[[MslKernel], Path]:
        """Builds (or finds) the library of one kernel of a translated source."""
        def build_one(k: MslKernel) -> Path:
            key = hashlib.sha256(f"{content}\0kernel\0{k.name}".encode()).hexdigest()[:32]
            path = artifact_path(config.build_dir() / "mps-emu", key, cxx)
            if path.exists() and not path.with_suffix(".json").exists():
                discard(path)
            ensure_artifact(path, lambda: _compile_unit(cxx, body + launcher(k), [k], path), MPS_EMU_POLICY,
                            _baseline(cxx))
            return path
        return build_one


def _read_kernels(path: Path) -> list[MslKernel]:
    try:
        return [MslKernel.from_dict(d) for d in json.loads(path.with_suffix(".json").read_text())]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CompileError(f"corrupt emulator cache entry {path.with_suffix('.json').name}: {e}") from e


@functools.cache
def _environment() -> Environment:
    return Environment(backend="mps-emu", device_name=f"MSL emulator on {cpu_name()}", os=os_description(),
                       torch=torch_major_minor())
