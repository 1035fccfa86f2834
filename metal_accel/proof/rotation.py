"""Contenders timed in a balanced order: each one runs right after each other equally often.

A call's speed depends on what ran just before it (caches, clocks, the allocator, a GPU's queue), so
the order of the calls is part of the measurement. The calls follow a closed walk that takes every
ordered pair of distinct contenders exactly once (an Eulerian circuit of the complete directed graph);
repeated round after round, each contender directly follows every other equally often, across the
rounds' boundaries too. A round of N contenders is N * (N - 1) calls, N - 1 of each.

Shared by the end-to-end proof (model_choice), `metal-accel bench` (kernelbench/timing) and the model
zoo benchmark (benchmarks/models.py). Pure Python: the caller passes the device's synchronize.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, TypeVar

T = TypeVar("T")


def _nothing() -> None:
    return None


def balanced_sequence(n: int) -> list[int]:
    """One round of calls of N contenders (0..N-1): every ordered pair (a, b), a != b, appears once as
    'b right after a', counting the pair that closes the round onto its first call."""
    if n < 2:
        return list(range(n))
    unused = {v: [w for w in range(n) if w != v] for v in range(n)}
    stack, walk = [0], []
    while stack:  # Hierholzer: follow unused edges, back up when stuck
        v = stack[-1]
        if unused[v]:
            stack.append(unused[v].pop())
        else:
            walk.append(stack.pop())
    walk.reverse()
    return walk[:-1]  # the circuit ends where it began: the next round's first call closes it


def rounds_for(n: int, samples: int) -> int:
    """Whole rounds of N contenders that give each at least SAMPLES calls (a round gives N - 1 each)."""
    return max(1, math.ceil(samples / max(1, n - 1)))


def balanced_calls(items: Sequence[T], samples: int) -> list[T]:
    """ITEMS in call order: whole balanced rounds, each item called at least SAMPLES times (all equally
    often); stopping mid-round would leave some pairs short."""
    seq = balanced_sequence(len(items))
    return [items[i] for _ in range(rounds_for(len(items), samples)) for i in seq]


def predecessor_pairs(calls: Sequence[str]) -> Counter[tuple[str, str]]:
    """How often each contender ran right after each other in CALLS (a contender after itself not counted)."""
    return Counter((a, b) for a, b in pairwise(calls) if a != b)


@dataclass
class Contender:
    """One timed function; ENTER and LEAVE run around each of its blocks, outside the timed span (e.g. an
    import hook switched on for this contender only)."""

    name: str
    call: Callable[[], Any]
    enter: Callable[[], None] = _nothing
    leave: Callable[[], None] = _nothing


def as_contenders(contenders: Mapping[str, Callable[[], Any]] | Sequence[Contender]) -> list[Contender]:
    if isinstance(contenders, Mapping):
        return [Contender(name, fn) for name, fn in contenders.items()]
    return list(contenders)


def time_blocks(contenders: Mapping[str, Callable[[], Any]] | Sequence[Contender], calls_per_block: int,
                samples: int, sync: Callable[[], None]) -> dict[str, list[float]]:
    """Seconds per call of each contender: blocks of CALLS_PER_BLOCK back-to-back calls, one device
    synchronization before and after each block, in balanced rounds until each contender has at least
    SAMPLES blocks (all the same number). The k-th samples of two contenders come from the same round."""
    cs = as_contenders(contenders)
    times: dict[str, list[float]] = {c.name: [] for c in cs}
    for c in balanced_calls(cs, samples):
        c.enter()
        try:
            sync()
            t0 = time.perf_counter()
            for _ in range(calls_per_block):
                c.call()
            sync()
            times[c.name].append((time.perf_counter() - t0) / calls_per_block)
        finally:
            c.leave()
    return times
