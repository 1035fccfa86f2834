"""Zero-code use: `import metal_accel` patches the module classes that the active caches name.

A class is patched when its module is imported (at once if it already is), and only if its
source still hashes to what the cache recorded, so a changed library never gets a stale kernel.
The patched forward costs a shape check per call; calls whose first tensor's shape appears in no
cache entry go straight to the original. Others get a per-instance Dispatcher that resolves each
new input signature once: a cached kernel proven in this environment is installed; one proven
elsewhere is proven here first (METAL_ACCEL_REVALIDATE=first-use, the default) or skipped
(=optimize: only metal_accel.optimize() proves kernels).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from . import dispatch
from .cache_index import read_index
from .dispatch import ORIGINAL_FORWARDS, Dispatcher
from .ops import KernelOp, _is_compiling


log = logging.getLogger(__name__)
_AUTO_ATTR = "_metal_accel_auto"


@dataclass
class ClassPlan:
    """What the caches hold for one module class."""

    class_path: str
    class_source_sha: str
    shapes: set[tuple[int, ...]] = field(default_factory=set)  # first tensor argument's shapes


_plans: dict[str, ClassPlan] = {}
_pending: dict[str, list[str]] = {}  # module name -> class paths waiting for it to be imported
_patched: dict[type, Callable[..., Any]] = {}
_lock = threading.RLock()
_active = False


def revalidate_policy() -> str:
    policy = os.environ.get("METAL_ACCEL_REVALIDATE", "first-use")
    return policy if policy in ("first-use", "optimize") else "first-use"


def _first_shape(input_spec: dict[str, Any]) -> tuple[int, ...] | None:
    for arg in input_spec.get("args", []):
        if arg.get("tensor"):
            return tuple(arg["shape"])
    return None


def build_plans() -> dict[str, ClassPlan]:
    """Class path -> plan, from the indexes of every active cache."""
    from .backends import available_backends
    from .cache import all_caches
    usable = set(available_backends())  # kernels for a device this machine lacks patch nothing
    plans: dict[str, ClassPlan] = {}
    for cache in all_caches():
        if not cache.root.is_dir():
            continue
        for record in read_index(cache.root).values():
            if not record.get("class_source_sha") or record.get("backend") not in usable:
                continue
            plan = plans.setdefault(record["module_class"],
                                    ClassPlan(record["module_class"], record["class_source_sha"]))
            shape = _first_shape(record["input_spec"])
            if shape is not None and record["class_source_sha"] == plan.class_source_sha:
                plan.shapes.add(shape)
    return plans


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
    """The class at `class_path` if its defining module is imported."""
    parts = class_path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is None:
            continue
        obj: Any = mod
        for name in parts[i:]:
            obj = getattr(obj, name, None)
        return obj if isinstance(obj, type) and issubclass(obj, nn.Module) else None
    return None


def _patch_module(module_name: str) -> None:
    with _lock:
        for class_path in _pending.pop(module_name, []):
            cls = _resolve_class(class_path)
            if cls is not None:
                patch_class(cls, _plans[class_path])


def patch_class(cls: type, plan: ClassPlan) -> bool:
    """Replace cls.forward with the auto-dispatching forward; False if the source has changed."""
    from .keys import class_source_sha
    from .specs import UnsupportedCall
    if cls in _patched or "forward" not in vars(cls):
        return False
    try:
        if class_source_sha(cls) != plan.class_source_sha:
            log.info("metal_accel: %s changed since its kernels were cached; not patched", plan.class_path)
            return False
    except UnsupportedCall:
        return False
    original = vars(cls)["forward"]
    shapes = frozenset(plan.shapes)

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if dispatch.bypass or type(self) is not cls or not args or _is_compiling():
            return original(self, *args, **kwargs)  # traced by the user's torch.compile: their graph, eager code
        first = args[0]
        if type(first) is not torch.Tensor or first.shape not in shapes:
            return original(self, *args, **kwargs)
        auto = self.__dict__.get(_AUTO_ATTR)
        if auto is None:
            auto = _auto_dispatcher(self, original)
        return auto(*args, **kwargs)

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = original.__doc__
    ORIGINAL_FORWARDS[cls] = original
    _patched[cls] = original
    cls.forward = forward  # type: ignore[attr-defined]
    return True


def _auto_dispatcher(module: nn.Module, original: Callable[..., Any]) -> Dispatcher:
    disp = Dispatcher(module, original.__get__(module, type(module)))
    disp.resolver = lambda args, kwargs: _resolve(module, args, kwargs)
    module.__dict__[_AUTO_ATTR] = disp
    return disp


def _resolve(module: nn.Module, args: tuple, kwargs: dict) -> KernelOp | None:
    """The kernel for this call from the caches, proven here if needed; None means eager. Never raises."""
    try:
        from .autoload import kernel_for_call
        return kernel_for_call(module, args, kwargs, prove_here=revalidate_policy() == "first-use")
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
            cls.forward = original  # type: ignore[attr-defined]
            ORIGINAL_FORWARDS.pop(cls, None)
        _patched.clear()
        _pending.clear()
        _plans.clear()
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def is_active() -> bool:
    return _active


def patched_classes() -> list[type]:
    return list(_patched)
