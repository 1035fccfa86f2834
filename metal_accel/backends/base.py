"""The one small interface every backend implements."""
from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class Environment:
    """Where a verdict was measured. Verdicts are only trusted in the same environment."""

    backend: str
    device_name: str
    os: str
    torch: str  # major.minor

    @property
    def id(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Environment":
        return cls(**{k: str(data[k]) for k in ("backend", "device_name", "os", "torch")})


def torch_major_minor() -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def os_description() -> str:
    system = platform.system()
    if system == "Darwin":
        return f"macOS {platform.mac_ver()[0].split('.')[0]}"
    return system


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
    # Optional, read with getattr: `timer()` -> a bench.Timer (default: wall clock around synchronize);
    # `measures_speed = False` for emulated devices, whose verdicts then say "correct" and nothing about speed.

    def is_available(self) -> bool: ...

    def environment(self) -> Environment: ...

    def compile(self, source: str) -> KernelLibrary:
        """Compile SOURCE (cached on disk by source hash); raise CompileError with diagnostics."""
        ...

    def synchronize(self) -> None:
        """Block until all work queued on the device is done."""
        ...
