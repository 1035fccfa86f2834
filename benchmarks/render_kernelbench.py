"""KernelBench in docs/benchmarks.md: the chosen best per problem over every run of a platform (a later
run's measured row replaces an earlier one's), the headline table by level, and the per-problem tables."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .results import Run

PLATFORMS = {"cpu": "CPU", "cpu-xeon16": "CPU (16-core Xeon)", "h100": "CUDA H100", "h200": "CUDA H200"}
CHOSEN = (("kernel", "kernel"), ("compile", "torch.compile"), ("graph", "CUDA graph"), ("eager", "eager"))


@dataclass(frozen=True)
class Row:
    data: dict
    run: Run

    @property
    def measured(self) -> bool:
        d = self.data
        return d.get("status") != "skipped" and d.get("vs_eager") is not None and d.get("vs_compile") is not None


def kernelbench_runs(runs: dict[str, list[Run]]) -> list[Run]:
    """KernelBench runs with rows, oldest first; runs another run supersedes are left out."""
    out = [r for b in ("kernelbench_cpu", "kernelbench_cuda") for r in runs.get(b, [])
           if r.data.get("rows") and not r.data.get("superseded_by")]
    return sorted(out, key=lambda r: r.order)


def merged(runs: list[Run], platform: str) -> dict[str, Row]:
    """Per problem, the latest measured row of PLATFORM's runs (or its latest unmeasured row)."""
    out: dict[str, Row] = {}
    for run in runs:
        if run.data.get("platform") != platform:
            continue
        for d in run.data["rows"]:
            row = Row(d, run)
            if row.measured or d["key"] not in out or not out[d["key"]].measured:
                out[d["key"]] = row
    return out


def with_fill(main: dict[str, Row], other: dict[str, Row]) -> tuple[dict[str, Row], list[str]]:
    """MAIN plus OTHER's measured rows for problems MAIN never measured; the keys filled in."""
    fill = [k for k, r in other.items() if r.measured and not (k in main and main[k].measured)]
    return {**main, **{k: other[k] for k in fill}}, sorted(fill, key=sort_key)


def sort_key(key: str) -> tuple[int, int]:
    level, pid = key.split("_")[:2]
    return int(level[1:]), int(pid)


def short(key: str) -> str:
    return "_".join(key.split("_")[:2])


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def level_rows(label: str, rows: dict[str, Row]) -> list[str]:
    """Headline rows of one platform: each level and all levels."""
    out = []
    for level in ("1", "2", "3", "all"):
        rs = [r for k, r in rows.items() if r.measured and (level == "all" or k.startswith(f"L{level}_"))]
        if not rs:
            continue
        e = [r.data["vs_eager"] for r in rs]
        c = [r.data["vs_compile"] for r in rs]
        worst = min(rs, key=lambda r: r.data["vs_compile"])
        counts = " / ".join(str(sum(r.data["status"] == s for r in rs)) for s, _ in CHOSEN)
        out.append(f"| {label} | {level} | {len(rs)} | {geomean(e):.2f}x | {statistics.median(e):.2f}x | "
                   f"{geomean(c):.2f}x | {statistics.median(c):.2f}x | {worst.data['vs_compile']:.2f}x "
                   f"({short(worst.data['key'])}) | {counts} |")
    return out


def platforms(runs: list[Run]) -> dict[str, dict[str, Row]]:
    found = {r.data["platform"] for r in runs}
    return {p: merged(runs, p) for p in PLATFORMS if p in found}


def headline(runs: list[Run], anchor: str) -> str:
    """The headline table: per platform and level, the chosen best against eager and torch.compile."""
    by = platforms(runs)
    head = [("| backend | level | problems measured | geomean vs eager | median vs eager | geomean vs torch.compile "
             "| median vs torch.compile | worst vs torch.compile | chosen best: kernel / torch.compile / CUDA graph "
             "/ eager |"), "|---|---|---|---|---|---|---|---|---|"]
    lines = list(head)
    notes = []
    if "cpu" in by:
        cpu, fill = with_fill(by["cpu"], by.get("cpu-xeon16", {}))
        lines += level_rows("CPU", cpu)
        if fill:
            notes.append(f"CPU rows are the 2-core AMD EPYC's, plus {len(fill)} problems too large for it measured "
                         f"on a 16-core Xeon ({', '.join(short(k) for k in fill)}).")
    for p in ("h100", "h200"):
        if p in by:
            lines += level_rows(PLATFORMS[p], by[p])
    if "h100" in by and "h200" in by and with_fill(by["h100"], by["h200"])[1]:
        both, fill = with_fill(by["h100"], by["h200"])
        rs = [r for r in both.values() if r.measured]
        notes.append(f"H100 and H200 together (the H200's rows only for the {len(fill)} problems no H100 run "
                     f"measured): {len(rs)} problems, geomean {geomean([r.data['vs_eager'] for r in rs]):.2f}x "
                     f"eager and {geomean([r.data['vs_compile'] for r in rs]):.2f}x torch.compile.")
    text = "\n".join(lines) + "\n"
    text += ("\nPer problem, the pipeline picks the best of eager, torch.compile, torch.compile replayed as a CUDA "
             "graph (CUDA) and the kernel candidates of benchmarks/candidates/ under one proof and speed gate; "
             "the suite then times eager, the whole model under torch.compile and the chosen best side by side. "
             "Each problem's row is its latest measured run on that platform; the runs differ in date and tensor "
             f"cap, so this summarizes what was measured, not one run ([per problem](#{anchor})). "
             + " ".join(notes) + "\n")
    return text


def result_text(d: dict) -> str:
    status = d.get("status", "?")
    if status == "skipped" or (status == "eager" and d.get("reason")):
        return f"{status}: {d.get('reason', '')}".replace("|", "/")[:110]
    return status


def cell(x: float | None, spec: str = ".1f") -> str:
    return "–" if x is None else format(x, spec)


def per_problem(rows: dict[str, Row]) -> str:
    """Every problem of one platform: its latest row and the run it comes from."""
    out = [("| problem | batch | eager µs | torch.compile µs | chosen best µs | vs eager | vs torch.compile | "
            "chosen | run |"), "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(rows, key=sort_key):
        r = rows[key]
        d = r.data
        batch = d.get("batch")
        batch_text = "–" if batch is None else (f"{batch}" if batch == d.get("batch_original")
                                                 else f"{batch} (of {d.get('batch_original')})")
        out.append(f"| {key} | {batch_text} | {cell(d.get('eager_us'))} | {cell(d.get('compile_us'))} | "
                   f"{cell(d.get('kernel_us'))} | {ratio(d.get('vs_eager'))} | {ratio(d.get('vs_compile'))} | "
                   f"{result_text(d)} | [{r.run.name}]({r.run.rel()}) |")
    return "\n".join(out) + "\n"


def run_summary(run: Run) -> str:
    """One line about a KernelBench run for the history: what it measured."""
    rows = [Row(d, run) for d in run.data.get("rows", [])]
    rs = [r for r in rows if r.measured]
    if not rows:
        return ""
    text = f"{len(rows)} problems, {len(rs)} measured with torch.compile beside them"
    if rs:
        text += (f": geomean {geomean([r.data['vs_eager'] for r in rs]):.2f}x eager, "
                 f"{geomean([r.data['vs_compile'] for r in rs]):.2f}x torch.compile")
    counts = {label: sum(r.data.get("status") == s for r in rows) for s, label in CHOSEN}
    text += "; chosen: " + ", ".join(f"{n} {label}" for label, n in counts.items() if n)
    return text + "."
