"""The CUDA-graph op (runtime/graph.py) feeds its static buffers in the order of the call's key: keyword
arguments sorted by name, as core/specs.call_signature sorts them, so a call with the same keywords in
another order (the same key, the same graph) puts each tensor in its own buffer."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn

from metal_accel.core.specs import call_signature
from metal_accel.runtime.graph import GraphedOp, call_tensors


class Diff(nn.Module):
    def forward(self, *, a: torch.Tensor, b: torch.Tensor, pair: tuple = ()) -> torch.Tensor:
        out = a - 2 * b
        for t in pair:
            out = out + t
        return out


def test_call_tensors_follow_the_keys_order_not_the_callers():
    a, b, c, d, x = (torch.full((2,), float(i)) for i in range(5))
    one = call_tensors((x,), {"a": a, "b": b, "pair": (c, d)})
    other = call_tensors((x,), {"pair": (c, d), "b": b, "a": a})
    assert [t is u for t, u in zip(one, [x, a, b, c, d])] == [True] * 5
    assert [t is u for t, u in zip(other, [x, a, b, c, d])] == [True] * 5
    # the same key for both orders: the dispatcher sends both calls to the same graph
    assert call_signature((x,), {"a": a, "b": b}) == call_signature((x,), {"b": b, "a": a})


class _Stream:
    def wait_stream(self, other: Any) -> None:
        pass


class _Replayed:
    """What a capture records, for a CPU stand-in of a CUDA graph: replay() runs the op again on the
    static buffers it was captured with, writing into the output it returned then."""

    def __init__(self, module: nn.Module) -> None:
        self.module, self.name, self.static, self.out = module, "diff", None, None

    def __call__(self, args: tuple, kwargs: dict, state: list) -> torch.Tensor:
        self.static = (args, kwargs)
        self.out = self.module(*args, **kwargs)
        return self.out

    def replay(self) -> None:
        args, kwargs = self.static
        self.out.copy_(self.module(*args, **kwargs))


def test_a_replay_with_keywords_in_another_order_computes_what_eager_does(monkeypatch):
    module = Diff()
    op = _Replayed(module)

    class FakeGraph:
        def replay(self) -> None:
            op.replay()

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: nullcontext())
    graphed = GraphedOp(op, module)
    g = torch.Generator().manual_seed(0)
    a, b, c, d = (torch.randn(8, generator=g) for _ in range(4))
    first = graphed((), {"a": a, "b": b, "pair": (c, d)}, [])
    torch.testing.assert_close(first, module(a=a, b=b, pair=(c, d)))
    a2, b2, c2, d2 = (torch.randn(8, generator=g) for _ in range(4))
    again = graphed((), {"pair": (c2, d2), "b": b2, "a": a2}, [])  # same key, keywords in another order
    torch.testing.assert_close(again, module(a=a2, b=b2, pair=(c2, d2)))
    assert graphed.captures == 1


@pytest.mark.cuda
def test_gpu_graph_replay_with_keywords_in_another_order():
    module = Diff().cuda()
    graphed = GraphedOp(_Eager(module), module)
    a, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    with torch.inference_mode():
        torch.testing.assert_close(graphed((), {"a": a, "b": b}, []), module(a=a, b=b))
        a2, b2 = torch.randn_like(a), torch.randn_like(b)
        torch.testing.assert_close(graphed((), {"b": b2, "a": a2}, []), module(a=a2, b=b2))
    assert graphed.captures == 1


class _Eager:
    def __init__(self, module: nn.Module) -> None:
        self.module, self.name = module, "diff"

    def __call__(self, args: tuple, kwargs: dict, state: list) -> torch.Tensor:
        return self.module(*args, **kwargs)

