"""Accepted kernels as torch custom ops: metal_accel::k_<key>_<digest>(Tensor[] args, Tensor[] state)."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..core.keys import module_config
from ..core.specs import InputSpec, OutputSpec, TensorSpec, output_tensors

_LIB = torch.library.Library("metal_accel", "FRAGMENT")
_OPS: dict[str, "KernelOp"] = {}
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}

StateRef = tuple[nn.Module, str, str]  # (submodule, "_parameters" or "_buffers", name)


class ModuleView:
    """What host code sees as `module`: the module's tensors, plain config and children; no methods."""

    def __init__(self, attrs: dict[str, Any]) -> None:
        self.__dict__.update(attrs)

    def __repr__(self) -> str:
        return f"ModuleView({', '.join(sorted(k for k in self.__dict__ if not k.startswith('_')))})"

    def __getitem__(self, index: int) -> ModuleView:
        """A numbered child (nn.Sequential, nn.ModuleList), as module.downsample[0]; nothing else."""
        child = self.__dict__.get(str(index)) if type(index) is int and index >= 0 else None
        if not isinstance(child, ModuleView):
            raise IndexError(f"no child {index!r}")
        return child

    def __len__(self) -> int:
        """How many numbered children (0, 1, ...) there are, as len(nn.Sequential)."""
        n = 0
        while isinstance(self.__dict__.get(str(n)), ModuleView):
            n += 1
        return n


class ModuleLayout:
    """Where a module's parameters and buffers live, and its static config, per submodule path."""

    def __init__(self, module: nn.Module) -> None:
        self.paths: list[str] = []
        self.static: dict[str, dict[str, Any]] = {}
        self.tensor_slots: list[tuple[str, str]] = []  # (path, attribute) per state tensor
        refs: list[StateRef] = []
        for path, sub in module.named_modules(remove_duplicate=False):
            self.paths.append(path)
            self.static[path] = module_config(sub)
            for store in ("_parameters", "_buffers"):
                for name, t in getattr(sub, store).items():
                    if t is not None:
                        refs.append((sub, store, name))
                        self.tensor_slots.append((path, name))
        self.refs = refs
        # the _parameters/_buffers dicts themselves: reassigning a weight updates them in place
        self._slots = [(getattr(sub, store), name) for sub, store, name in refs]

    def gather(self) -> list[torch.Tensor]:
        """The module's current state tensors (re-read every call, so reassigned weights are seen)."""
        return [d[name] for d, name in self._slots]

    def view(self, state: list[torch.Tensor]) -> ModuleView:
        return build_view(self.static, self.tensor_slots, state)


def build_view(static: dict[str, dict[str, Any]], tensor_slots: list[tuple[str, str]],
               state: list[torch.Tensor]) -> ModuleView:
    """The ModuleView tree of a module from its per-path config and its state tensors."""
    attrs: dict[str, dict[str, Any]] = {p: dict(a) for p, a in static.items()}
    for (path, name), t in zip(tensor_slots, state):
        attrs[path][name] = t
    views = {path: ModuleView(a) for path, a in attrs.items()}
    for path in attrs:
        if path:
            parent, _, leaf = path.rpartition(".")
            setattr(views[parent], leaf, views[path])
    views[""].__dict__["_state"] = state  # the whole state, for a candidate's prepare() (sandbox/host.py); private
    return views[""]


class KernelOp:
    """One installed kernel: a registered custom op specialized on one input spec. The op takes the call's
    tensors flat (containers walked, in the spec's order); host code gets the call's own structure back
    (tuples, dicts, None), and the tensors it returns are put back in the call's output container."""

    def __init__(self, name: str, host_forward: Callable[..., Any], spec: InputSpec, output_spec: OutputSpec,
                 layout: ModuleLayout, device_type: str) -> None:
        self.name = name
        self.spec = spec
        self.output_spec = output_spec
        self._host = host_forward
        self._layout = layout
        self._positional = [(isinstance(s, TensorSpec), getattr(s, "value", None)) for s in spec.args]
        self._keywords = [(k, isinstance(s, TensorSpec), getattr(s, "value", None)) for k, s in spec.kwargs]
        self._tensors_only = not self._keywords and all(is_t for is_t, _ in self._positional)
        # containers among the arguments: the op takes their tensors flat, host code gets the structure back
        self._structured = spec.structured
        self._plain_out = output_spec.tree is None
        self._view_key: tuple[int, ...] = ()
        self._view: ModuleView | None = None
        _LIB.define(f"{name}(Tensor[] args, Tensor[] state) -> Tensor[]")
        _LIB.impl(name, self._impl, _DISPATCH_KEYS[device_type])
        torch.library.register_fake(f"metal_accel::{name}", self._fake, lib=_LIB)
        self.op = getattr(torch.ops.metal_accel, name).default

    def _module_view(self, state: list[torch.Tensor]) -> ModuleView:
        # The view holds the state tensors, so their ids cannot be reused while it is cached.
        key = tuple(map(id, state))
        if self._view is None or key != self._view_key:
            self._view, self._view_key = self._layout.view(state), key
        return self._view

    def _impl(self, tensors: list[torch.Tensor], state: list[torch.Tensor]) -> list[torch.Tensor]:
        if any(t.storage_offset() for t in tensors):  # reached from a compiled graph, which does not see offsets:
            tensors = [_at_storage_start(t) for t in tensors]  # the kernel runs only on what its proof tried
        if self._tensors_only:
            return _as_list(self._host(self._module_view(state), *tensors))
        it = iter(tensors)
        if self._structured:
            args, kwargs = self.spec.build(lambda _: next(it))
            return _as_list(self._host(self._module_view(state), *args, **kwargs))
        args = [next(it) if is_t else value for is_t, value in self._positional]
        kwargs = {k: next(it) if is_t else value for k, is_t, value in self._keywords}
        return _as_list(self._host(self._module_view(state), *args, **kwargs))

    def _fake(self, tensors: list[torch.Tensor], state: list[torch.Tensor]) -> list[torch.Tensor]:
        like = tensors[0] if tensors else state[0]
        return [like.new_empty(t.shape, dtype=t.torch_dtype) for t in self.output_spec.tensors]

    def __call__(self, args: tuple, kwargs: dict, state: list[torch.Tensor]) -> Any:
        if self._tensors_only and not kwargs and _plain_eager(args):  # the hot path: host code called directly
            out = self._host(self._module_view(state), *args)
            if self.output_spec.single and type(out) is torch.Tensor:
                return out
            outs = _as_list(out)
        else:
            if self._structured:
                tensors = self.spec.flat_tensors(args, kwargs)
            else:
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                if kwargs:
                    tensors += [kwargs[k] for k, is_t, _ in self._keywords if is_t]
            if _plain_eager(tensors):
                outs = self._impl(tensors, state)  # the op's own implementation, minus ~3 us of dispatch
            else:
                outs = self.op(tensors, state)  # compiling, exporting, profiling or under a mode: the real op
        if self._plain_out:
            return outs[0] if self.output_spec.single else tuple(outs)
        return self.output_spec.rebuild(list(outs))  # the call's own container: ModelOutput, tuple with None


def _at_storage_start(t: torch.Tensor) -> torch.Tensor:
    """T, or a copy of it with the same shape and strides that starts its own storage when T is a view at an offset."""
    if not t.storage_offset():
        return t
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _as_list(out: Any) -> list[torch.Tensor]:
    """A host forward's result as the op's flat tensor list: containers walked, None left out."""
    return [out] if isinstance(out, torch.Tensor) else output_tensors(out)


_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_profiler_enabled = torch._C._autograd._profiler_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled


def _plain_eager(tensors: list[torch.Tensor] | tuple) -> bool:
    """True when calling the implementation directly is indistinguishable from calling the op:
    no compiler or exporter tracing, no profiler (which should see the op by name), no torch
    function or dispatch mode, and only plain tensors (or parameters) among the inputs: no fake
    tensors, proxies or other subclasses."""
    if _is_compiling() or _profiler_enabled() or _dispatch_modes() or _function_modes():
        return False
    for t in tensors:
        if type(t) is not _Tensor and type(t) is not torch.nn.Parameter:
            return False
    return True


def kernel_op(entry_key: str, digest: str, make_host: Callable[[], Callable[..., Any]], spec: InputSpec,
              output_spec: OutputSpec, module: nn.Module, device_type: str, variant: str = "") -> KernelOp:
    """The custom op for (entry, candidate[, VARIANT of its library]), registered once per process and shared by
    equal modules."""
    name = f"k_{entry_key[:16]}_{digest[:8]}" + (f"_{variant}" if variant else "")
    op = _OPS.get(name)
    if op is None:
        op = _OPS[name] = KernelOp(name, make_host(), spec, output_spec, ModuleLayout(module), device_type)
    return op
