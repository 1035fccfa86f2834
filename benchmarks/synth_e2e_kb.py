"""`python benchmarks/synth_e2e.py --kernelbench`: a KernelBench-sized synthesis run against the scripted server.

KernelBench problems (../shared/kernelbench/problems.jsonl, the ones with a CPU kernel in
benchmarks/candidates/cpu, batch_size halved until no tensor exceeds --max-tensor-mb) go through
`metal-accel synth` twice: on this machine (problems concurrently, `--problems`), and with `--farm` on a
local Ray cluster of two nodes of one device kind (ray.cluster_utils.Cluster; both nodes share this
machine's cores, so the farm's figure is its overhead and overlap, not a scale-out). No LLM is called: the
scripted server (tests/llm_server.py) answers through the real SDKs after a latency drawn around
`--latency` (the answer latency of a frontier reasoning model, scaled by `--time-scale`), with a failure
mix per answer (FAILURE_MIX below) and a different spelling of the answer each time (fence case and
language tag, CRLF, a C++ block or a draft before the final block, a thinking section), as real models
write them. Everything after the answer is real: sandbox, isolated compile, proof, timing, cache, bundle.

Reports problems per hour, requests in flight (as the server saw them), dollars per accepted kernel at
the vendors' list prices (synth/budget.py) with the token counts of USAGE, and the fraction of answers
lost to format errors (answers holding a usable kernel that were read as malformed: the target is none).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "benchmarks" / "candidates"  # <backend>/: the kernels the scripted model answers with
PROBLEMS = Path(os.environ.get("KB_PROBLEMS", ROOT.parent / "shared" / "kernelbench" / "problems.jsonl"))
MODELS = ("openai:gpt-5", "anthropic:claude-sonnet-4-5")
# What one answer is, per round (first answer, then repairs): the rates of a frontier model writing a
# kernel for a KernelBench level-1 problem, calibrated to KernelBench's headline figure (Ouyang et al. 2025,
# arXiv:2502.10517: out of the box, frontier reasoning models are correct and faster than PyTorch in under
# 20% of problems; feedback from execution raises that). The split of the failures between compile errors,
# wrong results and no usable block is this benchmark's assumption, stated in docs/benchmarks.md.
FAILURE_MIX = {"compile error": 0.30, "wrong result": 0.30, "no code block": 0.05}
REPAIRED = 0.5  # each repair round halves the failure rates: the verdict fed back helps the model
USAGE = (7000, 6000)  # tokens in (prompt, problem, profile) and out (reasoning and code) of one answer
# an answer without a kernel (a decline, prose only) is one output token shorter: its attempt record says which
# answers held no kernel, so those read as malformed are told from kernels lost to parsing, cancelled requests too
NO_KERNEL_USAGE = (USAGE[0], USAGE[1] - 1)
# The level-1 problems with a CPU kernel, those whose kernel fuses several of eager's passes first (they win
# clearly on 2 busy cores; a single elementwise op is at par with eager's own vectorized loop)
ORDER = (88, 94, 96, 98, 99, 25, 29, 30, 27, 31, 21, 22, 23, 24, 45)
LEFT_OUT: list[str] = []  # --every-problem: the problems over the tensor cap whatever their batch size
ROUNDS, AT_ONCE, CONCURRENCY = 3, 4, 8  # repair rounds; problems in flight; requests in flight (per process)
MODULE = re.compile(r"metal_accel_problem_[0-9a-f]{16}")


@dataclass
class Served:
    """What the server saw: one interval per answer, to count requests in flight."""

    start: float
    end: float


def kernel_for(name: str, level: int, pid: int, backend: str = "cpu") -> Path | None:
    for p in (CANDIDATES / backend / f"L{level}_{pid}_{name}.py", CANDIDATES / backend / f"{name}.py"):
        if p.is_file():
            return p
    return None


def shrunk(row: dict, cap_mb: float) -> tuple[str, str | None]:
    """The problem's code with batch_size halved until no input or output exceeds CAP_MB, and why it is still
    over the cap (None when it is not)."""
    from metal_accel.kernelbench.problems import Problem
    from metal_accel.kernelbench.sizes import fit_batch, over_cap
    pr = Problem(row["name"], row["code"], f"kb:{row['level']}:{row['problem_id']}", row["level"], row["problem_id"])
    original, batch = fit_batch(pr, cap_mb)
    over = over_cap(pr, cap_mb, batch, original)
    if not isinstance(batch, int):
        return row["code"], over
    return re.sub(r"^batch_size\s*=\s*\d+", f"batch_size = {batch}", row["code"], count=1, flags=re.M), over


def problem_rows(limit: int, cap_mb: float, backend: str = "cpu", every_problem: bool = False,
                 shard: tuple[int, int] | None = None) -> tuple[list[dict], dict[str, Path]]:
    """Up to LIMIT KernelBench rows with a kernel for BACKEND, shrunk; and module name -> kernel file. CPU: the
    level-1 problems of ORDER; other backends: every problem with a kernel, by level and id. EVERY_PROBLEM: also
    the problems with no kernel (the scripted model declines those), by level and id. SHARD (k, n): the k-th of
    every n of those rows."""
    import hashlib
    rows, kernels = [], {}
    every = [json.loads(line) for line in PROBLEMS.read_text().splitlines()]
    if backend == "cpu" and not every_problem:
        level1 = {r["problem_id"]: r for r in every if r["level"] == 1}
        order = [level1.get(pid) for pid in ORDER]
    else:
        order = sorted(every, key=lambda r: (r["level"], r["problem_id"]))
    for row in order:
        k = kernel_for(row["name"], row["level"], row["problem_id"], backend) if row else None
        if row is None or (k is None and not every_problem):
            continue
        code, over = shrunk(row, cap_mb)
        if over and every_problem and backend == "cpu":  # too large for a small machine at any batch: counted
            LEFT_OUT.append(f"{row['name']} ({over})")
            continue
        row = {**row, "code": code, "scripted": k is not None}
        rows.append(row)
        if k is not None:
            kernels["metal_accel_problem_" + hashlib.sha256(row["code"].encode()).hexdigest()[:16]] = k
        if len(rows) >= limit:
            break
    if shard is not None:
        rows = rows[shard[0]:: shard[1]]
    return rows, kernels


def spelled(code: str, rng: random.Random) -> str:
    """A usable answer holding CODE, written one of the ways models write them."""
    fence = rng.choice(["```python", "```Python", "``` python", "```python3", "```py"])
    body = f"{fence}\n{code.rstrip()}\n```"
    style = rng.randrange(5)
    if style == 1:
        body = "The kernel, for reference:\n```cpp\n// the loop\nfor (;;) {}\n```\n\nThe answer:\n\n" + body
    elif style == 2:
        body = f"A first draft:\n```python\ndef forward(module, x):\n    return x\n```\nThe final version:\n{body}"
    elif style == 3:
        body = f"<think>\nI could write\n```python\nSOURCE = 'draft'\n```\nbut no.\n</think>\n{body}"
    text = f"Here is the kernel.\n\n{body}\n"
    return text.replace("\n", "\r\n") if rng.random() < 0.2 else text


class Script:
    """The scripted server's answers: per request, a failure drawn from the mix (lower in later rounds)."""

    def __init__(self, kernels: dict[str, Path], latency: float, seed: int = 0) -> None:
        self.kernels = kernels
        self.latency = latency
        self.served: list[Served] = []
        self.drawn: dict[str, int] = {}
        self._lock = threading.Lock()
        self._seed = seed

    def __call__(self, rec: Any) -> Any:
        from llm_server import Reply
        task = next((m["content"] if isinstance(m["content"], str) else "".join(b.get("text", "") for b in m["content"])
                     for m in rec.messages if m["role"] == "user"), "")
        found = MODULE.search(task)
        rounds = sum(1 for m in rec.messages if m["role"] == "assistant")
        key = f"{found.group(0) if found else ''}:{rec.model}:{rounds}:{len(rec.messages)}:{len(self.served)}"
        rng = random.Random(f"{self._seed}:{key}")
        delay = self.latency * rng.uniform(0.5, 1.5)
        now = time.monotonic()
        with self._lock:
            self.served.append(Served(now, now + delay))
        path = self.kernels.get(found.group(0)) if found else None
        if path is None:
            with self._lock:
                self.drawn["declined"] = self.drawn.get("declined", 0) + 1
            return Reply("I cannot write a kernel for this module.", delay=delay, usage=NO_KERNEL_USAGE)
        code = path.read_text()
        roll, edge = rng.random(), 0.0
        outcome = "correct"
        for what, p in FAILURE_MIX.items():
            edge += p * (REPAIRED ** rounds)
            if roll < edge:
                outcome = what
                break
        with self._lock:
            self.drawn[outcome] = self.drawn.get(outcome, 0) + 1
        if outcome == "no code block":
            return Reply("I would fuse the loop and vectorize it; the details depend on the shapes.", delay=delay,
                         usage=NO_KERNEL_USAGE)
        if outcome == "compile error":
            code = code.replace('SOURCE = r"""', 'SOURCE = r"""\nthis is not C++;', 1)
        elif outcome == "wrong result":
            code = re.sub(r"(\n    return )(.+)\s*$", r"\1(\2) * 1.5\n", code.rstrip() + "\n")
        return Reply(spelled(code, rng), delay=delay, usage=USAGE)


def in_flight(served: list[Served]) -> tuple[float, int]:
    """Mean requests in flight while any was, and the peak, from the served intervals."""
    events = sorted([(s.start, 1) for s in served] + [(s.end, -1) for s in served])
    n = peak = 0
    busy = area = 0.0
    last = events[0][0] if events else 0.0
    for t, d in events:
        if n:
            busy += t - last
            area += n * (t - last)
        n += d
        peak = max(peak, n)
        last = t
    return (area / busy if busy else 0.0), peak


class _Tee(io.StringIO):
    """Kept for the tally and passed on to the real stderr, so a run stopped from outside still shows its progress."""

    def write(self, text: str) -> int:
        sys.__stderr__.write(text)
        return super().write(text)


def run_synth(argv: list[str]) -> tuple[list[dict], str, float]:
    """`metal-accel synth ARGV --json`: the problems' JSON lines, stderr, and the wall time."""
    from metal_accel.cli.main import main
    out, err = io.StringIO(), _Tee()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(argv)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    return rows, err.getvalue(), wall


def tally(rows: list[dict], wall: float, script: Script) -> dict[str, Any]:
    """The figures of one run."""
    attempts = [a for r in rows for rec in r.get("synthesis", []) for a in rec.get("attempts", [])]
    accepted = sum(1 for r in rows if any(m.get("status") == "kernel" for m in r.get("report", {}).get("modules", [])))
    lost = sum(1 for a in attempts if str(a.get("outcome", "")).startswith(("malformed", "empty", "truncated"))
               and int(a.get("tokens_out", 0)) != NO_KERNEL_USAGE[1])
    cut = sum(1 for r in rows if r.get("finished") is False or any(
        str(rec.get("stop_reason", "")).startswith("run ") for rec in r.get("synthesis", [])) or any(
        "not synthesized: run " in str(m.get("reason", "")) for m in r.get("report", {}).get("modules", [])))
    cost = sum(float(a.get("cost_usd", 0.0)) for a in attempts)
    records = [rec for r in rows for rec in r.get("synthesis", [])]
    device = sum(float(rec.get("eval_s", 0.0)) + float(rec.get("prompt_s", 0.0)) for rec in records)
    depth = max((1 + int(a.get("round", 0)) for a in attempts), default=0)
    conversations = {(r.get("problem"), a.get("model"), a.get("sample")) for r in rows
                     for rec in r.get("synthesis", []) for a in rec.get("attempts", [])}
    mean, peak = in_flight(script.served)
    unasked = [r.get("problem") for r in rows if not any(rec.get("attempts") for rec in r.get("synthesis", []))]
    answered = len(rows) - len(unasked)
    return {"problems": len(rows), "answered": answered, "unasked": unasked,
            "why_unasked": {str(r.get("problem")): _why_unasked(r) for r in rows if r.get("problem") in unasked},
            "accepted": accepted,
            "answers": len(attempts),
            "lost_to_format": lost,
            "cut_by_cap": cut,  # problems the run's caps stopped (--max-wall): not counted per hour
            "cost_usd": cost, "wall_s": wall, "per_hour": 3600.0 * (len(rows) - cut) / wall if wall else 0.0,
            "in_flight_mean": mean, "in_flight_peak": peak,
            "per_kernel_usd": cost / accepted if accepted else float("nan"), "conversations": len(conversations),
            "outcomes": _outcomes(attempts), "drawn": dict(script.drawn),
            "device_s_per_problem": device / len(rows) if rows else 0.0, "max_depth": depth,
            "answers_per_conversation": len(attempts) / len(conversations) if conversations else 0.0}


def _why_unasked(row: dict) -> str:
    """Why a problem got no request: its error, else what its report says of its modules."""
    if row.get("error"):
        return str(row["error"])[:300]
    mods = row.get("report", {}).get("modules", [])
    said = sorted({f"{m.get('status')}: {str(m.get('reason', ''))[:160]}" for m in mods})
    return "; ".join(said)[:600] or "no module captured"


def _outcomes(attempts: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in attempts:
        word = str(a.get("outcome", "")).split(":", 1)[0]
        out[word] = out.get(word, 0) + 1
    return out


def _fresh_caches(tag: str) -> None:
    """A user cache and verdict key of this run's own: every problem is synthesized, nothing replayed."""
    os.environ["METAL_ACCEL_USER_CACHE"] = tempfile.mkdtemp(prefix=f"metal_accel_kb_{tag}_")
    os.environ["METAL_ACCEL_CONFIG_DIR"] = tempfile.mkdtemp(prefix=f"metal_accel_kb_{tag}_config_")


def _on_cluster(argv: list[str], kind: str) -> tuple[list[dict], str, float]:
    """ARGV with --farm on a local Ray cluster of two nodes advertising KIND (one CPU each)."""
    import ray
    from ray.cluster_utils import Cluster

    from metal_accel.synth.farm import LLM_RESOURCE, resource_of
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "resources": {resource_of(kind): 1, LLM_RESOURCE: 1}})
    cluster.add_node(num_cpus=1, resources={resource_of(kind): 1})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        return run_synth(argv + ["--farm"])
    finally:
        ray.shutdown()
        cluster.shutdown()


def _on_gpu_node(argv: list[str], kind: str, gpus: int) -> tuple[list[dict], str, float]:
    """ARGV with --farm on a one-node Ray cluster of this host's GPUS GPUs: a farm worker per GPU (each Ray
    gives a GPU of its own through CUDA_VISIBLE_DEVICES; synth/farm.worker_options)."""
    import ray

    from metal_accel.synth.farm import LLM_RESOURCE, resource_of
    ray.init(num_gpus=gpus, resources={resource_of(kind): gpus, LLM_RESOURCE: 1}, include_dashboard=False,
             log_to_driver=False)
    try:
        return run_synth(argv + ["--farm"])
    finally:
        ray.shutdown()


def _modes(args: Any, shard: tuple[int, int] | None) -> list[str]:
    if args.ray_gpus:
        return [f"Ray: 1 node, {args.ray_gpus} GPUs"]
    return ["one machine"] + ([] if args.no_farm or shard else ["2-node Ray cluster"])


def main(args: Any) -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from llm_server import ScriptedLLM

    from metal_accel.synth.farm import device_kind
    # the LLM's kernels only (no library kernels, no torch.compile), run in process (METAL_ACCEL_TRUST_NATIVE=1:
    # through the kernel server's round trip these kernels are at par with eager on 2 busy cores)
    os.environ.update(METAL_ACCEL_LIBRARY="0", METAL_ACCEL_COMPILE="0", METAL_ACCEL_TRUST_NATIVE="1")
    shard = tuple(int(x) for x in args.shard.split("/")) if args.shard else None
    rows, kernels = problem_rows(args.limit, args.max_tensor_mb, args.backend, args.every_problem, shard)
    work = Path(tempfile.mkdtemp(prefix="metal_accel_kb_synth_"))
    jsonl = work / "problems.jsonl"
    jsonl.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "scripted"}) + "\n" for r in rows))
    latency = args.answer_s * args.time_scale
    script = Script(kernels, latency)
    rounds, problems_at_once, concurrency = ROUNDS, AT_ONCE, CONCURRENCY
    argv = ["synth", str(jsonl), "--models", ",".join(MODELS), "--samples", "1", "--rounds", str(rounds),
            "--problems", str(problems_at_once), "--concurrency", str(concurrency), "--no-profile", "--json",
            "--max-cost", "1000", "--max-tokens", "1000000000", "--backend", args.backend]
    if args.max_wall:
        argv += ["--max-wall", f"{args.max_wall:g}"]
    figures: dict[str, dict[str, Any]] = {}
    with ScriptedLLM(script) as server:
        os.environ.update(OPENAI_API_KEY="sk-bench-not-a-key", OPENAI_BASE_URL=server.url + "/v1",
                          ANTHROPIC_API_KEY="sk-bench-not-a-key", ANTHROPIC_BASE_URL=server.url)
        for mode in _modes(args, shard):
            script.served.clear()
            script.drawn.clear()
            _fresh_caches(mode.split()[0])
            if mode == "one machine":
                out, err, wall = run_synth(argv)
            elif mode.startswith("Ray: 1 node"):
                out, err, wall = _on_gpu_node(argv + ["--bundle", str(work / "farm.tar.gz")],
                                              device_kind(args.backend), args.ray_gpus)
            else:
                out, err, wall = _on_cluster(argv + ["--bundle", str(work / "farm.tar.gz")], device_kind(args.backend))
            figures[mode] = tally(out, wall, script)
            if args.rows_out:  # every problem's result line, for a look at what the figures summarize
                Path(args.rows_out).with_suffix(f".{mode.split()[0].strip(':').lower()}.jsonl").write_text(
                    "".join(json.dumps(r) + "\n" for r in out))
            figures[mode]["tail"] = err.strip().splitlines()[-3:]
            print(mode, json.dumps(figures[mode]), file=sys.stderr)
            if not out:  # nothing ran (no SDK, no device, a bad flag): no figures to record
                print(f"{mode}: metal-accel synth gave no problem results:\n{err.strip()[-3000:]}", file=sys.stderr)
                return 1
    if shard:  # one of `--shards N`: its figures, served intervals and bundle go to the parent (synth_e2e_shards.py)
        from metal_accel.cli.main import main as cli_main
        with contextlib.redirect_stdout(io.StringIO()):
            cli_main(["cache", "export", str(Path(args.figures_out).with_suffix(".tar.gz"))])
        Path(args.figures_out).write_text(json.dumps({
            "figures": figures["one machine"],
            "rows": [{"name": r["name"], "level": r["level"], "scripted": r["scripted"]} for r in rows],
            "left_out": LEFT_OUT,
            "served": [(s.start, s.end) for s in script.served]}))
        return 0
    from synth_e2e_report import command_of, render
    body = render(figures, rows, args, rounds, problems_at_once, concurrency)
    print(body)
    if not args.no_write:
        from results import from_markdown, record, today
        on = ("" if args.backend == "cpu" else f"{args.backend}_") + ("ray_" if args.ray_gpus else "")
        record("synth_e2e", f"kernelbench_{on}{today()}", command_of(args), from_markdown(body))
    return 0
