"""metal_accel: LLM-written kernels for PyTorch modules, proven correct and faster on your device.

    model = metal_accel.optimize(model, example_inputs)
    print(metal_accel.explain(model))
"""
import logging

from .api import explain, load_cache, optimize, restore
from .auto import hook, record
from .backends import available_backends, get_backend
from .candidates.directory import DirectoryProvider
from .core import config
from .core.candidate import Candidate, parse_candidate
from .core.config import Settings
from .core.errors import (
    BackendUnavailableError,
    CacheError,
    CandidateFormatError,
    CompileError,
    KernelLaunchError,
    MetalAccelError,
    SandboxError,
)
from .core.verdict import Verdict
from .core.version import VERSION as __version__
from .report import ModuleReport, OptimizeReport
from .runtime.dispatch import eager_only as eager
from .store.cache import CacheEntry
from .synth.budget import Limits
from .synth.loop import SynthesisError, SynthesisLoop
from .synth.models import ProviderConfigError
from .synth.settings import SynthSettings


def _activate_from_environment() -> None:
    """`import metal_accel` alone: patch cached classes, and record misses if asked to."""
    if config.disabled():
        return
    try:
        hook.activate()
        if config.current().record:
            record.start_recording()
    except Exception as exc:  # importing the library must never fail because of a cache
        logging.getLogger(__name__).warning("metal_accel: auto-instrumentation is off: %s", exc)


settings = config.current  # the settings in force: metal_accel.settings().build_dir, ...

_activate_from_environment()

__all__ = [
    "optimize", "restore", "explain", "load_cache", "eager", "Settings", "settings",
    "OptimizeReport", "ModuleReport", "CacheEntry", "Verdict",
    "Candidate", "parse_candidate", "DirectoryProvider", "SynthesisLoop", "SynthSettings", "Limits",
    "available_backends", "get_backend",
    "MetalAccelError", "BackendUnavailableError", "CacheError", "CandidateFormatError", "CompileError",
    "KernelLaunchError", "SandboxError", "ProviderConfigError", "SynthesisError",
    "__version__",
]
