"""What synthesizing a module did: every attempt, where the time went, the concurrency achieved."""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.provider import Evaluation


@dataclass
class Attempt:
    """One answer of one model: sample `sample`, round `round` (0 = first answer, then repairs)."""

    model: str
    sample: int
    round: int
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    llm_s: float = 0.0
    retries: int = 0
    estimated_tokens: bool = False
    outcome: str = ""
    digest: str = ""
    cached: bool = False   # replayed from the answer cache: no request was sent
    request: str = ""      # the request's key in the answer cache

    @property
    def tag(self) -> str:
        return f"{self.model}#s{self.sample}r{self.round}"

    def provenance(self) -> dict[str, Any]:
        d = asdict(self)
        d["cost_usd"] = round(self.cost_usd, 6)
        d["llm_s"] = round(self.llm_s, 3)
        return d


class InFlight:
    """Counts requests in flight and integrates over time: busy time, average and peak concurrency."""

    def __init__(self) -> None:
        self.n = 0
        self.peak = 0
        self.busy_s = 0.0
        self.area = 0.0
        self.evaluating = False
        self.overlap_s = 0.0  # time with requests in flight while a candidate was being evaluated
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def _advance(self) -> None:
        now = time.monotonic()
        if self.n > 0:
            self.busy_s += now - self._last
            self.area += self.n * (now - self._last)
            if self.evaluating:
                self.overlap_s += now - self._last
        self._last = now

    def enter(self) -> None:
        with self._lock:
            self._advance()
            self.n += 1
            self.peak = max(self.peak, self.n)

    def exit(self) -> None:
        with self._lock:
            self._advance()
            self.n -= 1

    def set_evaluating(self, on: bool) -> None:
        with self._lock:
            self._advance()
            self.evaluating = on

    @property
    def average(self) -> float:
        """Mean number of requests in flight while at least one was."""
        return self.area / self.busy_s if self.busy_s > 0 else 0.0


@dataclass
class ModuleRecord:
    """The synthesis of one module call: attempts, outcome, stop reason, time split."""

    module_class: str
    backend: str
    models: list[str]
    attempts: list[Attempt] = field(default_factory=list)
    evaluations: int = 0
    accepted: int = 0
    best_speedup: float | None = None
    best_origin: str = ""
    stop_reason: str = ""           # why it stopped early (budget, all models failed), '' if it ran out of rounds
    wall_s: float = 0.0
    llm_s: float = 0.0              # summed request latencies
    llm_busy_s: float = 0.0         # time with at least one request in flight
    concurrency: float = 0.0        # mean requests in flight while busy
    peak_in_flight: int = 0
    overlap_s: float = 0.0          # requests in flight while evaluating
    prompt_s: float = 0.0           # building the prompt (profile, references)
    eval_s: float = 0.0             # time spent evaluating (serialized)
    compile_s: float = 0.0
    validate_s: float = 0.0
    bench_s: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    replayed: int = 0               # answers replayed from the answer cache (no request sent, nothing paid)

    def add_evaluation(self, ev: Evaluation, seconds: float) -> None:
        self.evaluations += 1
        self.eval_s += seconds
        t = ev.verdict.details.get("timings", {}) if isinstance(ev.verdict.details, dict) else {}
        compile_s = float(t.get("compile_s", 0.0))
        self.compile_s += compile_s
        # prove.py: proof_s = the trials (the worker's compile, the candidate's runs, the comparison with eager)
        self.validate_s += max(0.0, float(t.get("proof_s", compile_s)) - compile_s)
        self.bench_s += float(t.get("bench_s", 0.0))
        if ev.verdict.accepted:
            self.accepted += 1

    def add_attempt(self, a: Attempt) -> None:
        self.attempts.append(a)
        self.replayed += int(a.cached)
        self.tokens_in += a.tokens_in
        self.tokens_out += a.tokens_out
        self.cost_usd += a.cost_usd
        self.llm_s += a.llm_s

    def totals(self) -> dict[str, Any]:
        """The module-level part of the provenance stored with each evaluation."""
        return {"models": self.models, "attempts": len(self.attempts), "evaluations": self.evaluations,
                "tokens_in": self.tokens_in, "tokens_out": self.tokens_out, "cost_usd": round(self.cost_usd, 6),
                "wall_s": round(self.wall_s, 3), "llm_s": round(self.llm_s, 3), "eval_s": round(self.eval_s, 3),
                "stop_reason": self.stop_reason}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["attempts"] = [a.provenance() for a in self.attempts]
        return d

    def summary(self) -> str:
        best = f"best {self.best_speedup:.2f}x ({self.best_origin})" if self.best_speedup else "no kernel accepted"
        stop = f"; stopped: {self.stop_reason}" if self.stop_reason else ""
        n = len(self.attempts)
        replayed = f" ({self.replayed} replayed from the answer cache)" if self.replayed else ""
        return (f"{self.module_class.rsplit('.', 1)[-1]}: {n} answer{'s' if n != 1 else ''}{replayed}, "
                f"{self.evaluations} evaluated, "
                f"{best}; {self.tokens_in + self.tokens_out} tokens, ${self.cost_usd:.4f}, {self.wall_s:.1f} s{stop}")
