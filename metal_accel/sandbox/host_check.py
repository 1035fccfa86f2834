"""The AST whitelist for host code: parse, walk, reject anything not explicitly allowed.

Host code (the `forward` of a candidate) comes from LLMs and downloaded caches, so it is
untrusted. `check_host_code` raises SandboxError(construct, lineno, detail) for anything outside a
small whitelist of Python (the tables in `sandbox_rules`); it runs on arrival and on every cache load.
In-place updates are allowed only on tensors the function made itself (sandbox_inplace.py).
"""
from __future__ import annotations

import ast

from ..core import pyast
from ..core.errors import SandboxError
from .host_inplace import Freshness, check_call, check_store
from .host_rules import (
    BUILTINS_ALLOWED,
    FORBIDDEN_NAMES,
    GLOBAL_ROOTS,
    MATH_ALLOWED,
    TENSOR_ATTRS,
    TENSOR_METHODS,
    TORCH_ALLOWED,
)

_STMT_NAMES: dict[type, str] = {
    ast.Import: "import", ast.ImportFrom: "from-import", ast.While: "while loop",
    ast.Try: "try/except", ast.With: "with", ast.AsyncWith: "with", ast.Global: "global",
    ast.Nonlocal: "nonlocal", ast.ClassDef: "class", ast.Raise: "raise", ast.Delete: "delete",
    ast.FunctionDef: "nested def", ast.AsyncFunctionDef: "async def", ast.AsyncFor: "async for",
    ast.Match: "match",
}
if hasattr(ast, "TryStar"):
    _STMT_NAMES[ast.TryStar] = "try/except"

_EXPR_NAMES: dict[type, str] = {
    ast.Lambda: "lambda", ast.DictComp: "dict comprehension", ast.SetComp: "set comprehension",
    ast.JoinedStr: "f-string", ast.FormattedValue: "f-string", ast.NamedExpr: "walrus (:=)",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Dict: "dict literal",
    ast.Set: "set literal",
}

_SIMPLE_EXPRS = (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Subscript,
                 ast.Slice, ast.Tuple, ast.List, ast.Starred)


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _is_const(node: ast.expr) -> bool:
    """A literal int/float/str/bool/None, a signed number, or a tuple of those."""
    if isinstance(node, ast.Constant):
        return not isinstance(node.value, bytes)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))
    if isinstance(node, ast.Tuple):
        return all(_is_const(e) for e in node.elts)
    return False


def _is_child_index(node: ast.expr) -> bool:
    """A literal non-negative int or a local name: the index of a numbered child (module.layers[0],
    module.layers[i]); ModuleView.__getitem__ accepts nothing but an int that names a child."""
    return isinstance(node, ast.Name) or (isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0)


def _params(fn: ast.FunctionDef) -> list[ast.arg]:
    a = fn.args
    return a.posonlyargs + a.args + a.kwonlyargs + ([a.vararg] if a.vararg else [])


class _Checker:
    """Walks one parsed block; every node kind not handled explicitly is rejected."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.constants: set[str] = set()
        self.functions: set[str] = set()
        self.locals: set[str] = set()
        self.has_module = False
        self.fresh: Freshness | None = None

    # -- top level ---------------------------------------------------------------------------
    def check(self) -> None:
        defs: list[ast.FunctionDef] = []
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                    raise SandboxError("top-level assignment", node.lineno, "only NAME = constant")
                if not _is_const(node.value):
                    raise SandboxError("top-level assignment", node.lineno,
                                       "only int/float/str/bool/None constants or tuples of them")
                self._check_binding(node.targets[0].id, node.lineno)
                self.constants.add(node.targets[0].id)
            elif isinstance(node, ast.FunctionDef):
                self._check_binding(node.name, node.lineno)
                self.functions.add(node.name)
                defs.append(node)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                continue
            else:
                raise SandboxError(_STMT_NAMES.get(type(node), "top-level statement"), node.lineno,
                                   f"{type(node).__name__} is not allowed at top level")
        forward = [d for d in defs if d.name == "forward"]
        if not forward:
            raise SandboxError("missing forward", None, "host code must define forward(module, ...)")
        for fn in forward:
            if not fn.args.args or fn.args.args[0].arg != "module":
                raise SandboxError("forward signature", fn.lineno, "first parameter must be `module`")
        for fn in defs:
            if fn.name == "prepare" and [p.arg for p in _params(fn)] != ["module"]:
                raise SandboxError("prepare signature", fn.lineno, "prepare takes one parameter, `module`")
            if fn.name == "prepare" and not all("prepared" in [p.arg for p in _params(f)] for f in forward):
                raise SandboxError("forward signature", fn.lineno, "with prepare(), forward takes `prepared`")
        for fn in defs:
            self._function(fn)

    def _check_binding(self, name: str, lineno: int, local: bool = False) -> None:
        """A name the block binds must not shadow what the checker relies on (LOCAL: a function's parameter or
        local, which must not take a top-level constant's name either)."""
        if name in FORBIDDEN_NAMES:
            raise SandboxError(name, lineno, f"{name} is a forbidden name")
        if _is_dunder(name):
            raise SandboxError("dunder name", lineno, f"{name} is not allowed")
        if name in GLOBAL_ROOTS or name in BUILTINS_ALLOWED or name in self.functions:
            raise SandboxError("rebinding", lineno, f"{name} may not be rebound")
        if local and name in self.constants:  # the in-place rule takes a constant's name as fresh
            raise SandboxError("rebinding", lineno, f"{name} is a top-level constant and may not be rebound")

    def _function(self, fn: ast.FunctionDef) -> None:
        line = fn.lineno
        if fn.decorator_list:
            raise SandboxError("decorator", fn.decorator_list[0].lineno, f"on {fn.name}")
        a = fn.args
        if a.kwarg:
            raise SandboxError("**kwargs", line, f"in {fn.name}")
        if a.vararg and a.vararg.arg != "inputs":
            raise SandboxError("*args", line, "only *inputs is allowed")
        for default in a.defaults + [d for d in a.kw_defaults if d is not None]:
            if not _is_const(default):
                raise SandboxError("default value", default.lineno, "defaults must be constants")
        params = [p.arg for p in _params(fn)]
        for p in _params(fn):
            self._check_annotation(p.annotation)
        self._check_annotation(fn.returns)
        self.has_module = "module" in params
        self.locals = set(params)
        for p in params:
            if p != "module":
                self._check_binding(p, line, local=True)
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                if node.id == "module" and self.has_module:
                    raise SandboxError("rebinding", node.lineno, "module may not be rebound")
                self._check_binding(node.id, node.lineno, local=True)
                self.locals.add(node.id)
        self.fresh = Freshness(fn, set(params), self.constants)
        for stmt in fn.body:
            self._stmt(stmt)

    def _check_annotation(self, node: ast.expr | None) -> None:
        """Annotations are stripped before running; allow only dotted names and subscripts."""
        if node is None:
            return
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr.startswith("_") or \
                    isinstance(sub, ast.Name) and _is_dunder(sub.id):
                raise SandboxError("annotation", sub.lineno, "private or dunder name")
            if not isinstance(sub, (ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.Constant,
                                    ast.BinOp, ast.BitOr, ast.Load)):
                raise SandboxError("annotation", sub.lineno, "only dotted names are allowed")

    # -- statements --------------------------------------------------------------------------
    def _stmt(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                self._target(t)
            self._expr(node.value)
        elif isinstance(node, ast.AugAssign):
            self._target(node.target)
            assert self.fresh is not None
            check_store(self.fresh, node.target, augmented=True)
            self._expr(node.value)
        elif isinstance(node, ast.AnnAssign):
            if not isinstance(node.target, ast.Name):
                raise SandboxError("annotated assignment", node.lineno, "target must be a name")
            self._check_annotation(node.annotation)
            if node.value is not None:
                self._expr(node.value)
        elif isinstance(node, ast.Return):
            if node.value is not None:
                self._expr(node.value)
        elif isinstance(node, (ast.If, ast.For)):
            if isinstance(node, ast.If):
                self._expr(node.test)
            else:
                self._target(node.target, names_only=True)
                self._expr(node.iter)
            for s in node.body + node.orelse:
                self._stmt(s)
        elif isinstance(node, ast.Expr):
            v = node.value
            if not (isinstance(v, ast.Call)
                    or isinstance(v, ast.Constant) and (isinstance(v.value, str) or v.value is ...)):
                raise SandboxError("expression statement", node.lineno, "only calls or docstrings")
            self._expr(v)
        elif isinstance(node, ast.Assert):
            self._expr(node.test)
            if node.msg is not None:
                self._expr(node.msg)
        elif not isinstance(node, (ast.Pass, ast.Break, ast.Continue)):
            raise SandboxError(_STMT_NAMES.get(type(node), type(node).__name__.lower()), node.lineno,
                               "statement not allowed in host code")

    def _target(self, node: ast.expr, names_only: bool = False) -> None:
        """Assignment targets: names (already vetted), tuples/lists/starred of them, subscripts."""
        if isinstance(node, ast.Name):
            return
        if isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                self._target(e, names_only)
        elif isinstance(node, ast.Starred):
            self._target(node.value, names_only)
        elif isinstance(node, ast.Subscript) and not names_only:
            self._expr(node.value)
            self._expr(node.slice)
            assert self.fresh is not None
            check_store(self.fresh, node, augmented=False)
        elif isinstance(node, ast.Attribute):
            raise SandboxError("attribute assignment", node.lineno, f".{node.attr} may not be assigned")
        else:
            raise SandboxError("assignment target", node.lineno, type(node).__name__)

    # -- expressions -------------------------------------------------------------------------
    def _expr(self, node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bytes):
                raise SandboxError("bytes literal", node.lineno)
        elif isinstance(node, ast.Name):
            self._name(node)
        elif isinstance(node, ast.Attribute):
            self._attribute(node, call=False)
        elif isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            for gen in node.generators:
                if gen.is_async:
                    raise SandboxError("async comprehension", node.lineno)
                self._target(gen.target, names_only=True)
                self._expr(gen.iter)
                for cond in gen.ifs:
                    self._expr(cond)
            self._expr(node.elt)
        elif isinstance(node, _SIMPLE_EXPRS):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self._expr(child)
        else:
            raise SandboxError(_EXPR_NAMES.get(type(node), type(node).__name__.lower()),
                               getattr(node, "lineno", None), "expression not allowed in host code")

    def _name(self, node: ast.Name) -> None:
        name, line = node.id, node.lineno
        if name in FORBIDDEN_NAMES:
            raise SandboxError(name, line, f"{name} is a forbidden name")
        if _is_dunder(name):
            raise SandboxError("dunder name", line, f"{name} is not allowed")
        if name in GLOBAL_ROOTS:
            raise SandboxError(f"bare {name}", line, f"{name} may only be used as {name}.<allowed name>")
        if name not in self.locals and name not in self.constants and name not in self.functions \
                and name not in BUILTINS_ALLOWED:
            raise SandboxError("undefined name", line, f"{name} is not defined or not allowed")

    def _attribute(self, node: ast.Attribute, call: bool) -> None:
        attrs: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            attrs.append(base.attr)
            base = base.value
        # a numbered child of the module (nn.Sequential, nn.ModuleList): module.downsample[0].weight
        sub: ast.expr = base
        indices: list[ast.expr] = []
        while isinstance(sub, ast.Subscript) and _is_child_index(sub.slice):
            indices.append(sub.slice)
            sub = sub.value
            while isinstance(sub, ast.Attribute):
                sub = sub.value
        if sub is not base and isinstance(sub, ast.Name) and sub.id == "module" and self.has_module:
            while base is not sub:  # the whole chain, indices skipped: every name in it is checked below
                if isinstance(base, ast.Attribute):
                    attrs.append(base.attr)
                base = base.value
            for index in indices:
                if isinstance(index, ast.Name):
                    self._name(index)
        attrs.reverse()
        line = node.lineno
        for a in attrs:
            if _is_dunder(a):
                raise SandboxError("dunder attribute", line, f".{a} is not allowed")
            if a.startswith("_"):
                raise SandboxError("private attribute", line, f".{a} is not allowed")
        root = base.id if isinstance(base, ast.Name) else None
        if root in ("torch", "F"):
            path = ".".join(["torch.nn.functional" if root == "F" else "torch"] + attrs)
            if path not in TORCH_ALLOWED:
                raise SandboxError(path, line, f"{path} is not an allowed torch function")
            return
        if root == "math":
            path = ".".join(["math"] + attrs)
            if path not in MATH_ALLOWED:
                raise SandboxError(path, line, f"{path} is not an allowed math function")
            return
        if root == "lib":
            if len(attrs) != 1 or not call:
                raise SandboxError("lib attribute", line, "lib.<kernel> may only be called")
            return
        if root == "module" and self.has_module:
            if call:
                last = attrs[-1]
                if len(attrs) == 1 or last not in TENSOR_METHODS:
                    raise SandboxError("module call", line,
                                       f"module.{'.'.join(attrs)}() may not be called")
                if last.endswith("_"):
                    raise SandboxError("in-place module update", line,
                                       f"module.{'.'.join(attrs)}() would modify the module")
            return
        for i, a in enumerate(attrs):
            if call and i == len(attrs) - 1:
                if a not in TENSOR_METHODS:
                    raise SandboxError(f".{a}()", line, f"method {a} is not an allowed tensor method")
            elif a not in TENSOR_ATTRS:
                raise SandboxError(f".{a}", line, f"attribute {a} is not an allowed tensor attribute")
        self._expr(base)

    def _call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            self._attribute(func, call=True)
        elif isinstance(func, ast.Name):
            if func.id not in self.functions and func.id not in BUILTINS_ALLOWED:
                self._name(func)  # raises the specific message for forbidden/undefined names
                raise SandboxError("call of a value", node.lineno,
                                   f"{func.id} is not a function of the block or an allowed builtin")
            if func.id in BUILTINS_ALLOWED and any(kw.arg == "key" for kw in node.keywords):
                # max(xs, key=module.forward) would call an unchecked method
                raise SandboxError("key function", node.lineno, f"{func.id}(key=...) is not allowed")
        else:
            raise SandboxError("call of a value", node.lineno, "only named functions may be called")
        for arg in node.args:
            self._expr(arg)
        for kw in node.keywords:
            if kw.arg is None:
                raise SandboxError("**kwargs", kw.value.lineno, "keyword unpacking in a call")
            self._expr(kw.value)
        assert self.fresh is not None
        check_call(self.fresh, node)


def check_host_code(code: str) -> None:
    """Raise SandboxError(construct, lineno, detail) unless `code` stays inside the whitelist."""
    parse_and_check(code)


def parse_and_check(code: str) -> ast.Module:
    """The parsed block, once it passed the check (SandboxError otherwise)."""
    try:
        tree = pyast.parse(code, "<candidate>")
    except SyntaxError as exc:
        raise SandboxError("syntax error", exc.lineno, str(exc.msg)) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise SandboxError("unparsable code", None, type(exc).__name__) from None
    try:
        _Checker(tree).check()
    except RecursionError:
        raise SandboxError("nesting too deep", None) from None
    return tree


def strip_annotations(tree: ast.Module) -> ast.Module:
    """Drop def-level annotations so names like torch.Tensor are never evaluated.

    Annotations of function-local variables are never evaluated by CPython; top-level ones are
    rejected by the check.
    """
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            node.returns = None
            for p in _params(node):
                p.annotation = None
    return tree
