"""`metal-accel synth PATH`: synthesize kernels for KernelBench-format problems and print the report."""
from __future__ import annotations

import argparse
import json
import logging
import queue
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ..api import explain, optimize, restore
from ..auto.record import recorded_calls, synthesize_recorded
from ..backends import available_backends, get_backend
from ..core.errors import MetalAccelError
from ..core.scrub import scrub
from ..kernelbench.problems import load_problems
from ..synth.budget import Limits, run_stops, stopped_early
from ..synth.lanes import lane_for
from ..synth.loop import SynthesisLoop
from ..synth.memo import RunJournal
from ..synth.settings import SynthSettings
from . import farm as cli_farm

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    """Register the `synth` subcommand on the CLI's subparsers."""
    p = sub.add_parser("synth", help="synthesize kernels with LLMs for KernelBench-format problems",
                       description="Optimize each problem's Model with LLM synthesis and print the report. PATH is a "
                       ".py file defining Model, get_inputs() and get_init_inputs(), a directory of them, or a JSON-lines "
                       "file with one problem's code per row.")
    p.add_argument("path", nargs="?", help="problem .py file, directory, or .jsonl file")
    p.add_argument("--recorded", action="store_true",
                   help="instead of PATH: the hottest module calls recorded with METAL_ACCEL_RECORD=1")
    p.add_argument("--top", type=int, default=10, help="with --recorded: how many recorded calls (default 10)")
    p.add_argument("--models", default=None, help="comma-separated model names (default: METAL_ACCEL_MODELS), e.g. "
                   "openai:gpt-5,anthropic:claude-sonnet-4-5,openai-compatible:http://localhost:11434/v1#qwen2.5-coder")
    p.add_argument("--backend", default=None, help="backend (default: mps, else cuda, else cpu, as available)")
    p.add_argument("--level", type=int, action="append", help="only problems of this level (repeatable)")
    p.add_argument("--id", type=int, action="append", dest="ids", help="only this problem id (repeatable)")
    p.add_argument("--name", action="append", dest="names", help="only problems whose name contains this")
    p.add_argument("--limit", type=int, default=None, help="at most this many problems")
    p.add_argument("--samples", type=int, default=None, help="conversations per model and module")
    p.add_argument("--rounds", type=int, default=None, help="repair rounds per conversation")
    p.add_argument("--concurrency", type=int, default=None, help="LLM requests in flight (over all problems)")
    p.add_argument("--problems", type=int, default=None,
                   help="problems in flight at once (default 2, METAL_ACCEL_PROBLEMS): their LLM requests overlap, "
                   "their device work (proofs, timing) takes turns")
    p.add_argument("--max-cost", type=float, default=None, help="USD cap for the whole run")
    p.add_argument("--max-tokens", type=int, default=None, help="token cap for the whole run")
    p.add_argument("--max-wall", type=float, default=None, help="seconds cap for the whole run")
    p.add_argument("--all-modules", action="store_true", help="also synthesize the Model's submodules")
    p.add_argument("--no-profile", action="store_true", help="leave the profiles (eager, and the kernel in speed rounds) out of prompts")
    p.add_argument("--json", action="store_true", help="print the reports as JSON lines")
    p.add_argument("--restart", action="store_true",
                   help="redo problems an earlier run of the same command finished (default: resume after them)")
    cli_farm.add_synth_arguments(p)
    p.set_defaults(fn=cmd_synth)


def _settings(args: argparse.Namespace) -> Any:

    s = SynthSettings.from_env()
    changes: dict[str, Any] = {}
    for arg, field in (("samples", "samples"), ("rounds", "repair_rounds"), ("concurrency", "concurrency"),
                        ("problems", "problems")):
        if getattr(args, arg) is not None:
            changes[field] = getattr(args, arg)
    if args.max_cost is not None or args.max_tokens is not None or args.max_wall is not None:
        r = s.run_limits
        changes["run_limits"] = Limits(tokens=args.max_tokens if args.max_tokens is not None else r.tokens,
                                       cost_usd=args.max_cost if args.max_cost is not None else r.cost_usd,
                                       wall_s=args.max_wall if args.max_wall is not None else r.wall_s)
    if not args.all_modules and not args.recorded:  # a KernelBench problem's module is its Model
        changes["only_classes"] = ("Model",)
    if args.no_profile:
        changes["profile"] = False
    return s.with_(**changes)


def cmd_synth(args: argparse.Namespace) -> int:

    try:
        loop = SynthesisLoop(args.models, _settings(args))
    except MetalAccelError as exc:  # a model name that cannot be parsed
        print(f"metal-accel synth: {exc}", file=sys.stderr)
        return 2
    problem = loop.configuration_error or "; ".join(loop.dead.values())
    if problem:  # every model named must be usable before anything is loaded, profiled or sent
        print(f"metal-accel synth: {problem}", file=sys.stderr)
        return 2
    if args.recorded:
        return _synth_recorded(args, loop)
    if not args.path:
        print("metal-accel synth: give a PATH of problems, or --recorded", file=sys.stderr)
        return 2
    usable = available_backends()
    backend = get_backend(args.backend or next((b for b in ("mps", "cuda", "cpu") if b in usable), "cpu"))
    problems = load_problems(args.path, levels=args.level, ids=args.ids, names=args.names)
    if args.limit is not None:
        problems = problems[: args.limit]
    if not problems:
        print(f"metal-accel synth: no problems in {args.path}", file=sys.stderr)
        return 1
    if args.farm is not None:  # every problem on every device kind of a Ray cluster
        return cli_farm.synth_on_farm(args, loop, problems)
    out = sys.stderr if args.json else sys.stdout
    journal = RunJournal(_identity(args, loop, backend.name))
    if args.restart:
        journal.reset()
    finished = journal.finished()
    kernels = 0
    todo = []
    for pr in problems:
        if pr.name in finished:
            kernels += int(finished[pr.name].get("kernels", 0))
            print(f"# {pr.name}: finished by an earlier run of this command (--restart redoes it)", file=out)
        else:
            todo.append(pr)
    lane = lane_for(backend.name)
    printing = threading.Lock()

    def solve(pr: Any) -> None:
        """One problem on this worker thread: its device work under the device's lane, which synthesis
        lends to the other problems while it waits for answers."""
        nonlocal kernels
        with lane.hold():
            try:
                model, inputs = pr.instantiate(backend.device_type)
            except MetalAccelError as exc:
                print(f"# {pr.name}: {exc}", file=sys.stderr)
                return
            with loop.collect() as records:
                try:
                    optimize(model, inputs, backend=backend.name, providers=[loop])
                    report = explain(model)
                finally:
                    restore(model)
        with printing:
            kernels += len(report.kernels)
            if args.json:
                print(json.dumps({"problem": pr.name, "level": pr.level, "problem_id": pr.problem_id,
                                  "report": report.to_dict(), "synthesis": [r.to_dict() for r in records]}))
            else:
                print(f"# {pr.name} ({pr.origin})")
                print(report.table())
                for r in records:
                    print("  synth " + r.summary())
                print()
            if _finished(loop, records):  # else a rerun of this command picks it up again
                journal.add(pr.name, kernels=len(report.kernels))
            else:
                unfinished.append(pr.name)
            stops.update(run_stops([loop.run_meter.exceeded()] + [r.stop_reason for r in records]))

    unfinished: list[str] = []
    stops: set[str] = set()
    run_concurrently(todo, solve, loop.settings.problems, loop)
    print(f"metal-accel synth: {kernels} kernels for {len(problems)} problems; {loop.run_meter.summary()}", file=out)
    if stops and unfinished:
        print(f"metal-accel synth: {stopped_early(stops, len(unfinished))}", file=sys.stderr)
    return _exit_code(loop)


def run_concurrently(items: list[Any], work: Callable[[Any], None], workers: int, loop: SynthesisLoop) -> None:
    """`work(item)` for every item in order, on up to `workers` threads at once, until the loop is
    interrupted. Ctrl-C (here, or raised in a worker) interrupts the loop: the problems in flight stop
    asking, keep what was proven and finish; a second Ctrl-C returns at once."""
    pending: "queue.Queue[Any]" = queue.Queue()
    for item in items:
        pending.put(item)

    def worker() -> None:
        while not loop.interrupted:
            try:
                item = pending.get_nowait()
            except queue.Empty:
                return
            try:
                work(item)
            except KeyboardInterrupt:
                loop.interrupt()
            except Exception as exc:  # one problem's failure is reported; the others go on
                log.error("metal_accel: synth: %s failed: %s", getattr(item, "name", item), scrub(exc))
                print(f"# {getattr(item, 'name', item)}: failed: {scrub(exc)}", file=sys.stderr)

    threads = [threading.Thread(target=worker, name=f"metal_accel-problem-{i}", daemon=True)
               for i in range(max(1, min(workers, len(items))))]
    for t in threads:
        t.start()
    try:
        _join(threads)
    except KeyboardInterrupt:
        loop.interrupt()
        try:
            _join(threads)
        except KeyboardInterrupt:  # the second Ctrl-C: leave the workers (daemon threads) behind
            pass


def _join(threads: list[threading.Thread]) -> None:
    for t in threads:
        while t.is_alive():
            t.join(0.1)  # a timed wait, so that Ctrl-C reaches this (the main) thread


def _finished(loop: SynthesisLoop, records: list[Any]) -> bool:
    """Whether a problem's synthesis ran its course: not interrupted, not stopped by the run's budget,
    no request that failed (a rerun asks those again; what was answered replays from the answer cache)."""
    if loop.interrupted or loop.run_meter.exceeded():
        return False
    return not any((r.stop_reason and not r.stop_reason.startswith("module "))
                   or any(a.outcome.startswith("request failed") for a in r.attempts)
                   for r in records)


def _identity(args: argparse.Namespace, loop: SynthesisLoop, backend: str) -> dict[str, Any]:
    """What makes two invocations the same run (the second resumes the first): the problems, the models,
    the backend and how hard to try; not the budgets, --limit or the output format."""
    return {"path": str(Path(args.path).resolve()), "models": [m.label for m in loop.models], "backend": backend,
            "level": args.level, "ids": args.ids, "names": args.names, "all_modules": args.all_modules,
            "samples": loop.settings.samples, "rounds": loop.settings.repair_rounds}


def _exit_code(loop: Any) -> int:
    """130 when interrupted (what was proven is cached), 1 when every LLM request failed, else 0."""
    meter = loop.run_meter
    if loop.interrupted:
        print(f"metal-accel synth: interrupted; kept what was proven so far (spent {meter.summary()})",
              file=sys.stderr)
        return 130
    if meter.requests and meter.failed == meter.requests:
        print(f"metal-accel synth: every LLM request failed ({meter.requests}); see the reasons above",
              file=sys.stderr)
        return 1
    return 0


def _synth_recorded(args: argparse.Namespace, loop: Any) -> int:
    """Synthesize the hottest calls that ran eager during a METAL_ACCEL_RECORD=1 run."""

    if not recorded_calls():
        print("metal-accel synth: nothing recorded yet; run your program once with METAL_ACCEL_RECORD=1",
              file=sys.stderr)
        return 1
    try:
        for rec, result in synthesize_recorded([loop], top=args.top, backend=args.backend):
            print(f"# {rec.class_path} {rec.input_spec.describe()}: {rec.calls} calls, {rec.mean_us:.1f} us each")
            print(result if isinstance(result, str) else result.table())
            print()
            if loop.interrupted:
                break
    except KeyboardInterrupt:
        loop.interrupt()
    print(f"metal-accel synth: {loop.run_meter.summary()}")
    return _exit_code(loop)
