"""A lazily resolving dispatcher (auto-instrumentation) whose calls all run eager settles: after SETTLE_CALLS calls
in a row of signatures already resolved to eager, with no kernel in its table, the module gets its own forward
back and the patched class forward costs it nothing more (issue 29: `import metal_accel` where no kernel applies)."""
from __future__ import annotations

import torch
from torch import nn

from metal_accel.auto import hook
from metal_accel.runtime import dispatch
from metal_accel.runtime.dispatch import SETTLE_CALLS, Dispatcher


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def lazy(module: nn.Module, answer=None) -> tuple[Dispatcher, list[int]]:
    disp = Dispatcher(module, module.forward)
    disp.resolver = lambda args, kwargs: answer
    settled: list[int] = []
    disp.on_settled = lambda: settled.append(disp.misses)
    return disp, settled


def test_settles_once_after_enough_calls_of_known_eager_signatures():
    disp, settled = lazy(Scale())
    x = torch.randn(3)
    for _ in range(SETTLE_CALLS):  # the first call resolves; the next SETTLE_CALLS - 1 are known
        disp.run_checked((x,), {})
    assert settled == []
    for _ in range(5):
        disp.run_checked((x,), {})
    assert len(settled) == 1 and disp.on_settled is None


def test_a_new_signature_starts_the_count_again():
    disp, settled = lazy(Scale())
    x, y = torch.randn(3), torch.randn(4)
    for _ in range(SETTLE_CALLS - 1):
        disp.run_checked((x,), {})
    disp.run_checked((y,), {})  # resolved now: the quiet run starts over
    for _ in range(SETTLE_CALLS - 1):
        disp.run_checked((x,), {})
    assert settled == []
    disp.run_checked((x,), {})
    assert len(settled) == 1


def test_never_settles_while_a_kernel_serves_some_signature():
    disp, settled = lazy(Scale())
    x = torch.randn(3)
    disp.table[("other",)] = object()  # a kernel for another signature: the class forward still earns its keep
    for _ in range(3 * SETTLE_CALLS):
        disp.kernel_for((x,), {})
    assert settled == []


def test_a_patched_instance_gets_its_own_forward_back_and_stays_exact():
    plan = hook.ClassPlan(f"{Scale.__module__}.{Scale.__qualname__}", "", any_shape=True)
    assert hook.patch_class(Scale, plan)
    try:
        m, x = Scale().eval(), torch.randn(5)
        with torch.inference_mode():
            for _ in range(SETTLE_CALLS + 1):
                assert torch.equal(m(x), x * 2)
            auto = m.__dict__[hook._AUTO_ATTR]
            assert "forward" in m.__dict__ and m.__dict__["forward"] == auto.original
            misses = auto.misses
            for _ in range(10):  # the patched class forward is not reached any more
                assert torch.equal(m(x), x * 2)
            assert auto.misses == misses
            other = Scale().eval()  # another instance of the class is still dispatched
            other(x)
            assert hook._AUTO_ATTR in other.__dict__ and "forward" not in other.__dict__
    finally:
        Scale.forward = hook._patched.pop(Scale)
        dispatch.ORIGINAL_FORWARDS.pop(Scale, None)


class ScaledSequential(nn.Sequential):
    """Like torchvision's Conv2dNormActivation: an nn.Sequential subclass with no forward of its own."""


def test_a_class_that_inherits_its_forward_is_patched_and_put_back():
    plan = hook.ClassPlan(f"{ScaledSequential.__module__}.{ScaledSequential.__qualname__}", "", any_shape=True)
    assert "forward" not in vars(ScaledSequential)
    assert hook.patch_class(ScaledSequential, plan)
    try:
        m, x = ScaledSequential(Scale()).eval(), torch.randn(5)
        plain = nn.Sequential(Scale()).eval()
        with torch.inference_mode():
            assert torch.equal(m(x), x * 2) and torch.equal(plain(x), x * 2)
        assert hook._AUTO_ATTR in m.__dict__  # its calls reach the auto dispatcher
        assert hook._AUTO_ATTR not in plain.__dict__  # nn.Sequential itself is untouched
        assert dispatch.eager_forward(m).__func__ is nn.Sequential.forward
    finally:
        hook.deactivate()
    assert "forward" not in vars(ScaledSequential) and ScaledSequential.forward is nn.Sequential.forward
