"""`import metal_accel` finds the classes its caches name without importing their modules.

transformers' `transformers.models` loads a modeling module on attribute access; resolving a class path with
getattr imported every modeling module the shipped class list names (bert, gpt2, llama, ...) into a process
that only built a Phi-3, and patched their classes.
"""
from __future__ import annotations

import sys
import types

from torch import nn

from metal_accel.auto import hook


class _LazyPackage(types.ModuleType):
    """A package that imports a submodule when an attribute it lacks is read (as transformers' do)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.loaded: list[str] = []

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self.loaded.append(attr)
        sub = types.ModuleType(f"{self.__name__}.{attr}")
        sub.Block = type("Block", (nn.Module,), {"forward": lambda self, x: x})
        return sub


def test_resolving_a_class_path_imports_nothing(monkeypatch):
    pkg = _LazyPackage("sw3_lazy_pkg")
    monkeypatch.setitem(sys.modules, "sw3_lazy_pkg", pkg)
    assert hook._resolve_class("sw3_lazy_pkg.modeling_x.Block") is None
    assert pkg.loaded == []


def test_a_class_of_an_imported_module_and_a_nested_class_resolve(monkeypatch):
    mod = types.ModuleType("sw3_plain_mod")
    outer = type("Outer", (), {})
    inner = type("Inner", (nn.Module,), {"forward": lambda self, x: x})
    outer.Inner = inner
    mod.Outer = outer
    mod.Block = type("Block", (nn.Module,), {"forward": lambda self, x: x})
    monkeypatch.setitem(sys.modules, "sw3_plain_mod", mod)
    assert hook._resolve_class("sw3_plain_mod.Block") is mod.Block
    assert hook._resolve_class("sw3_plain_mod.Outer.Inner") is inner
    assert hook._resolve_class("sw3_plain_mod.Missing") is None
