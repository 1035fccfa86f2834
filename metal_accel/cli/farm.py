"""`metal-accel farm node` (the Ray resources this machine advertises) and `metal-accel synth --farm`."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from ..backends import available_backends
from ..synth.budget import run_stops, stopped_early
from ..synth.farm import FarmError, FarmResult, node_resources, run_farm

DEFAULT_BUNDLE = "farm-bundle.tar.gz"


def add_parser(sub: Any) -> None:
    """Register `farm node` on the CLI's subparsers."""
    farm = sub.add_parser("farm", help="run synthesis on a Ray cluster (see docs/farm.md)")
    fsub = farm.add_subparsers(dest="farm_command", required=True)
    node = fsub.add_parser("node", help="print the `ray start --resources` this machine advertises")
    node.add_argument("--backend", action="append", help="backend whose device kind to advertise (repeatable; "
                      "default: mps, else cuda, else cpu, as available)")
    node.add_argument("--llm", action="store_true", help="also advertise metal_accel:llm: this node sends the "
                      "farm's LLM requests (it must have the provider keys in its environment)")
    node.add_argument("--json", action="store_true", help="print only the resources, as JSON")
    node.set_defaults(fn=cmd_node)


def add_synth_arguments(p: argparse.ArgumentParser) -> None:
    """`metal-accel synth`'s farm options."""
    p.add_argument("--farm", nargs="?", const="auto", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster: the one this machine joined with `ray start` (no ADDRESS, or 'auto'), "
                   "the one at ADDRESS (host:port or ray://host:port), or 'local' (this machine alone); needs "
                   "pip install 'metal-accel[farm]'")
    p.add_argument("--kinds", default=None, help="with --farm: comma-separated device kinds (default: every kind "
                   "the cluster's nodes advertise), e.g. mps:apple-m1,mps:apple-m2")
    p.add_argument("--bundle", default=None, help=f"with --farm: where the merged bundle goes (default {DEFAULT_BUNDLE})")


def _default_backends() -> list[str]:
    usable = available_backends()
    return [next((b for b in ("mps", "cuda", "cpu") if b in usable), "cpu")]


def cmd_node(args: argparse.Namespace) -> int:
    usable = available_backends()
    backends = args.backend or _default_backends()
    absent = [b for b in backends if b not in usable]
    if absent:
        print(f"metal-accel farm node: backend {', '.join(absent)} is not available on this machine", file=sys.stderr)
        return 2
    res = node_resources(backends, llm=args.llm)
    text = json.dumps(res, sort_keys=True)
    if args.json:
        print(text)
        return 0
    print(f"# this machine's device kinds: {', '.join(k for k in res)}")
    print(f"ray start --address=HEAD_ADDRESS:6379 --resources={shlex.quote(text)}")
    print("# on the head node: ray start --head --resources=... (the same JSON); then, on any node of the cluster:")
    print("#   metal-accel synth PROBLEMS --models ... --farm --bundle kernels.tar.gz")
    return 0


def synth_on_farm(args: argparse.Namespace, loop: Any, problems: list[Any]) -> int:
    """`metal-accel synth --farm`: every problem on every device kind of the cluster, one merged bundle."""
    address = None if args.farm == "local" else args.farm
    if args.farm == "local":
        try:
            import ray
        except ImportError:
            print("metal-accel synth: the farm needs Ray: pip install 'metal-accel[farm]'", file=sys.stderr)
            return 2
        if not ray.is_initialized():
            ray.init(resources=node_resources(_default_backends(), llm=True), include_dashboard=False)
    out = sys.stderr if args.json else sys.stdout
    bundle = args.bundle or DEFAULT_BUNDLE

    def show(res: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps({k: v for k, v in res.items() if k not in ("table", "summaries")}), flush=True)
            return
        head = f"# {res['problem']} on {res['kind']}"
        if res.get("error"):
            print(f"{head}: {res['error']}", flush=True)
            return
        print(head)
        print(res["table"])
        for line in res.get("summaries", []):
            print("  synth " + line)
        print(flush=True)

    kinds = [k.strip() for k in (args.kinds or "").split(",") if k.strip()]
    try:
        result = run_farm(problems, [m.label for m in loop.models], loop.settings, bundle, address=address,
                          kinds=kinds, on_result=show)
    except FarmError as exc:
        print(f"metal-accel synth: {exc}", file=sys.stderr)
        return 2
    _report(result, out)
    if result.interrupted:
        return 130
    if result.requests and result.failed == result.requests:
        print(f"metal-accel synth: every LLM request failed ({result.requests}); see the reasons above", file=sys.stderr)
        return 1
    return 0


def _report(result: FarmResult, out: Any) -> None:
    for line in (result.merge.conflicts if result.merge else []):
        print(f"metal-accel synth: conflict: {line}", file=out)
    for line in (result.merge.skipped if result.merge else []):
        print(f"metal-accel synth: left out of the bundle: {line}", file=out)
    if result.merge is not None and result.merge.bundle is not None:
        print(f"metal-accel synth: {result.merge.summary()}; lock {result.merge.bundle.lock}", file=out)
    else:
        print("metal-accel synth: nothing was proven; no bundle written", file=out)
    print(f"metal-accel synth: farm: {result.summary()}", file=out)
    stops = run_stops([str(r.get("stopped", "")) for r in result.results] + [
        str(rec.get("stop_reason", "")) for r in result.results for rec in r.get("synthesis", [])])
    unfinished = sum(1 for r in result.results if r.get("finished") is False)
    if stops and unfinished:  # a worker's caps are its share of the run's (synth/farm.share)
        print(f"metal-accel synth: {stopped_early(stops, unfinished)}; on the farm each of the "
              f"{len(result.spent)} workers has its share of the run's token and cost caps", file=sys.stderr)
