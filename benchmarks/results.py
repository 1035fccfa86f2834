"""The results tree: docs/results/<benchmark>/<run>.json, one file per run.

Every run carries "command", "machine" and "date" beside its data. Optional fields the renderer reads:
"session" (the title of the group of runs made together), "seq" (order among runs of one day), "notes"
(markdown prose about the run), "plot" (a PNG next to it), "superseded_by" (a run that replaces its rows),
"platform" (KernelBench runs: cpu, cpu-xeon16, h100, h200).
"""
from __future__ import annotations

import datetime
import json
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
REQUIRED = ("command", "machine", "date")


@dataclass(frozen=True)
class Run:
    benchmark: str
    name: str
    path: Path
    data: dict

    @property
    def order(self) -> tuple:
        return (str(self.data["date"])[:10], self.data.get("seq", 0), self.name)

    def rel(self) -> str:
        """The run's path relative to docs/ (where docs/benchmarks.md links from)."""
        return self.path.relative_to(ROOT / "docs").as_posix()


def load(root: Path = RESULTS) -> dict[str, list[Run]]:
    """Every run, by benchmark, oldest first."""
    out: dict[str, list[Run]] = {}
    for path in sorted(root.glob("*/*.json")):
        run = Run(path.parent.name, path.stem, path, json.loads(path.read_text()))
        out.setdefault(run.benchmark, []).append(run)
    return {b: sorted(rs, key=lambda r: r.order) for b, rs in sorted(out.items())}


def missing_fields(data: dict) -> list[str]:
    return [k for k in REQUIRED if not data.get(k)]


def machine() -> str:
    """This machine, in the words the CPU runs use."""
    import torch

    from metal_accel.backends.cpu.backend import cpu_name
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        nproc = "?"
    return (f"{cpu_name()}, {nproc} cores, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def today() -> str:
    return datetime.date.today().isoformat()


def record(benchmark: str, run: str, command: str, data: dict, machine_text: str | None = None,
           date: str | None = None) -> Path:
    """Write one run as docs/results/BENCHMARK/RUN.json; returns its path. Render docs/benchmarks.md
    afterwards with `python -m benchmarks.render`."""
    path = RESULTS / benchmark / f"{run}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command, "machine": machine_text or machine(), "date": date or today(), **data}
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def table(columns: list[str], rows: list[list], title: str | None = None) -> dict:
    """A table as data (cells already formatted), for runs whose figures are a table."""
    return {"title": title, "columns": columns, "rows": [[str(c) for c in r] for r in rows]}


def from_markdown(body: str) -> dict:
    """A script's markdown (tables and prose) as data: {"tables": [...], "notes": prose}."""
    tables: list[dict] = []
    prose: list[str] = []
    cur: dict | None = None
    for line in body.splitlines():
        s = line.strip()
        if s.startswith("|"):
            cells = [c.strip() for c in s.strip("|").split("|")]
            if cur is None:
                cur = {"title": None, "columns": cells, "rows": []}
                tables.append(cur)
            elif not set("".join(cells)) <= set("-: "):
                cur["rows"].append(cells)
            continue
        cur = None
        prose.append(line)
    notes = "\n".join(prose).strip()
    while "\n\n\n" in notes:
        notes = notes.replace("\n\n\n", "\n\n")
    return {"tables": tables, **({"notes": notes} if notes else {})}
