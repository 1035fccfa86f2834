"""`python benchmarks/synth_e2e.py --kernelbench --shards N`: the KernelBench-sized run on the N GPUs of one host.

One `metal-accel synth` process per GPU (CUDA_VISIBLE_DEVICES=k), each taking every Nth problem with its own
scripted server, cache and device lane (synth_e2e_kb.py with --shard k/N); their bundles are merged into one
with the same merge as `metal-accel cache merge`, and their figures into one row: counts summed, requests in
flight from all servers' answer intervals together (one monotonic clock on one host), and the wall time from
the first process's start to the last one's end, start-up included.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from synth_e2e_kb import AT_ONCE, CONCURRENCY, LEFT_OUT, ROUNDS, Served, in_flight
from synth_e2e_report import command_of, render

HERE = Path(__file__).resolve().parent
SUMMED = ("problems", "answered", "accepted", "answers", "lost_to_format", "cost_usd", "conversations", "cut_by_cap")


def shard_command(args: Any, k: int, figures: Path) -> list[str]:
    """The child's command line: this run's options, one shard of it, no results file of its own."""
    argv = [sys.executable, str(HERE / "synth_e2e.py"), "--kernelbench", "--backend", args.backend,
            "--limit", str(args.limit), "--answer-s", f"{args.answer_s:g}", "--time-scale", f"{args.time_scale:g}",
            "--max-tensor-mb", f"{args.max_tensor_mb:g}", "--no-write", "--no-farm",
            "--shard", f"{k}/{args.shards}", "--figures-out", str(figures)]
    if args.every_problem:
        argv.append("--every-problem")
    if args.max_wall:
        argv += ["--max-wall", f"{args.max_wall:g}"]
    return argv


def merged_figures(parts: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """One row of figures from the shards' rows, at the host's wall time WALL."""
    figures = [p["figures"] for p in parts]
    out: dict[str, Any] = {k: sum(f.get(k, 0) for f in figures) for k in SUMMED}
    out["unasked"] = [name for f in figures for name in f.get("unasked", [])]
    out["why_unasked"] = {k: v for f in figures for k, v in f.get("why_unasked", {}).items()}
    for key in ("outcomes", "drawn"):
        out[key] = {}
        for f in figures:
            for word, n in f[key].items():
                out[key][word] = out[key].get(word, 0) + n
    mean, peak = in_flight([Served(a, b) for p in parts for a, b in p["served"]])
    problems = out["problems"]
    out.update(wall_s=wall, per_hour=3600.0 * (problems - out["cut_by_cap"]) / wall if wall else 0.0,
               in_flight_mean=mean,
               in_flight_peak=peak, max_depth=max(f["max_depth"] for f in figures),
               per_kernel_usd=out["cost_usd"] / out["accepted"] if out["accepted"] else float("nan"),
               device_s_per_problem=(sum(f["device_s_per_problem"] * f["problems"] for f in figures) / problems
                                     if problems else 0.0),
               answers_per_conversation=out["answers"] / out["conversations"] if out["conversations"] else 0.0)
    return out


def main(args: Any) -> int:
    from metal_accel.core.errors import CacheError
    from metal_accel.store.merge import merge_bundles
    work = Path(tempfile.mkdtemp(prefix="metal_accel_kb_shards_"))
    procs = []
    t0 = time.perf_counter()
    for k in range(args.shards):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(k)) if args.backend == "cuda" else dict(os.environ)
        log = (work / f"shard{k}.log").open("w")
        procs.append((k, subprocess.Popen(shard_command(args, k, work / f"shard{k}.json"), env=env,
                                          stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for k, proc, log in procs:
        if proc.wait() != 0 or not (work / f"shard{k}.json").is_file():
            failed.append(k)
        log.close()
    wall = time.perf_counter() - t0
    for k in range(args.shards):
        tail = (work / f"shard{k}.log").read_text(errors="replace").strip().splitlines()[-3:]
        print(f"shard {k}: " + " | ".join(tail), file=sys.stderr)
    if failed:
        print(f"shards {failed} gave no figures; logs in {work}", file=sys.stderr)
        return 1
    parts = [json.loads((work / f"shard{k}.json").read_text()) for k in range(args.shards)]
    sources = [str(b) for b in sorted(work.glob("shard*.tar.gz"))]  # a shard that accepted nothing exports none
    try:
        if not sources:
            raise CacheError("no shard accepted a kernel")
        bundle = merge_bundles(sources, str(work / "merged.tar.gz"))
        merged = (f"{bundle.entries} entries from {bundle.sources} bundles, {len(bundle.conflicts)} conflicts, "
                  f"{len(bundle.skipped)} skipped")
    except CacheError as exc:  # nothing accepted anywhere: no entries to merge
        merged = f"none ({exc})"
    label = f"{args.shards} GPUs of one host" if args.backend == "cuda" else f"{args.shards} processes"
    figures = {label: merged_figures(parts, wall)}
    rows = [r for p in parts for r in p["rows"]]
    LEFT_OUT.extend(parts[0].get("left_out", []))  # every shard read the whole file: the same problems left out
    body = render(figures, rows, args, ROUNDS, AT_ONCE, CONCURRENCY)
    body += f"\n- The merged bundle: {merged}."
    print(body)
    if not args.no_write:
        from results import from_markdown, record, today
        on = "" if args.backend == "cpu" else f"{args.backend}_"
        record("synth_e2e", f"kernelbench_{on}shards_{today()}", command_of(args), from_markdown(body))
    return 0
