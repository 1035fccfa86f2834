"""Where the kernels of an MSL source are: plain kernels, templated kernels and their instantiations.

A plain kernel is `[attributes] kernel void name(params) [attributes] { body }` (or `[[kernel]] void`).
A templated kernel is `template <typename T, ...> [[kernel]] void name(...) {...}`; it runs under the
host names its explicit instantiations give it, in the forms the major code bases use:

    template [[host_name("add_f32")]] [[kernel]] decltype(add<float>) add<float>;     // MLX
    typedef decltype(add<float>) add_t;
    template [[host_name("add_f32")]] kernel add_t add<float>;                         // llama.cpp
    template [[host_name("add_f32")]] kernel void add<float>(device const float*, ...);

Each found kernel's `kernel` keyword becomes `static inline`; instantiation statements are removed
(the generated launcher instantiates the function it calls).
"""
from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

from ...core import pyast
from ...core.errors import CompileError
from .msl_lexer import Tokens


@dataclass
class FoundKernel:
    name_p: int                      # sig position of the function name
    lp: int                          # its parameter list's `(`
    body: int                        # its body's `{`
    fattrs: dict[str, str]
    template_params: list[tuple[str, str]] = field(default_factory=list)  # (name, default) of a templated kernel
    instances: list[tuple[str, str]] = field(default_factory=list)        # (host name, template arguments)


def _match_angle_back(tk: Tokens, r: int, lo: int) -> int:
    """Sig position of the `<` matching the `>` at R (not before LO), or -1."""
    depth = 0
    while r >= lo:
        t = tk.t(r)
        if t in (")", "]", "}") and r in tk.match:
            r = tk.match[r] - 1
            continue
        if t in (">", ">>"):
            depth += len(t)
        elif t == "<":
            depth -= 1
            if depth == 0:
                return r
        r -= 1
    return -1


def _split_top(tk: Tokens, lo: int, hi: int) -> list[list[int]]:
    """Sig positions between LO and HI (exclusive) split at commas outside brackets and angles."""
    out, cur, angle, p = [], [], 0, lo
    while p < hi:
        t = tk.t(p)
        if t in ("(", "[", "{") and p in tk.match:
            cur += list(range(p, tk.match[p] + 1)); p = tk.match[p] + 1
            continue
        if t == "<":
            angle += 1
        elif t in (">", ">>"):
            angle = max(0, angle - len(t))
        if t == "," and angle == 0:
            out.append(cur); cur = []
        else:
            cur.append(p)
        p += 1
    if cur:
        out.append(cur)
    return out


def _template_params(tk: Tokens, lt: int, gt: int) -> list[tuple[str, str]]:
    params = []
    for part in _split_top(tk, lt + 1, gt):
        words = [tk.t(q) for q in part]
        if "=" in words:
            i = words.index("=")
            head, default = words[:i], " ".join(words[i + 1:])
        else:
            head, default = words, ""
        ids = [w for w in head if re.fullmatch(r"[A-Za-z_]\w*", w) and w not in ("typename", "class")]
        params.append((ids[-1] if ids and "..." not in head else "", default))
    return params


def _attrs_before(tk: Tokens, p: int) -> tuple[int, dict[str, str]]:
    attrs: dict[str, str] = {}
    q = p
    while q > 0 and tk.t(q - 1) == "]" and tk.t(q - 2) == "]" and (q - 2) in tk.match:
        q = tk.match[q - 2] - 1
        attrs.update(dict(tk.attr_items(q)))
    return q, attrs


def _instantiation(tk: Tokens, start: int) -> tuple[str, str, str, int]:
    """(host name, function name, template arguments, end) of the instantiation statement at START (`template`)."""
    end, attrs, p = start + 1, {}, start + 1
    while end < len(tk.sig) and tk.t(end) != ";":
        end = tk.match[end] + 1 if tk.t(end) in ("(", "[", "{") and end in tk.match else end + 1
    while p < end:
        if tk.is_attr_open(p):
            attrs.update(dict(tk.attr_items(p))); p = tk.attr_end(p)
        else:
            p += 1
    last = end - 1
    if tk.t(last) == ")":
        last = tk.match[last] - 1
    lt = _match_angle_back(tk, last, start) if tk.t(last) in (">", ">>") else -1
    if lt < 0 or tk.kind[tk.sig[lt - 1]] != "id":
        raise CompileError(f"line {tk.line(start)}: cannot parse the kernel instantiation "
                           f"{' '.join(tk.t(q) for q in range(start, end + 1))!r}; expected e.g. "
                           "`template [[host_name(\"name\")]] [[kernel]] decltype(fn<float>) fn<float>;`")
    fname = tk.t(lt - 1)
    args = " ".join(tk.t(q) for q in range(lt + 1, last)) + (" >" if tk.t(last) == ">>" else "")
    return host_name(attrs.get("host_name", "")) or fname, fname, args, end


def host_name(arg: str) -> str:
    """The name a [[host_name(...)]] argument gives: its string literals, concatenated (`"rms" "float32"`)."""
    parts = re.findall(r'"((?:\\.|[^"\\])*)"', arg)
    return "".join(parts) if parts else arg.strip()


def find_kernels(tk: Tokens) -> list[FoundKernel]:
    """The kernels of TK (plain and templated, with their instantiations); marks them `static inline` and
    removes instantiation statements."""
    n = len(tk.sig)
    found: list[FoundKernel] = []
    instances: list[tuple[str, str, str, int]] = []
    for p in range(n):
        attr_kernel = tk.is_attr_open(p) and tk.parent[p] != "[" and any(a == "kernel" for a, _ in tk.attr_items(p))
        if not (tk.t(p) == "kernel" and tk.kind[tk.sig[p]] == "id" and tk.parent[p] != "[") and not attr_kernel:
            continue
        start, fattrs = _attrs_before(tk, p)
        if attr_kernel:
            fattrs.update(dict(tk.attr_items(p)))
        if tk.t(start - 1) == "template" and tk.t(start) != "<":
            host, fname, args, end = _instantiation(tk, start - 1)
            instances.append((host, fname, args, tk.line(start)))
            tk.blank(start - 1, end)
            continue
        r = tk.attr_end(p) if attr_kernel else p + 1
        while tk.is_attr_open(r):
            fattrs.update(dict(tk.attr_items(r))); r = tk.attr_end(r)
        if not attr_kernel and tk.t(r) != "void":
            continue  # `kernel` used as a name (e.g. a convolution's weights)
        tparams: list[tuple[str, str]] = []
        is_template = tk.t(start - 1) in (">", ">>")
        if is_template:
            lt = _match_angle_back(tk, start - 1, 0)
            if lt < 1 or tk.t(lt - 1) != "template":
                raise CompileError(f"line {tk.line(p)}: cannot parse the template before this kernel")
            tparams = _template_params(tk, lt, start - 1)
        if tk.parent[p] != "":
            raise CompileError(f"line {tk.line(p)}: kernels must be declared at global scope (not inside a namespace "
                               "or struct)")
        if tk.t(r) != "void" or tk.kind[tk.sig[r + 1]] != "id" or tk.t(r + 2) != "(":
            raise CompileError(f"line {tk.line(p)}: cannot parse the kernel declaration near "
                               f"{' '.join(tk.t(x) for x in range(p, r + 3))!r}")
        name_p, lp = r + 1, r + 2
        b = tk.match[lp] + 1
        while tk.is_attr_open(b):
            fattrs.update(dict(tk.attr_items(b))); b = tk.attr_end(b)
        if attr_kernel:
            tk.set(tk.attr_end(p), "static inline " + tk.t(tk.attr_end(p)))
        else:
            tk.set(p, "static inline")
        if tk.t(b) == ";":
            continue  # a declaration; the definition comes elsewhere
        if tk.t(b) != "{":
            raise CompileError(f"line {tk.line(p)}: kernel {tk.t(name_p)}: expected a body after the parameter list")
        found.append(FoundKernel(name_p, lp, b, fattrs, tparams if is_template else [], []))
        if is_template:
            found[-1].template_params = tparams or [("", "")]
    by_name = {tk.t(k.name_p): k for k in found if k.template_params}
    for host, fname, args, line in instances:
        k = by_name.get(fname)
        if k is None:
            raise CompileError(f"line {line}: kernel instantiation {host!r} names {fname}<{args}>, but no templated "
                               f"kernel `template <...> [[kernel]] void {fname}(...)` is defined")
        k.instances.append((host, args))
    return found


def substitute(text: str, params: list[tuple[str, str]], args: str) -> str:
    """TEXT with the template parameters PARAMS replaced by the arguments ARGS (defaults where omitted)."""
    values = _split_args(args)
    for i, (name, default) in enumerate(params):
        if not name:
            continue
        value = values[i] if i < len(values) else default
        if value:
            text = re.sub(rf"\b{re.escape(name)}\b", value, text)
    return text


def _split_args(args: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in args:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip()); cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def int_expr(text: str) -> int | None:
    """The value of an integer constant expression of literals and + - * / % << >> (None if it is not one)."""
    text = re.sub(r"(\d+)[uUlL]+\b", r"\1", text.replace(" ", ""))
    try:
        node = pyast.parse(text, mode="eval").body
    except SyntaxError:
        return None

    def ev(x: ast.AST) -> int:
        if isinstance(x, ast.Constant) and isinstance(x.value, int):
            return x.value
        if isinstance(x, ast.BinOp) and type(x.op) in _OPS:
            return _OPS[type(x.op)](ev(x.left), ev(x.right))
        if isinstance(x, ast.UnaryOp) and isinstance(x.op, ast.USub):
            return -ev(x.operand)
        raise ValueError
    try:
        return ev(node)
    except (ValueError, ZeroDivisionError):
        return None
