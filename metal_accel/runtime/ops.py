"""Accepted kernels as torch custom ops: metal_accel::k_<key>_<digest>(Tensor[] args, Tensor[] state)."""
from __future__ import annotations

import copy
import operator
from typing import Any, Callable

import torch
from torch import nn

from ..backends.protected import ProtectedTensors
from ..core.keys import module_config
from ..core.specs import InputSpec, OutputSpec, TensorSpec, output_tensors

_LIB = torch.library.Library("metal_accel", "FRAGMENT")
_OPS: dict[str, "KernelOp"] = {}
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}

StateRef = tuple[nn.Module, str, str]  # (submodule, "_parameters" or "_buffers", name)
_MISSING = object()
# the mode flag (the dispatcher runs eager in training mode itself) and the dispatcher's own slot
_UNWATCHED = frozenset({"training", "forward"})


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
        self.modules: list[nn.Module] = []  # per path
        for path, sub in module.named_modules(remove_duplicate=False):
            self.paths.append(path)
            self.modules.append(sub)
            # a copy: a list attribute changed in place later is not the value the op was proven with
            self.static[path] = copy.deepcopy(module_config(sub))
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

    def watch(self, proven: ModuleLayout) -> ConfigWatch:
        """A watch of this layout's modules, live, against the plain config PROVEN (an op's layout, maybe made from
        another module of equal fingerprint) holds; the rest of their public state as it is now."""
        return ConfigWatch(self, proven.static)


class ConfigWatch:
    """A module's non-tensor state as a kernel's op was proven with, checked cheaply before each call: the public
    plain attributes of the module and its descendants that the fingerprint and the op's view hold (by equality:
    1e-5 set again is the same), its other public attributes (a tensor that is no parameter or buffer, a config
    object, a function; same object, or an equal one) and children, which names are public (one added or deleted),
    and the version counter of a tensor kept as a plain attribute (written in place). `training` is left to the
    dispatcher's mode check. The check is one pass of C-level probes over the live dicts: itemgetters, len."""

    def __init__(self, layout: ModuleLayout, proven: dict[str, dict[str, Any]]) -> None:
        self._paths, self._modules = layout.paths, layout.modules
        self._other_tree = list(proven) != layout.paths  # not the op's tree: nothing can match
        # per watched dict (instance dicts; _modules of modules with children): (itemgetter of the watched names,
        # the dict, what the getter gave as proven, the dict's size then: -1 where its public names already differ)
        self._entries: list[tuple[Callable[[dict], Any], dict, Any, int]] = []
        self._names: list[frozenset[str] | None] = []  # per entry, its public names; None: every key (children)
        self._tensors: list[tuple[dict, str, int]] = []  # (instance dict, name, version) of plain tensor attributes
        self._plain: list[tuple[nn.Module, str, Any]] = []  # (module, name, proven value), for traced_changed
        self.reported = False
        for path, sub in zip(layout.paths, layout.modules):
            self._watch_module(sub, {k: v for k, v in proven.get(path, {}).items() if k not in _UNWATCHED})
        if self._other_tree:
            self._entries.append((_no_names, {}, (), -1))
            self._names.append(None)

    def _watch_module(self, sub: nn.Module, plain: dict[str, Any]) -> None:
        d, config = vars(sub), module_config(sub)
        self._plain += [(sub, k, v) for k, v in plain.items()]
        others = {k: v for k, v in d.items() if _watched_name(k) and k not in plain and k not in config}
        self._watch_dict(d, {**plain, **others}, public=True)
        self._tensors += [(d, k, v) for k, v in ((k, _version(t)) for k, t in others.items()) if v is not None]
        if sub._modules:
            self._watch_dict(sub._modules, dict(sub._modules), public=False)

    def _watch_dict(self, d: dict, expected: dict[str, Any], public: bool) -> None:
        names = frozenset(expected) if public else None
        size = len(d) if names is None or _public_names(d) == names else -1
        getter, values = _getter(expected)
        self._entries.append((getter, d, values, size))
        self._names.append(names)

    def changed(self) -> bool:
        try:
            for getter, d, expected, size in self._entries:
                if len(d) != size or getter(d) != expected:
                    return self._confirmed()
        except Exception:  # a deleted attribute (KeyError), or a replaced object whose == cannot answer
            return True
        return bool(self._tensors) and self._tensor_written()

    def traced_changed(self) -> bool:
        """changed() for dynamo to trace (the user's torch.compile of the model): the plain values only, read as
        module attributes, which dynamo guards; a later change retraces, and this is asked again."""
        if self._other_tree:
            return True
        for sub, name, value in self._plain:
            if getattr(sub, name, _MISSING) != value:
                return True
        return False

    def _confirmed(self) -> bool:
        """Some dict's size or values differ: True unless all that differs is the size of instance dicts whose
        public names are as proven (a private attribute came or went: their sizes are taken as the new ones)."""
        for i, ((getter, d, expected, size), names) in enumerate(zip(self._entries, self._names)):
            if getter(d) != expected:
                return True
            if len(d) != size:
                if names is None or _public_names(d) != names:
                    return True
                self._entries[i] = (getter, d, expected, len(d))
        return bool(self._tensors) and self._tensor_written()

    def _tensor_written(self) -> bool:
        for d, k, version in self._tensors:
            if _version(d[k]) != version:
                return True
        return False

    def difference(self) -> str:
        """What differs, in words, as "chain.shift is 1.0, proven with 0.125" (for the log; not on the hot path)."""
        if self._other_tree:
            return "its submodules are not those of the module the kernel was proven on"
        for getter, d, expected, _ in self._entries:
            keys = getter.__reduce__()[1] if getter is not _no_names else ()
            for k, v in zip(keys, expected):
                now = d.get(k, _MISSING)
                if now is _MISSING:
                    return f"{self._where(d)}{k} was deleted"
                if now is not v and not _equal(now, v):
                    if isinstance(v, (torch.Tensor, nn.Module)):
                        return f"{self._where(d)}{k} is another {type(now).__name__} than the one proven with"
                    return f"{self._where(d)}{k} is {_short(now)}, proven with {_short(v)}"
        for (_, d, _, size), names in zip(self._entries, self._names):
            if names is None and len(d) != size:
                return f"{self._where(d)}a child was added"
            if names is not None and _public_names(d) != names:
                return f"{self._where(d)}attributes {sorted(_public_names(d) ^ names)} came or went"
        for d, k, version in self._tensors:
            if _version(d[k]) != version:
                return f"{self._where(d)}{k} (a tensor) was written in place"
        return "its state differs from the proven one"

    def _where(self, d: dict) -> str:
        for path, sub in zip(self._paths, self._modules):
            if vars(sub) is d or sub._modules is d:
                return f"{path}." if path else ""
        return ""


def _no_names(d: dict) -> tuple:
    return ()


def _getter(expected: dict[str, Any]) -> tuple[Callable[[dict], tuple], tuple]:
    """An itemgetter of EXPECTED's names and what it gives from EXPECTED: a tuple even for one name (its items are
    compared identity first; a tensor or module compared alone would be compared by value, or raise)."""
    names = list(expected) if len(expected) != 1 else [*expected] * 2
    if not names:
        return _no_names, ()
    return operator.itemgetter(*names), tuple(expected[k] for k in names)


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False




def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _watched_name(name: str) -> bool:
    return not name.startswith("_") and name not in _UNWATCHED


def _public_names(d: dict) -> frozenset[str]:
    return frozenset(k for k in d if _watched_name(k))


def _version(value: Any) -> int | None:
    """A tensor's version counter; None for anything else, and for an inference tensor, which has none."""
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return value._version
    except RuntimeError:
        return None


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
                 layout: ModuleLayout, device_type: str, protect: bool = True) -> None:
        self.name = name
        self._protect = protect
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
        self._cached_view: tuple[ModuleView, tuple[int, ...]] | None = None
        _LIB.define(f"{name}(Tensor[] args, Tensor[] state) -> Tensor[]")
        _LIB.impl(name, self._impl, _DISPATCH_KEYS[device_type])
        torch.library.register_fake(f"metal_accel::{name}", self._fake, lib=_LIB)
        self.op = getattr(torch.ops.metal_accel, name).default

    def _module_view(self, state: list[torch.Tensor]) -> ModuleView:
        # The view holds the state tensors, so their ids cannot be reused while it is cached.
        # One (view, key) pair, read and written at once: equal modules share the op, maybe from several threads.
        key = tuple(map(id, state))
        cached = self._cached_view
        if cached is None or cached[1] != key:
            cached = self._cached_view = (self._layout.view(state), key)
        return cached[0]

    def _impl(self, tensors: list[torch.Tensor], state: list[torch.Tensor]) -> list[torch.Tensor]:
        if any(t.storage_offset() for t in tensors):  # reached from a compiled graph, which does not see offsets:
            tensors = [_at_storage_start(t) for t in tensors]  # the kernel runs only on what its proof tried
        if not self._protect:
            return self._run_host(tensors, state)
        with ProtectedTensors(state, tensors):  # here, not in __call__: a compiled graph runs the op on its own
            return self._run_host(tensors, state)

    def _run_host(self, tensors: list[torch.Tensor], state: list[torch.Tensor]) -> list[torch.Tensor]:
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
        # the strides the proof saw the kernel return (eager's, which the proof checks), not contiguous ones: a
        # compiled graph reads the real output through these (a channels_last output failed inductor's strides check)
        return [like.new_empty_strided(t.shape, t.stride, dtype=t.torch_dtype) for t in self.output_spec.tensors]

    def __call__(self, args: tuple, kwargs: dict, state: list[torch.Tensor]) -> Any:
        if self._tensors_only and not kwargs and _plain_eager(args):  # the hot path: host code called directly
            if self._protect:
                with ProtectedTensors(state, args):  # no kernel may write the module's tensors or the inputs
                    out = self._host(self._module_view(state), *args)
            else:
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
              output_spec: OutputSpec, module: nn.Module, device_type: str, variant: str = "",
              protect: bool = True) -> KernelOp:
    """The custom op for (entry, candidate[, VARIANT of its library]), registered once per process and shared by
    equal modules. PROTECT: its host code's kernels may not write the module's tensors or the call's inputs
    (backends/protected.py); False only for the package's own host code, which is reviewed (a few us a call)."""
    name = f"k_{entry_key[:16]}_{digest[:8]}" + (f"_{variant}" if variant else "")
    op = _OPS.get(name)
    if op is None:
        op = _OPS[name] = KernelOp(name, make_host(), spec, output_spec, ModuleLayout(module), device_type,
                                   protect)
    return op
