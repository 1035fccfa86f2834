"""metal_accel: LLM-written kernels for PyTorch modules, proven correct and faster on your device.

    model = metal_accel.optimize(model, example_inputs)
    print(metal_accel.explain(model))
"""
from .api import explain, optimize, restore
from .backends import available_backends, get_backend
from .cache import CacheEntry, Verdict, load_cache
from .candidate import Candidate, parse_candidate
from .errors import (BackendUnavailableError, CacheError, CandidateFormatError, CompileError,
                     KernelLaunchError, MetalAccelError, SandboxError)
from .report import ModuleReport, OptimizeReport
from .synth.directory import DirectoryProvider

__version__ = "0.1.0"

__all__ = [
    "optimize", "restore", "explain", "load_cache",
    "OptimizeReport", "ModuleReport", "CacheEntry", "Verdict",
    "Candidate", "parse_candidate", "DirectoryProvider",
    "available_backends", "get_backend",
    "MetalAccelError", "BackendUnavailableError", "CacheError", "CandidateFormatError", "CompileError",
    "KernelLaunchError", "SandboxError",
    "__version__",
]
