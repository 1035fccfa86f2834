"""Token, cost and wall-time accounting for synthesis, with caps per module and per run.

A request's worst case (its input, estimated from the text, and its whole output budget, at the
model's price) is reserved on every meter before it is sent and settled with the real usage when
it returns, so concurrent requests cannot together pass a cap.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping
from urllib.parse import urlsplit

from .models import ProviderConfigError

# USD per million tokens (input, output) by exact model name, as the vendors list them (2025; for
# budgeting only). A dated snapshot of a listed model (`gpt-4o-2024-08-06`, `claude-sonnet-4-5-20250929`,
# `...-latest`) has its price; any other name (`gpt-5-pro` is not `gpt-5`) must be priced by the user
# (SynthSettings.prices or METAL_ACCEL_PRICES) or synthesis with it does not start. A model of an
# OpenAI-compatible server on this machine (localhost, 127.0.0.1, ::1) is free unless priced.
PRICES: dict[str, tuple[float, float]] = {
    "gpt-5": (1.25, 10.00), "gpt-5-mini": (0.25, 2.00), "gpt-5-nano": (0.05, 0.40), "gpt-5-pro": (15.00, 120.00),
    "gpt-5-codex": (1.25, 10.00), "gpt-5-chat-latest": (1.25, 10.00), "gpt-5.1": (1.25, 10.00),
    "gpt-5.1-codex": (1.25, 10.00),
    "gpt-4.1": (2.00, 8.00), "gpt-4.1-mini": (0.40, 1.60), "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4o": (2.50, 10.00), "gpt-4o-mini": (0.15, 0.60),
    "o1": (15.00, 60.00), "o1-pro": (150.00, 600.00), "o1-mini": (1.10, 4.40),
    "o3": (2.00, 8.00), "o3-pro": (20.00, 80.00), "o3-mini": (1.10, 4.40), "o4-mini": (1.10, 4.40),
    "claude-opus-4-5": (5.00, 25.00), "claude-opus-4-1": (15.00, 75.00), "claude-opus-4-0": (15.00, 75.00),
    "claude-opus-4": (15.00, 75.00), "claude-sonnet-4-5": (3.00, 15.00), "claude-sonnet-4-0": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00), "claude-haiku-4-5": (1.00, 5.00), "claude-3-7-sonnet": (3.00, 15.00),
    "claude-3-5-sonnet": (3.00, 15.00), "claude-3-5-haiku": (0.80, 4.00), "claude-3-opus": (15.00, 75.00),
    "claude-3-haiku": (0.25, 1.25),
}
PRICES_ENV = "METAL_ACCEL_PRICES"
_SNAPSHOT = re.compile(r"(?:-\d{4}-\d{2}-\d{2}|-\d{8}|-latest|@\d{8})$")
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


class UnknownPriceError(ProviderConfigError):
    """A model with no known price: the user must give one before any request is sent."""


def _lookup(model: str, table: Mapping[str, tuple[float, float]]) -> tuple[float, float] | None:
    if model in table:
        return table[model]
    base = _SNAPSHOT.sub("", model)
    if base != model and base in table:
        return table[base]
    prefixes = [p for p in table if p.endswith("*") and model.startswith(p[:-1])]
    return table[max(prefixes, key=len)] if prefixes else None


def price_of(model: str, prices: Mapping[str, tuple[float, float]] | None = None, *,
             base_url: str = "") -> tuple[float, float]:
    """(input, output) USD per million tokens of `model` (a bare model name). The user's `prices`
    (exact names, or prefixes ending in '*') come first, then the table. `base_url`: of an
    OpenAI-compatible server, free when it is on this machine. Raise UnknownPriceError otherwise."""
    found = _lookup(model, prices or {})
    if found is None:
        found = _lookup(model, PRICES)
    if found is None and base_url and (urlsplit(base_url).hostname or "") in _LOOPBACK:
        found = (0.0, 0.0)
    if found is None:
        raise UnknownPriceError(
            f"no price known for model {model!r}: give its USD per million input/output tokens with "
            f"{PRICES_ENV}='{model}=IN/OUT' (several: comma-separated; '{model}=0/0' if it is free) or "
            f"SynthSettings(prices={{'{model}': (IN, OUT)}})")
    return found


def parse_prices(text: str) -> dict[str, tuple[float, float]]:
    """`name=IN/OUT,name2=IN/OUT` (USD per million tokens; a name may end in '*') as a price table."""
    out: dict[str, tuple[float, float]] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, eq, value = item.rpartition("=")
        p_in, slash, p_out = value.partition("/")
        try:
            if not (eq and slash and name.strip()):
                raise ValueError
            out[name.strip()] = (float(p_in), float(p_out))
        except ValueError:
            raise ProviderConfigError(f"bad price {item!r} in {PRICES_ENV}: expected NAME=IN/OUT, "
                                      "USD per million input/output tokens, e.g. 'my-model=0.5/1.5'") from None
    return out


def cost_of(model: str, tokens_in: int, tokens_out: int,
            prices: Mapping[str, tuple[float, float]] | None = None, *, base_url: str = "") -> float:
    """Estimated USD cost of one request."""
    p_in, p_out = price_of(model, prices, base_url=base_url)
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


_LOCK = threading.RLock()  # one lock for all meters: a reservation is made on two meters at once


@dataclass(frozen=True)
class Reservation:
    """The worst case of one request in flight, held on its meters until settled."""

    tokens: int
    cost_usd: float


@dataclass
class Meter:
    """What one scope (a module, or a whole run) has spent so far, and holds reserved. Thread-safe."""

    name: str
    limits: Limits
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    requests: int = 0
    failed: int = 0                  # requests that brought no answer
    reserved_tokens: int = 0
    reserved_cost: float = 0.0
    started: float = field(default_factory=time.monotonic)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def charge(self, tokens_in: int, tokens_out: int, cost_usd: float, *, failed: bool = False) -> None:
        with _LOCK:
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out
            self.cost_usd += cost_usd
            self.requests += 1
            self.failed += int(failed)

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

    def misfit(self, r: Reservation, *, with_reserved: bool) -> str:
        """'' if `r` fits under the caps (with what is reserved, or once it is settled), else why not."""
        lim = self.limits
        held_t = self.reserved_tokens if with_reserved else 0
        held_c = self.reserved_cost if with_reserved else 0.0
        if lim.tokens is not None and self.tokens + held_t + r.tokens > lim.tokens:
            return (f"{self.name} token budget reached ({self.tokens} spent, {held_t} reserved, the next request "
                    f"may take {r.tokens}, of {lim.tokens})")
        if lim.cost_usd is not None and self.cost_usd + held_c + r.cost_usd > lim.cost_usd + 1e-12:
            return (f"{self.name} cost budget reached (${self.cost_usd:.4f} spent, ${held_c:.4f} reserved, the next "
                    f"request may cost ${r.cost_usd:.4f}, of ${lim.cost_usd:g})")
        return ""

    def remaining_s(self) -> float | None:
        return None if self.limits.wall_s is None else max(0.0, self.limits.wall_s - self.elapsed_s)

    def to_dict(self) -> dict[str, float | int]:
        return {"tokens_in": self.tokens_in, "tokens_out": self.tokens_out, "cost_usd": round(self.cost_usd, 6),
                "requests": self.requests, "failed": self.failed, "wall_s": round(self.elapsed_s, 3)}

    def summary(self) -> str:
        failed = f" ({self.failed} failed)" if self.failed else ""
        return (f"{self.requests} requests{failed}, {self.tokens} tokens, ${self.cost_usd:.4f}, "
                f"{self.elapsed_s:.0f} s")


def run_stops(stop_reasons: Iterable[str]) -> set[str]:
    """Which of the run's caps stopped synthesis, from its records' stop reasons ('run token budget reached')."""
    return {r.split(" (")[0] for r in stop_reasons if r.startswith("run ")}


def stopped_early(stops: set[str], unfinished: int) -> str:
    """What to tell a user whose run's caps (STOPS: run_stops) cut synthesis short."""
    return (f"stopped early ({'; '.join(sorted(stops))}): {unfinished} problem(s) not finished; raise --max-tokens, "
            "--max-cost or --max-wall and run the same command again to resume them")


@dataclass
class Budget:
    """The meters a request is charged to: its module's and the run's. Before a request is sent its
    worst case is reserved on both (`reserve`); its answer `settle`s the reservation."""

    module: Meter
    run: Meter

    @property
    def meters(self) -> tuple[Meter, Meter]:
        return (self.run, self.module)

    def charge(self, tokens_in: int, tokens_out: int, cost_usd: float, *, failed: bool = False) -> None:
        with _LOCK:
            for m in self.meters:
                m.charge(tokens_in, tokens_out, cost_usd, failed=failed)

    def reserve(self, tokens: int, cost_usd: float) -> tuple[Reservation | None, str, bool]:
        """(the reservation, '', _) if the worst case fits every cap with what is already reserved; else
        (None, why, later): `later` when it would fit once the requests in flight are settled."""
        r = Reservation(tokens, cost_usd)
        with _LOCK:
            why = self.exceeded()
            if why:
                return None, why, False
            for m in self.meters:
                hard = m.misfit(r, with_reserved=False)
                if hard:
                    return None, hard, False
            for m in self.meters:
                soft = m.misfit(r, with_reserved=True)
                if soft:
                    return None, soft, True
            for m in self.meters:
                m.reserved_tokens += r.tokens
                m.reserved_cost += r.cost_usd
            return r, "", False

    def settle(self, r: Reservation, tokens_in: int, tokens_out: int, cost_usd: float, *,
               failed: bool = False) -> None:
        """Release `r` and charge what the request really cost."""
        with _LOCK:
            for m in self.meters:
                m.reserved_tokens = max(0, m.reserved_tokens - r.tokens)
                m.reserved_cost = max(0.0, m.reserved_cost - r.cost_usd)
            self.charge(tokens_in, tokens_out, cost_usd, failed=failed)

    def exceeded(self) -> str:
        return self.run.exceeded() or self.module.exceeded()

    def remaining_s(self) -> float | None:
        left = [r for r in (self.module.remaining_s(), self.run.remaining_s()) if r is not None]
        return min(left) if left else None
