"""Input and output specs of a module call: what a cache key and a kernel are specialized on."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from .errors import MetalAccelError

_SCALARS = (bool, int, float, str, type(None))


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


ArgSpec = Union[TensorSpec, ScalarSpec]


def _arg_spec(value: Any, where: str) -> ArgSpec:
    if isinstance(value, torch.Tensor):
        return TensorSpec.of(value)
    if isinstance(value, _SCALARS):
        return ScalarSpec(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value):
        return ScalarSpec(tuple(value))
    raise UnsupportedCall(f"argument {where} of type {type(value).__name__} is not a tensor or a scalar")


def _arg_from_dict(d: dict[str, Any]) -> ArgSpec:
    if d["tensor"]:
        vr = d.get("value_range")
        return TensorSpec(tuple(d["shape"]), d["dtype"], tuple(d["stride"]), d["device"],
                          tuple(vr) if vr is not None else None)
    value = d["value"]
    return ScalarSpec(tuple(value) if isinstance(value, list) else value)


def _runtime_signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # torch.Size hashes and compares equal to the tuple
        # is_cpu / is_cuda first: `value.device` builds a torch.device object (a quarter microsecond)
        kind = "cpu" if value.is_cpu else "cuda" if value.is_cuda else value.device.type
        return (value.shape, value.stride(), value.dtype, kind)
    if isinstance(value, list):
        return ("s", tuple(value))
    return ("s", value)


def call_signature(args: tuple, kwargs: dict) -> tuple:
    """Hashable signature of a call, cheap enough for the dispatch hot path."""
    sig = tuple([_runtime_signature(a) for a in args])
    if kwargs:
        sig += tuple((k, _runtime_signature(kwargs[k])) for k in sorted(kwargs))
    return sig


@dataclass(frozen=True)
class InputSpec:
    """The tensor specs and scalar values of one call: positional args, then keyword args."""

    args: tuple[ArgSpec, ...]
    kwargs: tuple[tuple[str, ArgSpec], ...] = ()

    @classmethod
    def of(cls, args: tuple, kwargs: dict | None = None) -> "InputSpec":
        kwargs = kwargs or {}
        return cls(tuple(_arg_spec(a, f"#{i}") for i, a in enumerate(args)),
                   tuple((k, _arg_spec(kwargs[k], k)) for k in sorted(kwargs)))

    def signature(self) -> tuple:
        """The same tuple call_signature() returns for a call matching this spec."""
        def one(spec: ArgSpec) -> Any:
            if isinstance(spec, TensorSpec):
                return (spec.shape, spec.stride, spec.torch_dtype, spec.device)
            return ("s", spec.value)
        sig = tuple(one(a) for a in self.args)
        return sig + tuple((k, one(s)) for k, s in self.kwargs)

    @property
    def key(self) -> str:
        blob = json.dumps(self.to_dict(with_hints=False), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def to_dict(self, with_hints: bool = True) -> dict[str, Any]:
        def enc(s: ArgSpec) -> dict[str, Any]:
            d = s.to_dict()
            if not with_hints:
                d.pop("value_range", None)
            return d
        return {"args": [enc(a) for a in self.args], "kwargs": [[k, enc(s)] for k, s in self.kwargs]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InputSpec":
        return cls(tuple(_arg_from_dict(a) for a in d["args"]),
                   tuple((k, _arg_from_dict(s)) for k, s in d.get("kwargs", [])))

    def tensor_specs(self) -> list[TensorSpec]:
        return [s for s in self.args if isinstance(s, TensorSpec)] + \
               [s for _, s in self.kwargs if isinstance(s, TensorSpec)]

    def describe(self) -> str:
        parts = [a.describe() for a in self.args] + [f"{k}={s.describe()}" for k, s in self.kwargs]
        return ", ".join(parts)


@dataclass(frozen=True)
class OutputSpec:
    """Shapes and dtypes of a call's outputs; `single` when forward returns one tensor."""

    tensors: tuple[TensorSpec, ...]
    single: bool

    @classmethod
    def of(cls, out: Any) -> "OutputSpec":
        if isinstance(out, torch.Tensor):
            return cls((TensorSpec.of(out),), True)
        if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
            return cls(tuple(TensorSpec.of(o) for o in out), False)
        raise UnsupportedCall(f"output of type {type(out).__name__} is not a tensor or a tuple of tensors")

    def to_dict(self) -> dict[str, Any]:
        return {"single": self.single, "tensors": [t.to_dict() for t in self.tensors]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OutputSpec":
        return cls(tuple(_arg_from_dict(t) for t in d["tensors"]), bool(d["single"]))  # type: ignore[misc]
