"""What `metal-accel bench` writes: markdown tables, a plot and the JSON of a suite run."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .result import SuiteResult, calls_text


def _fmt(v: float | None, spec: str) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def markdown(res: SuiteResult) -> str:
    lines = []
    for key, s in [(str(lv), res.summary(lv)) for lv in res.levels()] + [("all", res.summary())]:
        lines.append(f"- level {key}: {s['attempted']} attempted; geomean {_fmt(s['geomean_vs_eager'], '.2f')}x vs eager, "
                     f"{_fmt(s['geomean_vs_compile'], '.2f')}x vs torch.compile; candidate correct "
                     f"{s['correct']}/{s['attempted']}; installed (correct and >= 1.05x) {s['installed']}"
                     f" (and {s.get('outpaced_by_compile', 0)} more that passed but lost to torch.compile); "
                     f"installed but slower than eager: {', '.join(s['installed_slower_than_eager']) or 'none'}")
    for key, b in [(str(lv), res.best_summary(lv)) for lv in res.levels()] + [("all", res.best_summary())]:
        if b["measured"]:
            lines.append(f"- level {key}, chosen best over all {b['measured']} measured problems "
                         f"(runs: {b['runs']['kernel']} kernel, {b['runs']['compile']} torch.compile, "
                         f"{b['runs'].get('graph', 0)} torch.compile as a CUDA graph, "
                         f"{b['runs']['eager']} eager): geomean {_fmt(b['geomean_vs_eager'], '.2f')}x vs eager, "
                         f"{_fmt(b['geomean_vs_compile'], '.2f')}x vs torch.compile; worst "
                         f"{_fmt(b['min_vs_eager'], '.2f')}x vs eager, {_fmt(b['min_vs_compile'], '.2f')}x vs "
                         "torch.compile")
            if any(b.get("calls", {}).values()):
                lines.append(f"- level {key}, the captured calls of the measured models: {calls_text(b['calls'])}")
            noise = b.get("self_noise") or {}
            if noise.get("problems"):
                lines.append(f"- level {key}, self-noise (eager timed against a second copy of itself in the same "
                             f"balanced rounds): median {_fmt(100 * noise['median'], '.1f')}%, max "
                             f"{_fmt(100 * noise['max'], '.1f')}% over {noise['problems']} problems; a speedup "
                             "closer to 1.00x than its row's noise is a tie")
    lines += ["", "| problem | batch | eager µs | compile µs | optimized µs | vs eager | vs compile | noise | correct | "
              "result (top-level module) | calls (whole subtree) | % DRAM BW |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.rows:
        batch = f"{r.batch}" + (f" (of {r.batch_original})" if r.batch != r.batch_original else "")
        correct = {True: "yes", False: "no", None: "–"}[r.candidate_correct]
        result = "kernel" if r.status == "kernel" else \
            "torch.compile won the pipeline" if r.status == "compile" else \
            "torch.compile as a CUDA graph won the pipeline" if r.status == "graph" else f"{r.status}: {r.reason}"
        result = result.replace("|", "/").replace("\n", " ")[:160]
        bw = _fmt(100 * r.bandwidth_frac, ".0f") + "%" if r.memory_bound and r.bandwidth_frac else "–"
        noise = "–" if r.self_noise is None or math.isnan(r.self_noise) else f"{100 * r.self_noise:.1f}%"
        lines.append(f"| {r.key} | {batch} | {_fmt(r.eager_us, '.1f')} | {_fmt(r.compile_us, '.1f')} | "
                     f"{_fmt(r.kernel_us, '.1f')} | {_fmt(r.vs_eager, '.2f')} | {_fmt(r.vs_compile, '.2f')} | "
                     f"{noise} | {correct} | {result} | {calls_text(r.calls) or '–'} | {bw} |")
    return "\n".join(lines) + "\n"


def plot(res: SuiteResult, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in res.rows if r.vs_eager]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r.vs_eager for r in rows], height=0.4, label="vs eager",
            color=["tab:green" if r.status == "kernel" else "tab:gray" for r in rows])
    ax.barh([i - 0.2 for i in y], [r.vs_compile or 0 for r in rows], height=0.4, label="vs torch.compile",
            color="tab:blue", alpha=0.6)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(list(y), [r.key[:40] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup of the optimized model (green: kernel installed, gray: eager fallback)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_outputs(res: SuiteResult, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "suite.json", out / "suite.md"]
    paths[0].write_text(json.dumps(res.to_dict(), indent=1, default=str))
    paths[1].write_text(markdown(res))
    if plot(res, out / "suite.png"):
        paths.append(out / "suite.png")
    return paths
