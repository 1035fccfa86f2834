"""The rewrite pass of the MSL emulator's translator: MSL tokens edited in place into C++17.

`device` and `thread` vanish, `constant` becomes `const`, unsuffixed floating literals become
`float` (Metal has no double) and `h` literals `metal::half`, attributes and pragmas are removed,
function-body `threadgroup` variables become storage shared by the threads of a group, and calls
to helpers that reach SIMD-group functions (free functions and member functions) record their line.
"""
from __future__ import annotations

import re

from ...core.errors import CompileError
from .msl_instrument import chain_start
from .msl_kernels import _match_angle_back
from .msl_lang import in_function_body
from .msl_lexer import Tokens


def rewrite(tk: Tokens, wrap: set[str]) -> None:
    """Address spaces, threadgroup variables, literals, pragmas and attributes, in place; calls to the
    helper functions in WRAP (they reach SIMD-group functions) record their line on the call path."""
    n = len(tk.sig)
    for i, k in enumerate(tk.kind):
        if k == "pp" and re.match(r"#\s*pragma\b", tk.text[i]):
            tk.text[i] = ""
    p = 0
    while p < n:
        t, kind = tk.t(p), tk.kind[tk.sig[p]]
        if tk.is_attr_open(p):
            end = tk.attr_end(p)
            for q in range(p, end):
                tk.set(q, "")
            p = end
            continue
        if kind == "num":
            tk.set(p, _literal(t))
        elif kind == "id":
            if t in ("device", "thread"):
                tk.set(p, "")
            elif t == "restrict":
                tk.set(p, "__restrict")
            elif t == "constant":  # `constant constexpr const T` needs no more const
                near = {tk.t(q) for q in range(p - 2, p + 3)} | {tk.t(p + 3)}
                tk.set(p, "" if near & {"const", "constexpr"} else "const")
            elif t == "threadgroup":
                _rewrite_threadgroup(tk, p)
            elif t in wrap and tk.t(p + 1) == "(" and in_function_body(tk, p):
                close = tk.match[p + 1]
                if tk.t(p - 1) in (".", "->"):  # a member function: from the object expression on (r.reduce(v))
                    start = chain_start(tk, close)
                else:
                    start = qualified_name_start(tk, p)
                if start is not None:
                    tk.set(start, "(ma_rt::SiteGuard(__LINE__), " + tk.t(start))
                    tk.set(close, tk.t(close) + ")")
        p += 1


def qualified_name_start(tk: Tokens, p: int) -> int:
    """First token of the qualified name that ends with the id at P: `A::B<T, 1>::f` from `f`."""
    start = p
    while tk.t(start - 1) == "::":
        q = start - 2
        if tk.t(q) in (">", ">>"):
            lt = _match_angle_back(tk, q, 0)
            q = lt - 1 if lt > 0 else -1
        if q < 0 or tk.kind[tk.sig[q]] != "id" or tk.t(q) in ("return", "case", "else", "do"):
            break
        start = q
    return start


def _literal(t: str) -> str:
    if t[:2].lower() == "0x":
        return t
    m = re.fullmatch(r"([\d'.]+(?:[eE][+-]?\d+)?)([A-Za-z_]*)", t)
    if not m:
        return t
    mant, suffix = m.groups()
    is_float = "." in mant or "e" in mant.lower()
    if suffix in ("h", "H"):
        return f"metal::half({mant}{'f' if is_float else ''})"
    if suffix in ("bf", "BF"):
        return f"metal::bfloat({mant}{'f' if is_float else ''})"
    if suffix == "" and is_float:
        return mant + "f"  # Metal has no double: an unsuffixed floating literal is a float
    return t


def _rewrite_threadgroup(tk: Tokens, p: int) -> None:
    """`threadgroup T x[N];` in a function body -> shared static storage; elsewhere drop the qualifier.

    The storage is raw bytes (`static thread_local unsigned char`), with `x` a reference of the declared type
    to it: Metal constructs nothing in threadgroup memory, and a thread-local object of class type would get a
    compiler guard, memory outside every region the race detector knows (shadow.h)."""
    q, names, expect_name = p + 1, [], False
    pointer = tk.parent[p] != "{"
    last: tuple[str, int] | None = None
    where: dict[str, int] = {}

    def add(name: str, pos: int) -> None:
        names.append(name)
        where.setdefault(name, pos)
    while not pointer and q < len(tk.sig):
        t = tk.t(q)
        if t in ("*", "&", "&&"):
            pointer = True
        elif t in ("(", "[", "{"):
            if t == "(" and any(tk.t(x) in ("*", "&", "&&") for x in range(q + 1, tk.match[q])):
                pointer = True  # `threadgroup float (*rows)[33] = tile;`: a pointer to threadgroup arrays
                break
            if t == "[" and last is not None and not names:
                add(*last)
            q = tk.match[q]
        elif t in (";", "="):
            break
        elif t == ",":
            expect_name = True
            if last is not None and not names:
                add(*last)
        elif tk.kind[tk.sig[q]] == "id":
            if expect_name:
                add(t, q)
                expect_name = False
            last = (t, q)
        q += 1
    if pointer:
        tk.set(p, "")
        return
    if not names and last is not None:
        add(*last)
    note = "tg_note"
    if tk.t(q) == "=":
        r = q + 1
        while r < len(tk.sig) and tk.t(r) not in (";", ","):
            r = tk.match[r] + 1 if tk.t(r) in ("(", "[", "{") else r + 1
        init = [tk.t(x) for x in range(q + 1, r)]
        if tk.t(r) != ";" or not _all_zero(init):
            raise CompileError(f"line {tk.line(p)}: threadgroup variable {names[0] if names else ''!r} has the "
                               f"initializer {' '.join(init)!r}: Metal gives threadgroup memory no initial value "
                               "(only `= {0}` / `= {}` is accepted, as zeroing); write it from the threads, then "
                               "threadgroup_barrier")
        tk.blank(q, r - 1)
        q, note = r, "tg_note_zero"
    tk.set(p, "typedef")
    for nm, pos in where.items():
        tk.set(pos, f"ma_tgt_{nm}")
    tk.set(q, ";" + "".join(
        f" alignas(ma_tgt_{nm}) static thread_local unsigned char ma_tgr_{nm}[sizeof(ma_tgt_{nm})];"
        f" ma_tgt_{nm}& {nm} = *reinterpret_cast<ma_tgt_{nm}*>(ma_tgr_{nm});"
        f' ma_rt::{note}(&{nm}, sizeof({nm}), "{nm}", sizeof(std::remove_all_extents_t<ma_tgt_{nm}>));'
        for nm in where))


def _all_zero(init: list[str]) -> bool:
    """Whether an initializer is a braced list of zeros (`{0}`, `{}`, `{0.0f, 0}`)."""
    if not init or init[0] != "{" or init[-1] != "}":
        return False
    return all(t in ("{", "}", ",") or re.fullmatch(r"0+(?:\.0*)?[fFhHuUlL]*|0x0+[uUlL]*", t) for t in init)
