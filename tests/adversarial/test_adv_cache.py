"""Cache and bundle integrity (issue 25, deliverable 4) and reasons safe to show and send (deliverable 5).

An entry's verdict is proof only when this user's own library sealed it (attest.py) or the app
pinned the bundle it came from; an edited entry, a verdict copied from another user's cache and a
re-hashed bundle are claims, so their kernel is proven before it runs. The tampered kernels here
compute a wrong result, so the proof rejects them deterministically (no speed gate involved).
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch

import metal_accel
from metal_accel.store import attest, cache as cache_mod
from metal_accel.backends import get_backend
from metal_accel.store.bundle import export_bundle, verify_bundle
from metal_accel.store.cache import CacheEntry, Verdict
from metal_accel.core.candidate import parse_candidate
from metal_accel.cli.main import main
from metal_accel.core.errors import CacheError
from metal_accel.core.keys import class_path, class_source_sha, entry_key, module_fingerprint
from metal_accel.core.specs import InputSpec, OutputSpec
from metal_accel.core.provider import Evaluation

from harness import candidate_dir
from toymodels import GOOD, WRONG, Chain, Net

pytestmark = pytest.mark.needs_cxx


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    """This user's verdict key lives in a config directory of the test's own."""
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "config_me"))
    monkeypatch.setattr(cache_mod, "_loaded", {})


def env():
    return get_backend("cpu").environment()


def chain_call() -> tuple[Net, torch.Tensor, str, InputSpec, OutputSpec]:
    model, x = Net().eval(), torch.randn(4, 256)
    spec = InputSpec.of((x,), {})
    with torch.inference_mode():
        out = OutputSpec.of(model.chain(x))
    return model, x, entry_key(module_fingerprint(model.chain), spec, "cpu"), spec, out


def seal_as_mine(text: str, key: str, spec: InputSpec, out: OutputSpec) -> Path:
    """Write an accepted entry for TEXT into the user cache as if this user's library had proven it."""
    cand = parse_candidate(text, "cpu", "dir:test")
    entry = CacheEntry(key, "cpu", class_path(Chain), module_fingerprint(Chain()), spec, out, cand,
                       sandbox={"ok": True}, class_source_sha=class_source_sha(Chain))
    entry.verdicts[env().id] = Verdict(env(), True, "1.50x eager (test)", cand.digest, 1.5, 10.0, 6.6)
    return cache_mod.user_cache().put(entry)


def swap_kernel(doc: dict, text: str) -> None:
    """An attacker's edit: TEXT's code and source, digest recomputed, every verdict pointed at it."""
    cand = parse_candidate(text, "cpu", doc["candidate"]["origin"])
    doc["candidate"].update(code=cand.code, source=cand.source, digest=cand.digest)
    for v in doc["verdicts"].values():
        v["candidate_digest"] = cand.digest


def chain_report(model: Net) -> metal_accel.ModuleReport:
    return next(m for m in metal_accel.explain(model).modules if m.name == "chain")


def assert_proven_and_rejected(model: Net, x: torch.Tensor) -> None:
    """The tampered (wrong) kernel did not run from the cache: it was proven here and rejected."""
    metal_accel.optimize(model, (x,))
    rep = chain_report(model)
    assert rep.status == "eager" and rep.source != "cache:user", rep
    assert any("incorrect" in r for r in rep.rejected), rep.rejected


@pytest.mark.slow
def test_a_sealed_entry_of_this_user_installs_without_proof():
    """The control: the seal is what makes a verdict proof (the negative tests below can fail)."""
    model, x, key, spec, out = chain_call()
    seal_as_mine(GOOD, key, spec, out)
    assert cache_mod.user_cache().get("cpu", key).verdict_for(env()) is not None
    metal_accel.optimize(model, (x,), end_to_end=False)
    rep = chain_report(model)
    assert rep.status == "kernel" and rep.source == "cache:user", rep


@pytest.mark.slow
def test_edited_kernel_with_recomputed_digest_is_proven_not_installed():
    model, x, key, spec, out = chain_call()
    path = seal_as_mine(GOOD, key, spec, out)
    doc = json.loads(path.read_text())
    swap_kernel(doc, WRONG)
    path.write_text(json.dumps(doc))
    assert cache_mod.user_cache().get("cpu", key).verdict_for(env()) is None  # the seal no longer holds
    assert_proven_and_rejected(model, x)
    after = cache_mod.user_cache().get("cpu", key)
    assert not after.verdict_for(env()).accepted  # this user's own (sealed) rejection replaced the claim


def test_edited_source_field_alone_is_never_compiled(caplog):
    model, x, key, spec, out = chain_call()
    path = seal_as_mine(GOOD, key, spec, out)
    doc = json.loads(path.read_text())
    doc["candidate"]["source"] = parse_candidate(WRONG, "cpu").source  # code (and digest) left as they were
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="metal_accel"):
        metal_accel.optimize(model, (x,))
    assert "differs from the SOURCE literal" in caplog.text
    assert chain_report(model).status == "eager"


def test_edited_kind_or_backend_is_detected():
    _, _, key, spec, out = chain_call()
    path = seal_as_mine(GOOD, key, spec, out)
    good = path.read_text()
    for field, value in (("kind", "inductor"), ("backend", "cuda")):
        doc = json.loads(good)
        doc["candidate"][field] = value
        path.write_text(json.dumps(doc))
        assert cache_mod.user_cache().get("cpu", key) is None, field


@pytest.mark.slow
def test_verdict_copied_from_another_users_cache_is_not_trusted(tmp_path, monkeypatch):
    model, x, key, spec, out = chain_call()
    theirs = seal_as_mine(WRONG, key, spec, out)  # sealed by "them": their key claims the wrong kernel passed
    assert cache_mod.user_cache().get("cpu", key).verdict_for(env()) is not None
    mine = tmp_path / "my_user_cache"
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(mine))
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "config_other_user"))
    (mine / "cpu").mkdir(parents=True)
    (mine / "cpu" / theirs.name).write_bytes(theirs.read_bytes())
    assert cache_mod.user_cache().get("cpu", key).verdict_for(env()) is None
    assert attest.key_path().read_bytes() != (tmp_path / "config_me" / attest.KEY_NAME).read_bytes()
    assert_proven_and_rejected(model, x)


def rehash(root: Path, rel: str) -> str:
    """Recompute the bundle's manifest hash of REL and its lock, as an attacker would; the new lock."""
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    lock = hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
    (root / "bundle.lock").write_text(lock + "\n")
    return lock


@pytest.fixture
def rehashed_bundle(tmp_path, monkeypatch):
    """A bundle of a sealed GOOD entry, then edited to WRONG with every hash recomputed; the app's
    machine (fresh user cache, its own key) gets it. Returns (root, original lock, key)."""
    _, _, key, spec, out = chain_call()
    seal_as_mine(GOOD, key, spec, out)
    info = export_bundle(tmp_path / "bundle", [cache_mod.user_cache()])
    rel = f"cpu/{key}.json"
    doc = json.loads((info.path / rel).read_text())
    swap_kernel(doc, WRONG)
    (info.path / rel).write_text(json.dumps(doc, indent=1, sort_keys=True))
    assert rehash(info.path, rel) != info.lock
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "app_user_cache"))
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "config_app"))
    return info.path, info.lock, key


def test_rehashed_bundle_verifies_only_as_self_consistent(rehashed_bundle):
    root, original, _ = rehashed_bundle
    report = verify_bundle(root)
    assert report.clean and report.ok  # the hashes match its own manifest...
    assert report.trust().startswith("only self-consistent") and report.sealed == 0  # ...which proves nothing
    pinned = verify_bundle(root, pin=original)
    assert pinned.pinned is False and not pinned.clean


@pytest.mark.slow
def test_rehashed_bundle_loaded_unpinned_is_proven_before_use(rehashed_bundle):
    root, _, key = rehashed_bundle
    metal_accel.load_cache(root)
    assert cache_mod.lookup("cpu", key).verdict_for(env()) is None
    model, x, *_ = chain_call()
    assert_proven_and_rejected(model, x)


def test_rehashed_bundle_pinned_to_the_original_lock_is_refused(rehashed_bundle):
    root, original, _ = rehashed_bundle
    with pytest.raises(CacheError, match="does not match the pinned"):
        metal_accel.load_cache(root, sha256=original)


@pytest.mark.slow
def test_import_does_not_seal_a_bundles_verdicts(rehashed_bundle, capsys):
    root, _, key = rehashed_bundle
    assert main(["cache", "import", str(root)]) == 0
    assert "claims" in capsys.readouterr().out
    entry = cache_mod.user_cache().get("cpu", key)
    assert entry is not None and entry.verdicts and entry.verdict_for(env()) is None
    model, x, *_ = chain_call()
    assert_proven_and_rejected(model, x)


@pytest.mark.slow
def test_cache_clear_leaves_no_file_in_the_user_cache(tmp_path, isolated_user_cache, capsys):
    model, x, key, spec, out = chain_call()
    seal_as_mine(GOOD, key, spec, out)
    metal_accel.optimize(model, (x,))  # compiles the kernel into the build directory
    info = export_bundle(tmp_path / "b.tar.gz", [cache_mod.user_cache()])
    metal_accel.load_cache(info.path)  # unpacked under the user cache
    (isolated_user_cache / "recorded").mkdir(exist_ok=True)
    (isolated_user_cache / "recorded" / "calls.json").write_text("{}")
    assert list((isolated_user_cache / "build").rglob("*.so")) and (isolated_user_cache / "bundles").is_dir()
    assert main(["cache", "clear", "-y"]) == 0
    said = capsys.readouterr().out
    assert "1 entries" in said and "build files" in said and "1 unpacked bundles" in said, said
    assert [p for p in isolated_user_cache.rglob("*") if not p.is_dir()] == []


def test_a_broken_build_is_not_remembered_as_the_kernels_rejection(monkeypatch):
    """A shipped (or any cached) kernel that fails here because of this machine is tried again next time."""
    model, x, key, spec, out = chain_call()
    seal_as_mine(GOOD, key, spec, out)
    path = cache_mod.user_cache().path_for("cpu", key)
    doc = json.loads(path.read_text())
    doc["verdicts"] = {}  # proven elsewhere only: this machine must prove it
    path.write_text(json.dumps(doc))

    def broken_build(call, key, cand, backend, settings):
        reason = (f"compile error: the compiled kernel library {key[:8]}.so is truncated or corrupt and "
                  "rebuilding it did not help; it is not loaded")
        return Evaluation(cand, Verdict(backend.environment(), False, reason, cand.digest))
    monkeypatch.setattr("metal_accel.pipeline.prove_candidate", broken_build)
    metal_accel.optimize(model, (x,))
    assert chain_report(model).status == "eager"
    entry = cache_mod.user_cache().get("cpu", key)
    assert entry.verdicts == {} and entry.rejected == []


SECRET = "fake-openai-key-0123456789abcdef"


@pytest.fixture
def leaky_crash(tmp_path, monkeypatch):
    """Every proof fails with a crash report quoting the API key, an environment dump and a home path."""
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)

    def crash(call, key, cand, backend, settings):
        reason = (f"failed in the worker: Segmentation fault in {home}/proj/kernel.cpp; environment: "
                  f"OPENAI_API_KEY={SECRET} HOME={home} USER=alice")
        return Evaluation(cand, Verdict(backend.environment(), False, reason, cand.digest))
    monkeypatch.setattr("metal_accel.pipeline.prove_candidate", crash)
    return str(home)


def assert_clean(text: str, home: str) -> None:
    assert SECRET not in text and home not in text and "alice" not in text, text


def test_crash_reason_is_redacted_in_the_cache_and_in_explain(tmp_path, leaky_crash, isolated_user_cache):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidate_dir(tmp_path, GOOD)])
    rep = chain_report(model)
    assert rep.status == "eager" and any("Segmentation fault in ~/proj/kernel.cpp" in r for r in rep.rejected)
    files = [p for p in isolated_user_cache.rglob("*.json")]
    assert files
    for f in files:
        assert_clean(f.read_text(), leaky_crash)
    assert_clean(str(metal_accel.explain(model)), leaky_crash)
    assert_clean(json.dumps(metal_accel.explain(model).to_dict()), leaky_crash)


def test_crash_reason_is_redacted_in_the_llm_feedback(leaky_crash, monkeypatch):
    pytest.importorskip("openai")
    from llm_server import ScriptedLLM
    from metal_accel.synth.settings import SynthSettings
    settings = SynthSettings(samples=1, repair_rounds=1, concurrency=1, request_timeout_s=120.0, sdk_max_retries=0,
                             extra_retries=0, profile=False, references=False, progress=False)
    second = GOOD.replace("def forward(module, x):", "def forward(module, x):\n    n = x.shape[-1]")
    with ScriptedLLM({"gpt-4o": [f"```python\n{GOOD}```\n", f"```python\n{second}```\n"]}) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        monkeypatch.delenv("METAL_ACCEL_MODELS", raising=False)
        model = Chain().eval()
        metal_accel.optimize(model, (torch.randn(4, 256),), backend="cpu", models=["openai:gpt-4o"],
                             synth_settings=settings, progress=False)
    assert len(server.requests) == 2
    feedback = server.requests[1].last_user()
    assert "Segmentation fault" in feedback and "~/proj/kernel.cpp" in feedback
    assert_clean(feedback, leaky_crash)
