"""Cache keys: module fingerprint + input spec + backend."""
from __future__ import annotations

import functools
import hashlib
import json
import sys
import types
from typing import Any

from torch import nn

from . import pyast
from .specs import InputSpec, TensorSpec, UnsupportedCall, dtype_name

_PLAIN = (bool, int, float, str, type(None))


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, (tuple, list)) and all(_plain(v) for v in value)


def class_source(cls: type) -> str:
    """Source of the module class's methods and of the module-level functions its methods call.

    Raises UnsupportedCall when the source is not available (built-in or dynamically created classes).
    """
    try:
        parts = [pyast.getsource(cls)]
    except (OSError, TypeError) as exc:
        raise UnsupportedCall(f"no source for {class_path(cls)}: {exc}") from None
    module_globals = vars(sys.modules[cls.__module__]) if cls.__module__ in sys.modules else {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            break
        for attr in vars(klass).values():
            code = getattr(attr, "__code__", None)
            if not isinstance(code, types.CodeType):
                continue
            for name in code.co_names:
                fn = module_globals.get(name)
                if name in seen or not isinstance(fn, types.FunctionType) or fn.__module__ != cls.__module__:
                    continue
                seen.add(name)
                try:
                    parts.append(pyast.getsource(fn))
                except (OSError, TypeError):
                    parts.append(f"<no source: {name}>")
        if klass is not cls and klass.__module__ != "torch.nn.modules.module":
            try:
                parts.append(pyast.getsource(klass))
            except (OSError, TypeError):
                pass
    return "\n".join(parts)


@functools.lru_cache(maxsize=None)
def class_source_sha(cls: type) -> str:
    """sha256 of class_source(cls); raises UnsupportedCall when there is no source."""
    return hashlib.sha256(class_source(cls).encode()).hexdigest()


def module_config(module: nn.Module) -> dict[str, Any]:
    """The module's own non-tensor attributes (public, plain values), `training` included."""
    return {k: v for k, v in sorted(vars(module).items()) if not k.startswith("_") and _plain(v)}


def module_fingerprint(module: nn.Module) -> str:
    """sha256 of class path, class source, config, parameter/buffer specs and children's fingerprints."""
    cls = type(module)
    tensors = [[name, list(t.shape), dtype_name(t.dtype)]
               for name, t in list(module._parameters.items()) + list(module._buffers.items()) if t is not None]
    children = [[name, module_fingerprint(child)] for name, child in module.named_children()]
    blob = {
        "class": class_path(cls),
        "source": class_source_sha(cls),
        "config": json.loads(json.dumps(module_config(module), default=repr)),
        "tensors": tensors,
        "children": children,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def entry_key(fingerprint: str, spec: InputSpec, backend: str) -> str:
    """The cache key of one (module, input spec, backend)."""
    return hashlib.sha256(f"{fingerprint}\0{spec.key}\0{backend}".encode()).hexdigest()[:32]



def generic_key(fingerprint: str, spec: InputSpec, backend: str, kind: str = "rows") -> str | None:
    """The key under which a kernel proven for any leading dimensions of its inputs (SHAPE_GENERIC =
    "rows": the kernel library's) is also stored: the spec without those dimensions (each input's dtype,
    rank, last dimension, device). KIND "kv" (attention over a KV cache): the spec with the batch and the kv
    length left out (kv_generic_spec). None for calls of other forms: keywords, an argument that is not a
    tensor, or several inputs whose leading dimensions differ (a broadcast residual is another call)."""
    if kind in ("kv", "rope"):
        generic = kv_generic_spec(spec) if kind == "kv" else rope_generic_spec(spec)
        return hashlib.sha256(f"{fingerprint}\0{generic}\0{backend}".encode()).hexdigest()[:32] if generic else None
    tensors = row_inputs(spec)
    if tensors is None:
        return None
    rows = "|".join(f"rows:{t.dtype}:{len(t.shape)}:{t.shape[-1]}:{t.device}" for t in tensors)
    return hashlib.sha256(f"{fingerprint}\0{rows}\0{backend}".encode()).hexdigest()[:32]


def kv_generic_spec(spec: InputSpec) -> str | None:
    """An attention call's spec (query [B, Hq, q, D], key and value [B, Hkv, L, D], optionally a mask
    [B or 1, Hq or 1, q, L]) as text with the batch B and the kv length L written as letters: one text for
    every batch size and cache length. None for calls of other forms."""
    tensors = spec.tensor_specs()
    if spec.kwargs or len(spec.args) != len(tensors) or len(tensors) not in (3, 4) \
            or any(len(t.shape) != 4 for t in tensors):
        return None
    batch, length = tensors[0].shape[0], tensors[1].shape[2]
    parts = []
    for i, t in enumerate(tensors):
        dims: list[object] = list(t.shape)
        dims[0] = "B" if dims[0] == batch else dims[0]
        if i in (1, 2):
            dims[2] = "L"
        elif i == 3:
            dims[3] = "L" if dims[3] == length else dims[3]
        parts.append(f"{t.dtype}{dims}{'c' if t.contiguous else 's'}@{t.device}")
    return "kv:" + ";".join(parts)


def rope_generic_spec(spec: InputSpec) -> str | None:
    """A rotary-embedding call's spec (q [B, Hq, S, D], k [B, Hkv, S, D], cos and sin [B or 1, S, D]) as text with
    the batch B and the sequence length S written as letters (KIND "rope"), but for S = 1: a decode step is timed
    and decided apart from prefill (its host overhead is another regime: 0.7x at one position, 1.3-16x at 128-512
    on the CPU). None for calls of other forms."""
    tensors = spec.tensor_specs()
    if spec.kwargs or len(spec.args) != 4 or len(tensors) != 4 \
            or [len(t.shape) for t in tensors] != [4, 4, 3, 3]:
        return None
    batch, length = tensors[0].shape[0], tensors[0].shape[2]
    parts = []
    for i, t in enumerate(tensors):
        dims: list[object] = list(t.shape)
        seq = 2 if i < 2 else 1
        dims[0] = "B" if dims[0] == batch and (i < 2 or batch > 1) else dims[0]  # cos [1, S, D]: broadcast
        dims[seq] = "S" if dims[seq] == length and length > 1 else dims[seq]  # decode (one position): its own
        parts.append(f"{t.dtype}{dims}@{t.device}")  # any layout: the sweep proves both of HF's (rope_sweep_specs)
    return "rope:" + ";".join(parts)


def row_inputs(spec: InputSpec) -> list[TensorSpec] | None:
    """SPEC's inputs when the call is rows of them: positional tensors only, each of rank 1 or more, all with the
    first's leading dimensions (a row-wise kernel walks their rows together); None otherwise."""
    if spec.kwargs or not spec.args or not all(isinstance(a, TensorSpec) and a.shape for a in spec.args):
        return None
    tensors: list[TensorSpec] = list(spec.args)  # type: ignore[arg-type]
    if any(t.shape[:-1] != tensors[0].shape[:-1] for t in tensors):
        return None
    return tensors
