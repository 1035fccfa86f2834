"""Per-call cost of running an untrusted CPU kernel in the kernel server instead of in this process.

    python benchmarks/dispatch_cost.py [--rounds 41] [--run NAME]

Writes docs/results/dispatch_cost/NAME.json (default cpu_DATE); then `python -m benchmarks.render`.

For the toy Chain module (tests/toymodels.py: 36 elementwise ops eager, one fused kernel) at a few sizes:
(a) the eager module, (b) the candidate's host forward with its kernel loaded in this process (trusted:
ctypes), (c) the same host forward with the kernel in the kernel server (untrusted: arena copies and one
round trip per call). Timed in interleaved rounds (the order rotates each round; each round calls every
variant a batch of times, so the timer's own cost is spread), medians in microseconds per call, with
ratios. Outputs of (b) and (c) are checked bit-identical, and against eager, first.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
sys.path.insert(0, str(ROOT / "tests"))
SIZES = ((4, 256), (64, 1024), (1024, 4096))
BATCH_S = 0.004  # a batch of calls takes about this long


def variants(rows: int, n: int) -> tuple[dict[str, Callable[[], Any]], torch.Tensor]:
    """The three ways to run Chain on a (rows, n) input, and that input."""
    from toymodels import GOOD, Chain
    from metal_accel.backends import get_backend
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.runtime.kernel_server import RemoteLibrary
    from metal_accel.runtime.ops import ModuleLayout
    from metal_accel.proof.prove import kernels_only
    from metal_accel.sandbox.host import load_forward
    module, x = Chain(n).eval(), torch.randn(rows, n)
    cand = parse_candidate(GOOD, "cpu")
    backend = get_backend("cpu")
    layout = ModuleLayout(module)
    view = layout.view(layout.gather())
    here = load_forward(cand.code, kernels_only(backend.compile(cand.source)))
    remote = load_forward(cand.code, kernels_only(RemoteLibrary(backend, cand.source)))
    return {"eager": lambda: module(x), "in_process": lambda: here(view, x), "server": lambda: remote(view, x)}, x


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median microseconds per call of each function over ROUNDS rounds of one batch each, order rotating."""
    names = list(fns)
    batch = {}
    for name, fn in fns.items():  # warm up, and size each batch to about BATCH_S
        fn()
        t0 = time.perf_counter()
        fn()
        batch[name] = max(1, min(1000, int(BATCH_S / max(time.perf_counter() - t0, 1e-7))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, k = fns[name], batch[name]
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            samples[name].append((time.perf_counter() - t0) / k * 1e6)
    return {n: statistics.median(v) for n, v in samples.items()}


def machine() -> dict[str, Any]:
    from metal_accel.backends.cpu.backend import cpu_name
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "os": platform.platform(),
            "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--run", help="the run's name in docs/results/dispatch_cost/ (default: cpu_DATE)")
    opts = parser.parse_args()
    os.environ.setdefault("METAL_ACCEL_USER_CACHE", tempfile.mkdtemp(prefix="dispatch-cost-"))
    results = []
    with torch.inference_mode():
        for rows, n in SIZES:
            fns, _ = variants(rows, n)
            here, there, eager = fns["in_process"](), fns["server"](), fns["eager"]()
            assert torch.equal(here, there), "the server's output differs from the in-process kernel's"
            torch.testing.assert_close(here, eager, rtol=1e-5, atol=1e-5)
            med = interleaved(fns, opts.rounds)
            row = {"shape": [rows, n], "eager_us": med["eager"], "in_process_us": med["in_process"],
                   "server_us": med["server"], "server_extra_us": med["server"] - med["in_process"],
                   "eager_over_in_process": med["eager"] / med["in_process"],
                   "eager_over_server": med["eager"] / med["server"],
                   "server_over_in_process": med["server"] / med["in_process"]}
            results.append(row)
            print(f"{rows}x{n}: eager {med['eager']:.1f} us, in-process {med['in_process']:.1f} us, "
                  f"server {med['server']:.1f} us (+{row['server_extra_us']:.1f} us, "
                  f"{row['eager_over_server']:.2f}x eager)", flush=True)
    doc = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(),
           "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "rounds": opts.rounds,
           "results": results}
    path = RESULTS / "dispatch_cost" / f"{opts.run or 'cpu_' + doc['date'][:10]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
