"""metal_accel: LLM-written kernels for PyTorch modules, proven correct and faster on your device.

    model = metal_accel.optimize(model, example_inputs)
    print(metal_accel.explain(model))
"""
from .api import explain, optimize, restore
from .backends import available_backends, get_backend
from .store.cache import CacheEntry, Verdict, load_cache
from .core.candidate import Candidate, parse_candidate
from .runtime.dispatch import eager_only as eager
from .core.errors import (BackendUnavailableError, CacheError, CandidateFormatError, CompileError,
    KernelLaunchError, MetalAccelError, SandboxError)
from .report import ModuleReport, OptimizeReport
from .synth.budget import Limits
from .candidates.directory import DirectoryProvider
from .synth.loop import SynthesisError, SynthesisLoop
from .synth.models import ProviderConfigError
from .synth.settings import SynthSettings

__version__ = "0.1.0"


def _activate_from_environment() -> None:
    """`import metal_accel` alone: patch cached classes, and record misses if asked to."""
    import logging
    import os

    from .core import config
    if config.disabled():
        return
    try:
        from .auto import hook
        hook.activate()
        if os.environ.get("METAL_ACCEL_RECORD", "") not in ("", "0"):
            from .auto import record
            record.start_recording()
    except Exception as exc:  # importing the library must never fail because of a cache
        logging.getLogger(__name__).warning("metal_accel: auto-instrumentation is off: %s", exc)


_activate_from_environment()

__all__ = [
    "optimize", "restore", "explain", "load_cache", "eager",
    "OptimizeReport", "ModuleReport", "CacheEntry", "Verdict",
    "Candidate", "parse_candidate", "DirectoryProvider", "SynthesisLoop", "SynthSettings", "Limits",
    "available_backends", "get_backend",
    "MetalAccelError", "BackendUnavailableError", "CacheError", "CandidateFormatError", "CompileError",
    "KernelLaunchError", "SandboxError", "ProviderConfigError", "SynthesisError",
    "__version__",
]
