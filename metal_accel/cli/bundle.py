"""`metal-accel cache export|import|verify|merge`: move kernel caches between machines and apps."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..store import cache as cache_mod
from ..store.bundle import export_bundle, verify_bundle
from ..store.cache import read_entry
from ..store.merge import merge_bundles
from ..store.manifest import unpack


def cmd_export(args: argparse.Namespace) -> int:
    caches = cache_mod.all_caches() if args.all_caches else [cache_mod.user_cache()]
    info = export_bundle(args.dest, caches, keys=args.key or (), classes=args.cls or (), backends=args.backend or ())
    print(f"exported {info.entries} entries to {info.path}")
    print(f"lock (pin it with metal_accel.load_cache(path, sha256=...)): {info.lock}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = verify_bundle(unpack(args.bundle, Path(tmp)), pin=args.sha256)
        for key in report.ok:
            print(f"ok       {key}")
        for problem in report.problems:
            print(f"PROBLEM  {problem}")
        print(f"{len(report.ok)} entries load; {len(report.problems)} problems")
        print(f"trust: {report.trust()}")
    return 0 if report.clean else 1


def cmd_import(args: argparse.Namespace) -> int:
    user = cache_mod.user_cache()
    with tempfile.TemporaryDirectory() as tmp:
        root = unpack(args.bundle, Path(tmp))
        report = verify_bundle(root)
        for problem in report.problems:
            print(f"skipped: {problem}")
        imported = 0
        for key in report.ok:
            entry = next((e for e in (read_entry(p, "import") for p in root.glob(f"*/{key}.json")) if e), None)
            if entry is not None:
                user.put(entry)
                imported += 1
        print(f"imported {imported} entries into {user.root}")
        if imported and report.sealed < report.verdicts:
            print(f"their {report.verdicts - report.sealed} verdicts not sealed by you are claims: each kernel is "
                  "proven on this device before its first use")
    return 0 if report.clean else 1


def cmd_merge(args: argparse.Namespace) -> int:
    report = merge_bundles(args.sources, args.dest)
    for line in report.conflicts:
        print(f"conflict {line}")
    for line in report.skipped:
        print(f"skipped  {line}")
    print(report.summary())
    if report.bundle is not None:
        print(f"lock (pin it with metal_accel.load_cache(path, sha256=...)): {report.bundle.lock}")
    return 0 if not report.skipped else 1


def add_parsers(csub: argparse._SubParsersAction) -> None:
    exp = csub.add_parser("export", help="write accepted entries to a bundle directory or .tar.gz")
    exp.add_argument("dest", help="a new directory, or a path ending in .tar.gz")
    exp.add_argument("--key", action="append", help="entry key prefix (repeatable)")
    exp.add_argument("--class", dest="cls", action="append", help="module class name or glob (repeatable)")
    exp.add_argument("--backend", action="append", help="backend name (repeatable)")
    exp.add_argument("--all-caches", action="store_true", help="also take entries from loaded and shipped caches")
    exp.set_defaults(fn=cmd_export)
    ver = csub.add_parser("verify", help="check a bundle's hashes and entries")
    ver.add_argument("bundle")
    ver.add_argument("--sha256", default=None, help="the lock you trust (from the bundle's author): check the "
                     "manifest is that one")
    ver.set_defaults(fn=cmd_verify)
    imp = csub.add_parser("import", help="copy a bundle's valid entries into the user cache")
    imp.add_argument("bundle")
    imp.set_defaults(fn=cmd_import)
    mrg = csub.add_parser("merge", help="merge bundles (e.g. one per device kind) into one; see docs/farm.md for "
                          "how entries of one key are resolved")
    mrg.add_argument("dest", help="a new directory, or a path ending in .tar.gz")
    mrg.add_argument("sources", nargs="+", help="bundle directories or .tar.gz files")
    mrg.set_defaults(fn=cmd_merge)
