"""Compiled Metal libraries and the two launchers that build them.

`ShaderLauncher` wraps `torch.mps.compile_shader` (PyTorch compiles, binds and encodes);
`ExtensionLauncher` wraps `metal_accel._mps_ext` (csrc/mps/metal_launcher.mm: our MTLLibrary and
pipeline caches, encoding on PyTorch's current MPS stream). Both return `MpsKernel`s, which check
devices and launch geometry (mps_launch.py) before Metal sees a launch; `MpsLibrary` holds them by name.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...core.errors import CompileError, KernelLaunchError
from ..protected import check_writable
from .launch import (
    MAX_BUFFER_INDEX,
    ascii_source,
    kernel_names_in,
    launch_geometry,
    pack_arguments,
)

EXT_MSL_VERSION = "3.1"       # what metal_launcher.mm compiles with, on every macOS


class MpsKernel:
    """One kernel of an MpsLibrary: `kernel(*args, threads=..., group_size=..., arg_casts=...)`."""

    def __init__(self, name: str, max_threads: int, execution_width: int, device_type: str,
                 run: Callable[[tuple, list[int], list[int], Any], None]) -> None:
        self.__name__ = name
        self.max_threads_per_threadgroup = int(max_threads)
        self.thread_execution_width = int(execution_width)
        self._device_type = device_type
        self._run = run
        self.written: frozenset[int] | None = None  # buffer indices the kernel may write; None: every one

    def _check_written(self, i: int, a: torch.Tensor) -> None:
        if self.written is None or i in self.written:
            check_writable(f"kernel {self.__name__}, argument {i}", a)

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
                self._check_written(i, a)
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


def _message(exc: BaseException) -> str:
    text = str(exc.msg) if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    return text.strip() or type(exc).__name__
