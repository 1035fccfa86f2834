"""Bundles: export, verify, load with a pinned lock, import; tampering is caught; concurrent writers."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import metal_accel
from metal_accel.store import cache as cache_mod
from metal_accel.backends import get_backend
from metal_accel.store.bundle import export_bundle, verify_bundle
from metal_accel.store.cache import CacheEntry, Verdict
from metal_accel.core.candidate import parse_candidate
from metal_accel.cli.main import main
from metal_accel.core.errors import CacheError
from metal_accel.core.keys import class_path, class_source_sha, entry_key, module_fingerprint
from metal_accel.core.specs import InputSpec, OutputSpec

from test_optimize import chain_report
from toymodels import GOOD, Chain, Net
from limits import HANG_S

pytestmark = pytest.mark.needs_cxx
HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    """This user's verdict key (attest.py) in a config directory of the test's own."""
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "config"))


def proven_entry() -> None:
    """The user cache holds Chain's GOOD kernel with a verdict of this user's (sealed): no speed gate to pass."""
    model, x = Net().eval(), torch.randn(4, 256)
    spec = InputSpec.of((x,), {})
    with torch.inference_mode():
        out = OutputSpec.of(model.chain(x))
    cand = parse_candidate(GOOD, "cpu", "dir:test")
    env = get_backend("cpu").environment()
    entry = CacheEntry(entry_key(module_fingerprint(model.chain), spec, "cpu"), "cpu", class_path(Chain),
                       module_fingerprint(model.chain), spec, out, cand, sandbox={"ok": True},
                       class_source_sha=class_source_sha(Chain))
    entry.verdicts[env.id] = Verdict(env, True, "2.00x eager (test)", cand.digest, 2.0, 10.0, 5.0)
    cache_mod.user_cache().put(entry)


@pytest.fixture
def bundle(tmp_path, isolated_user_cache, monkeypatch):
    proven_entry()
    info = export_bundle(tmp_path / "bundle", [cache_mod.user_cache()])
    # a fresh user cache: the app's machine has only the bundle
    fresh = tmp_path / "fresh_user_cache"
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(fresh))
    monkeypatch.setattr(cache_mod, "_loaded", {})
    return info


def test_export_writes_manifest_lock_and_index(bundle):
    root = bundle.path
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["format"] == "metal_accel-bundle" and manifest["metal_accel_version"] == metal_accel.__version__
    assert len(manifest["entries"]) == bundle.entries == 1
    assert (root / "bundle.lock").read_text().strip() == bundle.lock
    assert set(manifest["files"]) == {"index.json", manifest["entries"][0]["file"]}
    assert verify_bundle(root).clean


def test_app_loads_pinned_bundle_and_runs_its_kernel(bundle):
    metal_accel.load_cache(bundle.path, sha256=bundle.lock)
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,))
    rep = chain_report(model)
    assert rep.status == "kernel" and rep.source.startswith("cache:loaded:")


def test_wrong_lock_is_refused(bundle):
    with pytest.raises(CacheError, match="does not match the pinned"):
        metal_accel.load_cache(bundle.path, sha256="0" * 64)


@pytest.mark.slow
def test_unpinned_bundle_of_another_user_is_proven_here_before_it_runs(bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "config_of_the_app_user"))
    metal_accel.load_cache(bundle.path)
    assert verify_bundle(bundle.path).trust().startswith("only self-consistent")
    model = Net().eval()
    metal_accel.optimize(model, (torch.randn(4, 256),))
    rep = chain_report(model)
    # proven here: accepted ("re-validated here") or rejected by this machine's speed gate; never a bare install
    assert rep.status == "eager" or rep.source.endswith("(re-validated here)"), rep


def test_tampered_entry_is_skipped_and_reported(bundle, caplog):
    entry_file = next(bundle.path.glob("cpu/*.json"))
    entry_file.write_text(entry_file.read_text().replace("0.25f", "0.26f"))  # a different kernel, same digest field
    report = verify_bundle(bundle.path)
    assert not report.clean and any("sha256 differs" in p for p in report.problems)
    metal_accel.load_cache(bundle.path)
    model = Net().eval()
    with caplog.at_level(logging.WARNING):
        metal_accel.optimize(model, (torch.randn(4, 256),))
    assert chain_report(model).status == "eager"
    assert "not in the bundle manifest or its sha256 differs" in caplog.text


def test_truncated_and_unlisted_entries(bundle):
    entry_file = next(bundle.path.glob("cpu/*.json"))
    (bundle.path / "cpu" / ("f" * 32 + ".json")).write_text(entry_file.read_text())
    entry_file.write_text(entry_file.read_text()[:200])
    problems = verify_bundle(bundle.path).problems
    assert any("not listed in the manifest" in p for p in problems)
    assert any("sha256 differs" in p for p in problems)


def test_unknown_bundle_version_is_refused(bundle):
    manifest = bundle.path / "manifest.json"
    data = json.loads(manifest.read_text())
    data["bundle_version"] = 99
    manifest.write_text(json.dumps(data))
    with pytest.raises(CacheError, match="known version"):
        metal_accel.load_cache(bundle.path)
    assert not verify_bundle(bundle.path).clean


def test_archive_round_trip_and_cli(bundle, tmp_path, capsys):
    # export the (already exported) entries again, through the CLI, as an archive
    metal_accel.load_cache(bundle.path)
    archive = tmp_path / "kernels.tar.gz"
    assert main(["cache", "export", str(archive), "--all-caches", "--class", "Chain"]) == 0
    lock = capsys.readouterr().out.strip().splitlines()[-1].split()[-1]
    assert main(["cache", "verify", str(archive)]) == 0
    out = capsys.readouterr().out
    assert "1 entries load; 0 problems" in out and "trust: sealed: all 1 verdicts" in out  # exported by this user
    assert main(["cache", "verify", str(archive), "--sha256", lock]) == 0
    assert "trust: pinned" in capsys.readouterr().out
    assert main(["cache", "verify", str(archive), "--sha256", "0" * 64]) == 1
    assert "NOT the pinned bundle" in capsys.readouterr().out
    assert main(["cache", "import", str(archive)]) == 0
    assert len(list(cache_mod.user_cache().entries("cpu"))) == 1
    cache_mod._loaded.clear()
    root = metal_accel.load_cache(archive, sha256=lock)
    assert (root / "manifest.json").is_file()


def test_export_with_nothing_selected_is_an_error(bundle, tmp_path):
    with pytest.raises(CacheError, match="nothing exported"):
        export_bundle(tmp_path / "empty", [cache_mod.user_cache()])


WRITER = """
import sys, torch
sys.path.insert(0, {here!r})
import metal_accel
from test_optimize import candidates
from toymodels import Net
from pathlib import Path
n = int(sys.argv[1])
m = Net().eval()
metal_accel.optimize(m, (torch.randn(1 + n % 4, 256),), providers=[candidates(Path(sys.argv[2]), good=sys.argv[3])],
                     bench_budget_s=0.2, progress=False)
print([r.status for r in metal_accel.explain(m).modules if r.name == "chain"][0])
"""


@pytest.mark.slow
def test_eight_processes_write_one_cache_without_loss(tmp_path, isolated_user_cache):
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(isolated_user_cache)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER.format(here=str(HERE)), str(i), str(tmp_path / f"c{i}"),
                               GOOD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    outs = [p.communicate(timeout=HANG_S) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    entries = list(cache_mod.user_cache().entries("cpu"))  # every file parses, or it would be skipped
    files = list((isolated_user_cache / "cpu").glob("*.json"))
    assert len(entries) == len(files)
    chain_entries = [e for e in entries if e.module_class.endswith("Chain")]
    assert sorted(e.input_spec.args[0].shape[0] for e in chain_entries) == [1, 2, 3, 4]  # 4 shapes, 8 writers
    index = json.loads((isolated_user_cache / "index.json").read_text())
    assert set(index["entries"]) == {e.key for e in entries}
    assert not list(isolated_user_cache.glob("cpu/.tmp-*"))
