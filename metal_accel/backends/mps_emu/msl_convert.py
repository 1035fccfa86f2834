"""Checked floating-point to integer casts (MSL spec 2.14: such conversions do not saturate, so NaN, infinities
and out-of-range values have no defined result; include/msl_emu/conversions.h stops the thread instead).

`edits(tk)` rewrites the casts written with a builtin integer type (scalar or vector), from the unedited tokens:

- `int(E)` and `static_cast<int>(E)` -> `int(ma_rt::cvt<int>((E), __LINE__))` (one argument only); also
  `static_cast<T>(E)` with T one identifier (a template parameter or typedef: checked when it is an integer type)
- `(int)E` -> `(int)(ma_rt::Fc<int, __LINE__>)E`: a second C-style cast, to a class that checks and converts
  back, so the cast's operand and precedence stay as written.

Functional casts to a template parameter (`T(x)`) and implicit conversions are not rewritten (see conversions.h).
"""
from __future__ import annotations

from .msl_lexer import Tokens

_BASES = ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong")
INT_TYPES = frozenset(
    {*_BASES, "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t", "uint64_t", "size_t",
     "ptrdiff_t", "unsigned", "signed", *(f"{b}{n}" for b in _BASES for n in (2, 3, 4))})
# words after which `(T)` starts a cast, although they are identifiers
_EXPR_WORDS = {"return", "case", "else", "do", "co_return", "co_yield", "throw"}
# tokens before `T(` that make it part of a declaration or a longer type, not a functional cast
_NOT_BEFORE_FUNCTIONAL = {"unsigned", "signed", "long", "short", "const", "constant", "device", "thread", "threadgroup",
                          "::", ".", "->", "struct", "typename", "using", "operator", "~", "template"}
_EXPR_START_PUNCT = {"(", "-", "+", "!", "~", "*", "&", "++", "--"}
# builtin types a static_cast to which is never a float -> integer conversion
_NOT_INTEGER = {"float", "half", "bfloat", "bool", "void", "auto", "double", *(f"{b}{n}" for b in ("float", "half", "bfloat", "bool")
                                                                               for n in (2, 3, 4))}

Edit = tuple[int, str, str]


def _single_argument(tk: Tokens, lo: int, hi: int) -> bool:
    """The tokens lo..hi (exclusive) are one non-empty expression: no top-level comma."""
    if hi <= lo:
        return False
    q = lo
    while q < hi:
        t = tk.t(q)
        if t in ("(", "[", "{") and q in tk.match:
            q = tk.match[q] + 1
            continue
        if t == ",":
            return False
        q += 1
    return True


def _type_text(tk: Tokens, lo: int, hi: int) -> str | None:
    """`int`, `unsigned int`, `uint4`: the tokens lo..hi (exclusive) when they name a builtin integer type."""
    words = [tk.t(q) for q in range(lo, hi)]
    if not words or any(w not in INT_TYPES and w not in ("int", "short", "long", "char") for w in words):
        return None
    if len(words) > 1 and words[0] not in ("unsigned", "signed", "long"):
        return None
    return " ".join(words)


def edits(tk: Tokens) -> list[Edit]:
    out: list[Edit] = []
    n = len(tk.sig)
    in_attr = [False] * n  # [[...]] attributes are read as written (msl_signature.py), not compiled
    for p in range(n):
        if tk.is_attr_open(p):
            for q in range(p, min(tk.attr_end(p) + 1, n)):
                in_attr[q] = True
    for p in range(n):
        if in_attr[p]:
            continue
        t = tk.t(p)
        kind = tk.kind[tk.sig[p]]
        if t == "static_cast" and p + 4 < n and tk.t(p + 1) == "<":
            q = p + 2
            while q < n and tk.t(q) != ">" and q - p < 6:
                q += 1
            ty = _type_text(tk, p + 2, q) if q < n else None
            if not ty and q == p + 3 and tk.kind[tk.sig[p + 2]] == "id" and tk.t(p + 2) not in _NOT_INTEGER:
                ty = tk.t(p + 2)  # a template parameter or typedef (MLX's static_cast<IdxT>(x)): checked if integral
            if ty and q + 1 < n and tk.t(q + 1) == "(" and (q + 1) in tk.match:
                close = tk.match[q + 1]
                if _single_argument(tk, q + 2, close):
                    out += [(q + 2, f"ma_rt::cvt<{ty}>((", ""), (close - 1, "", "), __LINE__)")]
        elif kind == "id" and t in INT_TYPES and p + 1 < n and tk.t(p + 1) == "(" and (p + 1) in tk.match:
            prev = tk.t(p - 1) if p > 0 else ";"
            if prev in _NOT_BEFORE_FUNCTIONAL or prev == "<" or (p > 0 and tk.kind[tk.sig[p - 1]] == "id" and prev not in _EXPR_WORDS):
                continue
            close = tk.match[p + 1]
            after = tk.t(close + 1) if close + 1 < n else ";"
            if after in ("=", "[") or (after == "(" and tk.t(p + 2) in ("*", "&", "^")):
                continue  # a declarator in parentheses: int (x) = ..., int (*p)[4], int (*f)(int)
            if prev in (";", "{", "}") and after in (";", ","):
                continue  # `int(x);` declares x
            if _single_argument(tk, p + 2, close):
                out += [(p + 2, f"ma_rt::cvt<{t}>((", ""), (close - 1, "", "), __LINE__)")]
        elif t == "(" and p in tk.match:
            close = tk.match[p]
            ty = _type_text(tk, p + 1, close)
            if not ty or close + 1 >= n:
                continue
            prev = tk.t(p - 1) if p > 0 else ";"
            if p > 0 and (tk.kind[tk.sig[p - 1]] == "id" and prev not in _EXPR_WORDS or prev in (")", "]", ">")):
                continue  # f(int), sizeof(int), decltype(x)(int), a<b>(int): not a cast
            nxt, nkind = tk.t(close + 1), tk.kind[tk.sig[close + 1]]
            if nkind in ("id", "num", "str") or nxt in _EXPR_START_PUNCT:
                out.append((close, "", f"(ma_rt::Fc<{ty}, __LINE__>)"))
    return out
