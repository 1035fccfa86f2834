"""Caches (user, loaded, env, shipped) and the command line."""
from __future__ import annotations

import json
import logging

import pytest
import torch

import metal_accel
from metal_accel.store import cache as cache_mod
from metal_accel.backends import get_backend
from metal_accel.store.cache import CacheDir, CacheEntry, Verdict
from metal_accel.core.candidate import parse_candidate
from metal_accel.cli.main import main
from metal_accel.core.errors import CacheError
from metal_accel.core.specs import InputSpec, OutputSpec

from toymodels import GOOD


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    """This user's verdict key (attest.py) in a config directory of the test's own."""
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "config"))


def make_entry(key: str = "a" * 32, code: str = GOOD) -> CacheEntry:
    x = torch.randn(2, 8)
    cand = parse_candidate(code, "cpu", "test")
    env = get_backend("cpu").environment()
    entry = CacheEntry(key=key, backend="cpu", module_class="toymodels.Chain", module_fingerprint="f" * 64,
                       input_spec=InputSpec.of((x,)), output_spec=OutputSpec.of(x), candidate=cand)
    entry.verdicts[env.id] = Verdict(env, True, "1.50x eager", cand.digest, 1.5, 3.0, 2.0)
    return entry


def test_roundtrip_and_atomic_write(tmp_path):
    c = CacheDir(tmp_path, writable=True, name="t")
    entry = make_entry()
    path = c.put(entry)
    got = c.get("cpu", "a" * 32)
    assert got is not None and got.to_dict() == entry.to_dict()
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".json"] == [path.name]  # no temp files left


def test_tampered_entry_is_skipped_with_a_warning(tmp_path, caplog):
    c = CacheDir(tmp_path, writable=True, name="t")
    path = c.put(make_entry())
    data = json.loads(path.read_text())
    data["candidate"]["code"] = data["candidate"]["code"].replace("torch.empty_like", "torch.zeros_like")
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        assert c.get("cpu", "a" * 32) is None
    assert "digest does not match" in caplog.text


def test_entry_whose_host_code_escapes_the_sandbox_is_never_loaded(tmp_path, caplog):
    c = CacheDir(tmp_path, writable=True, name="t")
    path = c.put(make_entry())
    data = json.loads(path.read_text())
    evil = data["candidate"]["code"].replace("out = torch.empty_like(x)", "out = torch.load('x')")
    data["candidate"]["code"] = evil
    data["candidate"]["digest"] = parse_candidate(evil, "cpu").digest
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        assert c.get("cpu", "a" * 32) is None
    assert "torch.load" in caplog.text


def test_the_code_checks_remember_only_code_that_passed(tmp_path, caplog):
    """A process remembers which cached code passed its checks (identical modules read one entry many times);
    code that failed is checked, and refused, at every read."""
    c = CacheDir(tmp_path, writable=True, name="t")
    path = c.put(make_entry())
    assert c.get("cpu", "a" * 32) is not None and c.get("cpu", "a" * 32) is not None
    data = json.loads(path.read_text())
    evil = data["candidate"]["code"].replace("out = torch.empty_like(x)", "out = torch.load('x')")
    data["candidate"]["code"], data["candidate"]["digest"] = evil, parse_candidate(evil, "cpu").digest
    path.write_text(json.dumps(data))
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert c.get("cpu", "a" * 32) is None
        assert "torch.load" in caplog.text


def test_truncated_and_unknown_version_entries_are_skipped(tmp_path):
    c = CacheDir(tmp_path, writable=True, name="t")
    path = c.put(make_entry())
    path.write_text(path.read_text()[:100])
    assert c.get("cpu", "a" * 32) is None
    data = make_entry().to_dict()
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    assert c.get("cpu", "a" * 32) is None


def test_read_only_cache_refuses_writes(tmp_path):
    with pytest.raises(CacheError):
        CacheDir(tmp_path, writable=False, name="ro").put(make_entry())


def test_lookup_order_user_then_loaded_then_env_then_shipped(tmp_path, monkeypatch):
    loaded, env_dir = tmp_path / "loaded", tmp_path / "env"
    CacheDir(env_dir, writable=True, name="x").put(make_entry("b" * 32))
    monkeypatch.setenv("METAL_ACCEL_CACHE_PATH", str(env_dir))
    assert cache_mod.lookup("cpu", "b" * 32).origin == f"env:{env_dir}"
    CacheDir(loaded, writable=True, name="x").put(make_entry("b" * 32))
    monkeypatch.setattr(cache_mod, "_loaded", {})
    metal_accel.load_cache(loaded)
    assert cache_mod.lookup("cpu", "b" * 32).origin == f"loaded:{loaded}"
    cache_mod.user_cache().put(make_entry("b" * 32))
    assert cache_mod.lookup("cpu", "b" * 32).origin == "user"
    with pytest.raises(CacheError):
        metal_accel.load_cache(tmp_path / "missing")


def test_doctor_reports_keys_without_values(capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-123")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "SECRET" not in out
    assert "OPENAI_API_KEY" in out and "set" in out
    assert "backend cpu" in out


def test_cache_ls_show_clear(capsys):
    cache_mod.user_cache().put(make_entry())
    assert main(["cache", "ls", "--cache", "user"]) == 0
    out = capsys.readouterr().out
    assert "aaaaaaaaaaaa" in out and "Chain" in out and "ok 1.50x" in out
    assert main(["cache", "show", "aaaa", "--source"]) == 0
    out = capsys.readouterr().out
    assert "def forward" in out and '"accepted": true' in out
    assert main(["cache", "show", "zzzz"]) == 1
    assert main(["cache", "clear", "--yes"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert not any(p.is_file() for p in cache_mod.user_cache().root.rglob("*"))
    assert cache_mod.user_cache().get("cpu", "a" * 32) is None


def test_verdict_key_is_private_and_made_once(tmp_path):
    from metal_accel.store import attest
    assert attest.user_key() == attest.user_key()
    path = attest.key_path()
    assert path.parent == tmp_path / "config" and len(path.read_bytes()) == 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert not any(p.name == attest.KEY_NAME for p in cache_mod.user_cache().root.rglob("*"))  # never in a cache


def test_a_seal_binds_entry_environment_and_content(tmp_path):
    env = get_backend("cpu").environment()
    c = CacheDir(tmp_path / "c", writable=True, name="t")
    c.put(make_entry())
    got = c.get("cpu", "a" * 32)
    assert got.verdict_for(env) is not None and got.verdicts[env.id].seal
    doc = got.to_dict()
    moved = CacheEntry.from_dict({**doc, "key": "b" * 32})  # the same sealed verdict under another entry
    assert moved.verdict_for(env) is None
    doc["verdicts"][env.id]["reason"] = "2.50x eager"
    assert CacheEntry.from_dict(doc).verdict_for(env) is None
    unsealed = make_entry().to_dict()  # written by someone else: no seal
    assert CacheEntry.from_dict(unsealed).verdict_for(env) is None


def test_ls_marks_claims(capsys, monkeypatch, tmp_path):
    cache_mod.user_cache().put(make_entry())
    assert main(["cache", "ls", "--cache", "user"]) == 0
    assert "ok 1.50x" in (out := capsys.readouterr().out) and "(claim)" not in out
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "someone_else"))
    assert main(["cache", "ls", "--cache", "user"]) == 0
    assert "ok 1.50x (claim)" in capsys.readouterr().out


def test_environment_faults_are_not_remembered_as_rejections():
    from metal_accel.store.cache import environment_fault
    assert environment_fault("compile error: the compiled kernel library ab12.so is truncated or corrupt and "
                             "rebuilding it did not help; it is not loaded")
    assert environment_fault("compile error: BackendUnavailableError: no C++ compiler found (set CXX)")
    assert not environment_fault("compile error: C++ compilation failed (g++, exit 1):\nkernel.cpp:3: error: x")
    assert not environment_fault("incorrect: output 0 differs from eager at 12 of 1024 elements")
    entry = make_entry()
    env = get_backend("cpu").environment()
    entry.verdicts[env.id] = Verdict(env, False, "compile error: cannot load compiled kernel library x.so: bad ELF",
                                     entry.candidate.digest)
    entry.rejected = [{"digest": entry.candidate.digest, "origin": "o", "reason": entry.verdicts[env.id].reason}]
    cache_mod.user_cache().put(entry)
    got = cache_mod.user_cache().get("cpu", entry.key)
    assert got.verdicts == {} and got.rejected == []


def test_sealed_verdict_reads_plain_json():
    from metal_accel.store.cache import sealed_verdict
    env = get_backend("cpu").environment()
    path = cache_mod.user_cache().put(make_entry())
    data = json.loads(path.read_text())
    assert sealed_verdict(data, env.id)
    assert not sealed_verdict({**data, "key": "b" * 32}, env.id)
    assert not sealed_verdict({**data, "output_spec": {**data["output_spec"], "single": False}}, env.id)
    data["verdicts"][env.id]["seal"] = ""
    assert not sealed_verdict(data, env.id)
    assert not sealed_verdict("garbage", env.id)
