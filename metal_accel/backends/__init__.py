"""Backend registry: backends are imported lazily, by name."""
from __future__ import annotations

import functools
import importlib

import torch

from ..core.errors import BackendUnavailableError
from .base import Backend, Environment, KernelLibrary

# name -> "module:Class" (relative to this package); each new backend adds one line
_REGISTRY: dict[str, str] = {
    "cpu": ".cpu.backend:CpuBackend",
    "cuda": ".cuda.backend:CudaBackend",
    "mps": ".mps.backend:MpsBackend",
    "mps-emu": ".mps_emu.backend:MpsEmuBackend",
}

# torch device type -> backend name
_DEVICE_BACKENDS: dict[str, str] = {"cpu": "cpu", "mps": "mps", "cuda": "cuda"}

__all__ = ["Backend", "Environment", "KernelLibrary", "get_backend", "available_backends",
           "backend_for_device", "known_backends", "register_backend"]


def register_backend(name: str, target: str) -> None:
    """Register backend NAME as "module:Class" (a module path may be relative to this package)."""
    _REGISTRY[name] = target
    _instance.cache_clear()


def known_backends() -> list[str]:
    """Every registered backend name, available here or not."""
    return list(_REGISTRY)


@functools.cache
def _instance(name: str) -> Backend:
    module, _, cls = _REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module, __name__), cls)()


def get_backend(name: str) -> Backend:
    """The backend NAME; BackendUnavailableError if unknown or unusable on this machine."""
    if name not in _REGISTRY:
        raise BackendUnavailableError(f"unknown backend {name!r}; known backends: {', '.join(_REGISTRY)}")
    backend = _instance(name)
    if not backend.is_available():
        raise BackendUnavailableError(
            f"backend {name!r} is not available on this machine; available: {', '.join(available_backends()) or 'none'}")
    return backend


def available_backends() -> list[str]:
    """Names of the registered backends usable on this machine."""
    out = []
    for name in _REGISTRY:
        try:
            if _instance(name).is_available():
                out.append(name)
        except Exception:  # a backend whose import fails is simply unavailable
            pass
    return out


def backend_for_device(device: torch.device | str) -> Backend:
    """The backend that runs kernels on tensors of DEVICE."""
    kind = torch.device(device).type
    name = _DEVICE_BACKENDS.get(kind)
    if name is None:
        raise BackendUnavailableError(f"no backend for device type {kind!r}; known backends: {', '.join(_REGISTRY)}")
    if name not in _REGISTRY:
        raise BackendUnavailableError(f"the {name} backend is not implemented yet")
    return get_backend(name)
