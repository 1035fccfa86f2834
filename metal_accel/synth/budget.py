"""Token, cost and wall-time accounting for synthesis, with caps per module and per run."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

# USD per million tokens (input, output), by model-name prefix; the longest matching prefix wins.
# List prices as published by the vendors (2025); approximate, for budgeting only. A model not
# listed costs 0 (its tokens still count against the token caps). Override with
# SynthSettings.prices.
PRICES: dict[str, tuple[float, float]] = {
    "gpt-5-nano": (0.05, 0.40), "gpt-5-mini": (0.25, 2.00), "gpt-5": (1.25, 10.00),
    "gpt-4.1-nano": (0.10, 0.40), "gpt-4.1-mini": (0.40, 1.60), "gpt-4.1": (2.00, 8.00),
    "gpt-4o-mini": (0.15, 0.60), "gpt-4o": (2.50, 10.00),
    "o4-mini": (1.10, 4.40), "o3-mini": (1.10, 4.40), "o3": (2.00, 8.00), "o1": (15.00, 60.00),
    "claude-opus-4-5": (5.00, 25.00), "claude-opus-4": (15.00, 75.00), "claude-sonnet-4": (3.00, 15.00),
    "claude-haiku-4": (1.00, 5.00), "claude-3-7-sonnet": (3.00, 15.00), "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-5-haiku": (0.80, 4.00), "claude-3-haiku": (0.25, 1.25),
}


def price_of(model: str, prices: Mapping[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    """(input, output) USD per million tokens for `model` (a bare model name); (0, 0) if unknown."""
    table = {**PRICES, **(prices or {})}
    best = ""
    for prefix in table:
        if model.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return table[best] if best else (0.0, 0.0)


def cost_of(model: str, tokens_in: int, tokens_out: int,
            prices: Mapping[str, tuple[float, float]] | None = None) -> float:
    """Estimated USD cost of one request."""
    p_in, p_out = price_of(model, prices)
    return (tokens_in * p_in + tokens_out * p_out) / 1e6


@dataclass(frozen=True)
class Limits:
    """Caps; None means no cap. Tokens count input and output together."""

    tokens: int | None = None
    cost_usd: float | None = None
    wall_s: float | None = None

    def describe(self) -> str:
        parts = [f"{self.tokens} tokens" if self.tokens is not None else "",
                 f"${self.cost_usd:g}" if self.cost_usd is not None else "",
                 f"{self.wall_s:g} s" if self.wall_s is not None else ""]
        return ", ".join(p for p in parts if p) or "no caps"


DEFAULT_MODULE_LIMITS = Limits(tokens=600_000, cost_usd=2.0, wall_s=1800.0)
DEFAULT_RUN_LIMITS = Limits(tokens=6_000_000, cost_usd=20.0, wall_s=4 * 3600.0)


@dataclass
class Meter:
    """What one scope (a module, or a whole run) has spent so far. Thread-safe."""

    name: str
    limits: Limits
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    requests: int = 0
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def charge(self, tokens_in: int, tokens_out: int, cost_usd: float) -> None:
        with self._lock:
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out
            self.cost_usd += cost_usd
            self.requests += 1

    def exceeded(self) -> str:
        """'' while within every cap, else which cap was reached."""
        lim = self.limits
        if lim.tokens is not None and self.tokens >= lim.tokens:
            return f"{self.name} token budget reached ({self.tokens} of {lim.tokens})"
        if lim.cost_usd is not None and self.cost_usd >= lim.cost_usd:
            return f"{self.name} cost budget reached (${self.cost_usd:.4f} of ${lim.cost_usd:g})"
        if lim.wall_s is not None and self.elapsed_s >= lim.wall_s:
            return f"{self.name} time budget reached ({self.elapsed_s:.0f} s of {lim.wall_s:g} s)"
        return ""

    def remaining_s(self) -> float | None:
        return None if self.limits.wall_s is None else max(0.0, self.limits.wall_s - self.elapsed_s)

    def to_dict(self) -> dict[str, float | int]:
        return {"tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                "cost_usd": round(self.cost_usd, 6), "requests": self.requests, "wall_s": round(self.elapsed_s, 3)}


@dataclass
class Budget:
    """The meters a request is charged to: its module's and the run's. Checked before each request."""

    module: Meter
    run: Meter

    def charge(self, tokens_in: int, tokens_out: int, cost_usd: float) -> None:
        self.module.charge(tokens_in, tokens_out, cost_usd)
        self.run.charge(tokens_in, tokens_out, cost_usd)

    def exceeded(self) -> str:
        return self.run.exceeded() or self.module.exceeded()

    def remaining_s(self) -> float | None:
        left = [r for r in (self.module.remaining_s(), self.run.remaining_s()) if r is not None]
        return min(left) if left else None
