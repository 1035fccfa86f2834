"""The `metal-accel` command: doctor, synth, cache ls|show|clear|export|import|verify|merge, bench, farm node."""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
from typing import Sequence

import torch

from ..backends import available_backends, get_backend, known_backends
from ..backends.cpu.backend import find_compiler
from ..core import config
from ..core.errors import MetalAccelError
from ..core.version import VERSION as __version__
from ..library import catalog as library_catalog
from ..store import cache as cache_mod
from . import bench as cli_bench
from . import bundle as cli_bundle
from . import farm as cli_farm
from . import synth as cli_synth

# Environment variables the LLM providers read; only their presence is ever reported.
PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL",
                 "METAL_ACCEL_COMPATIBLE_API_KEY", "METAL_ACCEL_MODELS")


def cmd_doctor(args: argparse.Namespace) -> int:
    print(f"metal_accel {__version__}  torch {torch.__version__}  python {platform.python_version()}  "
          f"{platform.system()} {platform.machine()}")
    usable = available_backends()
    for name in known_backends():
        if name in usable:
            be = get_backend(name)
            env = be.environment()
            extra = ""
            if name == "cpu":
                extra = f", compiler {find_compiler()}"
            print(f"backend {name:8s} available: {env.device_name} ({env.os}, torch {env.torch}{extra})")
        else:
            print(f"backend {name:8s} not available on this machine")
    print(f"user cache     {config.user_cache_dir()}")
    for c in cache_mod.read_only_caches():
        state = "" if c.root.is_dir() else " (missing)"
        print(f"read-only cache {c.name}: {c.root}{state}")
    if config.current().library:
        for line in library_catalog.describe(usable):
            print(line)
    else:
        print("library        off (METAL_ACCEL_LIBRARY=0)")
    for key in PROVIDER_KEYS:
        print(f"{key:18s} {'set' if os.environ.get(key) else 'not set'}")
    if config.disabled():
        print("METAL_ACCEL_DISABLE is set: optimize() leaves models unchanged")
    return 0


def _select(args: argparse.Namespace) -> list[cache_mod.CacheDir]:
    if args.cache == "user":
        return [cache_mod.user_cache()]
    if args.cache == "shipped":
        return [c for c in cache_mod.read_only_caches() if c.name == "shipped"]
    return cache_mod.all_caches()


def cmd_cache_ls(args: argparse.Namespace) -> int:
    rows = []
    for c in _select(args):
        for e in c.entries(args.backend):
            verdicts = ", ".join(_verdict_cell(e, env_id) for env_id in e.verdicts) or "-"
            rows.append((e.key[:12], c.name, e.backend, e.module_class.rsplit(".", 1)[-1],
                         e.input_spec.describe(), "kernel" if e.candidate else "none", verdicts))
    if not rows:
        print("no cache entries")
        return 0
    head = ("key", "cache", "backend", "module", "input", "kernel", "verdicts")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(col.ljust(w) for col, w in zip(r, widths)).rstrip())
    return 0


def _verdict_cell(e: cache_mod.CacheEntry, env_id: str) -> str:
    """'ok 1.30x' for a verdict this user's library made (or a pinned bundle vouches for); '(claim)' otherwise."""
    v = e.verdicts[env_id]
    cell = f"{'ok' if v.accepted else 'no'}" + (f" {v.speedup:.2f}x" if v.speedup else "")
    return cell if e.proven(env_id) else cell + " (claim)"


def cmd_cache_show(args: argparse.Namespace) -> int:
    matches = [e for c in _select(args) for e in c.entries(args.backend) if e.key.startswith(args.key)]
    if not matches:
        print(f"no entry with key {args.key}*", file=sys.stderr)
        return 1
    for e in matches:
        data = e.to_dict()
        if not args.source and data.get("candidate"):
            data["candidate"] = {k: v for k, v in data["candidate"].items() if k not in ("code", "source")}
        print(f"# {e.origin}")
        print(json.dumps(data, indent=2, sort_keys=True))
        if args.source and e.candidate:
            print(e.candidate.code)
    return 0


def cmd_cache_clear(args: argparse.Namespace) -> int:
    if not args.yes and sys.stdin.isatty():
        answer = input(f"delete everything in the user cache at {config.user_cache_dir()} (entries, compiled "
                       "kernels, unpacked bundles, recordings)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return 1
    cleared = cache_mod.user_cache().clear()
    print(f"{cleared.summary()} from {config.user_cache_dir()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metal-accel", description=__doc__)
    p.add_argument("--version", action="version", version=f"metal_accel {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log what the pipeline does and how long each step takes (-vv: each trial batch too)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="backends, compilers, cache locations, provider keys (set or not)"
                   ).set_defaults(fn=cmd_doctor)
    cache = sub.add_parser("cache", help="inspect or clear kernel caches")
    csub = cache.add_subparsers(dest="cache_command", required=True)
    for name, fn, helptext in (("ls", cmd_cache_ls, "list entries"), ("show", cmd_cache_show, "show one entry")):
        c = csub.add_parser(name, help=helptext)
        c.add_argument("--cache", choices=("all", "user", "shipped"), default="all")
        c.add_argument("--backend", default=None)
        if name == "show":
            c.add_argument("key", help="entry key or a prefix of it")
            c.add_argument("--source", action="store_true", help="print the kernel and host code")
        c.set_defaults(fn=fn)
    clear = csub.add_parser("clear", help="delete everything the user cache holds (entries, compiled kernels, "
                            "unpacked bundles, recordings)")
    clear.add_argument("-y", "--yes", action="store_true", help="do not ask")
    clear.set_defaults(fn=cmd_cache_clear)
    cli_bundle.add_parsers(csub)
    cli_synth.add_parser(sub)
    cli_bench.add_parser(sub)
    cli_farm.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
        logging.getLogger("metal_accel").setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
    try:
        return int(args.fn(args))
    except MetalAccelError as exc:
        print(f"metal-accel: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
