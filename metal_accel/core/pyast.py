"""Python's `ast.parse`, `compile` of a tree and `inspect.getsource`, safe to call from several threads at once.

CPython 3.11 and 3.12 keep the AST converters' recursion depth in interpreter-wide state. When a garbage
collection in one thread runs a finalizer that lets another thread in while a tree is built or compiled,
the two interleave and one raises SystemError("AST constructor recursion depth mismatch")
(python/cpython#106905). Synthesis reads answers, loads candidates and reads module sources on several
threads, so every parse and every compile of a tree in this package goes through one lock, and so does
`inspect.getsource`, which parses the whole file to find a class.
"""
from __future__ import annotations

import ast
import inspect
import threading
from types import CodeType
from typing import Any

_LOCK = threading.RLock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename, mode)


def compile_tree(tree: ast.AST, filename: str, mode: str = "exec") -> CodeType:
    """`compile(tree, filename, mode)` of a parsed tree, one thread at a time."""
    with _LOCK:
        return compile(tree, filename, mode)


def getsource(obj: Any) -> str:
    """`inspect.getsource(obj)`, one thread at a time (for a class it parses the file it is in)."""
    with _LOCK:
        return inspect.getsource(obj)
