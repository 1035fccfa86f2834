"""KernelBench on the CPU through the pipeline, torch.compile included as a candidate (issue 8).

    python benchmarks/kernelbench_cpu.py [--level 2] [--ids 1-30] [--max-tensor-mb 2] [--from DIR] [--section NAME]
    python benchmarks/kernelbench_cpu.py --keys L1_12 L2_20 ... --section NAME [--max-tensor-mb 128] [--from DIR]

Runs `metal-accel bench` with `--compile-candidate`, so per problem the pipeline picks the best of
eager, torch.compile and any CPU kernel candidate, and the suite times eager, torch.compile and the
chosen best side by side, with a fresh user cache (no verdict of an earlier run is reused). Writes its
section of docs/benchmarks.md. `--from DIR` writes the section
from an earlier run's output directory instead of running again.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_ids(text: str) -> list[str]:
    """"1-30" or "1,2,7" or "1-3,7": the problem ids, in order."""
    ids: list[str] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ids += [str(i) for i in range(int(lo), int(hi or lo) + 1)]
    return ids


def bench_command(args: argparse.Namespace, out: str) -> list[str]:
    which = ["--problems", *args.keys] if args.keys else ["--level", str(args.level), "--problems", *parse_ids(args.ids)]
    return ["metal-accel", "bench", str(ROOT.parent / "shared" / "kernelbench" / "problems.jsonl"), "--backend", "cpu",
            "--provider", "dir:benchmarks/candidates", *which, "--max-tensor-mb", str(args.max_tensor_mb),
            "--compile-candidate", "--budget", "0.5", "--bench-budget", "0.5", "--no-progress", "--out", out]


def suite_table(out: Path) -> str:
    """The run's markdown table: suite.md, or rendered from suite.json (raw data kept in docs/cpu)."""
    if (out / "suite.md").is_file():
        return (out / "suite.md").read_text()
    from metal_accel.suite_report import markdown
    from metal_accel.suite_result import SuiteResult
    doc = out if out.suffix == ".json" else out / "suite.json"
    return markdown(SuiteResult.from_dict(json.loads(doc.read_text())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", type=int, default=2)
    parser.add_argument("--ids", default="1-30", help="problem ids, e.g. 1-30 or 1,2,7")
    parser.add_argument("--keys", nargs="+", help="problems of any level, e.g. L1_12 L2_20 (needs --section)")
    parser.add_argument("--section", help="the docs/benchmarks.md section to write (default: from level and ids)")
    parser.add_argument("--max-tensor-mb", type=float, default=2.0)
    parser.add_argument("--from", dest="from_dir", help="an earlier run's --out directory, or its suite.json")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.keys and not args.section:
        parser.error("--keys needs --section")
    out = args.from_dir or tempfile.mkdtemp(prefix="kernelbench_cpu_")
    cmd = bench_command(args, "OUT")
    if not args.from_dir:
        env = {**os.environ, "METAL_ACCEL_USER_CACHE": tempfile.mkdtemp(prefix="kernelbench_cpu_cache_")}
        subprocess.run([sys.executable, "-m", "metal_accel.cli", *bench_command(args, out)[1:]], check=True, env=env,
                       cwd=ROOT)
    table = suite_table(Path(out))
    body = ("Per problem, the pipeline chose among eager, torch.compile (inductor, default mode) and the CPU kernel "
            "candidates of benchmarks/candidates/cpu, under the same proof and speed gate; the table times eager, "
            "torch.compile of the whole Model and the chosen best side by side (medians, interleaved). "
            f"`batch_size` is halved until no tensor exceeds {args.max_tensor_mb:g} MB, so shapes are smaller "
            "than KernelBench's.\n\n" + table)
    print(body)
    if not args.no_write:
        from _docs import write_section
        section = args.section or ("kernelbench_cpu" if args.level == 2 else f"kernelbench_cpu_l{args.level}")
        if not args.section and not args.ids.startswith("1-"):  # a later range of the level: a section of its own
            section += f"_{args.ids}"
        which = f"--keys {' '.join(args.keys)}" if args.keys else f"--level {args.level} --ids {args.ids}"
        levels = sorted({k.split("_")[0] for k in args.keys or ()})
        what = (f"{len(args.keys)} problems of {', '.join(levels)}" if args.keys
                else f"level {args.level} (problems {args.ids})")
        write_section(section, f"CPU: KernelBench {what}, best of eager / torch.compile / kernels",
                      f"python benchmarks/kernelbench_cpu.py {which} --max-tensor-mb {args.max_tensor_mb:g}  (runs: "
                      + shlex.join(cmd) + ")", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
