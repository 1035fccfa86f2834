"""Every setting of metal_accel in one object, read from the environment in one place.

`Settings.from_env()` is the only reader of metal_accel's environment variables (the synthesis knobs
parse the same mapping, `environment()`, in synth/settings.py). `current()` is what the library uses:
the settings in force (`using(settings)`, as optimize() does for its own run) or else those of the
environment now. The environment is read on every call, so a variable set at run time takes effect.

    METAL_ACCEL_USER_CACHE   writable user cache (default: the platform's user cache directory)
    METAL_ACCEL_BUILD_DIR    compiled kernel artifacts (default: <user cache>/build)
    METAL_ACCEL_CACHE_PATH   extra read-only caches, os.pathsep-separated
    METAL_ACCEL_CONFIG_DIR   where the verdict key lives (default: the platform's user config directory)
    METAL_ACCEL_DISABLE=1    no auto-instrumentation, optimize() does nothing
    METAL_ACCEL_RECORD=1     record calls without a kernel (`metal-accel synth --recorded`)
    METAL_ACCEL_COMPILE=0    never try torch.compile as a candidate
    METAL_ACCEL_END_TO_END=0 skip the end-to-end check of the optimized model (model_choice.py)
    METAL_ACCEL_PRECISION    eager (default: as strict as eager under PyTorch's flags) or compile (torch.compile's check)
    METAL_ACCEL_COMPILE_TIMEOUT_S  seconds the torch.compile candidate's first compile may take (default 120)
    METAL_ACCEL_REVALIDATE   first-use (default) or optimize: when claimed verdicts are proven
    METAL_ACCEL_TRUST_NATIVE=1   run untrusted native kernels in this process (not in the kernel server)
    METAL_ACCEL_UNCONFINED=1     allow untrusted native code where no confinement layer applies
    METAL_ACCEL_MPS_LAUNCHER auto (default), ext or compile_shader
    METAL_ACCEL_MODELS       LLMs to synthesize with, comma-separated
    METAL_ACCEL_LIBRARY=0    leave the shipped kernel library out (its kernels match modules by what they compute)
    CXX, CUDA_HOME / CUDA_PATH   the C++ compiler and the CUDA toolkit
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import platformdirs

APP_NAME = "metal_accel"
PREFIX = "METAL_ACCEL_"
_TOOL_VARIABLES = ("CXX", "CUDA_HOME", "CUDA_PATH")
REVALIDATE_POLICIES = ("first-use", "optimize")
DEFAULT_MARGIN = 0.05      # a kernel must be this much faster than eager, beyond the noise
DEFAULT_TIMEOUT_S = 120.0  # a candidate's time limit in the worker


def environment() -> dict[str, str]:
    """metal_accel's own environment variables (and the toolchain's), as they are now."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIX) or k in _TOOL_VARIABLES}


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(PREFIX + name)
    return default if raw is None else raw not in ("", "0")


@dataclass(frozen=True)
class Settings:
    """What metal_accel does and where it keeps things. optimize(settings=..., **changes) takes one;
    the defaults come from the environment (module docstring)."""

    user_cache: Path
    config_dir: Path
    build_dir_override: Path | None = None
    cache_path: tuple[Path, ...] = ()
    disabled: bool = False
    record: bool = False
    compile: bool = True                 # try torch.compile (and on CUDA its graph replay) as candidates
    revalidate: str = "first-use"
    trust_native: bool = False
    unconfined: bool = False
    mps_launcher: str = "auto"
    models: tuple[str, ...] = ()
    cxx: str | None = None
    cuda_home: str | None = None
    # the proof (optimize()'s knobs)
    margin: float = DEFAULT_MARGIN
    bench_budget_s: float = 1.0          # seconds of timing per speed gate
    timeout_s: float = DEFAULT_TIMEOUT_S
    precision: str = "eager"             # eager: as strict as eager under PyTorch's flags; compile: torch.compile's check
    compile_timeout_s: float = 120.0     # the torch.compile candidate's first compile, else eager stays
    end_to_end: bool = True              # time the optimized model whole against eager; drop what slows it
    library: bool = True                 # the shipped kernel library (library/) proposes kernels by computation
    # also try the model compiled whole with the installed kernels inside its graph as custom ops: never the
    # fastest in the zoo so far (docs/benchmarks.md), and a second whole-model compile (4-14 s on the H100)
    kernels_in_whole: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = environment() if env is None else env
        user_cache = env.get(PREFIX + "USER_CACHE") or platformdirs.user_cache_dir(APP_NAME)
        build = env.get(PREFIX + "BUILD_DIR")
        revalidate = env.get(PREFIX + "REVALIDATE", "first-use")
        return cls(
            user_cache=Path(user_cache),
            config_dir=Path(env.get(PREFIX + "CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME)),
            build_dir_override=Path(build) if build else None,
            cache_path=tuple(Path(p) for p in env.get(PREFIX + "CACHE_PATH", "").split(os.pathsep) if p),
            end_to_end=_flag(env, "END_TO_END", True), library=_flag(env, "LIBRARY", True),
            kernels_in_whole=_flag(env, "KERNELS_IN_WHOLE"),
            disabled=_flag(env, "DISABLE"), record=_flag(env, "RECORD"), compile=_flag(env, "COMPILE", True),
            revalidate=revalidate if revalidate in REVALIDATE_POLICIES else "first-use",
            trust_native=_flag(env, "TRUST_NATIVE"), unconfined=_flag(env, "UNCONFINED"),
            mps_launcher=env.get(PREFIX + "MPS_LAUNCHER", "auto"),
            models=tuple(p.strip() for p in env.get(PREFIX + "MODELS", "").split(",") if p.strip()),
            precision="compile" if env.get(PREFIX + "PRECISION") == "compile" else "eager",
            compile_timeout_s=float(env.get(PREFIX + "COMPILE_TIMEOUT_S") or 120.0),
            cxx=env.get("CXX") or None, cuda_home=env.get("CUDA_HOME") or env.get("CUDA_PATH") or None)

    def with_(self, **changes: Any) -> "Settings":
        """A copy with CHANGES (field names; a TypeError names any unknown one)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return replace(self, **changes)

    @property
    def build_dir(self) -> Path:
        return self.build_dir_override or self.user_cache / "build"


_in_force: list[Settings] = []
_lock = threading.Lock()


def current() -> Settings:
    """The settings in force: the innermost `using()`, else the environment's now."""
    return _in_force[-1] if _in_force else Settings.from_env()


@contextlib.contextmanager
def using(settings: Settings) -> Iterator[Settings]:
    """Run the body with SETTINGS in force (process-wide: the library's threads see them too)."""
    with _lock:
        _in_force.append(settings)
    try:
        yield settings
    finally:
        with _lock:
            _in_force.remove(settings)


def user_cache_dir() -> Path:
    """The writable user cache."""
    return current().user_cache


def build_dir() -> Path:
    """Where compiled kernel artifacts live, keyed by source hash (read-only to the worker)."""
    return current().build_dir


def shipped_cache_dir() -> Path:
    """The prebuilt cache shipped inside the package."""
    return Path(__file__).parent.parent / "kernels_cache"


def include_dir() -> Path:
    """Headers that kernels may include (e.g. vector math for the CPU)."""
    return Path(__file__).parent.parent / "include"


def extra_cache_paths() -> list[Path]:
    """Read-only caches named by METAL_ACCEL_CACHE_PATH."""
    return list(current().cache_path)


def disabled() -> bool:
    return current().disabled


def compile_enabled() -> bool:
    """Whether torch.compile is tried as a candidate."""
    return current().compile
