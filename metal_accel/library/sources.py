"""Where the kernel library's files are, and the digests of the kernel sources it ships.

It imports only core (below every stage): runtime/native_policy.py reads library_sources() to trust
the library's native kernels as it trusts the shipped cache's, below the stages that match and propose them.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from ..core.candidate import declared_source

KERNELS = Path(__file__).resolve().parent / "kernels"


@functools.cache
def library_sources() -> frozenset[str]:
    """sha256 of every SOURCE the library ships (all backends): as trusted as the package's own code."""
    out: set[str] = set()
    for path in KERNELS.glob("*/*.py"):
        try:
            source = declared_source(path.read_text())
        except OSError:
            continue
        if source is not None:
            out.add(hashlib.sha256(source.encode()).hexdigest())
    return frozenset(out)
