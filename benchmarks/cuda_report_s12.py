"""Render the docs/benchmarks.md section for the twelfth session's GPU runs (2026-11-26) on an H100 (runs 33-37):
the problems the proof's memory had kept unmeasured (L1_4, L1_100), L1_33 under the perturbed-state proof, L2_3
with its channels-last candidate, and the problems only an H200 had measured.

    python benchmarks/cuda_report_s12.py [--no-write]

Inputs under docs/cuda/ (written on the device by `bash benchmarks/cuda_device.sh setup bench`, the command in
each file): h100_run33.json .. h100_run37.json, h100_env_run33.txt (and h100_sweep_s12.json, quoted).
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cuda_report_h100_best import per_problem, render, rows  # noqa: E402

RUNS = ("h100_run33.json", "h100_run34.json", "h100_run35.json", "h100_run36a.json", "h100_run36b.json",
        "h100_run37.json")  # a later run's row replaces an earlier one's

INTRO = """\
Three calls of the device tool on an H100, each `ATTEMPTED= BENCH_MB=... BENCH_ARGS="--compile-candidate
--problems ..." bash benchmarks/cuda_device.sh setup bench`:

1. Run 33, `BENCH_MB=1100`, L1_33 and L2_3. L1_33 (an eval-mode BatchNorm with fresh statistics) is proven
   with random module state (`metal_accel/perturb.py`) and installs torch.compile; its earlier H100 row
   (0.84x torch.compile) predates that proof. L2_3 ran the earlier candidate (cuDNN's NCDHW
   conv_transpose3d, then one fused kernel): 3.35x eager but 0.87x torch.compile, so its row is replaced by
   run 35's.
2. Run 34, `BENCH_MB=9000`, L1_100 (4.3 GB of inputs, tied to the batch size) and L1_4 (an 8.6 GB matrix, no
   batch size). Earlier calls measured nothing for them: the proof made all six trials, each with private
   copies, before running any, and ran out of memory or time. It now makes, runs and judges its trials a
   batch of at most 256 MB at a time (one trial at least), and draws large CUDA inputs on the GPU.
3. Run 35, `BENCH_MB=1100`, L2_3 with the new candidate: conv_transpose3d in channels-last-3d layout (cuDNN,
   383 us against 596 us in NCDHW at batch 8, measured side by side on this card) and the fused sum,
   LayerNorm, pooling and GELU kernel reading that layout, its statistics in double. torch.compile and its
   CUDA graph fail the proof here (3-7 of 33.5 million elements outside tolerance on the small-inputs trial).
   Two calls before it, not kept, failed on the candidate itself: the launcher refused the channels-last
   tensor as not contiguous (fixed by passing its contiguous NDHWC view).
4. Run 36, the eight problems only an H200 had measured (section `cuda_h200_s11`), now on this card:
   `BENCH_MB=270` for L2_56, L2_59, L3_6 and L3_25, then `BENCH_MB=540` for L1_46, L1_63 and L1_87.
5. Run 37, `BENCH_MB=1100`, L1_45: 62 s on this card (194 s on the H200 before trials were streamed).

A check of the streamed proof over every CUDA candidate, not a speed figure: `SWEEP_MB=32 bash
benchmarks/cuda_device.sh setup sweep` (each candidate through the pipeline at tensors of at most 32 MB,
no torch.compile; raw data in docs/cuda/h100_sweep_s12.json) proved all 56 candidates whose problem fits
correct (45 installed, 11 not faster than eager at that size); 14 problems exceed 32 MB at batch size 1.
"""


def main() -> int:
    text = "\n".join([INTRO, *per_problem(sorted(rows(RUNS), key=lambda r: (r["level"], r["problem_id"])))])
    return render(__doc__, text, "cuda_h100_s12", "CUDA on an NVIDIA H100: the problems left unmeasured, L1_33 "
                  "and L2_3 again, the H200-only problems (runs 33-37)", "ATTEMPTED= BENCH_MB=270|540|1100|9000 "
                  "BENCH_BUDGET=0.4 "
                  "BENCH_ARGS=\"--compile-candidate --problems ...\" bash benchmarks/cuda_device.sh setup bench  "
                  "(then python benchmarks/cuda_report_s12.py)", "h100_env_run33.txt", "2026-11-26")


if __name__ == "__main__":
    sys.exit(main())
