"""What METAL_ACCEL_RECORD=1 costs on a real model, and what a recording weighs.

    PYTHONPATH=. python benchmarks/record_cost.py [--pairs 3] [--no-write]

A 2-layer HF Llama (transformers, the bench extra) runs its forward and a short generate() in fresh
processes, alternately without and with recording, on one fresh user cache; reported: the median
ratio of recorded to plain time per pair (pairs side by side, so the machine's drift cancels), the
bytes the recordings take, and whether every recorded call replays (synthesize_recorded with an empty
candidate directory: replayed, nothing synthesized). Writes docs/results/record_cost/ (render with
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402

RUN = r"""
import time, torch
import metal_accel
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
m = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=32000)).eval()
ids = torch.randint(3, 32000, (1, 64))
with torch.inference_mode():
    for _ in range(3):
        m(ids)
    t0 = time.perf_counter()
    for _ in range(20):
        m(ids)
    fwd = (time.perf_counter() - t0) / 20
    t0 = time.perf_counter()
    m.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    gen = time.perf_counter() - t0
print("RESULT", fwd, gen)
"""

REPLAY = r"""
import os, tempfile
from metal_accel.auto.record import recorded_calls, synthesize_recorded
from metal_accel.candidates.directory import DirectoryProvider
empty = tempfile.mkdtemp()
out = synthesize_recorded([DirectoryProvider(empty)], top=1000, end_to_end=False)
print("RESULT", len(recorded_calls()), sum(1 for _, r in out if not isinstance(r, str)))
"""


def run(script: str, env: dict[str, str]) -> list[float]:
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    return [float(v) for v in line.split()[1:]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    cache = tempfile.mkdtemp()
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": cache, "METAL_ACCEL_LIBRARY": "0", "METAL_ACCEL_COMPILE": "0"}
    fwd, gen = [], []
    for _ in range(a.pairs):
        plain = run(RUN, {**env, "METAL_ACCEL_RECORD": "0"})
        recorded = run(RUN, {**env, "METAL_ACCEL_RECORD": "1"})
        fwd.append(recorded[0] / plain[0])
        gen.append(recorded[1] / plain[1])
    rec_dir = Path(cache) / "recorded"
    size = sum(f.stat().st_size for f in rec_dir.rglob("*") if f.is_file())
    calls, replayed = run(REPLAY, env)
    data = {"forward_ratio_median": statistics.median(fwd), "forward_ratios": fwd,
            "generate_ratio_median": statistics.median(gen), "generate_ratios": gen,
            "recording_bytes": size, "recorded_calls": int(calls), "replayed": int(replayed)}
    print(json.dumps(data, indent=1))
    if not a.no_write:
        results.record("record_cost", f"cpu_{results.today()}", "PYTHONPATH=. python benchmarks/record_cost.py", data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
