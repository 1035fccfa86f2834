"""Where the kernel library's files are, and the digests of the kernel sources it ships.

A leaf module (no imports from the package): runtime/native_policy.py reads library_sources() to trust
the library's native kernels as it trusts the shipped cache's, below the stages that match and propose them.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

KERNELS = Path(__file__).resolve().parent / "kernels"


@functools.cache
def library_sources() -> frozenset[str]:
    """sha256 of every SOURCE the library ships (all backends): as trusted as the package's own code."""
    out: set[str] = set()
    for path in KERNELS.glob("*/*.py"):
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SOURCE" for t in node.targets):
                try:
                    source = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(source, str):
                    out.add(hashlib.sha256(source.encode()).hexdigest())
    return frozenset(out)

