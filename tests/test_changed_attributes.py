"""A module's non-tensor state changed after its kernel was proven (`norm.eps = 1e-6`, `model.chain.shift = 1.0`,
a child's attribute inside a composite, a tensor kept as a plain attribute, an attribute added or deleted): the
call runs eager, and the kernel again once the state is back (redteam2 a04). The ops here are made directly from
Python host code that reads the config the way a kernel's host code does (from the op's view), so no proof runs."""
from __future__ import annotations

import itertools
import logging

import pytest
import torch
from torch import nn

from metal_accel.auto import hook
from metal_accel.core.keys import entry_key, module_fingerprint
from metal_accel.core.specs import InputSpec, OutputSpec, call_signature
from metal_accel.runtime import dispatch
from metal_accel.runtime.dispatch import Dispatcher, install
from metal_accel.runtime.ops import KernelOp, ModuleLayout, kernel_op

_names = itertools.count()


class Shift(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shift = 0.125

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + getattr(self, "extra", 0.0) + self.shift


class Block(nn.Module):
    """A composite whose kernel covers its children: a child's attribute is part of what it was proven with."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.scaling = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * self.scaling


def shift_host(module, x):
    return x + module.shift


def block_host(module, x):
    norm = module.norm
    return torch.nn.functional.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps) * module.scaling


def optimized(module: nn.Module, host, x: torch.Tensor) -> Dispatcher:
    """MODULE with an op of HOST installed for X's signature, as optimize() leaves it."""
    op = KernelOp(f"attr_test_{next(_names)}", host, InputSpec.of((x,), {}), OutputSpec.of(module(x)),
                  ModuleLayout(module), "cpu")
    return install(module, call_signature((x,), {}), op)


def kernel_ran(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    disp = module.__dict__["forward"]
    hits = disp.hits
    with torch.inference_mode():
        out = module(x)
    return out, disp.hits > hits


def eager(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return type(module).forward(module, x)


def test_a_plain_float_changed_after_optimize_gives_eagers_answer_and_is_logged(caplog):
    m, x = Shift().eval(), torch.randn(4, 8)
    optimized(m, shift_host, x)
    assert kernel_ran(m, x)[1]
    m.shift = 1.0
    with caplog.at_level(logging.WARNING, logger="metal_accel.runtime.dispatch"):
        out, ran = kernel_ran(m, x)
        kernel_ran(m, x)
    assert not ran and torch.equal(out, eager(m, x))
    logged = [r.getMessage() for r in caplog.records if "shift is 1.0, proven with 0.125" in r.getMessage()]
    assert len(logged) == 1, caplog.text  # once, saying why
    assert m.forward.config_calls == 2


def test_the_kernel_runs_again_once_the_value_is_back():
    m, x = Shift().eval(), torch.randn(4, 8)
    optimized(m, shift_host, x)
    m.shift = 1.0
    assert not kernel_ran(m, x)[1]
    m.shift = 0.125  # an equal value (another float object) is the proven state
    out, ran = kernel_ran(m, x)
    assert ran and torch.equal(out, eager(m, x))


def test_a_childs_attribute_changed_inside_a_composite_that_runs_one_kernel():
    m, x = Block().eval(), torch.randn(4, 8)
    optimized(m, block_host, x)
    assert kernel_ran(m, x)[1]
    m.norm.eps = 0.5
    out, ran = kernel_ran(m, x)
    assert not ran and torch.equal(out, eager(m, x))
    m.norm.eps = 1e-5
    assert kernel_ran(m, x)[1]


def test_a_child_replaced_runs_eager():
    m, x = Block().eval(), torch.randn(4, 8)
    optimized(m, block_host, x)
    m.norm = nn.LayerNorm(8, eps=0.5)
    out, ran = kernel_ran(m, x)
    assert not ran and torch.equal(out, eager(m, x))


def test_attributes_added_or_deleted_run_eager_and_private_ones_do_not_matter():
    m, x = Shift().eval(), torch.randn(4, 8)
    optimized(m, shift_host, x)
    m._cache = {}  # private bookkeeping (hooks, accelerate's, ours): not the module's config
    assert kernel_ran(m, x)[1]
    m.extra = 3.0  # read by eager through getattr with a default
    out, ran = kernel_ran(m, x)
    assert not ran and torch.equal(out, eager(m, x))
    del m.extra
    assert kernel_ran(m, x)[1]
    del m.shift
    with pytest.raises(AttributeError):  # eager's own answer: the kernel does not run on a value that is gone
        kernel_ran(m, x)


def test_a_tensor_kept_as_a_plain_attribute_is_watched_by_identity_and_version():
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = torch.ones(8)  # neither parameter nor buffer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.mask

    m, x = Masked().eval(), torch.randn(4, 8)
    optimized(m, lambda module, t: t.clone(), x)  # a kernel proven while the mask was all ones
    assert kernel_ran(m, x)[1]
    m.mask.mul_(2)
    out, ran = kernel_ran(m, x)
    assert not ran and torch.equal(out, x * 2)
    m.mask = torch.ones(8)
    out, ran = kernel_ran(m, x)
    assert not ran and torch.equal(out, x)


def test_a_deep_copy_watches_its_own_attributes():
    import copy
    m, x = Shift().eval(), torch.randn(4, 8)
    optimized(m, shift_host, x)
    twin = copy.deepcopy(m)
    twin.shift = 1.0
    assert kernel_ran(m, x)[1]
    out, ran = kernel_ran(twin, x)
    assert not ran and torch.equal(out, eager(twin, x))


def test_the_traced_path_leaves_a_stale_op_out_of_the_users_graph():
    m, x = Shift().eval(), torch.randn(4, 8)
    disp = optimized(m, shift_host, x)
    op = next(iter(disp.table.values()))
    assert disp._traced_op((x,), {}) is op
    m.shift = 1.0
    assert disp._traced_op((x,), {}) is None


class AutoShift(Shift):
    """Patched by auto-instrumentation in the test below (a class of its own, so other tests see Shift unpatched)."""


def test_auto_mode_never_runs_an_op_proven_for_another_config():
    """`import metal_accel`: equal modules share the op made for the first (keyed on the fingerprint at resolve
    time). One whose config changes, before or after its first call, never runs it."""
    x = torch.randn(4, 8)
    made: list[KernelOp] = []

    def resolve(module: nn.Module, args: tuple, kwargs: dict, disp=None) -> KernelOp | None:
        key = entry_key(module_fingerprint(module), InputSpec.of(args, kwargs), "cpu")
        if module.shift != 0.125:  # the cache holds a kernel for the proven config only
            return None
        made.append(kernel_op(key, "d" * 8, lambda: shift_host, InputSpec.of(args, kwargs), OutputSpec.of(x),
                              module, "cpu", variant=f"t{id(made)}"))
        return made[-1]

    plan = hook.ClassPlan(f"{AutoShift.__module__}.{AutoShift.__qualname__}", "", any_shape=True)
    saved = hook._resolve
    hook._resolve = resolve
    assert hook.patch_class(AutoShift, plan)
    try:
        a, b, c = AutoShift().eval(), AutoShift().eval(), AutoShift().eval()
        c.shift = 1.0  # changed before its first call: resolved on its own config
        with torch.inference_mode():
            for m in (a, b, c):
                assert torch.equal(m(x), x + m.shift)
            assert made[0] is made[1]  # a and b share one op
            auto = {m: m.__dict__[hook._AUTO_ATTR] for m in (a, b, c)}
            assert auto[a].hits == auto[b].hits == 1 and auto[c].hits == 0
            b.shift = 1.0  # changed after: b's op was made from a, whose shift is still 0.125
            assert torch.equal(b(x), x + 1.0) and auto[b].hits == 1
            assert torch.equal(a(x), x + 0.125) and auto[a].hits == 2
            b.shift = 0.125
            assert torch.equal(b(x), x + 0.125) and auto[b].hits == 2
    finally:
        hook._resolve = saved
        AutoShift.forward = hook._patched.pop(AutoShift)
        dispatch.ORIGINAL_FORWARDS.pop(AutoShift, None)
