"""How one call is timed on a device: the default wall-clock timer, the Timer type a backend may provide
instead, and a cache flusher. The speed gate (proof/speed.py) builds on these."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch


def cache_flusher(device: torch.device | str, nbytes: int = 64 << 20) -> Callable[[], None]:
    """A function that evicts the caches (CPU L3, GPU L2) by writing a buffer larger than them."""
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)

    def flush() -> None:
        buf.fill_(1.0)
    return flush


class TimingRejected(Exception):
    """A timer does not trust one sample (e.g. CUDA-event and wall-clock times disagree)."""


Timer = Callable[[Callable[..., Any], tuple, dict, Callable[[], None]], "tuple[float, Any]"]


def time_call(fn: Callable[..., Any], args: tuple, kwargs: dict, sync: Callable[[], None]) -> tuple[float, Any]:
    """Wall time of one call, with the device synchronized before and after (all streams)."""
    sync()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    sync()
    return time.perf_counter() - t0, out
