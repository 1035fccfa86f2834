"""Calls an installed op would take from under a forward hook (a descendant's, or a global one), weights moved
out of their slots (prune, weight_norm, parametrize), and the strides a compiled graph is told an op returns."""
from __future__ import annotations

import torch
from torch import nn

from metal_accel.core.specs import InputSpec, OutputSpec, call_signature
from metal_accel.runtime.dispatch import install
from metal_accel.runtime.ops import KernelOp, ModuleLayout


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


class Wrong:
    """An installed op that answers zeros: any call it takes shows."""

    name = "zeros"

    def __call__(self, args: tuple, kwargs: dict, state: list) -> torch.Tensor:
        return torch.zeros_like(args[0])


def installed() -> tuple[Block, torch.Tensor]:
    block, x = Block().eval(), torch.randn(4, 16)
    install(block, call_signature((x,), {}), Wrong())
    with torch.no_grad():
        assert not block(x).any()  # the op runs when nothing is hooked
    return block, x


def test_a_hook_on_a_descendant_sees_every_call_and_the_answer_is_eagers():
    block, x = installed()
    seen: list[torch.Tensor] = []
    handle = block.lin.register_forward_hook(lambda mod, inp, out: seen.append(out) or out * 2)
    with torch.no_grad():
        y = block(x)
        torch.testing.assert_close(y, block.act(block.lin.weight.new_tensor(0) + 2 * nn.functional.linear(
            x, block.lin.weight, block.lin.bias)))
    assert len(seen) == 1
    handle.remove()
    with torch.no_grad():
        assert not block(x).any()  # unhooked: the op again


def test_a_pre_hook_on_a_descendant_and_a_global_hook_count_too():
    block, x = installed()
    handle = block.act.register_forward_pre_hook(lambda mod, inp: None)
    with torch.no_grad():
        assert block(x).any()
    handle.remove()
    calls: list[str] = []
    handle = nn.modules.module.register_module_forward_hook(lambda mod, inp, out: calls.append(type(mod).__name__))
    try:
        with torch.no_grad():
            assert block(x).any()
        assert "Linear" in calls and "GELU" in calls
    finally:
        handle.remove()


def test_weights_moved_out_of_their_slots_run_eager_instead_of_raising():
    block, x = installed()
    torch.nn.utils.parametrizations.weight_norm(block.lin)  # lin.weight is a parametrization now
    with torch.no_grad():
        torch.testing.assert_close(block(x), Block.forward(block, x))


def test_a_compiled_graph_is_told_the_strides_the_op_returns():
    conv = nn.Conv2d(3, 8, 3, padding=1).eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    with torch.no_grad():
        out = conv(x)
    assert not out.is_contiguous()
    op = KernelOp("metal_accel_test_fake_strides", lambda view, t: conv(t), InputSpec.of((x,), {}),
                  OutputSpec.of(out), ModuleLayout(conv), "cpu")
    (fake,) = op._fake([x], [])
    assert fake.shape == out.shape and fake.stride() == out.stride()
