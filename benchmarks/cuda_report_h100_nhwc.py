"""Render the docs/benchmarks.md section for the H100 level-2 run after channels-last convolutions and the
CUDA-graph launch of kernels (2026-11-25).

    python benchmarks/cuda_report_h100_nhwc.py [--no-write]

Inputs under docs/cuda/ (written on the device by `bash benchmarks/cuda_device.sh ...`):
h100_l2_graph_run14a..c.json (level 2, three calls), h100_conv_layout_run1.txt (benchmarks/conv_layout.py),
h100_kgap_run1.txt (benchmarks/kernel_gap.py, before the change).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cuda_report import DATA, fmt, geo  # noqa: E402
from cuda_report_h100_best import per_problem, render, rows, targets  # noqa: E402

WHAT = {"graph": "torch.compile as a CUDA graph", "compile": "torch.compile"}
L2_RUNS = ("h100_l2_graph_run14a.json", "h100_l2_graph_run14b.json", "h100_l2_graph_run14c.json")

INTRO = """\
Calls of the device tool on an H100, 2026-11-25 (sixth session); each call got a fresh machine:

1. `GAP_IDS="31 32 17 13 36 8 40 1 4 12 24 38 6 42" bash benchmarks/cuda_device.sh setup kgap`
   (`benchmarks/kernel_gap.py`, docs/cuda/h100_kgap_run1.txt): per problem, the kernel candidate's GPU time
   (torch.profiler) against its time per call. L2_31's kernel did 246 us of GPU work where eager did 348 us;
   a later profile showed eager's cuDNN call itself converting NCHW to NHWC and back around an NHWC kernel.
2. `python3 benchmarks/conv_layout.py ...` (docs/cuda/h100_conv_layout_run1.txt): each level-2 problem's
   first convolution timed NCHW (as eager runs it) and channels-last (input converted in the call): the
   channels-last conv was 1.05-2.61x faster on 42 of 45 problems; the three slower ones had 8 input channels.
3. Kernel-only bench runs (`--no-compile`) while the candidates were rewritten to run the conv channels-last
   (docs/cuda/h100_l2_kernel_run13*.json): they found a shadowed scalar in the generated epilogue (caught by
   the proof: wrong values), and that with 3 input channels cuDNN's NDHWC kernels lose eager's precision
   (L2_6, L2_24, L2_48: rejected by the proof, 0.02% to 43% of elements outside tolerance), hence the
   8-input-channel rule for 3-D convs.
4. `BENCH_MB=68 BENCH_ARGS="--level 2 --compile-candidate --problems ..." bash benchmarks/cuda_device.sh
   setup bench`, three calls (runs 14a-c: problems 1-17, 18-38, 40-60): every level-2 problem with a candidate.

New since the 2026-11-24 runs: (a) the candidates run their convolution channels-last and their epilogue
kernels read that layout (the generated ones transpose through shared memory as they write NCHW; the
reductions over channels read each pixel's channels contiguously); (b) a proven kernel is also timed
replayed as a CUDA graph (`prove.graph_alternative`), and the faster launch is installed ("replayed as a
CUDA graph" in the result). The speed gate is the one of session 5 (median >= 1.05x and a 99% lower bound
of the median per-pair ratio above 1). All tensors are capped at 68 MB (batch halved until they fit), so
batch sizes differ from the 2026-11-24 tables (64 MB there).
"""


def notes(rs: list[dict]) -> list[str]:
    worst = sorted((r for r in rs if r.get("vs_compile")), key=lambda r: r["vs_compile"])[:3]
    graph_launched = [r for r in rs if any("replayed as a CUDA graph" in t for t in [r["reason"], *r["outpaced"]])]
    out = ["### Notes on this run\n",
           "- Lowest best-vs-compile: " + ", ".join(f"{r['key']} {fmt(r['vs_compile'])}x" for r in worst) + ". "
           "L2_3's torch.compile and its graph replay failed the proof (1-2 of 16.8M elements outside tolerance "
           "on the small-inputs trial), so the kernel (3.23x eager) runs where the whole-model compile, which "
           "nothing checks, is faster.",
           "- L2_12 and L2_40 stay eager: fp32 GEMMs that are over 95% of the call (no faster GEMM without TF32, "
           "which the proof would reject); L2_24's kernel loses to eager (its NCDHW min-softmax pass is slow, and "
           "the channels-last conv with 3 input channels is not precise enough).",
           "- Kernels whose faster launch was the graph replay: " + ", ".join(
               f"L{r['level']}_{r['problem_id']} (installed: {WHAT.get(r['status'], r['status'])})" for r in graph_launched) +
           "; elsewhere the direct launch was as fast "
           "or the graph's input copies and output clones cost more than the host time they save.\n"]
    return out


def body() -> str:
    l2 = rows(L2_RUNS)
    dram = json.loads((DATA / L2_RUNS[0]).read_text())["dram_bandwidth_gbs"]
    measured = [r for r in l2 if r["status"] != "skipped" and r.get("vs_compile")]
    summary = (f"All {len(measured)} measured: geomean {fmt(geo([r['vs_eager'] for r in measured]))}x eager, "
               f"{fmt(geo([r['vs_compile'] for r in measured]))}x torch.compile.\n")
    return "\n".join([INTRO, *targets(l2, dram), summary, *notes(l2), *per_problem(l2)])


def main() -> int:
    return render(__doc__, body(), "cuda_h100_nhwc", "CUDA on an NVIDIA H100: level 2 with channels-last "
                  "convolutions and graph-launched kernels", "BENCH_MB=68 BENCH_ARGS=\"--level 2 --compile-candidate "
                  "--problems ...\" bash benchmarks/cuda_device.sh setup bench  (then python "
                  "benchmarks/cuda_report_h100_nhwc.py)", "h100_env_run14.txt", "2026-11-25")


if __name__ == "__main__":
    sys.exit(main())
