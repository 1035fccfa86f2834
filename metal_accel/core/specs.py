"""Input and output specs of a module call: what a cache key and a kernel are specialized on."""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Union

import torch
from torch.utils import _pytree

from .errors import MetalAccelError

_SCALARS = (bool, int, float, str, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)
_NODES = _pytree.SUPPORTED_NODES  # live: classes registered later (ModelOutput subclasses) are seen
_BUILTIN_NODES = {"tuple": tuple, "list": list, "dict": dict}


class UnsupportedCall(MetalAccelError):
    """A module call whose arguments or outputs metal_accel cannot specialize a kernel on."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedCall(f"unknown dtype {name!r}")
    return dtype


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    device: str  # device type: "cpu", "cuda", "mps"
    # Observed value range of integer/bool inputs, used to draw valid test inputs; not part of the key.
    value_range: tuple[int, int] | None = field(default=None, compare=False)

    @property
    def contiguous(self) -> bool:
        expected, step = [], 1
        for size in reversed(self.shape):
            expected.append(step)
            step *= max(size, 1)
        return all(sz <= 1 or st == ex for sz, st, ex in zip(self.shape, self.stride, reversed(expected)))

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSpec":
        if t.is_nested or t.layout is not torch.strided:  # torch's fast paths make nested tensors of padded batches
            raise UnsupportedCall(f"a {'nested' if t.is_nested else str(t.layout).replace('torch.', '')} tensor has "
                                  "no one shape and strides for a kernel")
        value_range = None
        if not t.is_floating_point() and not t.is_complex() and t.numel() and t.device.type != "meta":
            value_range = (int(t.min()), int(t.max()))
        return cls(tuple(t.shape), dtype_name(t.dtype), tuple(t.stride()), t.device.type, value_range)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tensor": True, "shape": list(self.shape), "dtype": self.dtype,
                             "stride": list(self.stride), "device": self.device}
        if self.value_range is not None:
            d["value_range"] = list(self.value_range)
        return d

    def describe(self) -> str:
        layout = "" if self.contiguous else " strided"
        return f"{self.dtype}[{','.join(map(str, self.shape))}]{layout}"


@dataclass(frozen=True)
class ScalarSpec:
    value: Any  # a JSON-able Python scalar or a tuple of them

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": False, "value": list(self.value) if isinstance(self.value, tuple) else self.value}

    def describe(self) -> str:
        return repr(self.value)


def _resolve(kind: str) -> type:
    """The class a StructSpec names: a builtin container or "module:qualname"."""
    if kind in _BUILTIN_NODES:
        return _BUILTIN_NODES[kind]
    module, _, qualname = kind.partition(":")
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type):
        raise UnsupportedCall(f"container class {kind} is not importable here")
    return obj


def _kind_of(cls: type) -> str:
    for name, klass in _BUILTIN_NODES.items():
        if cls is klass:
            return name
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_namedtuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _is_node(cls: type) -> bool:
    """Whether values of CLS are containers metal_accel looks into: tuple, list, dict, a namedtuple, or a
    class registered with torch.utils._pytree (transformers' ModelOutput dataclasses register themselves)."""
    return cls in _NODES or _is_namedtuple(cls)


def _children(value: Any, cls: type) -> tuple[Any, Any]:
    """(children, context) of a container value, in torch.utils._pytree's order."""
    if cls is tuple or cls is list or _is_namedtuple(cls):
        return value, None
    if cls is dict:
        return value.values(), tuple(value)
    children, context = _NODES[cls].flatten_fn(value)
    return children, _freeze(context)


def _freeze(value: Any) -> Any:
    """Lists as tuples, recursively: a container's context as part of a hashable signature."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _json_plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_json_plain(v) for v in value)
    return isinstance(value, _SCALARS)


@dataclass(frozen=True)
class StructSpec:
    """A container argument or output (tuple, list, dict, namedtuple, or a torch.utils._pytree node such
    as a ModelOutput): its class, its context (dict keys, field names) and the spec of each child. The
    structure is part of the key; the tensors are the leaves, in pytree order."""

    kind: str                       # "tuple", "list", "dict", or "module:qualname"
    context: Any                    # hashable: None, or scalars and tuples of them (keys of a dict)
    items: tuple["ArgSpec", ...]
    cls: type | None = field(default=None, compare=False, repr=False)   # resolved lazily from `kind`
    raw_context: Any = field(default=None, compare=False, repr=False)   # the context as flatten gave it

    @property
    def node_class(self) -> type:
        return self.cls if self.cls is not None else _resolve(self.kind)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tensor": False, "struct": self.kind, "items": [i.to_dict() for i in self.items]}
        if self.context is not None:
            d["context"] = _thaw(self.context)
        return d

    def signature(self) -> tuple:
        return (self.node_class, self.context, tuple(_spec_signature(i) for i in self.items))

    def build(self, leaf: Callable[[TensorSpec], Any]) -> Any:
        """A value of this structure: LEAF(spec) for each tensor, scalars and None as recorded."""
        children = [_build(i, leaf) for i in self.items]
        cls = self.node_class
        if cls is tuple or cls is list:
            return cls(children)
        if _is_namedtuple(cls):
            return cls(*children)
        if cls is dict:
            return dict(zip(self.context, children))
        context = self.raw_context if self.raw_context is not None else _thaw(self.context)
        return _NODES[cls].unflatten_fn(children, context)

    def describe(self) -> str:
        inner = [i.describe() for i in self.items]
        if self.kind == "tuple":
            return f"({', '.join(inner)}{',' if len(inner) == 1 else ''})"
        if self.kind == "list":
            return f"[{', '.join(inner)}]"
        keys = self.context if isinstance(self.context, tuple) and len(self.context) == len(inner) else None
        body = ", ".join(f"{k}={v}" for k, v in zip(keys, inner)) if keys else ", ".join(inner)
        return f"{{{body}}}" if self.kind == "dict" else f"{self.kind.rpartition(':')[2]}({body})"


ArgSpec = Union[TensorSpec, ScalarSpec, StructSpec]


def _build(spec: ArgSpec, leaf: Callable[[TensorSpec], Any]) -> Any:
    if isinstance(spec, TensorSpec):
        return leaf(spec)
    if isinstance(spec, StructSpec):
        return spec.build(leaf)
    return spec.value


def _tensor_leaves(spec: ArgSpec) -> list[TensorSpec]:
    if isinstance(spec, TensorSpec):
        return [spec]
    if isinstance(spec, StructSpec):
        return [t for i in spec.items for t in _tensor_leaves(i)]
    return []


def _map_tensors(spec: ArgSpec, fn: Callable[[TensorSpec], TensorSpec]) -> ArgSpec:
    if isinstance(spec, TensorSpec):
        return fn(spec)
    if isinstance(spec, StructSpec):
        return replace(spec, items=tuple(_map_tensors(i, fn) for i in spec.items))
    return spec


def _collect(spec: ArgSpec, value: Any, out: list[torch.Tensor]) -> None:
    """Append VALUE's tensors to OUT in the order of SPEC's leaves (VALUE matches SPEC's signature)."""
    if isinstance(spec, TensorSpec):
        out.append(value)
    elif isinstance(spec, StructSpec):
        children, _ = _children(value, type(value))
        for s, v in zip(spec.items, children):
            _collect(s, v, out)


def _arg_spec(value: Any, where: str) -> ArgSpec:
    if isinstance(value, torch.Tensor):
        return TensorSpec.of(value)
    cls = type(value)
    if (cls is tuple or cls is list or cls is torch.Size) and all(type(v) in _SCALAR_TYPES for v in value):
        return ScalarSpec(tuple(value))
    if isinstance(value, _SCALARS):
        return ScalarSpec(value)
    if _is_node(cls):
        return _struct_spec(value, cls, where, _arg_spec)
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value):
        return ScalarSpec(tuple(value))  # torch.Size and other tuples that are no pytree node
    raise UnsupportedCall(f"argument {where} of type {cls.__name__} is not a tensor, a scalar, None or a "
                          "container of them (an object the module may change, such as a cache, keeps the "
                          "call eager)")


def _output_leaf_spec(value: Any, where: str) -> ArgSpec:
    if isinstance(value, torch.Tensor):
        return TensorSpec.of(value)
    if value is None:
        return ScalarSpec(None)
    cls = type(value)
    if _is_node(cls):
        return _struct_spec(value, cls, where, _output_leaf_spec)
    raise UnsupportedCall(f"{where} of type {cls.__name__} is not a tensor, None or a container of them")


def _struct_spec(value: Any, cls: type, where: str, leaf: Callable[[Any, str], ArgSpec]) -> StructSpec:
    children, raw = (value, None) if (cls is tuple or cls is list or _is_namedtuple(cls)) else \
        (list(value.values()), list(value)) if cls is dict else _NODES[cls].flatten_fn(value)
    context = _freeze(raw)
    if not _json_plain(context):
        raise UnsupportedCall(f"{where}: the structure of a {cls.__name__} cannot be keyed (context "
                              f"{type(raw).__name__})")
    names = context if isinstance(context, tuple) and len(context) == len(children) else None
    items = tuple(leaf(c, f"{where}.{names[i]}" if names else f"{where}[{i}]") for i, c in enumerate(children))
    return StructSpec(_kind_of(cls), context, items, cls, raw)


def _arg_from_dict(d: dict[str, Any]) -> ArgSpec:
    if "struct" in d:
        context = d.get("context")
        return StructSpec(d["struct"], _freeze(context), tuple(_arg_from_dict(i) for i in d["items"]))
    if d["tensor"]:
        vr = d.get("value_range")
        return TensorSpec(tuple(d["shape"]), d["dtype"], tuple(d["stride"]), d["device"],
                          tuple(vr) if vr is not None else None)
    value = d["value"]
    return ScalarSpec(tuple(value) if isinstance(value, list) else value)


def _runtime_signature(value: Any, offsets: bool = True) -> Any:
    if isinstance(value, torch.Tensor):  # torch.Size hashes and compares equal to the tuple
        # is_cpu / is_cuda first: `value.device` builds a torch.device object (a quarter microsecond)
        kind = "cpu" if value.is_cpu else "cuda" if value.is_cuda else value.device.type
        try:
            # a view at a storage offset is another signature: proofs run inputs that start their storage, so a
            # kernel (or its host code) that behaves otherwise at an offset was never tried there: eager runs it
            return (value.shape, value.stride(), value.dtype, kind, not offsets or value.storage_offset() == 0)
        except RuntimeError:  # a nested or sparse tensor: a signature no kernel is keyed on
            return ("unkeyed", id(value))
    cls = type(value)
    if cls in _SCALAR_TYPES:
        return ("s", value)
    if cls is tuple or cls is list or cls is torch.Size:
        for v in value:
            if type(v) not in _SCALAR_TYPES:  # a container of tensors: (class, context, children)
                return (cls, None, tuple([_runtime_signature(c, offsets) for c in value]))
        return ("s", value if cls is not list else tuple(value))
    if not _is_node(cls):
        return ("s", value)  # an object no kernel is keyed on: hashed by identity, or unhashable
    return _node_signature(value, cls, offsets)


def _node_signature(value: Any, cls: type, offsets: bool = True) -> tuple:
    children, context = _children(value, cls)
    return (cls, context, tuple([_runtime_signature(c, offsets) for c in children]))


def _spec_signature(spec: ArgSpec) -> Any:
    if isinstance(spec, TensorSpec):
        return (spec.shape, spec.stride, spec.torch_dtype, spec.device, True)
    if isinstance(spec, StructSpec):
        return spec.signature()
    return ("s", spec.value)


def call_signature(args: tuple, kwargs: dict, offsets: bool = True) -> tuple:
    """Hashable signature of a call, cheap enough for the dispatch hot path: per argument its tensor
    spec, scalar value, or container class, context and children's signatures. OFFSETS False: every tensor
    counts as starting its storage (for dynamo, which breaks its graph on `storage_offset()`; the kernel's op then
    copies such an input itself, runtime/ops.py)."""
    sig = tuple([_runtime_signature(a, offsets) for a in args])
    if kwargs:
        sig += tuple((k, _runtime_signature(kwargs[k], offsets)) for k in sorted(kwargs))
    return sig


@dataclass(frozen=True)
class InputSpec:
    """The specs of one call: positional args, then keyword args (sorted by name). Each is a tensor spec,
    a scalar value (None included) or a container (StructSpec) of them."""

    args: tuple[ArgSpec, ...]
    kwargs: tuple[tuple[str, ArgSpec], ...] = ()

    @classmethod
    def of(cls, args: tuple, kwargs: dict | None = None) -> "InputSpec":
        kwargs = kwargs or {}
        return cls(tuple(_arg_spec(a, f"#{i}") for i, a in enumerate(args)),
                   tuple((k, _arg_spec(kwargs[k], k)) for k in sorted(kwargs)))

    def signature(self) -> tuple:
        """The same tuple call_signature() returns for a call matching this spec."""
        sig = tuple(_spec_signature(a) for a in self.args)
        return sig + tuple((k, _spec_signature(s)) for k, s in self.kwargs)

    @property
    def structured(self) -> bool:
        """Whether some argument is a container (tensors are then found by walking it)."""
        return any(isinstance(s, StructSpec) for s in (*self.args, *(s for _, s in self.kwargs)))

    @property
    def key(self) -> str:
        blob = json.dumps(self.to_dict(with_hints=False), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def to_dict(self, with_hints: bool = True) -> dict[str, Any]:
        def enc(s: ArgSpec) -> dict[str, Any]:
            d = s.to_dict()
            if not with_hints:
                _drop_hints(d)
            return d
        return {"args": [enc(a) for a in self.args], "kwargs": [[k, enc(s)] for k, s in self.kwargs]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InputSpec":
        return cls(tuple(_arg_from_dict(a) for a in d["args"]),
                   tuple((k, _arg_from_dict(s)) for k, s in d.get("kwargs", [])))

    def tensor_specs(self) -> list[TensorSpec]:
        """Every tensor's spec, containers walked: args, then kwargs (the order of flat_tensors)."""
        return [t for s in (*self.args, *(s for _, s in self.kwargs)) for t in _tensor_leaves(s)]

    def flat_tensors(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        """The tensors of a call matching this spec, in tensor_specs() order."""
        out: list[torch.Tensor] = []
        for s, a in zip(self.args, args):
            _collect(s, a, out)
        for k, s in self.kwargs:
            _collect(s, kwargs[k], out)
        return out

    def build(self, leaf: Callable[[TensorSpec], Any]) -> tuple[tuple, dict[str, Any]]:
        """Positional and keyword arguments of this structure: LEAF(spec) for each tensor, in
        tensor_specs() order; scalars, None and containers as recorded."""
        return tuple(_build(a, leaf) for a in self.args), {k: _build(s, leaf) for k, s in self.kwargs}

    def map_tensors(self, fn: Callable[[TensorSpec], TensorSpec]) -> "InputSpec":
        """This spec with FN applied to every tensor spec, containers included."""
        return InputSpec(tuple(_map_tensors(a, fn) for a in self.args),
                         tuple((k, _map_tensors(s, fn)) for k, s in self.kwargs))

    def describe(self) -> str:
        parts = [a.describe() for a in self.args] + [f"{k}={s.describe()}" for k, s in self.kwargs]
        return ", ".join(parts)


def _drop_hints(d: dict[str, Any]) -> None:
    d.pop("value_range", None)
    for item in d.get("items", ()):
        _drop_hints(item)


@dataclass(frozen=True)
class OutputSpec:
    """Shapes and dtypes of a call's outputs: `single` when forward returns one tensor; `tree` when it
    returns anything but a tensor or a tuple/list of tensors (tuples with None, dicts, ModelOutput):
    its structure, rebuilt around the tensors a kernel returns. `tensors` are the tensor leaves in order."""

    tensors: tuple[TensorSpec, ...]
    single: bool
    tree: StructSpec | None = None

    @classmethod
    def of(cls, out: Any) -> "OutputSpec":
        if isinstance(out, torch.Tensor):
            return cls((TensorSpec.of(out),), True)
        if type(out) in (tuple, list) and out and all(isinstance(o, torch.Tensor) for o in out):
            return cls(tuple(TensorSpec.of(o) for o in out), False)
        tree = _output_leaf_spec(out, "output")
        if not isinstance(tree, StructSpec):
            raise UnsupportedCall(f"output of type {type(out).__name__} is not a tensor or a container of tensors")
        tensors = _tensor_leaves(tree)
        if not tensors:
            raise UnsupportedCall(f"output of type {type(out).__name__} holds no tensor")
        return cls(tuple(tensors), False, tree)

    def rebuild(self, tensors: list[torch.Tensor]) -> Any:
        """The call's output from a kernel's tensors (in `tensors` order): the original container around them."""
        if self.tree is None:
            return tensors[0] if self.single else tuple(tensors)
        if len(tensors) != len(self.tensors):
            raise UnsupportedCall(f"{len(tensors)} output tensors, the call returns {len(self.tensors)}")
        it = iter(tensors)
        return self.tree.build(lambda _: next(it))

    def map_tensors(self, fn: Callable[[TensorSpec], TensorSpec]) -> "OutputSpec":
        """This spec with FN applied to every tensor spec, the tree's included."""
        tree = _map_tensors(self.tree, fn) if self.tree is not None else None
        return OutputSpec(tuple(fn(t) for t in self.tensors), self.single, tree)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"single": self.single, "tensors": [t.to_dict() for t in self.tensors]}
        if self.tree is not None:
            d["tree"] = self.tree.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OutputSpec":
        tree = _arg_from_dict(d["tree"]) if d.get("tree") else None
        return cls(tuple(_arg_from_dict(t) for t in d["tensors"]), bool(d["single"]),  # type: ignore[misc]
                   tree if isinstance(tree, StructSpec) else None)


def output_tensors(out: Any) -> list[Any]:
    """The tensors of a call's output, containers walked in pytree order, None left out: what a kernel
    returns for it and what proofs compare. Other leaves stay (and fail as not tensors)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) in (tuple, list):
        for o in out:
            if not isinstance(o, torch.Tensor):
                break
        else:
            return list(out)
    return [leaf for leaf in _pytree.tree_leaves(out) if leaf is not None]


def input_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Every tensor among a call's arguments, containers walked."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif _is_node(type(a)):
            out.extend(t for t in _pytree.tree_leaves(a) if isinstance(t, torch.Tensor))
    return out
