"""Merging bundles (a farm's device kinds): one kernel's verdicts are joined, conflicting kernels resolved by
the stated rule, tampered sources left out, and the merged bundle verifies (fast tier: nothing compiles)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from metal_accel.cli.main import main
from metal_accel.core.candidate import parse_candidate
from metal_accel.core.keys import class_path, class_source_sha, entry_key, module_fingerprint
from metal_accel.core.specs import InputSpec, OutputSpec
from metal_accel.core.verdict import Environment
from metal_accel.store.bundle import export_bundle, verify_bundle
from metal_accel.store.cache import CacheDir, CacheEntry, Verdict
from metal_accel.store.merge import merge_bundles

from toymodels import GOOD, SLOW, Chain, Net

M1 = Environment("mps", "Apple M1", "macOS 15", "2.13")
M2 = Environment("mps", "Apple M2", "macOS 15", "2.13")
M3 = Environment("mps", "Apple M3 Pro", "macOS 15", "2.13")


class _Cache:
    def __init__(self, entries: list[CacheEntry]) -> None:
        self._e = entries

    def entries(self):
        return iter(self._e)


def entry(code: str, verdicts: dict[Environment, tuple[bool, float | None]]) -> CacheEntry:
    """Chain's entry (CPU kernel code, stored under the environments given: the merge reads no device)."""
    model, x = Net().eval(), torch.randn(4, 256)
    spec = InputSpec.of((x,), {})
    with torch.inference_mode():
        out = OutputSpec.of(model.chain(x))
    cand = parse_candidate(code, "cpu", "dir:test")
    e = CacheEntry(entry_key(module_fingerprint(model.chain), spec, "cpu"), "cpu", class_path(Chain),
                   module_fingerprint(model.chain), spec, out, cand, sandbox={"ok": True},
                   class_source_sha=class_source_sha(Chain))
    for env, (ok, speedup) in verdicts.items():
        e.verdicts[env.id] = Verdict(env, ok, f"test {speedup}", cand.digest, speedup, 10.0, 5.0)
    e.rejected.append({"digest": f"bad-{env.device_name}", "origin": "test", "reason": "incorrect"})
    return e


def bundle_of(tmp_path: Path, name: str, e: CacheEntry) -> Path:
    return export_bundle(tmp_path / f"{name}.tar.gz", [_Cache([e])]).path


OTHER = SLOW  # another kernel for the same module


def merged_entries(path: Path) -> list[CacheEntry]:
    return list(CacheDir(path, writable=False, name="t").entries())


def test_one_kernel_from_several_kinds_keeps_every_verdict(tmp_path):
    a = bundle_of(tmp_path, "m1", entry(GOOD, {M1: (True, 1.5)}))
    b = bundle_of(tmp_path, "m2", entry(GOOD, {M2: (True, 2.0)}))
    c = bundle_of(tmp_path, "m2-again", entry(GOOD, {M2: (True, 1.8)}))
    report = merge_bundles([a, b, c], tmp_path / "all")
    assert report.entries == 1 and report.joined == 1 and not report.conflicts and not report.skipped
    assert verify_bundle(report.bundle.path).clean
    (e,) = merged_entries(report.bundle.path)
    assert {v.env.device_name: v.speedup for v in e.verdicts.values()} == {"Apple M1": 1.5, "Apple M2": 1.8}
    assert {r["digest"] for r in e.rejected} == {"bad-Apple M1", "bad-Apple M2"}


def test_a_rejection_in_one_environment_wins(tmp_path):
    a = bundle_of(tmp_path, "a", entry(GOOD, {M1: (True, 1.5), M2: (True, 1.4)}))
    b = bundle_of(tmp_path, "b", entry(GOOD, {M1: (False, None), M2: (True, 1.6)}))
    (e,) = merged_entries(merge_bundles([a, b], tmp_path / "all").bundle.path)
    assert {v.env.device_name: v.accepted for v in e.verdicts.values()} == {"Apple M1": False, "Apple M2": True}


def test_conflicting_kernels_keep_the_one_accepted_on_most_environments(tmp_path):
    assert OTHER != GOOD
    wide = entry(OTHER, {M1: (True, 1.2), M3: (True, 1.1)})
    fast = entry(GOOD, {M2: (True, 3.0)})
    sources = [bundle_of(tmp_path, "fast", fast), bundle_of(tmp_path, "wide", wide)]
    report = merge_bundles(sources, tmp_path / "all")
    (e,) = merged_entries(report.bundle.path)
    assert e.candidate.digest == wide.candidate.digest and len(e.verdicts) == 2
    assert len(report.conflicts) == 1 and "left out " + fast.candidate.digest[:12] in report.conflicts[0]
    # the order of the sources does not matter
    again = merge_bundles(list(reversed(sources)), tmp_path / "again")
    assert merged_entries(again.bundle.path)[0].candidate.digest == wide.candidate.digest


def test_a_tie_goes_to_the_faster_kernel(tmp_path):
    slow, fast = entry(OTHER, {M1: (True, 1.2)}), entry(GOOD, {M2: (True, 2.5)})
    report = merge_bundles([bundle_of(tmp_path, "s", slow), bundle_of(tmp_path, "f", fast)], tmp_path / "all")
    assert merged_entries(report.bundle.path)[0].candidate.digest == fast.candidate.digest


def test_a_tampered_source_is_left_out_and_the_command_says_so(tmp_path, capsys):
    a = export_bundle(tmp_path / "a", [_Cache([entry(GOOD, {M1: (True, 1.5)})])]).path
    b = export_bundle(tmp_path / "b", [_Cache([entry(OTHER, {M2: (True, 9.0)})])]).path
    (f,) = b.glob("cpu/*.json")
    doc = json.loads(f.read_text())
    doc["verdicts"] = {k: {**v, "speedup": 99.0} for k, v in doc["verdicts"].items()}
    f.write_text(json.dumps(doc))
    assert main(["cache", "merge", str(tmp_path / "all.tar.gz"), str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "skipped" in out and "sha256 differs" in out and "merged 2 bundles" in out
    assert main(["cache", "verify", str(tmp_path / "all.tar.gz")]) == 0
    with pytest.raises(Exception, match="nothing written"):
        merge_bundles([b], tmp_path / "none")
