"""Results of `metal-accel bench`: one `Row` per problem and the `SuiteResult` with its summaries.

`summary` covers the problems a candidate was proposed for (correct, installed, geometric-mean
speedups); `best_summary` covers every measured problem with whatever the pipeline installed, the
calls of the captured subtrees by what runs them, and the self-noise (eager timed against a second
copy of itself in the same rounds); `to_dict` is the document written to suite.json (report.py
renders it).
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..report import COVERED, ModuleReport

ATTEMPT_SPEEDUP = 1.05
RUNS = ("kernel", "compile", "graph", "eager", "covered")  # what runs a captured call; covered: inside a kernel


def call_counts(modules: Iterable[ModuleReport]) -> dict[str, int]:
    """The captured calls of a model's whole subtree by what runs them (`covered`: inside a call that runs
    something other than eager)."""
    counts = dict.fromkeys(RUNS, 0)
    for m in modules:
        counts["covered" if m.status == "eager" and m.reason == COVERED else m.status] += 1
    return counts


def calls_text(calls: dict[str, int]) -> str:
    """'82 calls: 11 compile, 71 eager', or '' when the calls were not counted."""
    if not calls:
        return ""
    parts = [f"{n} {k}" for k, n in calls.items() if n]
    return f"{sum(calls.values())} calls: {', '.join(parts)}"


def _noise(rows: list[Row]) -> dict[str, Any]:
    vals = [r.self_noise for r in rows if r.self_noise is not None and not math.isnan(r.self_noise)]
    return {"problems": len(vals), "median": statistics.median(vals) if vals else None, "max": max(vals, default=None)}


@dataclass
class Row:
    key: str
    level: int | None
    problem_id: int | None
    name: str
    batch: int | None = None
    batch_original: int | None = None
    attempted: bool = False          # a candidate was proposed
    status: str = "eager"            # of the top-level module: kernel | compile | graph | eager | error | skipped
    calls: dict[str, int] = field(default_factory=dict)  # every captured call of the subtree by what runs it (RUNS)
    reason: str = ""
    candidate_correct: bool | None = None
    output_ok: bool | None = None
    pipeline_speedup: float | None = None
    eager_us: float | None = None
    compile_us: float | None = None
    kernel_us: float | None = None   # the optimized model (kernel, or eager fallback)
    eager_again_us: float | None = None  # eager again, as a second contender of the same rounds
    self_noise: float | None = None  # |1 - eager_again / eager|: ratios closer to 1 than this are ties
    samples: int | None = None       # timed calls of each contender
    vs_eager: float | None = None
    vs_compile: float | None = None
    compile_s: float | None = None
    flops: float | None = None
    min_bytes: float | None = None
    memory_bound: bool | None = None
    bandwidth_gbs: float | None = None
    bandwidth_frac: float | None = None
    winner: str = ""                 # origin of the installed candidate (a file, or builtin:torch.compile)
    rejected: list[str] = field(default_factory=list)
    outpaced: list[str] = field(default_factory=list)  # candidates that passed but lost to the installed one
    seconds: float = 0.0


@dataclass
class SuiteResult:
    rows: list[Row]
    environment: dict[str, Any]
    dram_bandwidth: float | None
    command: str = ""

    def summary(self, level: int | None = None) -> dict[str, Any]:
        rows = [r for r in self.rows if r.attempted and r.status != "skipped" and (level is None or r.level == level)]
        timed = [r for r in rows if r.vs_eager]
        geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None  # noqa: E731
        return {
            "attempted": len(rows),
            "geomean_vs_eager": geo([r.vs_eager for r in timed]),
            "geomean_vs_compile": geo([r.vs_compile for r in timed if r.vs_compile]),
            "correct": sum(bool(r.candidate_correct) for r in rows),
            "fraction_correct": sum(bool(r.candidate_correct) for r in rows) / len(rows) if rows else None,
            "installed": sum(r.status == "kernel" for r in rows),
            "installed_compile": sum(r.status == "compile" for r in rows),
            "installed_graph": sum(r.status == "graph" for r in rows),
            "outpaced_by_compile": sum(r.status in ("compile", "graph") and any(not o.startswith("builtin:") for o in r.outpaced)
                                       for r in rows),
            "fraction_correct_and_1.05x": sum(r.status == "kernel" and (r.vs_eager or 0) >= ATTEMPT_SPEEDUP
                                               for r in rows) / len(rows) if rows else None,
            "installed_slower_than_eager": [r.key for r in rows if r.status == "kernel" and (r.vs_eager or 0) < 1.0],
            "self_noise": _noise(timed),
        }

    def best_summary(self, level: int | None = None) -> dict[str, Any]:
        """The chosen best (eager, torch.compile or a kernel, whichever the pipeline installed) over every
        measured problem, attempted or not: what a user gets for the whole suite."""
        timed = [r for r in self.rows if r.status != "skipped" and r.vs_eager and (level is None or r.level == level)]
        geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None  # noqa: E731
        vs_c = [r.vs_compile for r in timed if r.vs_compile]
        return {"measured": len(timed), "geomean_vs_eager": geo([r.vs_eager for r in timed]),
                "geomean_vs_compile": geo(vs_c), "min_vs_eager": min((r.vs_eager for r in timed), default=None),
                "min_vs_compile": min(vs_c, default=None),
                "runs": {k: sum(r.status == k for r in timed) for k in ("kernel", "compile", "graph", "eager")},
                "calls": {k: sum(r.calls.get(k, 0) for r in timed) for k in RUNS},
                "self_noise": _noise(timed)}

    def to_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "dram_bandwidth_gbs": (self.dram_bandwidth or 0) / 1e9,
                "best": {str(lv): self.best_summary(lv) for lv in self.levels()} | {"all": self.best_summary()},
                "date": time.strftime("%Y-%m-%d"),
                "command": self.command, "summary": {str(lv): self.summary(lv) for lv in self.levels()} |
                {"all": self.summary()}, "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> SuiteResult:
        """The result `to_dict` wrote (suite.json), to render again."""
        fields = set(Row.__dataclass_fields__)
        return cls([Row(**{k: v for k, v in r.items() if k in fields}) for r in doc["rows"]], doc["environment"],
                   (doc.get("dram_bandwidth_gbs") or 0) * 1e9 or None, doc.get("command", ""))

    def levels(self) -> list[int]:
        return sorted({r.level for r in self.rows if r.level is not None})
