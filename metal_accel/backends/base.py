"""The one small interface every backend implements."""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from ..core.verdict import Environment, os_description, torch_major_minor
from .timing import Timer

__all__ = ["Backend", "BackendDefaults", "BoundKernels", "Environment", "KernelLibrary", "Timer", "os_description", "torch_major_minor"]


@runtime_checkable
class KernelLibrary(Protocol):
    """A compiled kernel source. `lib.<kernel>(*args, **launch)` runs one kernel."""

    kernel_names: tuple[str, ...]

    def __getattr__(self, name: str) -> Callable[..., None]: ...


class BoundKernels:
    """Mixin for libraries whose kernels are bound callables: `lib.<kernel>` is a plain attribute
    (the hot path), `lib.kernel(name)` also reaches names that clash with the library's own."""

    _kernels: dict[str, Callable[..., None]]

    def _install_kernels(self, kernels: dict[str, Callable[..., None]]) -> None:
        self._kernels = kernels
        for n, k in kernels.items():
            if n not in self.__dict__ and not hasattr(type(self), n):
                self.__dict__[n] = k

    def kernel(self, name: str) -> Callable[..., None]:
        """The kernel NAME."""
        kernels = self.__dict__.get("_kernels", {})
        if name not in kernels:
            raise AttributeError(f"no kernel {name!r} in this library; available: {', '.join(kernels) or 'none'}")
        return kernels[name]

    def __getattr__(self, name: str) -> Callable[..., None]:
        return self.kernel(name)


@runtime_checkable
class Backend(Protocol):
    """A device on which candidates are compiled, run and timed."""

    name: str          # "cpu", "mps", "mps-emu", "cuda"
    device_type: str   # the torch device type tensors live on
    language: str      # kernel language of SOURCE: "c++", "msl", "cuda"
    measures_speed: bool  # False for emulated devices: their verdicts say "correct" and nothing about speed

    def is_available(self) -> bool: ...

    def environment(self) -> Environment: ...

    def compile(self, source: str) -> KernelLibrary:
        """Compile SOURCE (cached on disk by source hash); raise CompileError with diagnostics."""
        ...

    def synchronize(self) -> None:
        """Block until all work queued on the device is done."""
        ...

    def build(self, source: str) -> Any:
        """Compile and check SOURCE without loading it into this process (where the backend can)."""
        ...

    def prepare(self) -> None:
        """Run now what building needs a process for, before a worker confines itself."""
        ...

    def timer(self) -> Timer | None:
        """The backend's own timer for the speed gate (CUDA: events checked against the wall clock);
        None: the wall clock around synchronize()."""
        ...


class BackendDefaults:
    """What a backend inherits unless it says otherwise: it measures speed, times with the wall clock,
    has nothing to prepare, and builds by compiling (which loads)."""

    measures_speed: bool = True

    def build(self, source: str) -> Any:
        return self.compile(source)  # type: ignore[attr-defined]

    def prepare(self) -> None:
        return None

    def timer(self) -> Timer | None:
        return None
