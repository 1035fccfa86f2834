"""Host code may change in place only tensors it made itself.

The caller's inputs and the module's parameters and buffers reach host code as its parameters and as
`module.<name>`; an in-place update of any of them (or of a view or alias of them) would change the
user's data, in production as in the proof. The rule, per function of the block, is local and static:

A name is *fresh* when every binding of it in the function is a fresh expression:
- a call of a torch allocation or computing function (torch.empty, zeros, full, arange, matmul, cat,
  where, F.linear, ... but not the view functions transpose, permute, reshape, flatten, narrow, split,
  chunk, einsum, and no `out=`/`inplace=` argument), `.clone()`, a method returning a new tensor or a
  plain value (add, mul, sum, size, numel, item, ...), a `.shape`/`.dtype`/... attribute, a constant;
- arithmetic (`a * b`, `-a`, comparisons) on fresh values, parameters or `module.<name>`: a new tensor
  or a number, never an alias;
- a view or part of a fresh value (`out[0]`, `out.view(-1)`, `out.T`), or a builtin or block function
  applied to fresh values only.
Parameters, `module.<name>`, and anything bound from them through a view or alias (`w = module.weight`,
`y = x.contiguous()`, `for t in (x, y)`) are not fresh.

Then: an in-place method (a name ending in `_`: add_, copy_, fill_, clamp_, ...), a subscript assignment
`t[...] = v`, an `out=` argument and `inplace=True` must each target a fresh tensor, and an augmented
assignment (`t += 1`) a fresh name. `inner = 1; inner *= s` and `out = torch.empty_like(x);
out.narrow(1, 0, n).copy_(src)` pass; `w = module.weight; w.clamp_(0)` and `x.add_(0)` do not.
"""
from __future__ import annotations

import ast
from typing import Callable

from ..core.errors import SandboxError

VIEW_FUNCTIONS = frozenset(("transpose", "permute", "reshape", "flatten", "narrow", "split", "chunk", "einsum"))
SCALAR_ATTRS = frozenset(("shape", "ndim", "dtype", "device", "itemsize"))
FRESH_METHODS = frozenset((
    "clone", "size", "stride", "dim", "numel", "element_size", "is_contiguous", "storage_offset", "item",
    "tolist", "is_floating_point", "add", "sub", "mul", "div", "matmul", "mm", "bmm", "sum", "mean", "amax",
    "amin", "max", "min", "exp", "neg", "sqrt", "rsqrt", "abs", "clamp", "softmax", "masked_fill",
    "index_select", "gather", "repeat", "sigmoid", "tanh", "relu", "pow"))
# no `sum`: sum([[t]], []) is a list holding t itself
FRESH_BUILTINS = frozenset(("range", "len", "int", "float", "bool", "divmod", "round", "abs"))
_ROOTS = ("torch", "F", "math")
# the arguments of torch.nn.functional's functions that change a tensor in place unless False, and the tensor
# arguments they change: F.relu(t, True) changes t; F.batch_norm(x, mean, var, training=True) mean and var
_MUTATING = {"inplace": ("input",), "training": ("running_mean", "running_var"),
             "max_norm": ("weight",)}  # F.embedding(..., max_norm=m) renormalizes the weight's rows it reads in place
_NO_STATS = {"training": ("instance_norm",)}  # functions whose `training`-like argument changes nothing


def _functional_mutators() -> dict[str, tuple[int, str, tuple[int, ...]]]:
    """name -> (position of its mutating argument, that argument's name, positions of the tensors it changes), for
    the functions host code may call as torch.nn.functional.<name> (host_rules.py)."""
    import inspect

    import torch.nn.functional as functional

    from .host_rules import TORCH_ALLOWED
    out = {}
    for qual in TORCH_ALLOWED:
        if not qual.startswith("torch.nn.functional."):
            continue
        name = qual.rsplit(".", 1)[1]
        try:
            params = list(inspect.signature(getattr(functional, name)).parameters)
        except (AttributeError, TypeError, ValueError):
            continue
        for arg, changed in _MUTATING.items():
            if arg in params and name not in _NO_STATS.get(arg, ()):
                out[name] = (params.index(arg), arg, tuple(params.index(c) for c in changed if c in params))
    return out


_MUTATORS = _functional_mutators()


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


class Freshness:
    """The fresh names of one function (see the module docstring), found by a fixed point over its bindings."""

    def __init__(self, fn: ast.FunctionDef, params: set[str], constants: set[str]) -> None:
        self.params = params - {"module"}
        self.constants = constants
        self.bindings: list[tuple[str, ast.expr]] = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    self._bind(t, node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                self._bind(node.target, node.value)
            elif isinstance(node, (ast.For, ast.comprehension)):
                self._bind(node.target, node.iter)
        self.fresh = {name for name, _ in self.bindings} - params
        self._settle(self.fresh, self.is_fresh)
        # names whose value is new as a whole though its parts may not be: `y = x * 2` is a new tensor, or (x a
        # tuple) a new tuple of x's tensors; y.add_(1) then changes only y, y[0].add_(1) may change x's
        self.whole = {name for name, _ in self.bindings} - params
        self._settle(self.whole, self.is_whole)

    def _settle(self, names: set[str], admits: Callable[[ast.expr], bool]) -> None:
        """Drop from NAMES, in place, each name with a binding ADMITS refuses, until none is left to drop (ADMITS
        reads NAMES: a name stays only while every value bound to it passes with the names still in)."""
        while True:
            stale = {name for name, value in self.bindings if name in names and not admits(value)}
            if not stale:
                return
            names -= stale

    def is_whole(self, node: ast.expr) -> bool:
        """NODE's value is one the function made, though (a sequence) it may hold tensors the function did not."""
        if self.is_fresh(node):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.whole
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            return self._operand(node.left) and self._operand(node.right)
        return False

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.bindings.append((target.id, value))
        elif isinstance(target, (ast.Tuple, ast.List)):
            pairs = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) \
                and not any(isinstance(e, ast.Starred) for e in (*value.elts, *target.elts))
            for i, t in enumerate(target.elts):
                self._bind(t, value.elts[i] if pairs else value)  # type: ignore[attr-defined]
        elif isinstance(target, ast.Starred):
            self._bind(target.value, value)

    def _operand(self, node: ast.expr) -> bool:
        """Fresh, or a tensor or number reached without a call from a parameter or the module: arithmetic on
        it makes a new value (parameters are tensors or scalars, never sequences of tensors)."""
        if self.is_fresh(node):
            return True
        if isinstance(node, (ast.Attribute, ast.Subscript)) and any(
                isinstance(n, ast.Call) for n in ast.walk(node)):
            return False
        root = _root(node)
        return isinstance(root, ast.Name) and (root.id in self.params or root.id == "module")

    def is_fresh(self, node: ast.expr) -> bool:
        """True when NODE's value cannot share memory with a tensor the function did not make."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.fresh or node.id in self.constants
        if isinstance(node, ast.Attribute):
            root = _root(node)
            if node.attr in SCALAR_ATTRS or isinstance(root, ast.Name) and root.id in _ROOTS:
                return True
            return self.is_fresh(node.value)
        if isinstance(node, ast.Subscript):
            return self.is_fresh(node.value)
        if isinstance(node, ast.Starred):
            return self.is_fresh(node.value)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, (ast.Add, ast.Mult)) and not (_is_float(node.left) or _is_float(node.right)):
                # on sequences (*inputs, prepared, a tuple argument) they alias: inputs + (), inputs * 1; a float
                # operand makes a sequence raise, so x * 2.0 is a new tensor whatever x is
                return self.is_fresh(node.left) and self.is_fresh(node.right)
            return self._operand(node.left) and self._operand(node.right)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.UAdd):  # +t is torch.positive(t): t itself
                return self.is_fresh(node.operand)
            return self._operand(node.operand)
        if isinstance(node, ast.Compare):
            return True
        if isinstance(node, ast.IfExp):
            return self.is_fresh(node.body) and self.is_fresh(node.orelse)
        if isinstance(node, (ast.BoolOp, ast.Tuple, ast.List)):
            return all(self.is_fresh(v) for v in (node.values if isinstance(node, ast.BoolOp) else node.elts))
        if isinstance(node, ast.Call):
            return self._call(node)
        return False

    def _call(self, node: ast.Call) -> bool:
        func = node.func
        args = [*node.args, *(k.value for k in node.keywords)]
        if any(k.arg == "out" for k in node.keywords) or _mutated(node) is not None:
            return False
        if isinstance(func, ast.Attribute):
            root = _root(func)
            if isinstance(root, ast.Name) and root.id in _ROOTS:
                return func.attr not in VIEW_FUNCTIONS or all(self.is_fresh(a) for a in args)
            if isinstance(root, ast.Name) and root.id == "lib":
                return False
            return func.attr in FRESH_METHODS or self.is_fresh(func.value)
        if isinstance(func, ast.Name) and func.id in FRESH_BUILTINS:
            return True
        return all(self.is_fresh(a) for a in args)  # min/max/tuple/zip/...: may return an argument


def _is_float(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, float)


def _functional_name(func: ast.expr) -> str | None:
    """NAME of a call of F.NAME or torch.nn.functional.NAME, else None."""
    if not isinstance(func, ast.Attribute):
        return None
    owner = ast.unparse(func.value)
    return func.attr if owner in ("F", "torch.nn.functional", "nn.functional") else None


def _mutated(node: ast.Call) -> tuple[str, list[ast.expr]] | None:
    """(the argument that makes this call change tensors in place, the tensors it changes) where it does: an
    `inplace=` not False (by keyword or by position, F.relu(t, True)), a batch norm with `training` not False
    (its running statistics); None for a call that changes none of its arguments."""
    def is_false(value: ast.expr, arg: str = "") -> bool:
        if arg == "max_norm":  # any max_norm but None renormalizes (0 zeroes the rows)
            return isinstance(value, ast.Constant) and value.value is None
        if isinstance(value, ast.Attribute) and value.attr == "training":  # module....training: False whenever
            root = _root(value)                                             # host code runs (kernels are for eval)
            return isinstance(root, ast.Name) and root.id == "module"
        return isinstance(value, ast.Constant) and value.value in (False, None, 0)
    name = _functional_name(node.func)
    where = _MUTATORS.get(name) if name else None
    if where is None:
        for k in node.keywords:  # a method or another function with inplace=: its receiver or first argument
            if k.arg == "inplace" and not is_false(k.value):
                return "inplace", node.args[:1] or [node.func]
        return None
    index, arg, changed = where
    value = next((k.value for k in node.keywords if k.arg == arg), None)
    if value is None and len(node.args) > index:
        value = node.args[index]
    if value is None or is_false(value, arg):
        return None
    targets = [node.args[i] for i in changed if i < len(node.args)]
    targets += [k.value for k in node.keywords if k.arg in _MUTATING[arg]]
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        targets.append(_UNKNOWN)  # *args or **kwargs: which tensors it changes cannot be read off the call
    return arg, targets or [_UNKNOWN]


_UNKNOWN = ast.Name(id="<an argument this check cannot see>")  # never fresh


_HOW = "only tensors this function made itself (torch.empty, zeros, ..., or a computed result) may change in place"


def check_call(fresh: Freshness, node: ast.Call) -> None:
    """Raise SandboxError where the call changes a tensor in place that the function did not make."""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_") \
            and not fresh.is_whole(func.value):
        raise SandboxError("in-place update", node.lineno,
                           f"{ast.unparse(func)}() would change a tensor the caller or the module owns; {_HOW}")
    for k in node.keywords:
        if k.arg == "out" and not fresh.is_whole(k.value):
            raise SandboxError("out= argument", node.lineno,
                               f"out={ast.unparse(k.value)} would overwrite a tensor the caller or the module owns; "
                               f"{_HOW}")
    mutated = _mutated(node)
    if mutated is not None:
        arg, targets = mutated
        stale = [t for t in targets if not (isinstance(t, ast.Constant) and t.value is None) and not fresh.is_whole(t)]
        if stale:
            what = "its running statistics" if arg == "training" else "its input"
            raise SandboxError(f"{arg}=", node.lineno, f"{ast.unparse(func)}({arg}=...) changes {what} in place "
                               f"({ast.unparse(stale[0])}), a tensor the caller or the module owns; {_HOW}")


def check_store(fresh: Freshness, target: ast.expr, augmented: bool) -> None:
    """Raise SandboxError where an assignment to TARGET changes a tensor in place that the function did not make."""
    if isinstance(target, ast.Subscript) and not fresh.is_fresh(target.value):
        raise SandboxError("subscript assignment", target.lineno,
                           f"{ast.unparse(target)} = ... would change a tensor the caller or the module owns; {_HOW}")
    if augmented and isinstance(target, ast.Name) and target.id not in fresh.whole:
        raise SandboxError("augmented assignment", target.lineno,
                           f"{target.id} may be a tensor the caller or the module owns, and an augmented assignment "
                           f"changes a tensor in place; write {target.id} = {target.id} <op> ... instead")
