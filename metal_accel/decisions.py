"""The captured calls decided one by one, and the workload's own calls held back until they are needed.

optimize() decides the example call's calls first; the calls only a workload makes (decode-step signatures)
and the decode attention kernels wait (Deferred) until the end-to-end stage finds that the model compiled
whole does not take every call of the workload: on the decoder LMs of the zoo it always did, and those proofs
were time spent for nothing.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from tqdm.auto import tqdm

from .core.keys import class_path
from .pipeline import Pipeline
from .report import MODULES, ModuleReport, OptimizeReport, clock
from .runtime.capture import ModuleCall

log = logging.getLogger(__name__)
MATCHING = "keys, caches and matching"  # module decisions' time outside proofs


def decide_calls(plan: Pipeline, report: OptimizeReport, calls: Sequence[ModuleCall], progress: bool | None,
                 total: int) -> None:
    """Each of CALLS decided by PLAN, its report appended, with progress on a terminal and in the log."""
    with clock(report.stage_s, MODULES):
        for call in tqdm(calls, desc="metal_accel", unit="module", disable=None if progress is None else not progress,
                         leave=False):
            rep = plan.process(call)
            report.modules.append(rep)
            # progress for logs too (a terminal bar shows nowhere in a service or a CI job)
            log.info("metal_accel: [%d/%d] %s (%s): %s%s (%.1f s)", len(report.modules), total, rep.name,
                     rep.module_class.rsplit(".", 1)[-1], rep.status, f", {rep.reason}" if rep.reason else "",
                     rep.elapsed_s)
    proving = sum(s for stage, s in plan.stage_s.items() if stage != MATCHING)
    plan.stage_s[MATCHING] = max(0.0, report.stage_s[MODULES] - proving)


@dataclass
class Deferred:
    """The workload's own calls (decode steps), decided when first needed: calling it decides them (once);
    `leave(why)` reports them undecided instead, because the model compiled whole runs them."""

    plan: Pipeline
    report: OptimizeReport
    calls: list[ModuleCall]
    progress: bool | None
    total: int
    attention: Callable[[], None] | None = None   # routes the model's attention through proven decode kernels
    elapsed_s: float = 0.0

    @property
    def pending(self) -> bool:
        return bool(self.calls) or self.attention is not None

    def __call__(self) -> None:
        calls, self.calls = self.calls, []
        attention, self.attention = self.attention, None
        t0 = time.perf_counter()
        if calls:
            decide_calls(self.plan, self.report, calls, self.progress, self.total)
        if attention is not None:
            attention()
        self.elapsed_s += time.perf_counter() - t0

    def leave(self, why: str) -> None:
        calls, self.calls = self.calls, []
        if self.attention is not None:
            self.report.notes.append(f"attention: sdpa kept ({why})")
        self.attention = None
        for call in calls:
            self.report.modules.append(ModuleReport(
                call.name, class_path(type(call.module)), call.spec.describe() if call.spec else "?", "eager",
                f"not decided alone: {why}", calls=call.calls, eager_us=call.eager_s / max(call.calls, 1) * 1e6))
