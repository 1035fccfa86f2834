"""Render the CUDA (H100) section of docs/benchmarks.md from the results copied back from the GPU machine.

    python benchmarks/cuda_report.py [--no-write]

Inputs, all under docs/cuda/ (written on the device by `bash benchmarks/cuda_device.sh ...`, see the
section itself): h100_bench_run2.json (level 1), h100_bench_run3.json (level 1 re-runs and level 2),
h100_sweep_run1.json (the first, smaller-size sweep), h100_blocks.json, h100_pytest_cuda.log, h100_env.txt.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DATA = HERE.parent / "docs" / "cuda"
RERUN_IN_RUN3 = {"L1_24_LogSoftmax", "L1_25_Swish", "L1_30_Softsign"}  # run 2 hit the NVRTC b" " bug
REWRITES = {"L2_14_Gemm_Divide_Sum_Scaling", "L2_18_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp",
            "L2_51_Gemm_Subtract_GlobalAvgPool_LogSumExp_GELU_ResidualAdd"}


INTRO = """\
What was run, on the device tool's H100 (three calls, 2026-11-22; this machine has no GPU):

1. `bash benchmarks/cuda_device.sh setup tests sweep blocks`: every candidate once at small sizes (the sweep;
   it found the bugs listed at the end, and its results are superseded except where said).
2. `BENCH_ARGS="--level 1" bash benchmarks/cuda_device.sh setup tests blocks bench`: level 1.
3. `BENCH_ARGS="--problems L1_24* L1_25* L1_30* L2_*" bash benchmarks/cuda_device.sh setup tests blocks bench`:
   level 2, the three level-1 problems that run 2 had mis-judged, the shipped blocks and the GPU tests.

The bench step is `metal-accel bench .kb/problems.jsonl --provider dir:benchmarks/candidates --attempted-only
--max-tensor-mb 64 --budget 0.6 --bench-budget 0.6 --compile-jobs 12` over KernelBench's problems.jsonl
(../shared/kernelbench, commit 423217d), with a fresh user cache. Raw results: docs/cuda/.

How to read it:
- Each problem's `Model` runs in eval mode (BatchNorm uses its running statistics: metal_accel is for
  inference) on its `get_inputs()`, with `batch_size` halved until no input or output tensor exceeds 64 MB;
  "batch" shows the size used and KernelBench's. The sizes are smaller than KernelBench's because the whole
  session had 30 minutes of GPU time; small sizes favour eager (fixed per-call costs weigh more).
- eager, torch.compile (inductor, default mode; compiled before timing, caches warmed in 12 parallel
  processes) and the optimized model (after `optimize()`: the accepted kernel, or eager where every
  candidate was rejected) are timed round-robin on three input sets, each call between device
  synchronizations, timed with CUDA events checked against the wall clock; medians. Times are whole
  calls, Python dispatch included.
- "correct": the candidate passed the pipeline's validation in an isolated worker process (six trials of
  fresh inputs including special values, NaN-poisoned outputs, a float64 reference, determinism, and for
  shape-generic candidates two other batch sizes). "result": `kernel` when it also passed the speed gate
  (median >= 1.05x eager over interleaved pairs and winning at least 3 of 4 pairs), else why it fell back.
  torch.compile as a pipeline candidate is off here (`--compile-candidate` turns it on), so "kernel" is
  always one of benchmarks/candidates/cuda/.
- Three level-2 candidates are algebraic rewrites rather than fusions (L2_14, L2_18, L2_51: the sum or
  mean over a linear layer's outputs is x . colsum(W), so the GEMM becomes a matrix-vector product; rows
  holding NaN, Inf or huge values are recomputed the GEMM's way). They are reported with and without.
- Level-2 problems not attempted: the fp32 GEMM-bound ones where the GEMM is over 95% of eager's time, so
  no fused epilogue can reach 1.05x (L2_9, 22, 28, 29, 30, 33, 39, 41, 53, 55, 56, 59; two such candidates,
  L2_12 and L2_40, were run to show the pipeline rejecting them), and, for lack of time, L2_10, 13, 24,
  25, 32, 36, 38, 42, 43, 44, 45, 49, 50, 58.
"""

FINDINGS = """\
### What the runs found (and what changed after them)

- NVRTC corrupted the interpreter: the log buffer of NVRTC's own examples (`b" " * size`) is CPython's
  cached one-byte `b" "` when the log is empty, and NVRTC's terminating NUL turned it into `b"\\x00"` for
  the life of the process. After that, unpickling and `torch.load` read every dimension of 32 as 0:
  candidates failed validation with "shape (0, 8192) != eager (32, 8192)" or "storage has wrong byte
  size". The buffers are bytearrays now; tests/test_cuda_backend.py has a regression test. Runs 1 and 2
  were affected (run 2's L1_24, L1_25, L1_30 were re-run in run 3).
- Validation failed on 0-dim outputs and buffers (scalar losses, BatchNorm's `num_batches_tracked`); fixed
  in validate.py before runs 2 and 3.
- The timer dropped a whole comparison as "unreliable" when one call's CUDA-event and wall-clock times
  disagreed four times in a row (L1_30 and the BiasGelu block, 4 to 6 refused samples in hundreds);
  since then only that pair is dropped (bench.py). Not re-run: those two stay rejected above.
- The Rotary block failed the special-values trial because the compiler contracted `a*b + c*d` into an
  FMA, which keeps an overflowing product finite where eager gets Inf - Inf = NaN; the kernel now rounds
  each product (`__fmul_rn`). Not re-proven on a GPU, so not shipped.
- A call through the pipeline costs tens of microseconds more than its kernel (the SiluMul block at
  64 x 8192, 2 MB, in the GPU test: eager 35 µs, kernel 58 µs), although launches already went through
  ctypes to libcuda with cached launch dimensions and reused argument buffers in runs 2 and 3 (run 1 used
  cuda-bindings' cuLaunchKernel, slower still). Where the rest goes (dispatcher, custom op, sandboxed host
  code) is not profiled yet. It is why the memory-bound kernels reach 14-45% of the DRAM bandwidth at
  these sizes (whole calls of 60-250 µs) and why several level-2 fusions miss the 1.05x gate at batch 1-4.
- Changed after the runs and not re-run on a GPU: the timer's pair dropping (bench.py), the Rotary
  kernel, the GPU isolation test's assertion, and float4 loads in the L1_94/L1_96/L1_98 reductions
  (their rows above are the scalar versions measured in run 2, which L1_94 and L1_96 lost to eager).
- Numerically ill-conditioned outputs fail the strict float32 tolerance against eager's own rounding:
  normalizing nearly constant data on the "small inputs" trial (L2_3, L2_15, L2_17) and L2_23, whose
  output (the mean of a GroupNorm output with default affine parameters) is rounding noise around zero.
"""


def geo(xs: list[float | None]) -> float | None:
    """Geometric mean of the values that were measured (None and 0 left out)."""
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def load_rows() -> tuple[list, list, dict]:
    from metal_accel.kernelbench.runner import Row
    run2 = json.loads((DATA / "h100_bench_run2.json").read_text())
    run3 = json.loads((DATA / "h100_bench_run3.json").read_text())
    mk = lambda d: Row(**d)  # noqa: E731
    rows = [mk(r) for r in run2["rows"] if r["key"] not in RERUN_IN_RUN3] + [mk(r) for r in run3["rows"]]
    measured = {r.key for r in rows}
    sweep = json.loads((DATA / "h100_sweep_run1.json").read_text())
    missing = [mk(r) for r in sweep["rows"] if r["key"] not in measured]
    rows.sort(key=lambda r: (r.level or 0, r.problem_id or 0))
    return rows, missing, {"run2": run2, "run3": run3, "sweep": sweep}


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def body() -> tuple[str, str]:
    from metal_accel.kernelbench.runner import SuiteResult
    from metal_accel.kernelbench.report import markdown
    rows, missing, raw = load_rows()
    env = raw["run3"]["environment"]
    dram = raw["run3"]["dram_bandwidth_gbs"]
    res = SuiteResult(rows, env, dram * 1e9)
    out = []
    l2 = [r for r in rows if r.level == 2]
    s2, s1 = res.summary(2), res.summary(1)
    l2_plain = [r.vs_eager for r in l2 if r.key not in REWRITES and r.vs_eager]
    l2_plain_c = [r.vs_compile for r in l2 if r.key not in REWRITES and r.vs_compile]
    mem = [r for r in rows if r.memory_bound and r.bandwidth_frac]
    out.append("### Against the targets of issue 6\n")
    out.append("| target | level 2 | level 1 |\n|---|---|---|")
    out.append(f"| geomean speedup over eager >= 1.5x | {fmt(s2['geomean_vs_eager'])}x (without the two algebraic "
               f"rewrites L2_14, L2_18: {fmt(geo(l2_plain))}x) | {fmt(s1['geomean_vs_eager'])}x |")
    out.append(f"| geomean speedup over torch.compile >= 1.1x | {fmt(s2['geomean_vs_compile'])}x (without the "
               f"rewrites: {fmt(geo(l2_plain_c))}x) | {fmt(s1['geomean_vs_compile'])}x |")
    out.append(f"| correct and >= 1.05x faster than eager on >= 80% of attempted | {s2['installed']}/{s2['attempted']}"
               f" = {s2['installed'] / s2['attempted']:.0%} (correct: {s2['correct']}/{s2['attempted']}) | "
               f"{s1['installed']}/{s1['attempted']} = {s1['installed'] / s1['attempted']:.0%} (correct: "
               f"{s1['correct']}/{s1['attempted']}) |")
    out.append(f"| no installed kernel slower than eager | "
               f"{', '.join(s2['installed_slower_than_eager']) or 'none slower'} | "
               f"{', '.join(s1['installed_slower_than_eager']) or 'none slower'} |")
    if mem:
        fr = sorted(r.bandwidth_frac for r in mem)
        dram2 = raw["run2"]["dram_bandwidth_gbs"]
        out.append(f"| memory-bound kernels at >= 80% of DRAM bandwidth | – | {fr[0]:.0%} to {fr[-1]:.0%} of the "
                   f"bandwidth measured in the same run (device-to-device copy: {dram2:.0f} GB/s in run 2, "
                   f"{dram:.0f} GB/s in run 3), whole calls |")
    out.append("")
    out.append(f"Geomeans are over the problems measured in the final runs (level 2: {s2['attempted']}, level 1: "
               f"{s1['attempted']}); a rejected candidate counts with the optimized model's own time (eager, about "
               "1.0x). Six more level-2 problems with candidates did not fit in the last run's time limit; their "
               "smaller-size sweep results are listed below and are not in these figures.\n")
    out.append(f"![speedups](cuda/h100_bench_run3.png)\n")
    out.append("### Per problem\n")
    table = markdown(res).split("\n\n", 1)[1] if "\n\n" in markdown(res) else markdown(res)
    out.append(table)
    if missing:
        out.append("### Candidates not measured in the final run (first sweep: tensors <= 32 MB, no torch.compile "
                   "column)\n")
        out.append("| problem | batch | eager µs | optimized µs | vs eager | result |\n|---|---|---|---|---|---|")
        for r in missing:
            why = "kernel" if r.status == "kernel" else f"{r.status}: {r.reason}"
            if "cannot be 0 to view" in " ".join(r.rejected):
                why = "not judged: the validation harness then failed on 0-dim buffers (fixed since)"
            out.append(f"| {r.key} | {r.batch} (of {r.batch_original}) | {fmt(r.eager_us, '.1f')} | "
                       f"{fmt(r.kernel_us, '.1f')} | {fmt(r.vs_eager)} | {why.replace('|', '/')[:140]} |")
        out.append("")
    blocks = json.loads((DATA / "h100_blocks.json").read_text())
    out.append("### Shipped kernels for common blocks (metal_accel/blocks.py, `scripts/build_shipped_cache.py "
               "--backend cuda`)\n")
    out.append("| block | eager µs | kernel µs | speedup | shipped? |\n|---|---|---|---|---|")
    for b in blocks:
        why = "yes" if b["status"] == "kernel" else "no: " + (b["rejected"][0].split(": ", 1)[1] if b["rejected"]
                                                              else b["reason"])
        out.append(f"| {b['block']} | {fmt(b['eager_us'], '.1f')} | {fmt(b['kernel_us'], '.1f')} | "
                   f"{fmt(b['speedup'])} | {why.replace('|', '/')[:150]} |")
    out.append("")
    log = (DATA / "h100_pytest_cuda.log").read_text()
    result = [line.strip("= ") for line in log.splitlines() if " passed" in line and " in " in line]
    out.append("### GPU tests (run 3)\n")
    out.append("`python3 -m pytest -p no:cacheprovider tests/test_cuda_backend.py -v -rs` (log: "
               "docs/cuda/h100_pytest_cuda.log): " + (result[-1] if result else "?") + ". The failure was "
               "the test's own assumption: it expected the correct SiluMul candidate to be installed at 64 x 8192, "
               "where the speed gate rejected it (0.61x, see below); the crashing candidate beside it was "
               "isolated as intended (\"failed in the worker: CUDA error: an illegal memory access\", the "
               "parent process unharmed). The test now accepts a speed rejection; that version was not re-run "
               "on a GPU. The tests that need no GPU, tests/test_cuda_sources.py included (every candidate and "
               "shipped kernel through the static checks, `nvcc -arch=sm_90 -cubin` and NVRTC; each compiler's "
               "test skips where it is absent), pass on the GPU-less machine here (nvcc 13.0, NVRTC 13.0).\n")
    machine = (f"{env.get('gpu')} (compute capability {env.get('capability')}, {env.get('sms')} SMs, "
               f"{env.get('memory_gib')} GiB), driver {env.get('driver')} (CUDA {env.get('driver_cuda')}), torch "
               f"{env.get('torch')}, NVRTC {env.get('nvrtc')} via cuda-bindings {env.get('cuda_bindings')}, "
               f"{env.get('os')}; the device tool's nvidia-h100-x1 machine")
    return "\n".join(out), machine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    text, machine = body()
    intro = INTRO
    if args.no_write:
        print(text)
        return 0
    from _docs import write_section
    write_section("cuda_h100", "CUDA on an NVIDIA H100: KernelBench levels 1 and 2 through the pipeline",
                  "bash benchmarks/cuda_device.sh setup tests blocks bench  (then python benchmarks/cuda_report.py)",
                  intro + "\n" + text + "\n" + FINDINGS, machine_text=machine, date="2026-11-22")
    return 0


if __name__ == "__main__":
    sys.exit(main())
