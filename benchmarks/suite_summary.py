"""Issue 8 over the visible KernelBench suite: the chosen best against eager and torch.compile, per level and
for all levels, from the sections of docs/benchmarks.md measured on one kind of machine.

    python benchmarks/suite_summary.py --device cpu|cuda [--no-write] [--sections NAME ...]

Reads the per-problem tables of the device's sections (a later section's row replaces an earlier one for the
same problem), so every figure here traces back to a section with its own command, machine and date; it
measures nothing itself. Writes the section `cpu_issue8` or `cuda_issue8`.
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _docs import DOC, write_section  # noqa: E402

SUITE = HERE.parent.parent / "shared" / "kernelbench" / "problems.jsonl"

# per device: the sections in the order they were measured, the section written, its title, and sections of
# another card or machine whose rows count only for problems the device's own sections never measured
PROFILES = {
    "cpu": (("kernelbench_cpu_l2_epilogues", "kernelbench_cpu", "kernelbench_cpu_l1", "kernelbench_cpu_l3",
             "kernelbench_cpu_l3_13-25", "kernelbench_cpu_l2_gn_mean", "kernelbench_cpu_l2_46_11",
             "kernelbench_cpu_l2_regate", "kernelbench_cpu_s11", "kernelbench_cpu_s12", "kernelbench_cpu_s13",
             "kernelbench_cpu_s14", "kernelbench_cpu_s15"),
            "cpu_issue8", "CPU: issue 8 over the measured KernelBench suite (summary of the CPU sections, and the "
            "16-core Xeon one for problems too large for the CPU machine)", ("kernelbench_cpu_xeon16",)),
    "cuda": (("cuda_h100", "cuda_h100_best", "cuda_h100_graph", "cuda_h100_nhwc", "cuda_h100_l1", "cuda_h100_l1c",
              "cuda_h100_bw", "cuda_h100_s10", "cuda_h100_s11", "cuda_h100_s12"),
             "cuda_issue8", "CUDA: issue 8 over the measured KernelBench suite (summary of the H100 sections, and the "
             "H200 one for problems no H100 run measured)", ("cuda_h200_s11",)),
}


def section_text(doc: str, name: str) -> str | None:
    m = re.search(re.escape(f"<!-- {name}:start -->") + "(.*?)" + re.escape(f"<!-- {name}:end -->"), doc, re.S)
    return m.group(1) if m else None


def table_rows(text: str) -> dict[str, dict]:
    """Measured rows of a section's per-problem table: key -> level, vs eager, vs compile, status."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or not re.match(r"L\d+_\d+_", cells[0]):
            continue
        try:
            vs_eager, vs_compile = float(cells[5]), float(cells[6])
        except ValueError:  # skipped: –
            continue
        out[cells[0]] = {"level": int(cells[0][1:cells[0].index("_")]), "vs_eager": vs_eager,
                         "vs_compile": vs_compile, "result": cells[8 if len(cells) >= 10 else 7].split(":")[0]}
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary_lines(rows: dict[str, dict]) -> list[str]:
    lines = ["| levels | measured | geomean vs eager | geomean vs torch.compile | worst vs torch.compile | "
             "below 0.97x torch.compile |", "|---|---|---|---|---|---|"]
    for label, levels in (("1", {1}), ("2", {2}), ("3", {3}), ("all", {1, 2, 3})):
        rs = {k: r for k, r in rows.items() if r["level"] in levels}
        if not rs:
            continue
        worst = min(rs, key=lambda k: rs[k]["vs_compile"])
        below = sorted((k for k, r in rs.items() if r["vs_compile"] < 0.97), key=lambda k: rs[k]["vs_compile"])
        lines.append(f"| {label} | {len(rs)} | {geomean([r['vs_eager'] for r in rs.values()]):.2f}x | "
                     f"{geomean([r['vs_compile'] for r in rs.values()]):.2f}x | {rs[worst]['vs_compile']:.2f}x "
                     f"({worst}) | " + (", ".join(f"{k.split('_', 2)[0]}_{k.split('_', 2)[1]} "
                                                  f"{rs[k]['vs_compile']:.2f}x" for k in below) or "none") + " |")
    return lines


def verdict(rows: dict[str, dict], device: str) -> str:
    """Issue 8's target over the measured problems, and the noise of timing a module against itself."""
    g = geomean([r["vs_compile"] for r in rows.values()])
    below = sum(r["vs_compile"] < 0.97 for r in rows.values())
    below_eager = [k for k, r in rows.items() if r["vs_eager"] < 0.97]
    itself = [k for k in below_eager if rows[k]["result"] == "eager"]
    text = (f"Against issue 8's {device.upper()} target over the {len(rows)} measured problems: geomean over torch.compile "
            f"{g:.2f}x ({'at least' if g >= 1.15 else 'below'} 1.15x); at least 1.0x torch.compile on every problem: "
            + ("met" if not below else f"not met, {below} problem{'s' if below > 1 else ''} below 0.97x (each section says why)")
            + "; at least 1.0x eager on every problem: "
            + ("met" if not below_eager else f"{len(below_eager)} below 0.97x eager"
               + (f", {len(itself)} of them where the chosen best is eager itself" if itself else "")) + ".\n")
    same = sorted(r["vs_eager"] for r in rows.values() if r["result"] == "eager")
    if same:
        text += (f"\nWhere the chosen best is eager ({len(same)} problems), the optimized model runs the same eager "
                 f"modules, so its ratio to eager is the noise of timing a module against itself in these runs: "
                 f"{same[0]:.2f}x to {same[-1]:.2f}x, median {statistics.median(same):.2f}x, "
                 f"{sum(x < 0.97 for x in same)} below 0.97x and {sum(x > 1.03 for x in same)} above 1.03x.\n")
    return text


def read_sections(doc: str, names: Sequence[str]) -> tuple[dict[str, dict], list[str]]:
    """The measured rows of NAMES (a later section's row replaces an earlier one's) and a line per section."""
    rows: dict[str, dict] = {}
    used = []
    for name in names:
        text = section_text(doc, name)
        if text is None:
            continue
        head = re.search(r"^- machine: (.*)$", text, re.M), re.search(r"^- date: (.*)$", text, re.M)
        used.append(f"- `{name}`: {head[0].group(1) if head[0] else '?'}, {head[1].group(1) if head[1] else '?'}")
        rows.update(table_rows(text))
    return rows, used


def suite_keys() -> list[str] | None:
    """Every problem of the visible suite (../shared/kernelbench), or None where it is absent."""
    if not SUITE.is_file():
        return None
    from metal_accel.kernelbench.problems import load_problems
    from metal_accel.kernelbench.problem import problem_key
    return [problem_key(p) for p in load_problems(SUITE)]


def short(key: str) -> str:
    return "_".join(key.split("_", 2)[:2])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=sorted(PROFILES), required=True)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--sections", nargs="+", help="in order; later rows replace earlier (default: the device's)")
    args = ap.parse_args()
    sections, out_section, title, others = PROFILES[args.device]
    doc = DOC.read_text()
    rows, used = read_sections(doc, args.sections or sections)
    lines = [f"The chosen best (eager, torch.compile or a kernel, per problem) over every {args.device.upper()}-"
             "measured problem, from these sections (a later one's row replaces an earlier one's):\n", *used,
             "", *summary_lines(rows), "", verdict(rows, args.device)]
    other_rows, other_used = read_sections(doc, others)
    extra = {k: r for k, r in other_rows.items() if k not in rows}
    if extra:
        both = {**rows, **extra}
        lines += [f"Measured on another {'card' if args.device == 'cuda' else 'machine'} only ({len(extra)} problems: "
                  + ", ".join(short(k) for k in sorted(extra, key=lambda k: (extra[k]['level'], k))) + "), from:\n",
                  *other_used, "", "With those rows added (each ratio from one machine, side by side in one run):\n",
                  *summary_lines(both), "", verdict(both, args.device)]
        rows = both
    keys = suite_keys()
    if keys is not None:
        missing = [k for k in keys if k not in rows]
        lines.append(f"Of the {len(keys)} problems of the visible suite, {len(keys) - len(missing)} are measured; "
                     + (f"not measured: {', '.join(short(k) for k in missing)} (the sections say why).\n"
                        if missing else "none is left unmeasured.\n"))
    lines.append("Ratios are side by side within each run; the sections are separate runs (see their dates and "
                 "machines) at capped tensor sizes, so this summarizes what was measured, not one run.\n")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section(out_section, title, f"python benchmarks/suite_summary.py --device {args.device}", body,
                      machine_text="see the sections listed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
