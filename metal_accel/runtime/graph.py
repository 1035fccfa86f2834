"""torch.compile replayed as a CUDA graph: the built-in candidate for host-bound modules on CUDA.

Where a module's GPU work is short, the time of a call is the host's: Python, dynamo's guards and
one launch per kernel. Captured once into a CUDA graph, the whole call is one replay. The op copies
the inputs into the graph's static buffers, replays, and returns clones of the outputs (a caller
may keep them across calls). It re-captures when a parameter or buffer moved to other memory
(a reassigned weight) or was changed in place (a kernel whose prepare() derived tensors from it: the replay
reads those, not the parameter), and serializes calls, since the static buffers are shared.
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .ops import ModuleLayout

WARMUP_CALLS = 2  # on a side stream before capture, as torch.cuda.graphs' documentation asks


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter
        return -1


class GraphedOp:
    """Dispatcher-compatible op: `compiled` (a CompiledOp or a KernelOp) captured into a CUDA graph on
    first call. It reads the module's state tensors itself (the `state` argument is not used), passes them
    to the op it captures, and re-captures when they moved."""

    def __init__(self, compiled: Any, module: torch.nn.Module) -> None:
        self.name = compiled.name
        self._compiled = compiled
        self._layout = ModuleLayout(module)
        self._lock = threading.Lock()
        self._graph: torch.cuda.CUDAGraph | None = None
        self._inputs: list[torch.Tensor] = []
        self._out: Any = None
        self._ptrs: list[tuple[int, int]] = []
        self.captures = 0

    def __call__(self, args: tuple, kwargs: dict, state: list[torch.Tensor]) -> Any:
        with self._lock:
            live = self._layout.gather()
            ptrs = [(t.data_ptr(), _version(t)) for t in live]
            if self._graph is None or ptrs != self._ptrs:
                self._capture(args, kwargs, live, ptrs)
            tensors = call_tensors(args, kwargs)
            if len(tensors) != len(self._inputs):
                raise RuntimeError(f"{self.name}: called with {len(tensors)} tensors, captured with {len(self._inputs)}")
            for dst, src in zip(self._inputs, tensors):
                dst.copy_(src)
            assert self._graph is not None
            self._graph.replay()
            return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self._out)

    def _capture(self, args: tuple, kwargs: dict, state: list[torch.Tensor], ptrs: list[tuple[int, int]]) -> None:
        self._graph = None
        with torch.inference_mode(False):  # static buffers any later call may write into, in any mode
            static_args, static_kwargs = tree_map(_static_copy, (args, kwargs))
        self._inputs = call_tensors(static_args, static_kwargs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self._compiled(static_args, static_kwargs, state)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out = self._compiled(static_args, static_kwargs, state)
        self._graph, self._ptrs = graph, ptrs
        self.captures += 1


def call_tensors(args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors of a call in the order of its key (core/specs.py call_signature): positional arguments,
    then keyword arguments sorted by name, containers walked in pytree order. Calls with the same keywords
    in another order share the key, and so the graph: their tensors must land in the same static buffers."""
    leaves = tree_flatten((args, [kwargs[k] for k in sorted(kwargs)]))[0]
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _static_copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value
