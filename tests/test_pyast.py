"""Parsing and compiling Python trees from several threads at once (CPython 3.11/3.12's shared AST recursion
depth, python/cpython#106905, failed CI's concurrent-synthesis test: two answers read on two threads)."""
from __future__ import annotations

import gc
import threading
import time

from metal_accel.core import pyast
from metal_accel.core.candidate import parse_candidate

SOURCE = "\n".join(f"def f{i}(x):\n    return [(a, {{'k': (b, [c for c in range(3)])}}) for a, b in zip(x, x)]"
                   for i in range(50))
ANSWER = ('```python\nSOURCE = r"""\nextern "C" void k() {}\n"""\n\ndef forward(module, x):\n'
          '    return [(a, {"k": (b, [c for c in range(3)])}) for a, b in zip(x, x)]\n```\n')


class _Cycle:
    """Garbage whose collection runs Python code that lets another thread in."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


def _hammer(work, threads: int = 4, rounds: int = 40) -> list[BaseException]:
    errors: list[BaseException] = []
    old = gc.get_threshold()
    gc.set_threshold(50, 1, 1)  # collections (and their finalizers) land inside tree construction

    def one() -> None:
        for _ in range(rounds):
            junk = [_Cycle() for _ in range(20)]
            del junk
            try:
                work()
            except Exception as exc:
                errors.append(exc)

    try:
        pool = [threading.Thread(target=one) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        gc.set_threshold(*old)
    return errors


def test_parse_and_compile_from_many_threads_never_raise():
    assert _hammer(lambda: pyast.compile_tree(pyast.parse(SOURCE), "<x>")) == []


def test_answers_parse_from_many_threads():
    assert _hammer(lambda: parse_candidate(ANSWER, "cpu")) == []


def test_class_sources_and_parses_from_many_threads():
    # inspect.getsource of a class parses its whole file; module keys and prompts read class sources on the
    # synthesizing threads while answers are parsed on others
    from metal_accel.core.keys import class_source

    def both() -> None:
        class_source(_Cycle)
        pyast.parse(SOURCE)

    assert _hammer(both, rounds=10) == []


def test_parse_keeps_ast_parse_semantics():
    assert pyast.parse("1 + 2", mode="eval").body.op.__class__.__name__ == "Add"
    try:
        pyast.parse("def (")
    except SyntaxError as exc:
        assert exc.lineno == 1
    else:
        raise AssertionError("a syntax error was not raised")
