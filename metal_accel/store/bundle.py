"""Cache bundles: a self-contained, hash-checked directory (or .tar.gz) of kernel cache entries.

    <bundle>/manifest.json   format, metal_accel version, entries and their verdicts, sha256 of every file
    <bundle>/bundle.lock     sha256 of manifest.json: what an app pins with load_cache(path, sha256=...)
    <bundle>/index.json      which classes and shapes it covers (for `import metal_accel`)
    <bundle>/<backend>/<key>.json

Loading checks every entry's hash against the manifest before it is parsed, and the sandbox
and source checks when it is; a tampered, truncated, unlisted or unknown-version entry is skipped
with a warning and reported by `verify`, never executed.

A bundle that matches its own manifest is only self-consistent: anyone who edits an entry can
recompute the hashes and the lock. So its verdicts are claims, and each kernel is proven on this
device before its first use, unless the app pinned the lock it got from a source it trusts
(load_cache(path, sha256=...)), or the verdict carries this user's own seal (attest.py).
"""
from __future__ import annotations

import fnmatch
import json
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..core.errors import CacheError
from ..core.version import VERSION
from .cache import read_entry, write_index
from .index import atomic_write
from .manifest import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    LOCK,
    MANIFEST,
    manifest_sha256,
    read_manifest,
    sha256_file,
)


@dataclass
class BundleInfo:
    path: Path
    entries: int
    lock: str  # sha256 of manifest.json


def export_bundle(dest: str | Path, caches: Iterable[Any], *, keys: Iterable[str] = (), classes: Iterable[str] = (),
                  backends: Iterable[str] = ()) -> BundleInfo:
    """Write the accepted entries of `caches` (filtered by key prefix, class pattern, backend) to `dest`.

    `dest` ending in .tar.gz or .tgz gives an archive; anything else a directory.
    """
    keys, classes, backends = list(keys), list(classes), list(backends)
    dest = Path(dest)
    archive = dest.name.endswith((".tar.gz", ".tgz"))
    root = Path(tempfile.mkdtemp(prefix="metal_accel_bundle_")) / "bundle" if archive else dest
    if root.exists() and any(root.iterdir()):
        raise CacheError(f"{root} exists and is not empty")
    root.mkdir(parents=True, exist_ok=True)
    chosen: dict[str, Any] = {}
    for cache in caches:
        for entry in cache.entries():
            if entry.key in chosen or entry.candidate is None or not any(v.accepted for v in entry.verdicts.values()):
                continue
            if keys and not any(entry.key.startswith(k) for k in keys):
                continue
            if classes and not any(fnmatch.fnmatch(entry.module_class, c) or
                                   fnmatch.fnmatch(entry.module_class.rsplit(".", 1)[-1], c) for c in classes):
                continue
            if backends and entry.backend not in backends:
                continue
            chosen[entry.key] = entry
    if not chosen:
        raise CacheError("no accepted entries match the selection; nothing exported")
    records, files = [], {}
    for entry in chosen.values():
        rel = f"{entry.backend}/{entry.key}.json"
        (root / entry.backend).mkdir(exist_ok=True)
        (root / rel).write_text(json.dumps(entry.to_dict(), indent=1, sort_keys=True))
        files[rel] = sha256_file(root / rel)
        records.append({"key": entry.key, "backend": entry.backend, "module_class": entry.module_class,
                        "file": rel, "verdicts": {k: {"env": v.env.to_dict(), "accepted": v.accepted,
                                                      "speedup": v.speedup} for k, v in entry.verdicts.items()}})
    write_index(root)
    files["index.json"] = sha256_file(root / "index.json")
    manifest = {"format": BUNDLE_FORMAT, "bundle_version": BUNDLE_VERSION, "metal_accel_version": VERSION,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "entries": sorted(records, key=lambda r: r["key"]), "files": files}
    atomic_write(root / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    lock = sha256_file(root / MANIFEST)
    (root / LOCK).write_text(lock + "\n")
    if archive:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(dest, "w:gz") as tar:
            tar.add(root, arcname="bundle")
        shutil.rmtree(root.parent)
        return BundleInfo(dest, len(chosen), lock)
    return BundleInfo(root, len(chosen), lock)


@dataclass
class VerifyReport:
    path: Path
    ok: list[str] = field(default_factory=list)        # entry keys that load
    problems: list[str] = field(default_factory=list)  # one line per problem
    pinned: bool | None = None   # the manifest matches the sha256 given (None: none given)
    verdicts: int = 0            # verdicts in the entries that load
    sealed: int = 0              # ...of which carry this user's own seal

    @property
    def clean(self) -> bool:
        return not self.problems and self.pinned is not False

    def trust(self) -> str:
        """One sentence: whether the bundle's verdicts are proof here or claims."""
        if self.pinned:
            return "pinned: the manifest matches the sha256 given, so its verdicts count as proof when loaded " \
                   "with load_cache(path, sha256=...)"
        if self.pinned is False:
            return "NOT the pinned bundle: its manifest differs from the sha256 given; load_cache refuses it"
        if self.verdicts and self.sealed == self.verdicts:
            return f"sealed: all {self.verdicts} verdicts were made by this user's own metal_accel"
        claims = self.verdicts - self.sealed
        return (f"only self-consistent: its files match its own manifest, which anyone can recompute; "
                f"{claims} of {self.verdicts} verdicts are claims, so those kernels are proven on this device "
                f"before their first use (pin the lock with load_cache(path, sha256=...) to vouch for them)")


def verify_bundle(root: Path, pin: str | None = None) -> VerifyReport:
    """Check every file's hash, every entry's format, sandbox and source checks; list what fails.
    With PIN (a lock from a trusted source), also whether the manifest is that one."""
    report = VerifyReport(root)
    if pin is not None:
        report.pinned = manifest_sha256(root) == pin.strip()
    try:
        manifest = read_manifest(root)
    except (CacheError, ValueError) as exc:
        report.problems.append(f"manifest: {exc}")
        return report
    if manifest is None:
        report.problems.append(f"no {MANIFEST}: not a bundle")
        return report
    listed = manifest.get("files", {})
    for rel, digest in sorted(listed.items()):
        f = root / rel
        if not f.is_file():
            report.problems.append(f"{rel}: missing")
        elif sha256_file(f) != digest:
            report.problems.append(f"{rel}: sha256 differs from the manifest (tampered or truncated)")
    for f in sorted(root.glob("*/*.json")):
        rel = f.relative_to(root).as_posix()
        if rel not in listed:
            report.problems.append(f"{rel}: not listed in the manifest (ignored when loading)")
    for rec in manifest.get("entries", []):
        rel = rec.get("file", "")
        if rel in listed and (root / rel).is_file() and sha256_file(root / rel) == listed[rel]:
            entry = read_entry(root / rel, "verify")
            if entry is None:
                report.problems.append(f"{rel}: entry does not load (bad format, version, sandbox or source check)")
            else:
                report.ok.append(rec["key"])
                report.verdicts += len(entry.verdicts)
                report.sealed += sum(1 for env_id in entry.verdicts if entry.proven(env_id))
    return report
