"""Source-level MSL constructs that C++ lacks, rewritten on the tokens before the main rewrite pass.

- Member functions and constructors qualified with an address space (`Foo() threadgroup = default;`,
  `float get() const device {`): the emulator has one address space, so the qualifier goes, and of
  overloads that differ only in it the first is kept.
- Class-scope explicit specializations (`template <> float f<float>(float x)` inside a struct, which
  clang accepts and g++ rejects) become non-template overloads.
- Function constants (`constant bool has_bias [[function_constant(0)]];`) become constexpr values
  supplied at compile time; `is_function_constant_defined(name)` becomes true or false; reading one
  that has no value is a launch error that names it.
- `in_function_body` tells a call inside a function from a declaration in a namespace or struct.
"""
from __future__ import annotations

import ast
import math
import re
from typing import Any

from ...core.errors import CompileError
from .msl_lexer import Tokens

ADDRESS_SPACES = ("device", "thread", "threadgroup", "constant", "threadgroup_imageblock", "ray_data", "object_data")
_TRAILING = {"const", "noexcept", "override", "final", "mutable", "volatile", *ADDRESS_SPACES}
_CONTROL = {"if", "for", "while", "switch", "catch", "return"}


def _skip_attrs_back(tk: Tokens, q: int) -> int:
    """Sig position before any [[...]] attributes that end at Q."""
    while q > 0 and tk.t(q) == "]" and tk.t(q - 1) == "]" and q - 1 in tk.match:
        q = tk.match[q - 1] - 1
    return q


def is_function_body(tk: Tokens, q: int) -> bool:
    """Whether the `{` at sig position Q opens the body of a function or lambda."""
    r = _skip_attrs_back(tk, q - 1)
    while tk.t(r) in _TRAILING:
        r -= 1
    if tk.t(r) == "]":
        return True  # a lambda without parameters
    if tk.t(r) != ")" or r not in tk.match:
        return False
    return tk.t(tk.match[r] - 1) not in _CONTROL


def in_function_body(tk: Tokens, p: int) -> bool:
    """Whether sig position P lies inside the body of a function (or lambda)."""
    o = tk.opener[p]
    while o >= 0:
        if tk.t(o) == "{" and is_function_body(tk, o):
            return True
        o = tk.opener[o]
    return False


def is_class_body(tk: Tokens, q: int) -> bool:
    """Whether the `{` at Q opens a struct, class or union body."""
    r = q - 1
    while r >= 0 and tk.t(r) not in (";", "{", "}", ")"):
        if tk.t(r) in ("struct", "class", "union"):
            return True
        if tk.t(r) in ("namespace", "enum", "="):
            return False
        r -= 1
    return False


def _decl_start(tk: Tokens, q: int) -> int:
    """First sig position of the member declaration that contains Q (scanning back to ; { } or an access label)."""
    while q > 0:
        t = tk.t(q - 1)
        if t in (";", "{", "}") or (t == ":" and tk.t(q - 2) in ("public", "private", "protected")):
            break
        if t in (")", "]", ">") and q - 1 in tk.match:
            q = tk.match[q - 1]
            continue
        q -= 1
    return q


def _decl_end(tk: Tokens, q: int) -> int:
    """Last sig position (the `;` or the body's `}`) of a function declaration whose qualifiers end before Q."""
    n = len(tk.sig)
    while q < n:
        t = tk.t(q)
        if t == ";":
            return q
        if t == "{" and (tk.kind[tk.sig[q - 1]] != "id" or tk.t(q - 1) in _TRAILING or tk.t(q - 1) == ""):
            return tk.match[q]
        if t in ("(", "[", "{"):
            q = tk.match[q]
        q += 1
    return n - 1


def fix_member_qualifiers(tk: Tokens) -> None:
    """Drop address-space qualifiers of member functions; of overloads that differ only in them keep the first."""
    seen: set[tuple[int, str]] = set()
    n = len(tk.sig)
    for r in range(n):
        if tk.t(r) != ")" or r not in tk.match:
            continue
        q = r + 1
        quals = []
        while tk.t(q) in ("const", "volatile", *ADDRESS_SPACES):
            quals.append(q)
            q += 1
        spaces = [x for x in quals if tk.t(x) in ADDRESS_SPACES]
        if not spaces or tk.t(q) not in ("{", ";", "=", ":", "noexcept", "->", "["):
            continue
        if tk.t(q) == "[" and not tk.is_attr_open(q):
            continue
        lp = tk.match[r]
        if tk.kind[tk.sig[lp - 1]] != "id" and tk.t(lp - 1) not in (">", ")"):
            continue
        start = _decl_start(tk, lp)
        key_tokens = [tk.t(x) for x in range(start, r + 1)] + [tk.t(x) for x in quals if x not in spaces]
        key = (tk.opener[lp], " ".join(t for t in key_tokens if t))
        if key in seen:
            tk.blank(start, _decl_end(tk, q))
        else:
            seen.add(key)
            for x in spaces:
                tk.set(x, "")


def _namespace_scope(tk: Tokens, p: int) -> bool:
    """Whether sig position P is at file or namespace scope."""
    o = tk.opener[p]
    return o == -1 or (tk.t(o) == "{" and "namespace" in (tk.t(o - 1), tk.t(o - 2)))


def _without_address_spaces(tk: Tokens, lo: int, hi: int) -> str:
    """Sig positions LO..HI as text, as the translation will have them: address spaces gone, `constant` a const."""
    words: list[str] = []
    for x in range(lo, hi + 1):
        t = tk.t(x)
        t = "const" if t == "constant" else t
        if t and t not in ADDRESS_SPACES and not (t == "const" and words and words[-1] == "const"):
            words.append(t)
    return " ".join(words)


def fix_address_space_overloads(tk: Tokens) -> None:
    """Of functions (free, member, constructors) that differ only in the address spaces of their parameters
    (distinct overloads in Metal, one function here: the emulator has one address space), keep the first. Their
    bodies must be the same but for address spaces (or one a defaulted copy, as code bases write the `thread`
    and `device` copy constructors), else a CompileError: which one a call means would be lost."""
    seen: dict[tuple[int, str], tuple[str, int]] = {}
    for r in range(len(tk.sig)):
        if tk.t(r) != ")" or r not in tk.match:
            continue
        lp = tk.match[r]
        o = tk.opener[lp]
        if tk.kind[tk.sig[lp - 1]] != "id" or not (_namespace_scope(tk, lp) or (o >= 0 and is_class_body(tk, o))) \
                or not any(tk.t(x) in ADDRESS_SPACES for x in range(lp, r)):
            continue
        q = r + 1
        while tk.t(q) in ("", "const", "noexcept", "override", "final"):
            q += 1
        if tk.t(q) in ("{", ":"):
            end = _decl_end(tk, q)
            body = _without_address_spaces(tk, q, end)
        elif tk.t(q) == "=" and tk.t(q + 1) in ("default", "delete") and tk.t(q + 2) == ";":
            end, body = q + 2, "= " + tk.t(q + 1)
        elif tk.t(q) == ";" and o >= 0 and tk.t(o) == "{" and is_class_body(tk, o):
            end, body = q, ";"  # a member declared twice is an error in a class: keep one
        else:
            continue
        start = _decl_start(tk, lp)
        key = (o, _without_address_spaces(tk, start, r))
        if key not in seen:
            seen[key] = (body, tk.line(lp))
            continue
        first_body, first_line = seen[key]
        if body != first_body and "= default" not in (body, first_body):
            raise CompileError(f"line {tk.line(lp)}: {tk.t(lp - 1)}() overloads the one on line {first_line} by "
                               "address space only, with another body: the MSL emulator has one address space "
                               "and cannot tell them apart")
        tk.blank(start, end)


def _class_head(tk: Tokens, o: int) -> tuple[str, bool]:
    """(name, is a template) of the class whose body opens at O."""
    r = o - 1
    while r >= 0 and tk.t(r) not in ("struct", "class", "union"):
        r -= 1
    name = tk.t(r + 1) if tk.kind[tk.sig[r + 1]] == "id" else ""
    return name, tk.t(r - 1) in (">", ">>")


def fix_class_scope_specializations(tk: Tokens) -> list[tuple[int, int, int, str]]:
    """Class-scope `template <> R f<A>(...)` (clang accepts it, g++ does not). In a non-template class at
    namespace scope it moves out of the class as `template <> R C::f<A>(...)`, exactly its meaning: the
    returned moves (first, last, insert-after position, class name) are done by `move_specializations`
    after the rewrite pass. In a class template it becomes the non-template overload `R f(...)`, which
    calls with deduced arguments choose as before (a call naming the arguments, f<A>(x), would not)."""
    moves = []
    n = len(tk.sig)
    for p in range(n - 2):
        if not (tk.t(p) == "template" and tk.t(p + 1) == "<" and tk.t(p + 2) == ">"):
            continue
        o = tk.opener[p]
        if o < 0 or tk.t(o) != "{" or not is_class_body(tk, o):
            continue
        q = p + 3
        while q < n and tk.t(q) not in ("(", ";", "{"):
            q = tk.match[q + 1] + 1 if tk.t(q) == "__attribute__" and tk.t(q + 1) == "(" else q + 1
        if tk.t(q) != "(":
            continue  # a member class specialization: left to the compiler
        cname, templated = _class_head(tk, o)
        close = tk.match[o]
        if cname and not templated and tk.opener[o] < 0 and tk.t(close + 1) == ";":
            end = _decl_end(tk, tk.match[q] + 1)
            for x in range(p + 3, q):
                if tk.t(x) in ("static", "virtual"):
                    tk.set(x, "")
            tk.set(q - 1 if tk.t(q - 1) not in (">", ">>") else _match_angle(tk, q - 1, p) - 1,
                   f"{cname}::" + tk.t(q - 1 if tk.t(q - 1) not in (">", ">>") else _match_angle(tk, q - 1, p) - 1))
            moves.append((p, end, close + 1, cname))
            continue
        tk.blank(p, p + 2)
        if tk.t(q - 1) in (">", ">>"):
            r = _match_angle(tk, q - 1, p + 2)
            if r > 0 and tk.kind[tk.sig[r - 1]] == "id" and tk.t(r - 2) != "operator":
                tk.blank(r, q - 1)
    return moves


def _match_angle(tk: Tokens, r: int, lo: int) -> int:
    depth = 0
    while r > lo:
        t = tk.t(r)
        depth += len(t) if t in (">", ">>") else (-1 if t == "<" else 0)
        if depth == 0:
            return r
        r -= 1
    return -1


def move_specializations(tk: Tokens, moves: list[tuple[int, int, int, str]]) -> None:
    """Move the (rewritten) member specializations out of their classes, after the class's `;`."""
    for first, last, after, _ in moves:
        text = " ".join(tk.t(x) for x in range(first, last + 1) if tk.t(x))
        tk.blank(first, last)
        tk.set(after, tk.t(after) + " " + text)  # on the same line: diagnostics keep their line numbers


def _value_text(ctype: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "__builtin_nanf(\"\")"
        if math.isinf(value):
            return ("-" if value < 0 else "") + "__builtin_inff()"
        return repr(value) + ("" if "e" in repr(value) or "." in repr(value) else ".0") + "f"
    raise CompileError(f"function constant of type {ctype}: value {value!r} must be a bool, int or float")


def _constant_index(text: str, line: int) -> int:
    """The index of `[[function_constant(i)]]`: an integer constant expression after preprocessing, as ggml writes
    `[[function_constant(FC_MUL_MV + 0)]]` (`600 + 0`). Only integer literals, + - * / % << and parentheses."""
    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            return -ev(n.operand) if isinstance(n.op, ast.USub) else ev(n.operand)
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b, ast.LShift: lambda: a << b}
            if type(n.op) in ops and not (isinstance(n.op, (ast.FloorDiv, ast.Mod)) and b <= 0) and \
                    not (isinstance(n.op, ast.LShift) and not 0 <= b < 32):
                return ops[type(n.op)]()
        raise ValueError
    expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b", lambda m: str(int(m.group(1), 0)), text.strip())
    try:
        index = ev(ast.parse(expr.replace("/", "//"), mode="eval"))
    except (ValueError, SyntaxError, RecursionError):
        index = -1
    if not 0 <= index < 65536:
        raise CompileError(f"line {line}: [[function_constant({text.strip()})]]: the index must be an integer constant "
                           "expression in 0..65535 (literals, + - * / % << and parentheses)")
    return index


def apply_function_constants(tk: Tokens, values: dict[Any, Any]) -> None:
    """`constant T name [[function_constant(i)]];` -> `static constexpr T name = value;` with the value from
    VALUES (keyed by name or index); is_function_constant_defined(name) -> true/false."""
    declared: dict[str, bool] = {}
    n = len(tk.sig)
    for p in range(n):
        if not tk.is_attr_open(p):
            continue
        items = dict(tk.attr_items(p))
        if "function_constant" not in items:
            continue
        if tk.parent[p] == "(":
            raise CompileError(f"line {tk.line(p)}: [[function_constant]] on a kernel parameter (an optional buffer) "
                               "is not supported by the MSL emulator")
        index = _constant_index(items["function_constant"], tk.line(p))
        start = p
        while start > 0 and tk.t(start - 1) not in (";", "}", "{"):
            start -= 1
        end = tk.attr_end(p)
        name = tk.t(p - 1)
        words = [tk.t(q) for q in range(start, p - 1) if tk.t(q) not in ("constant", "const", "static", "constexpr")]
        ctype = " ".join(words)
        if tk.t(end) != ";" or tk.kind[tk.sig[p - 1]] != "id" or not words:
            raise CompileError(f"line {tk.line(p)}: cannot parse the function constant declaration "
                               f"{' '.join(tk.t(q) for q in range(start, end + 1))!r} (expected "
                               "`constant T name [[function_constant(index)]];`)")
        key = name if name in values else (index if index in values else None)
        defined = key is not None
        declared[name] = defined
        for q in range(start, end):
            tk.set(q, "")
        if defined:
            tk.set(start, f"static constexpr {ctype} {name} = {ctype}({_value_text(ctype, values[key])})")
        else:  # reading it at run time is a launch error naming it; code that never reads it runs
            tk.set(start, f"static constexpr ma_rt::UndefinedConstant<{ctype}> {name}{{\"{name}\", {index}}}")
    for p in range(n - 3):
        if tk.t(p) == "is_function_constant_defined" and tk.t(p + 1) == "(" and tk.t(p + 3) == ")":
            name = tk.t(p + 2)
            if name not in declared:
                raise CompileError(f"line {tk.line(p)}: is_function_constant_defined({name}): {name!r} is not a "
                                   "function constant")
            tk.blank(p, p + 3)
            tk.set(p, "true" if declared[name] else "false")
