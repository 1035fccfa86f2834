"""End-to-end LLM synthesis of the quickstart model's modules against a local scripted server.

    python benchmarks/synth_e2e.py [--latency 1.5] [--models 2] [--samples 2] [--no-write]
    python benchmarks/synth_e2e.py --kernelbench [--limit 8] [--answer-s 60 --time-scale 0.02] [--no-write]

The second form is the KernelBench-sized run, on one machine and on a 2-node local Ray cluster
(benchmarks/synth_e2e_kb.py says what it does; it needs the farm extra: pip install 'metal-accel[farm]').

No LLM is called: a local HTTP server speaks the OpenAI and Anthropic APIs (through the real SDKs)
and answers each request after an artificial latency with the repository's CPU kernel for the
module class named in the prompt (kernels_src/cpu/<Class>.py); the first answer of every first
conversation has a compile error, so one repair round is exercised too. Everything after the
answer is real: sandbox, isolated compile and validation, timing against eager, cache.

Reports the wall time per synthesized module split into LLM wait (waiting for answers with no
evaluation running), compile, validate and benchmark, and the concurrency achieved (mean and
peak requests in flight). The shipped cache is hidden and the user cache is a temporary one, so
every module is synthesized. Writes its run to docs/results/ (render docs/benchmarks.md with `python -m benchmarks.render`).
"""
from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
KERNELS = ROOT / "kernels_src" / "cpu"
CLASS = re.compile(r"replacing the forward of `[\w.]*?(\w+)`")


def scripted_answer(rec, latency: float, rng: random.Random):
    """The reply for one recorded request: the class's kernel, broken in a first answer."""
    from llm_server import Reply
    task = next(m["content"] for m in rec.messages if m["role"] == "user")
    name = CLASS.search(task).group(1)
    path = KERNELS / f"{name}.py"
    delay = latency * rng.uniform(0.6, 1.4)
    if not path.is_file():
        return Reply("I have no kernel for this module.", delay=delay, usage=(6000, 300))
    code = path.read_text()
    first_round = len(rec.messages) == 1
    if first_round and rng.random() < 0.5:
        code = code.replace("#include <cstdint>", "#include <cstdint>\nthis is not C++;", 1)
    return Reply(f"Here is the kernel.\n\n```python\n{code}```\n", delay=delay, usage=(6000, 2500))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=1.5, help="mean seconds per LLM answer")
    parser.add_argument("--models", type=int, default=2, choices=(1, 2), help="1: openai only; 2: openai + anthropic")
    parser.add_argument("--samples", type=int, default=2, help="conversations per model and module")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument("--kernelbench", action="store_true", help="the KernelBench-sized run (synth_e2e_kb.py)")
    parser.add_argument("--limit", type=int, default=8, help="--kernelbench: at most this many problems")
    parser.add_argument("--time-scale", type=float, default=0.02,
                        help="--kernelbench: answer latencies are --answer-s times this")
    parser.add_argument("--answer-s", type=float, default=60.0,
                        help="--kernelbench: mean seconds per answer of the model the run stands for")
    parser.add_argument("--max-tensor-mb", type=float, default=16.0,
                        help="--kernelbench: batch_size halved until no tensor exceeds this")
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"),
                        help="--kernelbench: the backend whose kernels (benchmarks/candidates/BACKEND) the model answers with")
    parser.add_argument("--max-wall", type=float, default=None,
                        help="--kernelbench: seconds cap of each synth run (metal-accel synth --max-wall)")
    parser.add_argument("--no-farm", action="store_true", help="--kernelbench: one machine only, no Ray cluster run")
    parser.add_argument("--every-problem", action="store_true",
                        help="--kernelbench: every problem of the file; the scripted model declines those it has no "
                             "kernel for")
    parser.add_argument("--shards", type=int, default=0,
                        help="--kernelbench: one synth process per GPU of this host, bundles merged "
                             "(synth_e2e_shards.py); the number of GPUs")
    parser.add_argument("--ray-gpus", type=int, default=0,
                        help="--kernelbench --backend cuda: the farm on a one-node Ray cluster of this host's N GPUs, "
                             "a worker per GPU (no one-machine run)")
    parser.add_argument("--rows-out", default=None,
                        help="--kernelbench: also write each problem's result line (JSON) to ROWS_OUT.<run>.jsonl")
    parser.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # K/N: one process of --shards
    parser.add_argument("--figures-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kernelbench and args.shards:
        from synth_e2e_shards import main as shards_main
        return shards_main(args)
    if args.kernelbench:
        from synth_e2e_kb import main as kernelbench_main
        return kernelbench_main(args)
    os.environ["METAL_ACCEL_USER_CACHE"] = tempfile.mkdtemp(prefix="metal_accel_synth_bench_")

    import metal_accel
    from metal_accel.core import config
    from metal_accel.demo import DEFAULT_BATCH, DEFAULT_SEQ, build_demo_model, demo_inputs
    from metal_accel.synth.loop import SynthesisLoop
    from metal_accel.synth.settings import SynthSettings
    from llm_server import ScriptedLLM

    empty = Path(tempfile.mkdtemp(prefix="metal_accel_no_shipped_"))
    config.shipped_cache_dir = lambda: empty  # type: ignore[assignment]  # synthesize everything
    rng = random.Random(0)
    with ScriptedLLM(lambda rec: scripted_answer(rec, args.latency, rng)) as server:
        os.environ.update(OPENAI_API_KEY="sk-bench-not-a-key", OPENAI_BASE_URL=server.url + "/v1",
                          ANTHROPIC_API_KEY="sk-bench-not-a-key", ANTHROPIC_BASE_URL=server.url)
        models = ["openai:bench-model-a", "anthropic:bench-model-b"][: args.models]
        settings = SynthSettings(samples=args.samples, repair_rounds=2, concurrency=8, profile=True,
                                 references=True, progress=False,
                                 prices={"bench-model-*": (0.0, 0.0)},  # scripted models: free, but priced
                                 only_classes=tuple(p.stem for p in KERNELS.glob("*.py")))
        loop = SynthesisLoop(models, settings)
        model = build_demo_model().eval()
        (ids,) = demo_inputs(DEFAULT_BATCH, DEFAULT_SEQ)
        t0 = time.perf_counter()
        metal_accel.optimize(model, (ids,), backend="cpu", providers=[loop], progress=False)
        total_s = time.perf_counter() - t0
        requests = len(server.requests)
    report = metal_accel.explain(model)
    rows = ["| module | answers | evaluated | accepted | wall s | prompt s | LLM wait s | compile s | validate s "
            "| bench s | other eval s | LLM busy s | busy while evaluating s | in flight: mean / peak |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    sums = dict(wall=0.0, prompt=0.0, wait=0.0, compile=0.0, validate=0.0, bench=0.0, other=0.0, busy=0.0,
                overlap=0.0, area=0.0)
    for r in loop.records:
        wait = max(0.0, r.wall_s - r.eval_s - r.prompt_s)
        other = max(0.0, r.eval_s - r.compile_s - r.validate_s - r.bench_s)
        rows.append(f"| {r.module_class.rsplit('.', 1)[-1]} | {len(r.attempts)} | {r.evaluations} | {r.accepted} | "
                    f"{r.wall_s:.1f} | {r.prompt_s:.1f} | {wait:.1f} | {r.compile_s:.1f} | {r.validate_s:.1f} | "
                    f"{r.bench_s:.1f} | {other:.1f} | {r.llm_busy_s:.1f} | {r.overlap_s:.1f} | "
                    f"{r.concurrency:.2f} / {r.peak_in_flight} |")
        for k, v in (("wall", r.wall_s), ("prompt", r.prompt_s), ("wait", wait), ("compile", r.compile_s),
                     ("validate", r.validate_s), ("bench", r.bench_s), ("other", other), ("busy", r.llm_busy_s),
                     ("overlap", r.overlap_s), ("area", r.concurrency * r.llm_busy_s)):
            sums[k] += v
    mean_inflight = sums["area"] / sums["busy"] if sums["busy"] else 0.0
    rows.append(f"| **all {len(loop.records)} modules** | {sum(len(r.attempts) for r in loop.records)} | "
                f"{sum(r.evaluations for r in loop.records)} | {sum(r.accepted for r in loop.records)} | "
                f"{sums['wall']:.1f} | {sums['prompt']:.1f} | {sums['wait']:.1f} | {sums['compile']:.1f} | "
                f"{sums['validate']:.1f} | {sums['bench']:.1f} | {sums['other']:.1f} | {sums['busy']:.1f} | "
                f"{sums['overlap']:.1f} | {mean_inflight:.2f} / "
                f"{max((r.peak_in_flight for r in loop.records), default=0)} |")
    llm_sum = sum(r.llm_s for r in loop.records)
    eval_sum = sum(r.eval_s for r in loop.records)
    body = "\n".join(rows) + "\n\n" + "\n".join([
        f"- {len(report.kernels)} of {len(report.modules)} module calls run kernels after synthesis; optimize() took "
        f"{total_s:.1f} s in all ({requests} requests to the scripted server, {args.models} model(s) x {args.samples} "
        f"samples per module, answer latency {args.latency:g} s +-40%).",
        f"- Summed answer latency {llm_sum:.1f} s, but requests were in flight during {sums['busy']:.1f} s of the "
        f"{sums['wall']:.1f} s (mean {mean_inflight:.2f} at once while any was), and only {sums['wait']:.1f} s were "
        f"spent waiting with nothing else to do; {sums['overlap']:.1f} s of the {eval_sum:.1f} s of evaluation (one "
        "candidate at a time, on the caller's thread) ran while requests were in flight.",
        "- prompt = building the prompt (profiler run, cache scan for references); LLM wait = wall minus prompt "
        "minus evaluation; LLM busy = time with at least one request in flight; compile = the worker's compile, validate = the "
        "isolated trials and the comparison with eager, bench = interleaved timing; other eval = sandbox/source "
        "checks, worker round trip and op creation.",
    ])
    print(body)
    if not args.no_write:
        from results import from_markdown, record, today
        record("synth_e2e", f"cpu_{today()}", "python benchmarks/synth_e2e.py", from_markdown(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
