"""Render the H200 section of docs/benchmarks.md from the results copied back from the GPU machine.

    python benchmarks/cuda_report_h200.py [--no-write]

Inputs under docs/cuda/ (written on the device by `bash benchmarks/cuda_device.sh ...`):
h200_l2_run4.json and h200_l2_run5.json (level 2, problems 1-24 and 25-60, before the installed-compile
fix), h200_l2_run6.json (the 25 problems where torch.compile won or could win, after it),
h200_l1_softmax_run3.json, h200_blocks.json, h200_overhead_run2.txt / _run3.txt, h200_env.txt.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cuda_report import DATA, REWRITES, fmt, geo  # noqa: E402  (the H100 section's helpers)

from metal_accel.kernelbench.result import ATTEMPT_SPEEDUP as GATE  # noqa: E402

INTRO = """\
Five calls of the device tool on an H200 (this session's H100 request was served by an H200), 2026-11-22:

1. `bash benchmarks/cuda_device.sh setup overhead` (run 2; run 1 only found that the probe needed installing by hand).
2. `BENCH_MB=1024 BENCH_ARGS="--level 1 --compile-candidate" bash benchmarks/cuda_device.sh setup tests overhead
   blocks bench` (run 3): the GPU tests, the per-layer overhead probe, the shipped blocks, and level 1 at up to
   1 GB per tensor, of which only L1_23 finished in the time left (280 s for one problem: at that size the
   isolated worker's six validation trials and the float64 references dominate).
3. `BENCH_MB=64 BENCH_ARGS="--level 2 --compile-candidate --problems 1..24"` (run 4) and `--problems 25..60`
   (run 5): every level-2 problem with a candidate (47), torch.compile also a pipeline candidate.
4. Run 6, after the installed-compile fix (commit "Installed torch.compile runs as fast as compiling the whole
   model"): the 25 level-2 problems where torch.compile won or was faster than the chosen result.
5. Run 7, after the validation change (an element may be off by twice eager's 99th-percentile error on that
   output): the four problems whose candidates had failed validation (L2_3, 15, 17, 23) and two where torch.compile
   had won (L2_25, 36). The device time was then spent.

The bench step is the one of the H100 section below (eval mode, batch halved until no tensor exceeds 64 MB,
three input sets timed round-robin with CUDA events checked against the wall clock, medians), with
`--compile-candidate`: the pipeline judges torch.compile like any kernel and installs whichever of eager,
torch.compile and the candidate kernel is proven correct and fastest. "optimized" is the model after
`optimize()`. Raw results: docs/cuda/h200_*.
"""


def rows_of(name: str) -> list[dict]:
    return json.loads((DATA / name).read_text())["rows"]


def kernel_won_gate(r: dict) -> bool:
    """The candidate kernel was correct and >= 1.05x eager in the pipeline (installed, or beaten only by compile)."""
    if r["status"] == "kernel":
        return (r["vs_eager"] or 0) >= GATE
    # these runs predate Row.outpaced: a candidate that was proposed and is not among the rejected passed the
    # gate and lost to torch.compile (the pipeline evaluates every candidate and installs the fastest)
    return (r["status"] == "compile" and r["attempted"]
            and not any(not x.startswith("builtin:") for x in r["rejected"]))


def result_text(r: dict) -> str:
    if r["status"] in ("kernel", "compile") and r["output_ok"] is not False:
        return r["status"]
    return r["reason"].replace("|", "/")[:110]


def body() -> str:
    before = rows_of("h200_l2_run4.json") + rows_of("h200_l2_run5.json")
    after = {r["key"]: r for r in rows_of("h200_l2_run6.json")}
    dram = json.loads((DATA / "h200_l2_run4.json").read_text())["dram_bandwidth_gbs"]
    out = [INTRO]
    n = len(before)
    won = [r for r in before if kernel_won_gate(r)]
    installed = [r for r in before if r["status"] == "kernel"]
    correct = [r for r in before if r["candidate_correct"] or kernel_won_gate(r)]
    no_rw = [r for r in before if r["key"] not in REWRITES]
    merged = [after.get(r["key"], r) for r in before]
    worst_c = min(merged, key=lambda r: r["vs_compile"] or 9)
    out.append("### Against the targets (level 2, 47 problems with a candidate)\n")
    out.append("| target | runs 4-5 (before the fix) | with run 6's re-measured rows |\n|---|---|---|")
    out.append(f"| issue 6: geomean over eager >= 1.5x | {fmt(geo([r['vs_eager'] for r in before]))}x "
               f"(without the three algebraic rewrites: {fmt(geo([r['vs_eager'] for r in no_rw]))}x) | "
               f"{fmt(geo([r['vs_eager'] for r in merged]))}x |")
    out.append(f"| issue 6: geomean over torch.compile >= 1.1x | {fmt(geo([r['vs_compile'] for r in before]))}x | "
               f"{fmt(geo([r['vs_compile'] for r in merged]))}x |")
    out.append(f"| issue 6: candidate kernel correct and >= 1.05x eager on >= 80% | {len(won)}/{n} = "
               f"{len(won) / n:.0%} (correct: {len(correct)}/{n}; {sum(r['status'] == 'kernel' for r in won)} installed, "
               f"{sum(r['status'] == 'compile' for r in won)} more passed the gate but lost to torch.compile) | – |")
    out.append("| issue 6: no installed kernel slower than eager | "
               f"{'none slower' if all((r['vs_eager'] or 0) >= 1 for r in installed) else 'some slower'} | – |")
    out.append(f"| issue 8: best >= 1.0x eager on every problem | worst {fmt(min(r['vs_eager'] for r in before))}x | "
               f"worst {fmt(min(r['vs_eager'] for r in merged))}x |")
    out.append(f"| issue 8: best >= 1.0x torch.compile on every problem | worst "
               f"{fmt(min(r['vs_compile'] for r in before))}x | worst {fmt(worst_c['vs_compile'])}x "
               f"({worst_c['key']}) |")
    out.append(f"| issue 8: geomean over torch.compile >= 1.15x | {fmt(geo([r['vs_compile'] for r in before]))}x | "
               f"{fmt(geo([r['vs_compile'] for r in merged]))}x |\n")
    out.append(f"DRAM bandwidth measured in the same run (device-to-device copy): {dram:.0f} GB/s. "
               "Geomeans count a problem whose candidates were all rejected with the optimized model's own time "
               "(eager or torch.compile). The \"run 6\" column replaces a problem's row by its re-measurement; "
               "the 22 others keep their run 4-5 rows. The geomeans are of what the pipeline installed (kernel, "
               "torch.compile or eager), so they are not a kernels-only figure: where a kernel passed the gate and "
               "lost to torch.compile, these runs did not record the kernel's own time (the bench records such "
               "candidates since, as `outpaced`); that they passed is inferred from their absence among the "
               "rejected.\n")
    out.append("### Per problem\n")
    out.append("| problem | batch | eager us | compile us | optimized us | vs eager | vs compile | run 6 vs eager | "
               "run 6 vs compile | result |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in before:
        a = after.get(r["key"])
        out.append(f"| {r['key']} | {r['batch']} (of {r['batch_original']}) | {fmt(r['eager_us'], '.1f')} | "
                   f"{fmt(r['compile_us'], '.1f')} | {fmt(r['kernel_us'], '.1f')} | {fmt(r['vs_eager'])} | "
                   f"{fmt(r['vs_compile'])} | {fmt(a and a['vs_eager'])} | {fmt(a and a['vs_compile'])} | "
                   f"{result_text(a or r)} |")
    out.append("\n![speedups, run 5](cuda/h200_l2_run5.png)\n")
    out.append("### Run 7: after the validation change\n")
    out.append("| problem | eager us | compile us | optimized us | vs eager | vs compile | runs | passed but lost | "
               "rejected |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows_of("h200_l2_run7.json"):
        out.append(f"| {r['key']} | {r['eager_us']:.1f} | {r['compile_us']:.1f} | {r['kernel_us']:.1f} | "
                   f"{fmt(r['vs_eager'])} | {fmt(r['vs_compile'])} | {r['status']} | "
                   f"{'; '.join(r['outpaced']) or '–'} | {'; '.join(x[:140] for x in r['rejected']) or '–'} |")
    out.append(
        "\nWith the new rule the candidates for L2_3, L2_15 and L2_17 pass validation (L2_3's kernel installs at "
        "3.28x eager; L2_15's passes the gate at 1.20x and loses to torch.compile; L2_17's is correct but within "
        "noise), which makes 46 of the 47 level-2 candidates correct and 35 of 47 (74%) correct and past the "
        "gate, combining runs 4-5 with run 7. Run 7 also showed the spot checks while timed, and the bench's "
        "final output check, still using eager's plain tolerance: they rejected torch.compile on L2_17 and the "
        "L2_23 kernel mid-benchmark, and flagged 24 of 8.4 million L2_3 elements. Both now use the proof's rule "
        "(commit \"Spot checks while timed ...\"), tested on the CPU, not re-run on a GPU. L2_23's output is "
        "the mean of a GroupNorm output, rounding noise around zero (mean |eager| 1e-9): no candidate, "
        "torch.compile included, is close enough to the float64 value there.\n")
    blocks = json.loads((DATA / "h200_blocks.json").read_text())
    out.append("### Shipped blocks (`scripts/build_shipped_cache.py --backend cuda`, run 3)\n")
    out.append("| block | eager us | kernel us | result |\n|---|---|---|---|")
    for b in blocks:
        out.append(f"| {b['block']} | {fmt(b['eager_us'], '.1f')} | {fmt(b['kernel_us'], '.1f')} | "
                   f"{b['status']}: {b['reason']} |")
    l1 = rows_of("h200_l1_softmax_run3.json")[0]
    out.append(f"\nLevel 1 at up to 1 GB per tensor (run 3): {l1['key']} batch {l1['batch']} (of "
               f"{l1['batch_original']}): eager {l1['eager_us']:.0f} us, torch.compile {l1['compile_us']:.0f} us, "
               f"optimized {l1['kernel_us']:.0f} us ({l1['status']}; the candidate: {l1['rejected'][0].split(': ', 1)[1]}); "
               f"{l1['bandwidth_frac']:.0%} of the DRAM bandwidth. The rest of level 1 did not fit in the call.\n")
    out.append("### Per-call host cost on CUDA (`benchmarks/cuda_overhead.py`, SiluMul 64 x 8192)\n")
    out.append("Two runs on two machines (run 2 before, run 3 after the launch-path changes; host loop: N calls "
               "back to back, synced: one call between synchronizations, CUDA events):\n")
    out.append("```\nrun 2 (before)\n" + _table(DATA / "h200_overhead_run2.txt") + "\nrun 3 (after)\n" +
               _table(DATA / "h200_overhead_run3.txt") + "\n```\n")
    out.append(
        "The two runs do not compare: run 3's machine was slower everywhere (a bare prepacked cuLaunchKernel "
        "4.9 us in run 2, 7.4 us in run 3; torch.empty_like 1.5 vs 3.4 us). Within run 3 the optimized module "
        "costs 29 us of host time against eager's 16 us: the ctypes launch alone is 7 us, the launcher 6 us more, "
        "the candidate's host code (two contiguous(), empty_like, the size checks) 6 us, the custom op and the "
        "dispatcher 9 us. At this size the kernel is a few microseconds, so SiluMul 64 x 8192 stays slower "
        "than eager; the larger shipped shapes win (table above). A launcher in C (one call from Python to "
        "cuLaunchKernel, tensors read in C) is the next step; not done.\n")
    out.append(
        "Installed torch.compile: in runs 4-5 the model with torch.compile installed by the pipeline ran "
        "20-70 us per call slower than compiling the whole model (e.g. L2_5 362 vs 310 us, L2_32 328 vs 278 us), "
        "so torch.compile won the pipeline's A/B against eager and still lost to the whole-model compile. Found "
        "on the CPU: `fullgraph=True` and `dynamic=False` wrap every call of a compiled function in config "
        "contexts (about 4 and 7 us a call on the 2-core Xeon, /tmp probe). The op now compiles with the "
        "defaults and the proof checks the one-graph rule itself; on the CPU the installed compile then runs "
        "as fast as the whole-model compile (34.1 vs 33.5 us a call on a small conv model, down from 48.1). "
        "On the H200 (run 6) the installed compile still ran 11-44 us per call behind the whole-model compile "
        "(L2_5 253 vs 238 us, L2_6 614 vs 602, L2_36 512 vs 468, L2_42 414 vs 374, L2_58 3591 vs 3549), against "
        "21-71 us in runs 4-5; where the rest goes is not measured yet. The whole-model compile column itself "
        "moved by up to 2x between runs 5 and 6 on the same problem and machine kind (L2_34 158 vs 315 us, L2_35 "
        "238 vs 377 us, L2_36 328 vs 468 us), so vs-compile ratios within about 10% are inside the run-to-run "
        "variation of these measurements.\n")
    return "\n".join(out)


def _table(path: Path) -> str:
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("layer"))
    return "\n".join(lines[start:start + 11])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true", help="print the section instead of writing docs/benchmarks.md")
    args = ap.parse_args()
    text = body()
    env = (DATA / "h200_env.txt").read_text()
    machine = ("NVIDIA H200 (compute capability 9.0, 132 SMs, 139.8 GiB), driver 580.159.04 (CUDA 13.0), "
               "torch 2.11.0+cu130, NVRTC 13.0 via cuda-bindings 13.3.1; the device tool's nvidia-h200 machine"
               if "H200" in env else env.splitlines()[1])
    if args.no_write:
        print(text)
        return 0
    from _docs import write_section
    write_section("cuda_h200", "CUDA on an NVIDIA H200: KernelBench level 2, best of eager / torch.compile / kernels",
                  "bash benchmarks/cuda_device.sh setup tests overhead blocks bench  (then python "
                  "benchmarks/cuda_report_h200.py)", text, machine_text=machine, date="2026-11-22")
    return 0


if __name__ == "__main__":
    sys.exit(main())
