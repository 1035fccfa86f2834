"""KernelBench on the CPU through the pipeline, torch.compile included as a candidate (issue 8).

    python benchmarks/kernelbench_cpu.py [--level 2] [--ids 1-30] [--max-tensor-mb 2] [--from DIR] [--section NAME]
    python benchmarks/kernelbench_cpu.py --keys L1_12 L2_20 ... --section NAME [--max-tensor-mb 128] [--from DIR]
    python benchmarks/kernelbench_cpu.py --keys L1_45 L2_55 ... --section NAME --cap L1_45=1100 L2_55=4 ...

Runs `metal-accel bench` with `--compile-candidate`, so per problem the pipeline picks the best of
eager, torch.compile and any CPU kernel candidate, and the suite times eager, torch.compile and the
chosen best side by side, with a fresh user cache (no verdict of an earlier run is reused). Writes the
run to docs/results/kernelbench_cpu/RUN.json (then `python -m benchmarks.render`). `--from DIR` records
an earlier run's output directory instead of running again.

`--cap KEY=MB` gives a problem its own `--max-tensor-mb` (a larger one for a problem whose batch of
one is over the common cap, a smaller one to shrink the batch of a problem whose weights are the
cost); each problem then runs in a bench of its own, and the rows are merged into one suite.json.
`--from DIR` also takes such a directory of per-problem runs (DIR/<key>/suite.json). With `--machine`,
`--date` and `--platform` it records a run made elsewhere (e.g. the device host's CPU, benchmarks/cuda_device.sh
step cpu, for problems too large for this machine).
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


def bench_command(args: argparse.Namespace, out: str, keys: list[str] | None = None, cap: float | None = None
                  ) -> list[str]:
    keys = keys or args.keys
    which = ["--problems", *keys] if keys else ["--level", str(args.level), "--problems", *parse_ids(args.ids)]
    return ["metal-accel", "bench", str(ROOT.parent / "shared" / "kernelbench" / "problems.jsonl"), "--backend", "cpu",
            "--provider", "dir:benchmarks/candidates", *which, "--max-tensor-mb", f"{cap or args.max_tensor_mb:g}",
            "--compile-candidate", "--budget", "0.5", "--bench-budget", "0.5", "--no-progress", "--out", out]


def parse_caps(pairs: list[str]) -> dict[str, float]:
    """["L1_45=1100", ...] -> {"L1_45": 1100.0, ...}"""
    caps = {}
    for pair in pairs:
        key, sep, mb = pair.partition("=")
        if not sep:
            raise SystemExit(f"--cap {pair}: expected KEY=MB, e.g. L1_45=1100")
        caps[key] = float(mb)
    return caps


def merge(runs: list[Path], out: Path) -> None:
    """Rows of several runs' suite.json, in order, as one suite.json (and suite.md) in OUT."""
    from metal_accel.kernelbench.report import markdown
    from metal_accel.kernelbench.result import SuiteResult
    results = [SuiteResult.from_dict(json.loads(r.read_text())) for r in runs]
    merged = SuiteResult([row for res in results for row in res.rows], results[0].environment,
                         results[0].dram_bandwidth, " ; ".join(res.command for res in results))
    (out / "suite.json").write_text(json.dumps(merged.to_dict(), indent=1))
    (out / "suite.md").write_text(markdown(merged))


def run_benches(args: argparse.Namespace, out: Path, caps: dict[str, float]) -> None:
    """One bench for all problems, or, with per-problem caps, one bench per problem (in OUT/<key>), merged."""
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": tempfile.mkdtemp(prefix="kernelbench_cpu_cache_")}
    runs = [bench_command(args, str(out / k), [k], caps.get(k)) for k in args.keys] if caps \
        else [bench_command(args, str(out))]
    for cmd in runs:
        subprocess.run([sys.executable, "-m", "metal_accel.cli.main", *cmd[1:]], check=True, env=env, cwd=ROOT)
    if caps:
        merge([out / k / "suite.json" for k in args.keys], out)


def suite_table(out: Path) -> str:
    """The run's markdown table: suite.md, or rendered from suite.json (raw data kept in docs/results/kernelbench_cpu)."""
    if (out / "suite.md").is_file():
        return (out / "suite.md").read_text()
    from metal_accel.kernelbench.report import markdown
    from metal_accel.kernelbench.result import SuiteResult
    doc = out if out.suffix == ".json" else out / "suite.json"
    return markdown(SuiteResult.from_dict(json.loads(doc.read_text())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", type=int, default=2)
    parser.add_argument("--ids", default="1-30", help="problem ids, e.g. 1-30 or 1,2,7")
    parser.add_argument("--keys", nargs="+", help="problems of any level, e.g. L1_12 L2_20 (needs --run)")
    parser.add_argument("--run", "--section", dest="run",
                        help="the run's name in docs/results/kernelbench_cpu/ (default: from level, ids and date)")
    parser.add_argument("--platform", default="cpu", help="cpu, or e.g. cpu-xeon16 for another machine's run")
    parser.add_argument("--max-tensor-mb", type=float, default=2.0)
    parser.add_argument("--from", dest="from_dir", help="an earlier run's --out directory, or its suite.json")
    parser.add_argument("--cap", nargs="+", default=[], metavar="KEY=MB",
                        help="a problem's own --max-tensor-mb, e.g. L1_45=1100 (needs --keys)")
    parser.add_argument("--machine", help="with --from: the machine the run was made on (default: this one)")
    parser.add_argument("--date", help="with --from: the day the run was made (default: today)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if (args.machine or args.date) and not args.from_dir:
        parser.error("--machine and --date describe an earlier run: they need --from")
    if args.keys and not args.run:
        parser.error("--keys needs --run")
    caps = parse_caps(args.cap)
    if caps and not args.keys:
        parser.error("--cap needs --keys")
    out = args.from_dir or tempfile.mkdtemp(prefix="kernelbench_cpu_")
    cmd = bench_command(args, "OUT")
    if not args.from_dir:
        run_benches(args, Path(out), caps)
    elif Path(out).is_dir() and not (Path(out) / "suite.json").is_file():  # per-problem runs: merge them
        merge([Path(out) / k / "suite.json" for k in args.keys or () if (Path(out) / k / "suite.json").is_file()],
              Path(out))
    doc = Path(out) if Path(out).suffix == ".json" else Path(out) / "suite.json"
    suite = json.loads(doc.read_text())
    print(suite_table(Path(out)))
    if not args.no_write:
        from results import record, today
        which = f"--keys {' '.join(args.keys)}" if args.keys else f"--level {args.level} --ids {args.ids}"
        run = args.run or f"l{args.level}_{args.ids.replace(',', '_')}_{args.date or today()}"
        driver = (f"python benchmarks/kernelbench_cpu.py {which} --max-tensor-mb {args.max_tensor_mb:g}"
                  + (f" --cap {' '.join(args.cap)}" if caps else ""))
        command = suite.pop("command", None) or shlex.join(cmd)
        suite.pop("date", None)
        record("kernelbench_cpu", run, command, {"driver": driver, "platform": args.platform, **suite},
               machine_text=args.machine, date=args.date)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
