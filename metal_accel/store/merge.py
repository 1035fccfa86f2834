"""Merging bundles: one bundle from several (a farm's device kinds, or bundles built on several machines).

Every source is verified first (bundle.py's rules): an entry whose file does not match its manifest, or that
does not load (format, sandbox and source checks), is left out and reported. The merged bundle is written
by `export_bundle` (a fresh manifest and lock) and verified again; a merge that does not verify raises.

Entries of one key (one module, input spec and backend) are resolved by these rules:

- same kernel (candidate digest): one entry holding the verdicts of every environment (device, OS, torch);
  two verdicts for one environment keep the rejection if either rejects (a kernel that failed its proof
  there once is not shipped as proven there), else the lower speedup (the smaller claim);
- different kernels: the one accepted in the most environments is kept; ties go to the higher geometric
  mean of its accepted speedups, then to the smaller digest (so the result does not depend on the order
  of the sources). The other kernels and their verdicts are left out, and the conflict is reported: on
  the environments only they were proven on, the kept kernel is proven on the device before its first
  use, as any kernel whose verdict is a claim there.

The rejected candidates the entries remember are pooled (by digest).
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ..core.errors import CacheError
from .bundle import BundleInfo, export_bundle, verify_bundle
from .cache import CacheDir, CacheEntry
from .manifest import unpack


@dataclass
class MergeReport:
    """What a merge did: the bundle written, the entries and environments it holds, what was left out."""

    bundle: BundleInfo | None = None
    sources: int = 0
    entries: int = 0
    environments: int = 0                                   # distinct environments with a verdict
    joined: int = 0                                         # keys whose verdicts came from several sources
    conflicts: list[str] = field(default_factory=list)      # one line per key with several kernels
    skipped: list[str] = field(default_factory=list)        # one line per source problem (not merged)

    def summary(self) -> str:
        where = f" into {self.bundle.path}" if self.bundle else ""
        return (f"merged {self.sources} bundles{where}: {self.entries} entries, {self.environments} environments, "
                f"{self.joined} joined, {len(self.conflicts)} conflicts resolved, {len(self.skipped)} problems skipped")


class _Entries:
    """The merged entries, as export_bundle reads a cache."""

    def __init__(self, entries: list[CacheEntry]) -> None:
        self._entries = entries

    def entries(self) -> Iterator[CacheEntry]:
        return iter(self._entries)


def merge_entries(entries: Iterable[CacheEntry]) -> tuple[list[CacheEntry], list[str], int]:
    """The entries of one key each, by the rules above; also the conflict lines and how many keys were joined."""
    by_key: dict[str, list[CacheEntry]] = {}
    for e in entries:
        if e.candidate is not None:
            by_key.setdefault(e.key, []).append(e)
    merged, conflicts, joined = [], [], 0
    for key in sorted(by_key):
        group = by_key[key]
        by_kernel: dict[str, CacheEntry] = {}
        for e in group:
            digest = e.candidate.digest  # type: ignore[union-attr]
            by_kernel[digest] = _join(by_kernel[digest], e) if digest in by_kernel else _copy(e)
        if len(group) > 1:
            joined += 1
        ranked = sorted(by_kernel.values(), key=_rank)
        kept = ranked[0]
        if len(ranked) > 1:
            lost = ", ".join(f"{e.candidate.digest[:12]} ({_accepted(e)} env)" for e in ranked[1:])  # type: ignore[union-attr]
            conflicts.append(f"{kept.module_class.rsplit('.', 1)[-1]} {key[:12]}: kept {kept.candidate.digest[:12]} "  # type: ignore[union-attr]
                             f"({_accepted(kept)} env), left out {lost}")
        seen = {r.get("digest") for r in kept.rejected}
        for e in group:
            for r in e.rejected:
                if r.get("digest") not in seen:
                    kept.rejected.append(dict(r))
                    seen.add(r.get("digest"))
        merged.append(kept)
    return merged, conflicts, joined


def _copy(e: CacheEntry) -> CacheEntry:
    return CacheEntry(e.key, e.backend, e.module_class, e.module_fingerprint, e.input_spec, e.output_spec,
                      e.candidate, dict(e.sandbox), dict(e.verdicts), [dict(r) for r in e.rejected],
                      e.class_source_sha, origin="merge")


def _join(a: CacheEntry, b: CacheEntry) -> CacheEntry:
    """One kernel's entry with the verdicts of both (a rejection wins in one environment, then the lower speedup)."""
    for env_id, v in b.verdicts.items():
        old = a.verdicts.get(env_id)
        if old is None or (old.accepted and not v.accepted) or \
                (old.accepted and v.accepted and (v.speedup or 0.0) < (old.speedup or 0.0)):
            a.verdicts[env_id] = v
    return a


def _accepted(e: CacheEntry) -> int:
    return sum(1 for v in e.verdicts.values() if v.accepted)


def _rank(e: CacheEntry) -> tuple[int, float, str]:
    speedups = [v.speedup for v in e.verdicts.values() if v.accepted and v.speedup and v.speedup > 0]
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else 0.0
    return (-_accepted(e), -geomean, e.candidate.digest if e.candidate else "")


def merge_bundles(sources: Iterable[str | Path], dest: str | Path) -> MergeReport:
    """Merge the bundles (directories or .tar.gz) at SOURCES into a new bundle at DEST (a directory, or a
    path ending in .tar.gz) under the rules above; raises CacheError when nothing can be merged or the
    result does not verify."""
    report = MergeReport()
    entries: list[CacheEntry] = []
    with tempfile.TemporaryDirectory(prefix="metal_accel_merge_") as tmp:
        for i, src in enumerate(sources):
            report.sources += 1
            try:
                root = unpack(src, Path(tmp) / str(i))
            except (CacheError, OSError) as exc:
                report.skipped.append(f"{src}: {exc}")
                continue
            check = verify_bundle(root)
            report.skipped += [f"{src}: {p}" for p in check.problems]
            ok = set(check.ok)
            entries += [e for e in CacheDir(root, writable=False, name=f"merge:{src}").entries() if e.key in ok]
        merged, report.conflicts, report.joined = merge_entries(entries)
        if not any(e.candidate is not None and _accepted(e) for e in merged):
            raise CacheError("no accepted entries in the bundles to merge; nothing written")
        report.bundle = export_bundle(dest, [_Entries(merged)])
    with tempfile.TemporaryDirectory(prefix="metal_accel_merge_check_") as tmp:
        check = verify_bundle(unpack(report.bundle.path, Path(tmp)))
        if not check.clean:
            raise CacheError(f"the merged bundle {report.bundle.path} does not verify: {'; '.join(check.problems)}")
    report.entries = report.bundle.entries
    report.environments = len({env for e in merged for env in e.verdicts})
    return report
