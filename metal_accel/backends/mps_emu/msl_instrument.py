"""Checks the MSL emulator's translator adds to kernel code: array indices and integer divisors.

`plan(tk)` reads the original MSL tokens and returns edits that `apply(tk, edits)` makes after the
rewrite pass (msl_rewrite.py), so that both passes see the source as written:

- an index into an expression E (`E[i]`, E a name or a chain of members, calls and subscripts) becomes
  `E[ma_rt::ix<decltype(E)>((i), __LINE__)]`: when E is an array of known extent (a private array, a
  threadgroup array, a program-scope constant table, a member array), an index outside it stops the
  thread with an error naming the line (metal_accel/include/msl_emu/shadow.h); for a pointer or a
  class it is the index itself. Accesses through pointers are checked at run time by address instead.
- the right operand B of `/`, `%`, `/=` and `%=` becomes `ma_rt::dz((B), __LINE__)`: an integer zero
  stops the thread with an error (the CPU would trap and kill the process); other types pass.
- casts of floating values to builtin integer types are checked (msl_convert.py).
"""
from __future__ import annotations

import re

from . import msl_convert
from .msl_lexer import Tokens

# words after which `name[` is an expression, not a declarator
_EXPR_WORDS = {"return", "case", "else", "do", "sizeof", "throw", "co_return", "co_yield", "not", "and", "or"}
_BUILTIN_TYPES = {
    "void", "bool", "char", "short", "int", "long", "float", "double", "half", "bfloat", "uint", "ushort", "uchar",
    "ulong", "signed", "unsigned", "size_t", "ptrdiff_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t",
    "uint16_t", "uint32_t", "uint64_t", "auto", "const", "volatile"}
_ADDRESS_SPACES = {"device", "constant", "threadgroup", "thread", "threadgroup_imageblock", "ray_data", "object_data"}
_NO_CHAIN = {"if", "while", "for", "switch", "return", "sizeof", "alignof", "decltype", "static_assert", "operator",
             "new", "delete", "template", "typename", "case"}
_CASTS = {"static_cast", "reinterpret_cast", "const_cast", "as_type", "bit_cast"}
_UNARY = {"-", "+", "!", "~", "++", "--", "*", "&"}

Edit = tuple[int, str, str]  # sig position, text before it, text after it


def plan(tk: Tokens) -> list[Edit]:
    """The edits for index and divisor checks, from the unedited tokens."""
    edits: list[Edit] = []
    declarators: set[int] = set()
    for p in range(len(tk.sig)):
        t = tk.t(p)
        if t == "[":
            e = _index_edit(tk, p, declarators)
            if e:
                edits += e
        elif t in ("/", "%", "/=", "%=") and tk.kind[tk.sig[p]] == "punct":
            e = _divisor_edit(tk, p)
            if e:
                edits += e
    return edits + msl_convert.edits(tk)


def apply(tk: Tokens, edits: list[Edit]) -> None:
    for p, before, after in edits:
        tk.set(p, before + tk.t(p) + after)


def _is_id(tk: Tokens, p: int) -> bool:
    return 0 <= p < len(tk.sig) and tk.kind[tk.sig[p]] == "id"


def chain_start(tk: Tokens, q: int) -> int | None:
    """First token of the postfix expression (names, members, calls, subscripts) that ends at Q."""
    while True:
        t = tk.t(q)
        if _is_id(tk, q):
            if t in _NO_CHAIN or t in _ADDRESS_SPACES:
                return None
            s = q
        elif t in (")", "]") and q in tk.match:
            m = tk.match[q]
            if t == ")":
                if _is_id(tk, m - 1) and tk.t(m - 1) not in _NO_CHAIN and tk.t(m - 1) not in _CASTS:
                    s = m - 1  # a call
                else:
                    return None  # a parenthesized expression or a cast: not worth the risk
            else:
                inner = chain_start(tk, m - 1) if tk.t(m - 1) in (")", "]") or _is_id(tk, m - 1) else None
                if inner is None:
                    return None
                s = inner
        else:
            return None
        if tk.t(s - 1) in (".", "->", "::") and (_is_id(tk, s - 2) or tk.t(s - 2) in (")", "]")):
            q = s - 2
            continue
        if tk.t(s - 1) == "::":
            return None  # ::global
        return s


def _template_close(tk: Tokens, q: int) -> bool:
    """Whether the `>` at Q closes a template argument list (`vec<float, 4> a[2]`), by a look back."""
    depth, r = 0, q
    while r > 0:
        t = tk.t(r)
        if t in (")", "]", "}") and r in tk.match:
            r = tk.match[r] - 1
            continue
        if t == ">":
            depth += 1
        elif t == ">>":
            depth += 2
        elif t == "<":
            depth -= 1
            if depth == 0:
                return _is_id(tk, r - 1)
        elif t in (";", "{", "}", "(", "&&", "||", "==", "!=", "<=", ">=", "=", "?", "return"):
            return False
        r -= 1
    return False


def _paren_declarator(tk: Tokens, close: int) -> bool:
    """Whether the parentheses closing at CLOSE hold the declarator of a pointer or reference to an array
    (`(&a)`, `(*rows)`, or unnamed in a cast's type: `(threadgroup float (*)[9]) flat`) after a type: `(*p)[i]`
    in an expression follows an operator, `(` or a keyword."""
    lp = tk.match.get(close)
    if lp is None or tk.t(lp + 1) not in ("*", "&", "&&"):
        return False
    if not (close - lp == 3 and _is_id(tk, lp + 2) or close - lp == 2):
        return False
    before = tk.t(lp - 1)
    return (_is_id(tk, lp - 1) and before not in _EXPR_WORDS) or before in ("*", "&") or (
        before == ">" and _template_close(tk, lp - 1))


def _index_edit(tk: Tokens, p: int, declarators: set[int]) -> list[Edit] | None:
    if tk.is_attr_open(p) or (tk.t(p - 1) == "[" and tk.is_attr_open(p - 1)):
        return None
    close = tk.match.get(p)
    if close is None or close == p + 1 or tk.t(close + 1) == "]" and tk.is_attr_open(p - 1):
        return None
    prev = p - 1
    pt = tk.t(prev)
    if pt == "]" and tk.match.get(prev) in declarators:
        declarators.add(p)  # the next dimension of a declared array
        return None
    if not (_is_id(tk, prev) and pt not in _EXPR_WORDS) and pt not in (")", "]"):
        return None
    if pt == ")" and _paren_declarator(tk, prev):
        declarators.add(p)  # `float (&a)[2]`, `threadgroup float (*rows)[33]`: an array type, not an index
        return None
    if tk.parent[p] == "":
        declarators.add(p)  # global scope: declarations only
        return None
    start = chain_start(tk, prev)
    if start is None:
        return None
    if start == prev and _is_id(tk, prev):
        if pt in _BUILTIN_TYPES:
            return None
        before = tk.t(prev - 1)
        if (_is_id(tk, prev - 1) and before not in _EXPR_WORDS) or (before == ">" and _template_close(tk, prev - 1)) \
                or (before == "," and tk.parent[p] in ("{", "")) \
                or (before in ("*", "&") and (tk.t(prev - 2) in _BUILTIN_TYPES or tk.t(prev - 2) in _ADDRESS_SPACES
                                             or _address_space_type_before(tk, prev - 2))):
            declarators.add(p)
            return None
    words = [tk.t(q) for q in range(start, p)]
    if any(w in _ADDRESS_SPACES for w in words) or any(
            tk.kind[tk.sig[q]] == "str" or (tk.kind[tk.sig[q]] == "num" and not _plain_int(tk.t(q))) for q in range(start, p)):
        return None
    expr = " ".join(words)
    return [(p + 1, f"ma_rt::ix<decltype({expr})>((", ""), (close - 1, "", "), __LINE__)")]


def _plain_int(t: str) -> bool:
    return bool(re.fullmatch(r"(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*", t))


def _operand_end(tk: Tokens, q: int) -> int | None:
    """Last token of the cast-expression that starts at Q (the right operand of `/`), or None."""
    n = len(tk.sig)
    while q < n and tk.t(q) in _UNARY:
        q += 1
    if q >= n:
        return None
    t = tk.t(q)
    if t == "(":
        m = tk.match.get(q)
        if m is None:
            return None
        nxt = tk.t(m + 1)
        if m + 1 < n and (_is_id(tk, m + 1) or tk.kind[tk.sig[m + 1]] == "num"):
            return _operand_end(tk, m + 1)  # a C-style cast: (int)x
        if nxt == "(":
            return _operand_end(tk, m + 1)  # (T)(x), or a call through a parenthesized callee
        end = m
    elif _is_id(tk, q):
        if t in ("sizeof", "alignof"):
            return None
        end = q
        while True:
            if tk.t(end + 1) == "<" and t not in _CASTS:  # a template-id: C<4>::value, max<int>(a, b)
                depth, r = 0, end + 1
                while r < n:
                    if tk.t(r) == "<":
                        depth += 1
                    elif tk.t(r) in (">", ">>"):
                        depth -= len(tk.t(r))
                        if depth <= 0:
                            break
                    elif tk.t(r) in ("(", "[") and r in tk.match:
                        r = tk.match[r]
                    elif tk.t(r) in (";", "{", "}", "&&", "||", ")", "]"):
                        r = n
                        break
                    r += 1
                if r < n and depth == 0 and tk.t(r + 1) in ("::", "("):
                    end = r
            if tk.t(end + 1) == "::" and _is_id(tk, end + 2):
                end += 2
                continue
            break
        if tk.t(end) in _CASTS and tk.t(end + 1) == "<":
            depth, r = 0, end + 1
            while r < n:
                if tk.t(r) == "<":
                    depth += 1
                elif tk.t(r) == ">":
                    depth -= 1
                    if depth == 0:
                        break
                elif tk.t(r) in (";", "{", "}"):
                    return None
                r += 1
            if tk.t(r + 1) != "(":
                return None
            end = r
    elif tk.kind[tk.sig[q]] == "num":
        return None  # a literal divisor: checked by the compiler, and never worth a call
    else:
        return None
    while True:  # postfix operators
        nt = tk.t(end + 1)
        if nt in ("(", "[") and end + 1 in tk.match:
            end = tk.match[end + 1]
        elif nt in (".", "->") and _is_id(tk, end + 2):
            end += 2
        elif nt in ("++", "--"):
            end += 1
        else:
            return end


def _divisor_edit(tk: Tokens, p: int) -> list[Edit] | None:
    if tk.parent[p] == "" or tk.t(p - 1) == "operator":
        return None
    if tk.t(p) in ("/=", "%="):
        q = p + 1
        while q < len(tk.sig):
            t = tk.t(q)
            if t in ("(", "[", "{") and q in tk.match:
                q = tk.match[q] + 1
                continue
            if t in (";", ",", ")", "]", "}"):
                break
            q += 1
        if q == p + 1:
            return None
        return [(p + 1, "ma_rt::dz((", ""), (q - 1, "", "), __LINE__)")]
    end = _operand_end(tk, p + 1)
    if end is None:
        return None
    return [(p + 1, "ma_rt::dz((", ""), (end, "", "), __LINE__)")]


def _address_space_type_before(tk: Tokens, r: int) -> bool:
    """Whether the tokens ending at R are a type that starts with an address space at the start of a statement
    (`device const T`, `threadgroup metal::float4`): MSL pointer declarations name one, expressions never do."""
    while r >= 0:
        t = tk.t(r)
        if t in _ADDRESS_SPACES:
            return tk.t(r - 1) in (";", "{", "}", "(") or r == 0
        if t in (">", ">>"):
            depth = 0
            while r >= 0:
                if tk.t(r) in (">", ">>"):
                    depth += len(tk.t(r))
                elif tk.t(r) == "<":
                    depth -= 1
                    if depth == 0:
                        break
                r -= 1
            r -= 1
            continue
        if _is_id(tk, r) or t in ("::", "const", "volatile"):
            r -= 1
            continue
        return False
    return False
