"""What optimize() decided for every captured module, and why."""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

COVERED = "inside a module that already runs a kernel"
MODULES = "module decisions"  # the stage whose parts are the candidates' kinds (Pipeline.stage_s)


@contextlib.contextmanager
def clock(stage_s: dict[str, float], stage: str) -> Iterator[None]:
    """Add the seconds the body takes to STAGE_S[STAGE]."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stage_s[stage] = stage_s.get(stage, 0.0) + time.perf_counter() - t0


def time_summary(stage_s: dict[str, float], parts: dict[str, float], total_s: float) -> str:
    """One line saying where optimize()'s TOTAL_S went: its stages, the module decisions' parts inside."""
    def fmt(items: dict[str, float]) -> str:
        return ", ".join(f"{name} {s:.1f} s" for name, s in sorted(items.items(), key=lambda kv: -kv[1]) if s >= 0.05)
    bits = []
    for name, s in sorted(stage_s.items(), key=lambda kv: -kv[1]):
        if s < 0.05:
            continue
        inner = fmt(parts) if name == MODULES and parts else ""
        bits.append(f"{name} {s:.1f} s" + (f" ({inner})" if inner else ""))
    rest = total_s - sum(stage_s.values())
    if bits and rest >= 0.05:
        bits.append(f"other {rest:.1f} s")
    return "; ".join(bits)


@dataclass
class ModuleReport:
    name: str
    module_class: str
    spec: str
    status: str                 # "kernel" (LLM or supplied kernel), "compile" (torch.compile),
    #                             "graph" (torch.compile replayed as a CUDA graph) or "eager"
    reason: str
    key: str = ""
    source: str = ""            # where the kernel came from: "cache:user", "cache:shipped", "dir:..."
    calls: int = 0
    eager_us: float | None = None
    kernel_us: float | None = None   # the fastest measured kernel candidate, accepted or not
    compile_us: float | None = None  # torch.compile of the module, when measured
    graph_us: float | None = None    # torch.compile replayed as a CUDA graph, when measured
    speedup: float | None = None     # of what runs, over eager
    rejected: list[str] = field(default_factory=list)  # one line per rejected candidate
    outpaced: list[str] = field(default_factory=list)  # one line per candidate that passed but lost to the winner
    notes: list[str] = field(default_factory=list)     # when what runs would not: training mode, autograd
    elapsed_s: float = 0.0                             # what deciding this call took

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OptimizeReport:
    backend: str
    device: str
    modules: list[ModuleReport] = field(default_factory=list)
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)  # about the model: training mode, state optimize() put back
    end_to_end: dict[str, Any] | None = None        # model_choice.EndToEnd.to_dict(): the whole model timed
    stage_s: dict[str, float] = field(default_factory=dict)   # seconds per stage: capture, module decisions, ...
    module_s: dict[str, float] = field(default_factory=dict)  # module decisions' seconds by what was proven

    def __reduce_ex__(self, protocol: Any) -> tuple:
        # pickled with its model (torch.save(model)), the report is left out: the loaded model runs no kernels
        return (type(None), ())

    def __deepcopy__(self, memo: dict) -> OptimizeReport:  # a deep-copied model keeps its report
        new = object.__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    @property
    def time_spent(self) -> str:
        """Where optimize()'s time went, e.g. "module decisions 41.2 s (torch.compile candidates 30.1 s, ...)"."""
        return time_summary(self.stage_s, self.module_s, self.elapsed_s)

    @property
    def kernels(self) -> list[ModuleReport]:
        """Calls that run something other than eager (a kernel or torch.compile)."""
        return [m for m in self.modules if m.status != "eager"]

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "elapsed_s": self.elapsed_s,
                "modules": [m.to_dict() for m in self.modules], "notes": list(self.notes),
                "end_to_end": self.end_to_end, "stage_s": dict(self.stage_s), "module_s": dict(self.module_s)}

    def table(self, width: int = 60, verbose: bool = False) -> str:
        """A plain-text table: module, input spec, times, what runs and why (covered calls folded)."""
        def us(v: float | None) -> str:
            return f"{v:.1f}" if v is not None else "-"
        graphs = any(m.graph_us is not None for m in self.modules)
        rows = [("module", "class", "input", "eager us", "compile us", "kernel us", "runs", "speedup", "why")]
        if graphs:
            rows[0] = rows[0][:5] + ("graph us",) + rows[0][5:]
        covered = [m for m in self.modules if m.reason == COVERED]
        for m in self.modules:
            if m.reason == COVERED and not verbose:
                continue
            speed = f"{m.speedup:.2f}x" if m.speedup is not None else "-"
            why = m.reason if len(m.reason) <= width else m.reason[: width - 3] + "..."
            row = (m.name, m.module_class.rsplit(".", 1)[-1], m.spec, us(m.eager_us), us(m.compile_us),
                   us(m.kernel_us), m.status, speed, why)
            rows.append(row[:5] + (us(m.graph_us),) + row[5:] if graphs else row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        n_compile = sum(1 for m in self.modules if m.status == "compile")
        n_graph = sum(1 for m in self.modules if m.status == "graph")
        head = (f"metal_accel on {self.backend} ({self.device}): {len(self.kernels) - n_compile - n_graph} of "
                f"{len(self.modules)} module calls run kernels, {n_compile} torch.compile"
                + (f", {n_graph} torch.compile as a CUDA graph" if n_graph else "") + "; "
                f"decided in {self.elapsed_s:.1f} s")
        if self.end_to_end is not None:
            e = self.end_to_end
            final = e["final_speedup"] if e.get("final_speedup") is not None else e["speedup"]
            head = (f"end to end on the example inputs: {final:.2f}x eager (self-noise ±{e['self_noise'] * 100:.1f}%)"
                    + (f"; {e['decision']}" if e.get("decision") else "")
                    + ("; inconclusive (a busy machine): not remembered, timed again next time"
                       if e.get("inconclusive") or (e.get("workload") or {}).get("inconclusive") else "")
                    + "\n" + head)
        if covered and not verbose:
            lines.append(f"(+ {len(covered)} calls inside modules that run kernels; table(verbose=True) lists them)")
        if self.time_spent:
            lines.append(f"time: {self.time_spent}")
        notes = [f"note: {n}" for n in self.notes]
        notes += [f"note: {m.name}: {n}" for m in self.modules if m.reason != COVERED or verbose for n in m.notes]
        return head + "\n" + "\n".join(lines + notes)

    def __str__(self) -> str:
        return self.table()
