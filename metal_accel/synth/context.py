"""Extra context for a prompt: a profile of the eager forward and reference kernels from the caches."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from ..core.specs import InputSpec
from ..proof.testdata import make_inputs
from ..runtime.dispatch import eager_only
from ..store import cache as cache_mod
from ..store.cache import CacheEntry

log = logging.getLogger(__name__)
_MAX_REFERENCE_CHARS = 6000


def profile_breakdown(module: nn.Module, spec: InputSpec, device: torch.device | str, *, top: int = 8,
                      reps: int = 5) -> str:
    """A table of the ops the eager forward runs, by self time per call; '' if profiling fails."""
    try:
        from torch.profiler import ProfilerActivity, profile

        gen = torch.Generator().manual_seed(0)
        args, kwargs = make_inputs(spec, "normal", gen, device)
        activities = [ProfilerActivity.CPU]
        on_cuda = torch.device(device).type == "cuda"
        if on_cuda:
            activities.append(ProfilerActivity.CUDA)
        with torch.inference_mode(), eager_only():
            module(*args, **kwargs)
            with profile(activities=activities) as prof:
                for _ in range(reps):
                    module(*args, **kwargs)
                if on_cuda:
                    torch.cuda.synchronize()
        rows = []
        for ev in prof.key_averages():
            cpu = float(getattr(ev, "self_cpu_time_total", 0.0))
            dev = float(getattr(ev, "self_device_time_total", getattr(ev, "self_cuda_time_total", 0.0)) or 0.0)
            if ev.key.startswith("[") or (cpu <= 0 and dev <= 0):
                continue
            rows.append((dev if on_cuda else cpu, ev.key, ev.count / reps))
    except Exception as exc:  # a profile is a hint; never fail synthesis over it
        log.debug("metal_accel: profiling %s failed: %s", type(module).__name__, exc)
        return ""
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) or 1.0
    where = "device" if on_cuda else "CPU"
    lines = [f"| op | calls per forward | self {where} µs per forward | share |", "|---|---|---|---|"]
    for t, name, calls in rows[:top]:
        lines.append(f"| {name} | {calls:g} | {t / reps:.1f} | {100 * t / total:.0f}% |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Reference:
    """A proven kernel from the caches that may help: same module elsewhere, or a similar module."""

    why: str           # e.g. "the same module on the cuda backend"
    backend: str
    module_class: str
    input_spec: str
    speedup: float | None
    code: str

    def render(self) -> str:
        speed = f", {self.speedup:.2f}x eager there" if self.speedup else ""
        code = self.code if len(self.code) <= _MAX_REFERENCE_CHARS else self.code[:_MAX_REFERENCE_CHARS] + "\n# ...(cut)"
        return (f"### {self.why}: `{self.module_class}` on {self.backend}, input {self.input_spec}{speed}\n"
                f"```python\n{code.rstrip()}\n```")


def _best_speedup(entry: CacheEntry) -> float | None:
    speeds = [v.speedup for v in entry.verdicts.values() if v.accepted and v.speedup]
    return max(speeds) if speeds else None


def _score(entry: CacheEntry, fingerprint: str, signature: str, backend: str, key: str,
           signature_of: Callable[[CacheEntry], str]) -> tuple[float, str]:
    """How good a reference `entry` is, by what it computes: the same module (fingerprint: its source and
    configuration) elsewhere, else a module whose op signature is the same. Never by class name (every
    KernelBench class is named Model)."""
    if entry.module_fingerprint == fingerprint:
        if entry.backend != backend:
            return 3.0, f"the same module on the {entry.backend} backend"
        if entry.key != key:
            return 2.5, "the same module for other input shapes"
        return 0.0, ""
    if signature and signature_of(entry) == signature:
        return 2.0 + (0.2 if entry.backend == backend else 0.0), "a cached module that runs the same ops"
    return 0.0, ""


def find_references(fingerprint: str, signature: str, backend: str, key: str = "", *, limit: int = 2,
                    entries: Iterable[CacheEntry] | None = None,
                    signature_of: Callable[[CacheEntry], str] | None = None) -> list[Reference]:
    """Up to `limit` accepted kernels from every cache, best first: the same module on another
    backend, the same module for other shapes, then a module whose op signature (facts.signature) is
    `signature`. `signature_of(entry)`: an entry's signature (default: the one saved when it was synthesized)."""
    if signature_of is None:
        from .memo import stored_signature  # memo -> prompts -> context: imported here
        signature_of = lambda e: stored_signature(e.backend, e.key)  # noqa: E731
    if entries is None:
        entries = (e for c in cache_mod.all_caches() for e in c.entries())
    scored: list[tuple[float, str, CacheEntry]] = []
    try:
        for entry in entries:
            if entry.candidate is None or _best_speedup(entry) is None:
                continue
            score, why = _score(entry, fingerprint, signature, backend, key, signature_of)
            if score > 0:
                scored.append((score, why, entry))
    except Exception as exc:  # an unreadable cache must not stop synthesis
        log.debug("metal_accel: reading caches for references failed: %s", exc)
    scored.sort(key=lambda s: -s[0])
    out: list[Reference] = []
    seen: set[tuple[str, str]] = set()
    for _, why, e in scored:
        ident = (e.module_fingerprint, e.backend)
        if ident in seen:
            continue
        seen.add(ident)
        assert e.candidate is not None
        out.append(Reference(why, e.backend, e.module_class, e.input_spec.describe(), _best_speedup(e), e.candidate.code))
        if len(out) >= limit:
            break
    return out
