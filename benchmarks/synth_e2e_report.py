"""How a `synth_e2e.py --kernelbench` run reads: its table, its notes and its command line (synth_e2e_kb.py
runs it, synth_e2e_shards.py joins the shards of one)."""
from __future__ import annotations

import re
from typing import Any

from synth_e2e_kb import FAILURE_MIX, LEFT_OUT, MODELS, USAGE


def lost_to_format(f: dict[str, Any]) -> int:
    """Answers read as malformed that held a usable kernel (synth_e2e_kb.tally tells them by NO_KERNEL_USAGE)."""
    return f["lost_to_format"]


def extrapolated(f: dict[str, Any], answer_s: float, at_once: int) -> float:
    """Problems per hour of one machine at the real answer latency (see render's note)."""
    dev = max(f["device_s_per_problem"], 1e-9)
    return min(3600.0 * at_once / (f["answers_per_conversation"] * answer_s + dev), 3600.0 / dev)


def command_of(args: Any) -> str:
    """The command line that reproduces the run ARGS stands for."""
    return (f"python benchmarks/synth_e2e.py --kernelbench --backend {args.backend} --limit {args.limit} "
            f"--answer-s {args.answer_s:g} --time-scale {args.time_scale:g} --max-tensor-mb {args.max_tensor_mb:g}"
            + (" --every-problem" if args.every_problem else "") + (f" --shards {args.shards}" if args.shards else "")
            + (f" --ray-gpus {args.ray_gpus}" if getattr(args, "ray_gpus", 0) else "")
            + (" --no-farm" if args.no_farm else "") + (f" --max-wall {args.max_wall:g}" if args.max_wall else ""))


def render(figures: dict[str, dict[str, Any]], rows: list[dict], args: Any, rounds: int, at_once: int,
           concurrency: int) -> str:
    head = ("| run | problems | with a kernel | answers | problems per hour | requests in flight: mean / peak "
            "| $ per accepted kernel | answers lost to format errors | wall s |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for mode, f in figures.items():
        cut = f" ({f['cut_by_cap']} cut by the cap)" if f.get("cut_by_cap") else ""
        lines.append(f"| {mode} | {f['problems']}{cut} | {f['accepted']} | {f['answers']} | {f['per_hour']:.0f} | "
                     f"{f['in_flight_mean']:.1f} / {f['in_flight_peak']} | {f['per_kernel_usd']:.3f} | "
                     f"{lost_to_format(f)} of {f['answers']} | "
                     f"{f['wall_s']:.0f} |")
    one = next(iter(figures.values()))
    levels = sorted({r["level"] for r in rows})
    which = (f"KernelBench level-{levels[0]}" if len(levels) == 1 else
             "KernelBench (levels " + ", ".join(map(str, levels)) + ")")
    mix = ", ".join(f"{k} {100 * v:.0f}%" for k, v in FAILURE_MIX.items())
    outcomes = "; ".join(f"{mode}: " + ", ".join(f"{k} {v}" for k, v in sorted(f["outcomes"].items()))
                         for mode, f in figures.items())
    names = ", ".join(r["name"] for r in rows)
    scripted = sum(1 for r in rows if r.get("scripted", True))
    if args.every_problem:
        chosen = (f"- {len(rows)} {which} problems: every problem of ../shared/kernelbench/problems.jsonl, by level "
                  f"and id (batch_size halved until no tensor exceeds {args.max_tensor_mb:g} MB). The scripted model "
                  f"has a kernel for {scripted} of them (benchmarks/candidates/{args.backend}); for the other "
                  f"{len(rows) - scripted} it declines in every round, as a model that cannot write one would, so "
                  "those problems cost prompts, answers and repair rounds but no compile or proof.")
    else:
        chosen = (f"- {len(rows)} {which} problems (with a {args.backend} kernel in benchmarks/candidates/{args.backend}"
                  + (", multi-pass ones first" if args.backend == "cpu" else ", by level and id") + ", of "
                  f"../shared/kernelbench/problems.jsonl; batch_size halved until no tensor exceeds "
                  f"{args.max_tensor_mb:g} MB): {names}." + (" A subset: 185 problems with real proofs take hours on 2 "
                  "cores, and only 15 have a scripted kernel." if args.backend == "cpu" else ""))
    if "2-node Ray cluster" in figures:
        where = ("- The 2-node cluster is ray.cluster_utils.Cluster on this machine: two nodes of one CPU each "
                 "advertising the same device kind, so the problems are split between them; they share this machine's "
                 "2 cores, so the figure is the farm's overhead and overlap, not a scale-out.")
    elif getattr(args, "ray_gpus", 0):
        where = (f"- The farm (`metal-accel synth --farm`) on a one-node Ray cluster of this host's {args.ray_gpus} "
                 f"GPUs: the node advertises {args.ray_gpus} units of its device kind, and each of the "
                 f"{args.ray_gpus} farm workers asks Ray for a GPU of its own (CUDA_VISIBLE_DEVICES), proving and "
                 "timing there; the LLM requests go through the farm's gateway; one merged bundle at the end. "
                 "The wall time includes Ray's start and the workers' start-up.")
    elif args.shards:
        per = "per GPU of one host (CUDA_VISIBLE_DEVICES)" if args.backend == "cuda" else "on this machine"
        where = (f"- {args.shards} processes: one `metal-accel synth` {per}, each taking one problem in "
                 f"{args.shards} (the problems dealt out in turn) with its own scripted server, cache and device lane; "
                 "their bundles merged with `metal-accel cache merge` into one. The wall time runs from the first "
                 "process's start to the last one's end, process and device start-up included. No Ray: it is not "
                 "installed on the GPU machine.")
    else:
        where = "- No Ray cluster in this run (--no-farm: Ray is not installed on this machine)."
    return "\n".join(lines) + "\n\n" + "\n".join([
        chosen,
        f"- Models {', '.join(MODELS)} (1 conversation each per problem, up to {rounds} repairs and the speed "
        f"rounds), {at_once} problems in flight, {concurrency} requests in flight at most per machine (per farm "
        "worker on the cluster); prompts without the profiler breakdown (--no-profile); the kernel library and "
        "torch.compile candidates off, so every kernel is the scripted model's"
        + ("; CPU kernels run in process (METAL_ACCEL_TRUST_NATIVE=1), not through the kernel server."
           if args.backend == "cpu" else "."),
        f"- Answer latency: {args.answer_s:g} s +-50% (the minute or two a frontier reasoning model takes for a "
        f"kernel of several thousand tokens: an assumption, not a published figure), run {1 / args.time_scale:g}x "
        f"faster ({args.answer_s * args.time_scale:g} s) so the run takes minutes: problems per hour are those of "
        "the compressed run, counting the problems that ran their course (not those the run's cap cut short).",
        f"- Failure mix of a first answer: {mix}, the rest correct; each repair round halves the failure rates. "
        "Calibrated to KernelBench's headline (Ouyang et al. 2025, arXiv:2502.10517: frontier reasoning models "
        "match PyTorch in under 20% of problems out of the box, more with execution feedback); the split is this "
        "benchmark's assumption. Every answer is spelled differently (fence case and tag, CRLF, a C++ block, a "
        "draft or a thinking section before the final block).",
        "- No run cap on tokens or dollars (--max-tokens 1e9, --max-cost 1000): the default caps (6M tokens and "
        "$20 a run; on a farm each worker gets its share) would stop a run of this size early.",
        f"- Dollars at list prices (gpt-5 $1.25/$10, claude-sonnet-4-5 $3/$15 per million tokens in/out, "
        f"synth/budget.py) for {USAGE[0]} tokens in and {USAGE[1]} out per answer.",
        "- Answers lost to format errors: answers that held a usable kernel but were read as malformed, empty or "
        "truncated (the answers with no code block at all, drawn from the mix, are not counted). Target: none.",
        f"- Outcomes of the answers: {outcomes}. Problems with at least one answer: " + "; ".join(
            f"{mode}: {f['answered']} of {f['problems']}" for mode, f in figures.items()) + "." + "".join(
            f" {mode}: {_unasked(f)}" for mode, f in figures.items() if f.get("unasked")) + (f" Left out, over the cap at any batch size: {'; '.join(LEFT_OUT)}."
                                     if LEFT_OUT else ""),
        where,
        f"- Where the time goes: {one['device_s_per_problem']:.1f} s of device work per problem on one device "
        f"(building the prompt, compiling, proving, timing; one problem at a time on a device), conversations "
        f"of {one['answers_per_conversation']:.1f} answers on average. At the uncompressed {args.answer_s:g} s per "
        f"answer, {at_once} problems in flight would bound one machine at about "
        f"{extrapolated(one, args.answer_s, at_once):.0f} problems per hour (a model, not a measurement: "
        f"{at_once} x 3600 / (answers per conversation x latency + device s), and never more than 3600 / device s): "
        "the LLM's latency, not the device, sets the pace, so more problems in flight (or more machines) pay.",
    ])


def _unasked(f: dict) -> str:
    """The problems that got no request, grouped by why (numbers folded: 'composite of N modules')."""
    why = f.get("why_unasked") or {p: "" for p in f["unasked"]}
    groups: dict[str, list[str]] = {}
    for problem, reason in why.items():
        groups.setdefault(re.sub(r"\d+", "N", reason.split("; ")[0]) or "(no reason recorded)", []).append(problem)
    return f"no kernel was asked for on {len(why)} problems: " + "; ".join(
        f"{len(names)} for '{reason}' ({', '.join(names)})" for reason, names in
        sorted(groups.items(), key=lambda kv: -len(kv[1]))) + "."
