"""Settings read from the environment, with defaults."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "metal_accel"


def user_cache_dir() -> Path:
    """The writable user cache: METAL_ACCEL_USER_CACHE, else the platform's user cache dir."""
    override = os.environ.get("METAL_ACCEL_USER_CACHE")
    return Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME))


def build_dir() -> Path:
    """Where compiled kernel artifacts live, keyed by source hash: METAL_ACCEL_BUILD_DIR (the worker's,
    read-only to it), else the user cache's build directory."""
    override = os.environ.get("METAL_ACCEL_BUILD_DIR")
    return Path(override) if override else user_cache_dir() / "build"


def shipped_cache_dir() -> Path:
    """The prebuilt cache shipped inside the package."""
    return Path(__file__).parent.parent / "kernels_cache"


def include_dir() -> Path:
    """Headers that kernels may include (e.g. vector math for the CPU)."""
    return Path(__file__).parent.parent / "include"


def extra_cache_paths() -> list[Path]:
    """Read-only caches named by METAL_ACCEL_CACHE_PATH (os.pathsep-separated)."""
    raw = os.environ.get("METAL_ACCEL_CACHE_PATH", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def disabled() -> bool:
    return os.environ.get("METAL_ACCEL_DISABLE", "") not in ("", "0")


def compile_enabled() -> bool:
    """Whether torch.compile is tried as a candidate (METAL_ACCEL_COMPILE=0 turns it off)."""
    return os.environ.get("METAL_ACCEL_COMPILE", "1") not in ("", "0")
