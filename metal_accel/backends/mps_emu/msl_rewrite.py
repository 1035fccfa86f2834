"""The rewrite pass of the MSL emulator's translator: MSL tokens edited in place into C++17.

`device` and `thread` vanish, `constant` becomes `const`, unsuffixed floating literals become
`float` (Metal has no double) and `h` literals `metal::half`, attributes and pragmas are removed,
function-body `threadgroup` variables become storage shared by the threads of a group, and calls
to helpers that reach SIMD-group functions record their line.
"""
from __future__ import annotations

import re

from ...core.errors import CompileError
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
            elif t == "constant":
                tk.set(p, "" if "const" in (tk.t(p - 1), tk.t(p + 1)) else "const")
            elif t == "threadgroup":
                _rewrite_threadgroup(tk, p)
            elif t in wrap and tk.t(p + 1) == "(" and tk.parent[p] != "" and tk.t(p - 1) not in (".", "->"):
                start = p - 2 if tk.t(p - 1) == "::" and tk.kind[tk.sig[p - 2]] == "id" else p
                tk.set(start, "(ma_rt::SiteGuard(__LINE__), " + tk.t(start))
                close = tk.match[p + 1]
                tk.set(close, tk.t(close) + ")")
        p += 1


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
    if suffix == "" and is_float:
        return mant + "f"  # Metal has no double: an unsuffixed floating literal is a float
    return t


def _rewrite_threadgroup(tk: Tokens, p: int) -> None:
    """`threadgroup T x[N];` in a function body -> shared static storage; elsewhere drop the qualifier."""
    q, names, expect_name = p + 1, [], False
    pointer = tk.parent[p] != "{"
    last_id = None
    while not pointer and q < len(tk.sig):
        t = tk.t(q)
        if t in ("*", "&", "&&"):
            pointer = True
        elif t in ("(", "[", "{"):
            if t == "[" and last_id is not None and not names:
                names.append(last_id)
            q = tk.match[q]
        elif t in (";", "="):
            break
        elif t == ",":
            expect_name = True
            if last_id is not None and not names:
                names.append(last_id)
        elif tk.kind[tk.sig[q]] == "id":
            if expect_name:
                names.append(t); expect_name = False
            last_id = t
        q += 1
    if pointer:
        tk.set(p, "")
        return
    if not names and last_id is not None:
        names.append(last_id)
    if tk.t(q) == "=":
        raise CompileError("threadgroup variables cannot have initializers in Metal")
    tk.set(p, "static thread_local")
    tk.set(q, ";" + "".join(f' ma_rt::tg_note(&{nm}, sizeof({nm}), "{nm}", sizeof(std::remove_all_extents_t<decltype({nm})>));' for nm in dict.fromkeys(names)))
