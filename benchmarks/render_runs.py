"""Markdown for one run of any benchmark: its header (command, machine, date), its figures as tables, and a
one-line summary for the history of runs."""
from __future__ import annotations

import re
import statistics

from .render_kernelbench import run_summary
from .results import Run

META = ("command", "machine", "date", "driver", "session", "seq", "notes", "plot", "superseded_by", "platform",
        "recovered_from")


def portable(text: str) -> str:
    """Paths of the machines a run was made on, as a checkout sees them: ../shared/kernelbench/problems.jsonl
    is the KernelBench problems file (.kb/problems.jsonl is its copy on a GPU machine), $OUT the device's
    output folder."""
    text = text.replace("/work/shared/", "../shared/").replace("/tmp/benchtree/", "")
    return re.sub(r"/root/out/", "$OUT/", text)


def machine_text(m: object) -> str:
    if isinstance(m, dict):
        return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('os', '?')}, torch {m.get('torch', '?')}"
    return str(m)


def header(run: Run, link: bool = True) -> str:
    d = run.data
    lines = [f"- command: `{portable(d['command'])}`"]
    if d.get("driver"):
        lines.append(f"- driven by: `{portable(d['driver'])}`")
    lines += [f"- machine: {machine_text(d['machine'])}", f"- date: {str(d['date'])[:10]}"]
    if link:
        lines.append(f"- data: [{run.rel()}]({run.rel()})")
    return "\n".join(lines) + "\n"


def md_table(columns: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def num(x: object) -> str:
    if isinstance(x, bool) or not isinstance(x, float):
        return "–" if x is None else str(x)
    return f"{x:.2f}" if abs(x) < 100 else f"{x:.1f}"


def dict_table(rows: list[dict]) -> str:
    """Rows of scalar fields (nested dicts flattened one level) as a table."""
    flat = []
    for r in rows:
        f: dict = {}
        for k, v in r.items():
            if isinstance(v, dict):
                f.update({f"{k}.{k2}": v2 for k2, v2 in v.items() if not isinstance(v2, (dict, list))})
            elif not isinstance(v, list):
                f[k] = v
        flat.append(f)
    cols = list(dict.fromkeys(k for f in flat for k in f))
    return md_table(cols, [[num(f.get(c)) for c in cols] for f in flat])


def tables(data: dict) -> str:
    parts = []
    for t in data.get("tables", []):
        parts.append((f"{t['title']}:\n\n" if t.get("title") else "") + md_table(t["columns"], t["rows"]))
    return "\n".join(parts)


def bandwidth(data: dict) -> str:
    rows = [[r["kernel"], f"{r.get('mbytes', 0):.0f}", num(r.get("eager_us")), num(r.get("kernel_us")),
             f"{r['kernel_frac']:.0%}" if "kernel_frac" in r else str(r.get("error", "–"))[:60],
             f"{r['eager_frac']:.0%}" if "eager_frac" in r else "–"] for r in data["rows"]]
    return (md_table(["kernel", "MB moved", "eager µs", "kernel µs", "kernel % of copy", "eager % of copy"], rows)
            + f"\nDevice-to-device copy in the same run: {data['copy_gbs']:.0f} GB/s.\n")


def blocks(data: dict) -> str:
    rows = [[b["block"], num(b.get("eager_us")), num(b.get("kernel_us")),
             "–" if b.get("speedup") is None else f"{b['speedup']:.2f}x", b.get("status", "?"),
             str(b.get("reason", ""))[:100]] for b in data["rows"]]
    return md_table(["block", "eager µs", "kernel µs", "speedup", "result", "why"], rows)


def dispatch_cost(data: dict) -> str:
    rows = [[f"{r['shape'][0]}x{r['shape'][1]}", f"{r['eager_over_in_process']:.2f}x", f"{r['eager_over_server']:.2f}x",
             f"{r['server_over_in_process']:.2f}x", f"{r['server_extra_us']:.0f} µs (this machine; indicative)"]
            for r in data["results"]]
    load = data["machine"].get("load_average_1m") if isinstance(data["machine"], dict) else None
    return ("The toy Chain kernel (36 elementwise ops fused) called three ways, interleaved rounds, medians: eager, "
            "the kernel loaded in this process (shipped kernels, or `METAL_ACCEL_TRUST_NATIVE=1`), and through the "
            "kernel server (untrusted CPU kernels, the default). Ratios are the result; microseconds on this shared "
            "machine only indicate" + (f" (load average {load:.1f} at the start)" if load is not None else "")
            + ".\n\n" + md_table(["shape", "eager / in-process", "eager / kernel server", "server / in-process",
                                  "server's extra per call"], rows))


def trust_cost(data: dict) -> str:
    rows = []
    for name, runs in data["results"].items():
        cold = [r for r in runs if r["phase"] == "cold"]
        warm = [r for r in runs if r["phase"] == "warm"]
        med = lambda rs, k: statistics.median(r[k] for r in rs)
        rows.append([f"{name} ({data['checkouts'][name]})", f"{med(cold, 'optimize_s'):.1f}",
                     f"{med(warm, 'optimize_s'):.2f}", f"{med(warm, 'replaced'):.0f}",
                     f"{med(warm, 'forward_speedup'):.2f}x", f"{med(warm, 'dispatch_miss_us'):.2f}"])
    return ("`--before` names a checkout of the commit before the change (`git worktree add ../before "
            f"{data['checkouts']['before']}`). Medians over the rounds; `forward vs eager` is the median of "
            "interleaved eager/optimized pairs of the warm run (a ratio, measured side by side); `dispatcher miss` "
            "is the per-call cost of a dispatcher with no kernel for the call, over a bare call.\n\n"
            + md_table(["checkout", "optimize() cold, s", "optimize() warm, s", "modules replaced", "forward vs eager",
                        "dispatcher miss, µs"], rows))


def library(d: dict) -> str:
    """The kernel library's kernels (issue 29): per module and dtype, eager against the installed kernel in the
    pipeline's own timing; memory-bound kernels' bandwidth against a copy in the same run."""
    out = []
    cases = d.get("cases") or []
    if cases:
        out += ["| module | family | dtype | shape | eager µs | kernel µs | speedup | verdict |", "|---|---|---|---|---|---|---|---|"]
        for c in cases:
            verdict = "installed" if c.get("status") == "kernel" else (
                "correct, not faster: eager kept" if c.get("proven") else "not proven")
            us = (lambda v: "–" if v is None else f"{v:.1f}")
            sp = c.get("speedup") or (c["eager_us"] / c["kernel_us"] if c.get("eager_us") and c.get("kernel_us") else None)
            out.append(f"| {c.get('class', c.get('case'))} | {c.get('family', '?')} | {c.get('dtype')} | "
                       f"{'x'.join(map(str, c.get('shape', [])))} | {us(c.get('eager_us'))} | {us(c.get('kernel_us'))} | "
                       f"{'–' if sp is None else f'{sp:.2f}x'} | {verdict} |")
        out.append("")
    bw = d.get("bandwidth") or []
    if bw:
        out += ["| kernel | dtype | shape | copy GB/s | kernel GB/s (of copy) | eager GB/s (of copy) |", "|---|---|---|---|---|---|"]
        for b in bw:
            out.append(f"| {b['kernel']} | {b['dtype']} | {'x'.join(map(str, b['shape']))} | {b['copy_gbs']:.0f} | "
                       f"{b['kernel_gbs']:.0f} ({b['kernel_frac'] * 100:.0f}%) | {b['eager_gbs']:.0f} ({b['eager_frac'] * 100:.0f}%) |")
        out.append("")
    return "\n".join(out)


def figures(run: Run) -> str:
    """The run's figures as markdown ('' where it has none to show beyond its summary)."""
    d = run.data
    if "tables" in d:
        return tables(d)
    if run.benchmark == "cuda_bandwidth":
        return bandwidth(d)
    if run.benchmark == "cuda_blocks" and isinstance(d.get("rows"), list):
        return blocks(d)
    if run.benchmark == "dispatch_cost" and "results" in d:
        return dispatch_cost(d)
    if run.benchmark == "trust_cost":
        return trust_cost(d)
    if run.benchmark == "library" and ("cases" in d or "bandwidth" in d):
        return library(d)
    if "lines" in d:
        return "```\n" + "\n".join(d["lines"]).strip() + "\n```\n"
    if isinstance(d.get("rows"), list) and d["rows"] and not run.benchmark.startswith("kernelbench"):
        return dict_table(d["rows"])
    keyed = {k: v for k, v in d.items() if isinstance(v, dict) and k not in ("machine", "environment")}
    if keyed and len(keyed) == len([k for k in d if k not in META]):
        return dict_table([{"name": k, **v} for k, v in keyed.items()])
    return ""


def summary(run: Run) -> str:
    """One line for the history of runs."""
    d = run.data
    if run.benchmark.startswith("kernelbench"):
        text = run_summary(run) or "the run's printed output."
    elif run.benchmark == "cuda_bandwidth":
        low = min((r for r in d["rows"] if "kernel_frac" in r), key=lambda r: r["kernel_frac"], default=None)
        text = (f"{len(d['rows'])} kernels, copy {d['copy_gbs']:.0f} GB/s"
                + (f"; lowest {low['kernel_frac']:.0%} of the copy ({low['kernel']})" if low else "") + ".")
    elif run.benchmark == "cuda_blocks" and isinstance(d.get("rows"), list):
        text = f"{sum(b.get('status') == 'kernel' for b in d['rows'])} of {len(d['rows'])} blocks run a kernel."
    elif "lines" in d:
        text = f"text output, {len(d['lines'])} lines."
    else:
        text = ""
    if d.get("superseded_by"):
        text += f" Superseded by {d['superseded_by']}."
    return text.strip()
