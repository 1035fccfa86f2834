"""What the trust hardening of issue 25 costs: optimize() time of the quickstart model and the per-call
cost of the optimized model, for two checkouts of metal_accel measured side by side in one run.

    python benchmarks/trust_cost.py --before PATH_OF_OLD_CHECKOUT [--after .] [--rounds 3]

Each measurement runs in a fresh subprocess with the checkout first on PYTHONPATH and a fresh user cache
(and, where the checkout reads it, a fresh METAL_ACCEL_CONFIG_DIR): `cold` is optimize() with nothing
cached (compiles and proofs included), `warm` is optimize() again in a new process on that cache.
Rounds alternate the checkouts, so both see the same machine load. The forward figures are interleaved
eager/optimized pairs inside one process: on this shared CPU machine only their ratio is a result.
Writes its run (command, machine, date, every sample) to docs/results/trust_cost/ (then
`python -m benchmarks.render`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def child(phase: str) -> None:
    """One measurement in this process: optimize() wall time, then interleaved forward timings."""
    import torch

    import metal_accel
    from metal_accel.demo import build_demo_model, demo_inputs
    from metal_accel.runtime.dispatch import Dispatcher

    torch.manual_seed(0)
    model = build_demo_model().eval()
    (ids,) = demo_inputs()
    t0 = time.perf_counter()
    metal_accel.optimize(model, (ids,))
    optimize_s = time.perf_counter() - t0
    replaced = sum(m.status != "eager" for m in metal_accel.explain(model).modules)
    eager_s, opt_s = [], []
    with torch.inference_mode():
        for _ in range(5):
            model(ids)
        for i in range(400):
            order = ("eager", "opt") if i % 2 == 0 else ("opt", "eager")
            for which in order:
                start = time.perf_counter()
                if which == "eager":
                    with metal_accel.eager():
                        model(ids)
                    eager_s.append(time.perf_counter() - start)
                else:
                    model(ids)
                    opt_s.append(time.perf_counter() - start)
        tiny = torch.nn.Identity()
        x = torch.randn(4, 4)
        miss = Dispatcher(tiny, tiny.forward)
        plain, dispatched = [], []
        for _ in range(20):
            start = time.perf_counter()
            for _ in range(5000):
                tiny.forward(x)
            plain.append((time.perf_counter() - start) / 5000)
            start = time.perf_counter()
            for _ in range(5000):
                miss(x)
            dispatched.append((time.perf_counter() - start) / 5000)
    print(json.dumps({"phase": phase, "optimize_s": optimize_s, "replaced": replaced,
                      "forward_speedup": statistics.median(e / o for e, o in zip(eager_s, opt_s)),
                      "eager_us": statistics.median(eager_s) * 1e6, "optimized_us": statistics.median(opt_s) * 1e6,
                      "dispatch_miss_us": (statistics.median(dispatched) - statistics.median(plain)) * 1e6}))


def measure(checkout: Path, cache: Path, phase: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "METAL_ACCEL_USER_CACHE": str(cache / "user"),
           "METAL_ACCEL_CONFIG_DIR": str(cache / "config")}
    env.pop("METAL_ACCEL_CACHE_PATH", None)
    out = subprocess.run([sys.executable, __file__, "--child", phase], env=env, cwd=checkout, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{checkout} {phase} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child")
    parser.add_argument("--before", type=Path)
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run", help="the run's name (default: cpu_DATE, cpu_kernels_DATE with METAL_ACCEL_COMPILE=0)")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    if args.before is None:
        parser.error("--before PATH (a checkout of the commit to compare with) is required")
    checkouts = {"before": args.before.resolve(), "after": args.after.resolve()}
    revs = {n: subprocess.run(["git", "-C", str(p), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() for n, p in checkouts.items()}
    results: dict[str, list] = {n: [] for n in checkouts}
    for r in range(args.rounds):
        for name in (list(checkouts) if r % 2 == 0 else list(reversed(checkouts))):
            with tempfile.TemporaryDirectory() as tmp:
                for phase in ("cold", "warm"):
                    res = measure(checkouts[name], Path(tmp), phase)
                    results[name].append(res)
                    print(f"round {r} {name} {phase}: {res}", flush=True)
    sys.path.insert(0, str(HERE))
    from results import machine, record, today
    kernels_only = os.environ.get("METAL_ACCEL_COMPILE") == "0"
    command = " ".join(["METAL_ACCEL_COMPILE=0"] * kernels_only + ["python", "benchmarks/trust_cost.py", *sys.argv[1:]])
    record("trust_cost", args.run or f"cpu{'_kernels' * kernels_only}_{today()}", command,
           {"checkouts": revs, "results": results}, machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
