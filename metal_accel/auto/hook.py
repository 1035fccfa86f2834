"""Zero-code use: `import metal_accel` patches the module classes that the active caches name.

A class is patched when its module is imported (at once if it already is), only if some cache entry
holds a kernel that may run here (build_plans: accepted on this machine, or elsewhere under first-use;
never a rejected entry, never a cached torch.compile, which only optimize() installs), and only if its
source still hashes to what the cache recorded, so a changed library never gets a stale kernel. Classes
known to compute a family of the shipped kernel library (library/known.py) are patched too, for every
shape: each new call signature is traced, matched and its kernel proven here before it runs. The new
forward is invisible to TorchScript (torch.jit.script compiles the original: _script_transparent) and
steps aside under torch.jit.trace, torch.compile and in training mode.
The patched forward costs a shape check per call; calls whose first tensor's shape appears in no
cache entry go straight to the original. Others get a per-instance Dispatcher that resolves each
new input signature once: a cached kernel proven in this environment is installed (launched directly:
a win only its CUDA-graph replay gave is left to optimize()); one proven elsewhere is proven here first
(METAL_ACCEL_REVALIDATE=first-use, the default) or skipped (=optimize: only metal_accel.optimize() proves
kernels). An instance whose calls have all resolved to eager SETTLE_CALLS times in a row gets its own
forward back and costs nothing more.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import logging
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..backends import available_backends, get_backend
from ..core import config
from ..core.keys import class_source_sha
from ..core.specs import UnsupportedCall
from ..runtime import dispatch
from ..runtime.dispatch import ORIGINAL_FORWARDS, Dispatcher
from ..runtime.ops import KernelOp, _is_compiling
from ..library.known import known_classes
from ..library.provider import kernel_file
from ..store.cache import all_caches, read_index, sealed_verdict
from .autoload import direct_launch_won, kernel_for_call

log = logging.getLogger(__name__)
_AUTO_ATTR = "_metal_accel_auto"


@dataclass
class ClassPlan:
    """What the caches hold for one module class."""

    class_path: str
    class_source_sha: str                 # "" for a library class: its calls are matched by tracing instead
    shapes: set[tuple[int, ...]] = field(default_factory=set)  # first tensor argument's shapes
    any_shape: bool = False               # a library class: the library's kernels are shape-generic


_plans: dict[str, ClassPlan] = {}
_inherited: set[type] = set()  # patched classes whose forward was inherited
_pending: dict[str, list[str]] = {}  # module name -> class paths waiting for it to be imported
_patched: dict[type, Callable[..., Any]] = {}
_lock = threading.RLock()
_active = False


def revalidate_policy() -> str:
    return config.current().revalidate


def _first_shape(input_spec: dict[str, Any]) -> tuple[int, ...] | None:
    for arg in input_spec.get("args", []):
        if arg.get("tensor"):
            return tuple(arg["shape"])
    return None


def build_plans() -> dict[str, ClassPlan]:
    """Class path -> plan, from the indexes of every active cache: only entries whose kernel may run here.

    An entry counts when its candidate is a kernel (never a built-in torch.compile: compiling on a call
    path the user never optimized stalls it for seconds) accepted in this machine's environment, or,
    under METAL_ACCEL_REVALIDATE=first-use, accepted elsewhere with no verdict here yet. The first cache
    holding a key decides it (lookup order: the user's verdicts come before a bundle's claims), so a
    rejected entry patches nothing.
    """
    envs = _environment_ids(available_backends())  # kernels for a device this machine lacks patch nothing
    first_use = revalidate_policy() == "first-use"
    plans: dict[str, ClassPlan] = {}
    seen: set[tuple[str, str]] = set()
    for cache in all_caches():
        if not cache.root.is_dir():
            continue
        for key, record in read_index(cache.root).items():
            backend = record.get("backend")
            if (backend, key) in seen or backend not in envs:
                continue
            seen.add((backend, key))
            if not record.get("class_source_sha") or not record.get("accepted_envs"):
                continue
            if not _runs_here(cache.root / backend / f"{key}.json", envs[backend], first_use, cache.pin is not None):
                continue
            plan = plans.setdefault(record["module_class"],
                                    ClassPlan(record["module_class"], record["class_source_sha"]))
            shape = _first_shape(record["input_spec"])
            if shape is not None and record["class_source_sha"] == plan.class_source_sha:
                plan.shapes.add(shape)
    plans = {path: plan for path, plan in plans.items() if plan.shapes}
    if config.current().library and first_use:
        for path in known_classes():
            plans.setdefault(path, ClassPlan(path, "", any_shape=True)).any_shape = True
    return plans


def _environment_ids(backends: list[str]) -> dict[str, str]:
    """Backend name -> this machine's environment id, for every backend it has."""
    ids = {}
    for name in backends:
        try:
            ids[name] = get_backend(name).environment().id
        except Exception as exc:  # a backend that cannot name its device runs nothing automatically
            log.info("metal_accel: %s: no environment (%s); its cached kernels are not used", name, exc)
    return ids


def _runs_here(path: Path, env_id: str, first_use: bool, vouched: bool = False) -> bool:
    """Whether the entry at PATH holds a kernel (not a built-in) proven in ENV_ID (a verdict sealed by this
    user's key, or VOUCHED for by a pinned bundle), or, with FIRST_USE, accepted somewhere (a claim, here or
    elsewhere) and not yet proven here. Read as plain JSON: this only narrows what is patched; the entry is
    checked in full when a call resolves it."""
    try:
        data = json.loads(path.read_text())
        cand = data.get("candidate") or {}
        verdicts = data.get("verdicts") or {}
        if not cand or cand.get("kind", "kernel") != "kernel":
            return False
        digest = cand.get("digest")
        accepted = {k for k, v in verdicts.items() if v.get("accepted") and v.get("candidate_digest") == digest}
    except (OSError, ValueError, AttributeError, TypeError):
        return False
    if env_id in verdicts and (vouched or sealed_verdict(data, env_id)):
        return env_id in accepted and direct_launch_won(verdicts[env_id].get("details") or {})
    return first_use and bool(accepted)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of modules that define cached classes, to patch them once executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)  # type: ignore[attr-defined]
        _patch_module(module.__name__)


_finder = _PatchingFinder()


def _resolve_class(class_path: str) -> type | None:
    """The class at `class_path` if its defining module is imported; never imports anything.

    Names are looked up in the objects' own `__dict__`, not with getattr: a package whose submodules load on
    attribute access (transformers' lazy `transformers.models`) would otherwise import every modeling module
    the caches name (seven of them, seconds, at `import metal_accel` in a process that built a Phi-3).
    """
    parts = class_path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is None:
            continue
        obj: Any = mod
        for name in parts[i:]:
            obj = _own_attr(obj, name)
        return obj if isinstance(obj, type) and issubclass(obj, nn.Module) else None
    return None


def _own_attr(obj: Any, name: str) -> Any:
    """OBJ's attribute NAME if OBJ (a module or class) holds it itself, else None; runs no __getattr__."""
    try:
        return vars(obj).get(name)
    except TypeError:
        return None


def _patch_module(module_name: str) -> None:
    with _lock:
        for class_path in _pending.pop(module_name, []):
            cls = _resolve_class(class_path)
            if cls is not None:
                patch_class(cls, _plans[class_path])


def patch_class(cls: type, plan: ClassPlan) -> bool:
    """Replace cls.forward with the auto-dispatching forward; False if the source has changed."""
    if cls in _patched:
        return False
    original = own_forward(cls)
    if original is None:
        return False
    try:
        if plan.class_source_sha and class_source_sha(cls) != plan.class_source_sha:
            log.info("metal_accel: %s changed since its kernels were cached; not patched", plan.class_path)
            return False
    except UnsupportedCall:
        return False
    if "forward" not in vars(cls):  # inherited (torchvision's Conv2dNormActivation is an nn.Sequential): the
        _inherited.add(cls)         # wrapper goes on the class itself, and is deleted again by deactivate()
    ORIGINAL_FORWARDS[cls] = original
    _patched[cls] = original
    cls.forward = _script_transparent(
        _dispatching_forward(cls, original, None if plan.any_shape else frozenset(plan.shapes)), original)
    return True


def own_forward(cls: type) -> Callable[..., Any] | None:
    """The forward function CLS runs unpatched: its own, or the nearest base class's (that class's original where
    it is patched too); None where there is no plain function to wrap."""
    for klass in cls.__mro__:
        fn = vars(klass).get("forward")
        if fn is not None:
            fn = ORIGINAL_FORWARDS.get(klass, fn)
            return fn if isinstance(fn, types.FunctionType) else None
    return None


def _dispatching_forward(cls: type, original: Callable[..., Any], shapes: frozenset | None) -> Callable[..., Any]:
    """The class's new forward: the original unless this exact class is called, in eval mode, outside any
    tracer (torch.compile, export, torch.jit.trace), with a first tensor of a cached shape (any shape where
    SHAPES is None: a class the kernel library serves). Every name it
    uses is a closure cell with a `_ma_` prefix: see _script_transparent."""
    _ma_cls, _ma_original, _ma_shapes, _ma_dispatch = cls, original, shapes, dispatch
    _ma_tensor, _ma_compiling, _ma_tracing = torch.Tensor, _is_compiling, torch._C._get_tracing_state
    _ma_attr, _ma_auto = _AUTO_ATTR, _auto_dispatcher

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _ma_dispatch.bypass or type(self) is not _ma_cls or not args or self.training or _ma_compiling() \
                or _ma_tracing() is not None:
            return _ma_original(self, *args, **kwargs)  # traced by the user: their graph, eager code
        first = args[0]
        if type(first) is not _ma_tensor or (_ma_shapes is not None and first.shape not in _ma_shapes):
            return _ma_original(self, *args, **kwargs)
        auto = self.__dict__.get(_ma_attr)
        if auto is None:
            auto = _ma_auto(self, _ma_original)
        if auto.fallback is not None or auto.in_training():
            return auto(*args, **kwargs)
        return auto.run_checked(args, kwargs)  # bypass, compile and tracers ruled out above: not asked again
    return forward


def _script_transparent(fn: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """FN rebuilt so that torch.jit.script compiles ORIGINAL in its place: it reads the source and signature
    through `__wrapped__` and resolves names in the function's globals plus its closure cells, so FN gets
    ORIGINAL's globals (it reads none itself: its own names are `_ma_` closure cells)."""
    new = types.FunctionType(fn.__code__, original.__globals__, original.__name__, fn.__defaults__, fn.__closure__)
    functools.update_wrapper(new, original)  # __wrapped__, __doc__, __name__, __qualname__, __annotations__
    return new


def _auto_dispatcher(module: nn.Module, original: Callable[..., Any]) -> Dispatcher:
    disp = Dispatcher(module, original.__get__(module, type(module)))
    disp.auto = True
    disp.resolver = lambda args, kwargs: _resolve(module, args, kwargs, disp)
    disp.on_settled = lambda: _settle(module, disp)
    module.__dict__[_AUTO_ATTR] = disp
    return disp


def _settle(module: nn.Module, disp: Dispatcher) -> None:
    """MODULE's calls keep coming with signatures already resolved to eager, and no kernel serves any: its own
    forward goes back on the instance (shadowing the patched class forward), so it costs nothing from now on.
    The price: a later call of a new shape on this instance runs eager without a lookup (optimize() still
    decides it). Not where a dispatcher of optimize() or another forward is already on the instance."""
    if "forward" in module.__dict__ or disp.table:
        return
    module.__dict__["forward"] = disp.original
    log.debug("metal_accel: %s: every call runs eager here; its own forward is back on the instance",
              type(module).__name__)


def _library_only_without_kernel(module: nn.Module, args: tuple) -> bool:
    """MODULE's class was patched only for the kernel library, and the library has no kernel for its family on
    this call's backend: no later call can get one, so its dispatcher can stop asking (and cost nothing)."""
    plan = _plans.get(f"{type(module).__module__}.{type(module).__qualname__}")
    family = known_classes().get(plan.class_path) if plan is not None and not plan.shapes else None
    first = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if family is None or first is None:
        return False
    backend = {"cuda": "cuda", "mps": "mps", "cpu": "cpu"}.get(first.device.type)
    return backend is not None and kernel_file(backend, family) is None


def _resolve(module: nn.Module, args: tuple, kwargs: dict, disp: Dispatcher | None = None) -> KernelOp | None:
    """The kernel for this call from the caches, proven here if needed; None means eager. Never raises."""
    try:
        op = kernel_for_call(module, args, kwargs, prove_here=revalidate_policy() == "first-use")
        if op is None and disp is not None and not disp.table and _library_only_without_kernel(module, args):
            disp.resolver = None  # with an empty table: every call goes straight to the original forward
        return op
    except Exception as exc:  # auto mode must never break the user's model
        log.warning("metal_accel: %s: no kernel, running eager (%s: %s)", type(module).__name__,
                    type(exc).__name__, exc)
        return None


def activate() -> int:
    """Patch the classes named in the active caches; returns how many class paths are planned."""
    global _plans, _active
    with _lock:
        _active = True
        _plans = build_plans()
        for class_path, plan in _plans.items():
            cls = _resolve_class(class_path)
            if cls is not None:
                patch_class(cls, plan)
                continue
            # classes nested in other classes are patched only if their module is already imported
            _pending.setdefault(class_path.rsplit(".", 1)[0], []).append(class_path)
        if _pending and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        return len(_plans)


def deactivate() -> None:
    """Put every patched class's forward back and forget the plans."""
    global _active
    with _lock:
        _active = False
        for cls, original in _patched.items():
            if cls in _inherited:
                del cls.forward  # type: ignore[attr-defined]
            else:
                cls.forward = original  # type: ignore[attr-defined]
            ORIGINAL_FORWARDS.pop(cls, None)
        _patched.clear()
        _inherited.clear()
        _pending.clear()
        _plans.clear()
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def is_active() -> bool:
    return _active


def patched_classes() -> list[type]:
    return list(_patched)
