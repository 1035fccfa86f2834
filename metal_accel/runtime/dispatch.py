"""The dispatcher that replaces a module's forward: input spec -> kernel op, else the original forward."""
from __future__ import annotations

import copy
import functools
import inspect
import logging
import warnings
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

from ..core.keys import class_source
from ..core.specs import UnsupportedCall, call_signature, input_tensors
from . import spot_check
from .ops import ConfigWatch, KernelOp, ModuleLayout, _is_compiling

log = logging.getLogger(__name__)
_tracing_state = torch._C._get_tracing_state
_bypass_depth = 0
_UNRESOLVED = object()
SETTLE_CALLS = 16  # calls in a row of signatures already resolved to eager before a lazy dispatcher settles
bypass = False  # _bypass_depth > 0; a bool so torch.compile guards see one value at any depth


def enter_eager() -> None:
    global _bypass_depth, bypass
    _bypass_depth += 1
    bypass = True


def exit_eager() -> None:
    global _bypass_depth, bypass
    _bypass_depth -= 1
    bypass = _bypass_depth > 0


class eager_only:  # noqa: N801  (used like a function: `with eager_only():`)
    """Within this block every module runs its own eager forward: no kernels, no torch.compile.

    Public as `metal_accel.eager()`: for reference runs and side-by-side timing. A plain class
    rather than @contextmanager: it sits on the hot path of installed torch.compile candidates.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        enter_eager()

    def __exit__(self, *exc: Any) -> None:
        exit_eager()


class Dispatcher:
    """Installed as `module.forward`; the class's own forward stays untouched, so restore() is exact."""

    def __init__(self, module: nn.Module, original: Callable[..., Any], *, strict: bool = False) -> None:
        self.original = original
        self.module_name = type(module).__name__
        self.layout = ModuleLayout(module)
        self._child_hooks: tuple[dict, ...] | None = None  # the descendants' hook dicts (_hooked), read at first use
        self.table: dict[tuple, KernelOp] = {}
        self.strict = strict
        self.hits = 0
        self.misses = 0
        self.grad_calls = 0  # calls that ran eager because autograd was recording
        self.failures: dict[str, str] = {}  # op name -> why it was switched off
        self.honor_bypass = True  # False for the timing probe, which must always run its kernel
        # Auto-instrumentation resolves signatures lazily: asked once per new signature, answer kept.
        self.resolver: Callable[[tuple, dict], KernelOp | None] | None = None
        self._resolved: dict[tuple, KernelOp | None] = {}
        # called once SETTLE_CALLS calls in a row were of signatures already resolved to eager, with no kernel in
        # the table: auto-instrumentation then gives the module its own forward back (hook.py)
        self.on_settled: Callable[[], None] | None = None
        self._quiet_calls = 0
        # every call, whatever its signature (a model compiled whole, proven on the application's own workload)
        self.fallback: Callable[[tuple, dict, list], Any] | None = None
        self._first_shapes: frozenset | None = frozenset()  # None: no cheap pre-check possible
        self._arities: frozenset[int] = frozenset()
        # kernels are proven with the subtree in eval mode; in training mode it runs eager. The flags watched:
        # the module's own, and those of descendants whose code reads theirs (BatchNorm, Dropout, ...)
        self._mode_modules = tuple(m for i, m in enumerate(module.modules())
                                   if "training" in m.__dict__ and (i == 0 or reads_training(type(m))))
        self._mode_flags: tuple[dict, ...] | None = None  # their instance dicts, read on first use
        self.auto = False  # made by auto-instrumentation (a lazy resolver on the module), not by optimize()
        self._form_slot = 0
        self._form = self._state_form()  # the dtype and device the ops were proven with (first float state tensor)
        self._form_warned = False
        # per op: the module's plain state as the op was proven with, checked on each call (a changed
        # `norm.eps` runs eager); None for an op without a layout (a torch.compile: dynamo guards it itself)
        self._watches: dict[Any, ConfigWatch | None] = {}
        self.config_calls = 0  # calls that ran eager because the module's config differs from the proven one

    @functools.cached_property
    def __signature__(self) -> inspect.Signature | None:
        # the module's own forward's: callers that inspect `forward` see what they would without the dispatcher
        # (HF generate() passes logits_to_keep and position_ids only to a forward whose signature names them)
        try:
            return inspect.signature(self.original)
        except (TypeError, ValueError):
            return None

    def add(self, signature: tuple, op: KernelOp) -> None:
        self.table[signature] = op
        self._watches[op] = self._watch_for(op)
        self._form = self._state_form()
        self._table_changed()

    def _state_form(self) -> tuple | None:
        """(dtype, device) of the module's first floating-point state tensor (an integer buffer keeps its dtype
        through `model.double()`), remembering which it is; None for a module without one."""
        for i, (store, name) in enumerate(self.layout._slots):
            t = store.get(name)
            if t is not None and t.is_floating_point():
                self._form_slot = i
                return (t.dtype, t.device)
        return None

    def _moved(self, state: list[torch.Tensor] | None = None) -> bool:
        """True when the module's state changed dtype or device since its ops were proven (`model.double()`,
        `.to("cuda")`): a call signature names the inputs only, so the ops would run unproven (a kernel written
        for float32 on float64 weights, a compiled graph recompiled unchecked). Such calls run eager."""
        if self._form is None:
            return False
        slot = self._form_slot
        if state is None:
            store, name = self.layout._slots[slot]
            t = store.get(name)
        else:
            t = state[slot]
        form = None if t is None else (t.dtype, t.device)
        if form == self._form:
            return False
        if not self._form_warned:
            self._form_warned = True
            log.warning("metal_accel: %s: its weights are now %s on %s, not %s on %s as proven: it runs eager "
                        "(optimize() the model again to prove kernels for it)", self.module_name, form[0] if form
                        else None, form[1] if form else None, self._form[0], self._form[1])
        return True

    def _watch_for(self, op: Any) -> ConfigWatch | None:
        """The watch of this module's state against what OP was proven with (OP's own layout: an op shared by
        equal modules holds the config of the one it was made for)."""
        proven = getattr(op, "_layout", None)
        return self.layout.watch(proven) if isinstance(proven, ModuleLayout) else None

    def _config_changed(self, op: Any) -> bool:
        """True when a plain attribute of the module or a descendant (`norm.eps`, `attn.scaling`), a tensor kept
        as a plain attribute, a child, or the set of public attributes differs from what OP was proven with:
        the call then runs eager, as a signature without a kernel would, until the state is back or a new
        optimize() proves a kernel for it. Logged once per op."""
        watch = self._watches.get(op, _UNRESOLVED)
        if watch is _UNRESOLVED:  # put in the table by hand: watched from now on
            watch = self._watches[op] = self._watch_for(op)
        if _is_compiling():  # dynamo traces this call: what it can trace and guard, and no logging
            return watch is not None and watch.traced_changed()
        if watch is None or not watch.changed():
            return False
        if not watch.reported:
            watch.reported = True
            log.warning("metal_accel: %s: %s: it runs eager (its kernel %s was proven with the old state; "
                        "optimize() the model again to prove one for the new)", self.module_name,
                        watch.difference(), getattr(op, "name", op))
        return True

    def _hooked(self) -> bool:
        """True when a forward hook would miss a call the op replaces: one on a descendant (registered before or
        after optimize(): activation capture, steering, adapters) or a global one. The module's own hooks run
        around the dispatcher."""
        if self._child_hooks is None:
            self._child_hooks = tuple(d for sub in self.layout.modules[1:]
                                      for d in (sub._forward_hooks, sub._forward_pre_hooks))
        return bool(_nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks
                    or any(self._child_hooks))

    def remove(self, signature: tuple) -> None:
        self.table.pop(signature, None)
        self._table_changed()

    def _table_changed(self) -> None:
        self._first_shapes = _first_shapes(self.table)
        self._arities = frozenset(len(sig) for sig in self.table)  # arguments per call, keywords included

    def kernel_for(self, args: tuple, kwargs: dict) -> KernelOp | None:
        try:
            sig = call_signature(args, kwargs)
        except TypeError:  # an unhashable argument: no kernel can be specialized on it
            return None
        if self.resolver is None:
            return self.table.get(sig)
        op = self._resolved.get(sig, _UNRESOLVED)  # one hash of the signature on the hot path
        if op is _UNRESOLVED:
            self._quiet_calls = 0
            op = self._resolved[sig] = self.resolver(args, kwargs)
            if op is not None:
                form = self._state_form()
                if form != self._form:  # resolved for weights moved since (model.double()): earlier ops are stale
                    self.table = {s: o for s, o in self.table.items() if s == sig}
                    self._resolved = {s: o for s, o in self._resolved.items() if o is None or s == sig}
                    self._form, self._form_warned = form, False
                self.table[sig] = op
                self._watches[op] = self._watch_for(op)
        elif op is None and self.on_settled is not None and not self.table:
            self._quiet_calls += 1
            if self._quiet_calls >= SETTLE_CALLS:
                settled, self.on_settled = self.on_settled, None
                settled()
        return op

    def _traced_op(self, args: tuple, kwargs: dict) -> KernelOp | None:
        """The op to put in the graph when the user's own torch.compile traces this module: only a
        kernel's custom op, already resolved. An installed torch.compile, or a lazy cache lookup on
        fake tensors, has no place in someone else's graph: the eager code is traced instead."""
        if self.resolver is not None:
            return None
        try:
            op = self.table.get(call_signature(args, kwargs, offsets=False))
        except TypeError:
            return None
        return op if isinstance(op, KernelOp) and not self._config_changed(op) else None

    def in_training(self) -> bool:
        """True when the module or one of its descendants is in training mode: kernels are for eval only."""
        flags = self._mode_flags
        if flags is None:  # (again after a deepcopy: the copy's modules have dicts of their own)
            flags = self._mode_flags = tuple(m.__dict__ for m in self._mode_modules)
        for f in flags:  # instance dicts: a third of the cost of attribute lookups
            if f["training"]:
                return True
        return False

    def __deepcopy__(self, memo: dict) -> Dispatcher | None:
        """A copied model (`copy.deepcopy`) keeps the kernels, which read the copy's own weights at each call.
        Ops bound to this very module (its torch.compile, a CUDA graph of its tensors, the whole model compiled)
        stay behind: the copy would run the original's weights. An auto-instrumentation dispatcher is not copied
        at all (the copy makes its own at its first call)."""
        if self.auto:
            return None
        new = Dispatcher.__new__(Dispatcher)
        memo[id(self)] = new
        bound = {"table", "_resolved", "fallback", "resolver", "on_settled", "_mode_flags", "__signature__",
                 "_watches", "_child_hooks"}
        for key, value in self.__dict__.items():
            if key not in bound:
                new.__dict__[key] = copy.deepcopy(value, memo)
        new.table = {sig: copy.deepcopy(op, memo) for sig, op in self.table.items() if isinstance(op, KernelOp)}
        new._resolved, new.resolver, new.on_settled, new.fallback = {}, None, None, None
        new._mode_flags = None
        new._watches = {}  # the copy's own, made at its first call: its modules are still being copied now
        new._child_hooks = None  # likewise its descendants' hook dicts
        new._table_changed()
        return new

    def __reduce_ex__(self, protocol: Any) -> tuple:
        """Pickled (`torch.save(model)`), a dispatcher becomes the module's own forward: kernels and compiled
        graphs belong to this process; optimize() the loaded model again (its cache makes that quick)."""
        if self.auto:
            return (type(None), ())
        original = self.original
        if inspect.ismethod(original) and isinstance(original.__self__, nn.Module):
            # the loaded module's class forward (whatever its function is named); no metal_accel needed to load
            return (getattr, (original.__self__, "forward"))
        return (_same, (original,))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fallback is not None and not (bypass and self.honor_bypass) and _tracing_state() is None \
                and not _is_compiling() and not self.in_training() \
                and (not self.table or self.kernel_for(args, kwargs) is None):  # a signature's own op comes first
            if self._moved() or self._hooked():
                return self.original(*args, **kwargs)
            self.hits += 1
            return self.fallback(args, kwargs, [])
        if (bypass and self.honor_bypass) or (not self.table and self.resolver is None) \
                or _tracing_state() is not None:  # torch.jit.trace records the module's own forward
            return self.original(*args, **kwargs)
        if self.resolver is None:  # the common misses, decided without a full signature
            shapes = self._first_shapes
            if len(args) + len(kwargs) not in self._arities or (
                    shapes is not None and args and type(args[0]) is torch.Tensor and _shape(args[0]) not in shapes):
                self._count("misses")
                return self.original(*args, **kwargs)
        if self.in_training():
            return self.original(*args, **kwargs)
        if not _is_compiling():
            return self.run_checked(args, kwargs)
        # dynamo traces this call: the kernel's custom op goes into the user's graph (no counting: dynamo would
        # read a counter bumped in the graph as a constant and recompile on every call)
        op = self._traced_op(args, kwargs)
        return self.original(*args, **kwargs) if op is None else self._run_op(op, args, kwargs, count=False)

    def run_checked(self, args: tuple, kwargs: dict) -> Any:
        """A call known to be outside any tracer or compile, not bypassed, with no fallback, the module in eval
        mode: its kernel, or the original forward. The auto-instrumented forward (auto/hook.py) has made those
        checks itself; calling here saves repeating them on every call of a patched class."""
        op = self.kernel_for(args, kwargs)
        if op is None:
            self.misses += 1
            return self.original(*args, **kwargs)
        return self._run_op(op, args, kwargs, count=True)

    def _run_op(self, op: KernelOp, args: tuple, kwargs: dict, count: bool) -> Any:
        if self._hooked():
            return self.original(*args, **kwargs)
        try:
            state = self.layout.gather()
        except KeyError:  # a parameter or buffer left its slot (prune, weight_norm, parametrize): eager
            self.config_calls += count
            return self.original(*args, **kwargs)
        if self._form is not None and self._moved(state):
            return self.original(*args, **kwargs)
        if self._config_changed(op):
            if count:
                self.config_calls += 1
            return self.original(*args, **kwargs)
        if torch.is_grad_enabled() and (any(t.requires_grad for t in state)
                                        or any(t.requires_grad for t in input_tensors(args, kwargs))):
            self.grad_calls += 1
            if self.grad_calls == 1:
                warnings.warn(f"metal_accel: {self.module_name} runs eager: autograd is recording and its "
                              "tensors require grad (kernels have no backward); call the model under "
                              "torch.inference_mode() or torch.no_grad() to run its kernels", UserWarning, stacklevel=3)
            return self.original(*args, **kwargs)  # kernels have no backward: autograd needs eager
        try:
            started = spot_check.clock() if count else 0.0  # not while dynamo traces: a clock breaks its graph
            out = op(args, kwargs, state)
            if count and spot_check.due(op, started, args, kwargs):  # a kernel not the package's own, at random: against eager
                spot_check.check(op.name, out, lambda: self.original(*args, **kwargs),
                                 spot_check.reference64(self.original, args, kwargs))
        except Exception as exc:
            if self.strict:
                raise
            self.table = {s: o for s, o in self.table.items() if o is not op}
            self._resolved = {s: (None if o is op else o) for s, o in self._resolved.items()}
            self._table_changed()
            self.failures[op.name] = f"{type(exc).__name__}: {exc}"
            log.warning("metal_accel: kernel %s failed (%s); this module runs eager from now on", op.name, exc)
            return self.original(*args, **kwargs)
        if count:
            self.hits += 1
        return out

    def _count(self, counter: str) -> None:
        # not while dynamo traces the model around this dispatcher: it reads an int attribute of a module's
        # forward as a constant, so a counter bumped in the graph would recompile the graph on every call
        if not _is_compiling():
            setattr(self, counter, getattr(self, counter) + 1)


def _same(value: Any) -> Any:
    return value


def _shape(t: torch.Tensor) -> Any:
    """T's shape; None for a nested tensor, which has none (torch's fast paths make them of padded batches)."""
    try:
        return t.shape
    except RuntimeError:
        return None


@functools.lru_cache(maxsize=None)
def reads_training(cls: type) -> bool:
    """Whether the class's code (its methods and the module-level functions they call) mentions its
    training flag; True where the source cannot be read."""
    try:
        return "training" in class_source(cls)
    except UnsupportedCall:
        return True


def _first_shapes(table: dict[tuple, Any]) -> frozenset | None:
    """Shapes of the first argument over the table's signatures; None if some first argument is no tensor."""
    shapes = set()
    for sig in table:
        first = sig[0] if sig else None
        if not (isinstance(first, tuple) and len(first) == 4 and isinstance(first[0], tuple)):
            return None
        shapes.add(first[0])
    return frozenset(shapes)


# class -> its own forward function, for classes whose forward auto-instrumentation replaced
ORIGINAL_FORWARDS: dict[type, Callable[..., Any]] = {}


def eager_forward(module: nn.Module) -> Callable[..., Any]:
    """The module's own forward, bound: never a dispatcher, never a patched class forward."""
    disp = dispatcher_of(module)
    if disp is not None:
        return disp.original
    for klass in type(module).__mro__:
        if "forward" in vars(klass):
            fn = ORIGINAL_FORWARDS.get(klass, vars(klass)["forward"])
            return fn.__get__(module, type(module))
    return module.forward


def dispatcher_of(module: nn.Module) -> Dispatcher | None:
    fwd = module.__dict__.get("forward")
    return fwd if isinstance(fwd, Dispatcher) else None


def install(module: nn.Module, signature: tuple, op: KernelOp, *, strict: bool = False) -> Dispatcher:
    """Route calls of `module` matching `signature` to `op`; everything else stays eager."""
    disp = dispatcher_of(module)
    if disp is None:
        disp = Dispatcher(module, eager_forward(module), strict=strict)
        module.forward = disp  # instance attribute: shadows the class's forward, removable
    disp.add(signature, op)
    return disp


def uninstall(module: nn.Module) -> bool:
    if dispatcher_of(module) is None:
        return False
    del module.__dict__["forward"]
    return True
