"""redact(): environment values, home paths, URL credentials and environment dumps out of reasons."""
from __future__ import annotations

import pytest

from metal_accel.core.redact import redact, redact_obj
from metal_accel.core.scrub import REDACTED, scrub


@pytest.fixture
def env(monkeypatch, tmp_path):
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OPENAI_API_KEY", "plainvalue-no-shape-42")
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "hunter2hunter2")
    monkeypatch.setenv("PROJECT_DATA_DIR", "/srv/projects/alpha-data")
    monkeypatch.setenv("TOOLS_DIR", "/usr/local/share/tools")
    monkeypatch.setenv("SHORT_VAR", "abc")
    monkeypatch.setenv("DEBUG_FLAG", "123456789012345")
    return home


def test_credential_named_values_are_redacted_wherever_they_appear(env):
    out = redact("worker crashed; argv had plainvalue-no-shape-42 and hunter2hunter2 in it")
    assert "plainvalue-no-shape-42" not in out and "hunter2hunter2" not in out
    assert out.count(REDACTED) == 2


def test_long_ordinary_values_become_their_variable_name(env):
    out = redact("cannot open /srv/projects/alpha-data/weights.bin")
    assert out == "cannot open $PROJECT_DATA_DIR/weights.bin"


def test_system_paths_short_values_and_numbers_are_kept(env):
    text = "g++ in /usr/local/share/tools/bin failed: abc 123456789012345"
    assert redact(text) == text


def test_home_directory_becomes_tilde_only_at_a_path_boundary(env):
    home = str(env)
    out = redact(f"error in {home}/proj/kernel.cpp:3 and {home}; not {home}-old")
    assert out == f"error in ~/proj/kernel.cpp:3 and ~; not {home}-old"


def test_url_credentials_and_key_shapes_go_through_scrub(env):
    out = redact("GET https://bob:s3cr3t@mirror.example.com/x and key sk-ant-abcdefghijkl failed")
    assert "bob" not in out and "s3cr3t" not in out and "sk-ant" not in out
    assert "mirror.example.com/x" in out
    assert scrub("https://tok@host/") == f"https://{REDACTED}@host/"  # one implementation, shared


def test_environment_dump_values_are_redacted(env):
    dump = "crash report: USER=alice LOGNAME=alice MAIL=/var/mail/alice FOO_CONFIG=/etc/foo.conf"
    out = redact(dump)
    assert "alice" not in out and "/etc/foo.conf" not in out
    assert "USER=[redacted]" in out and "FOO_CONFIG=[redacted]" in out


def test_python_repr_of_environ_is_redacted(env):
    out = redact("environ({'SHORT_VAR': 'abc', 'LANG': 'C.UTF-8', 'WHATEVER': 'x1'})")
    assert "'abc'" not in out and "C.UTF-8" not in out and "x1" not in out


def test_a_single_pair_that_is_not_an_environment_variable_is_kept(env):
    text = "line 3: reshape(N=4) is not allowed; -DBLOCK=128"
    assert redact(text) == text
    assert redact("SHORT_VAR=abc") == f"SHORT_VAR={REDACTED}"  # a variable of this environment


def test_redact_is_idempotent_and_walks_documents(env):
    doc = {"reason": "at /srv/projects/alpha-data", "list": ["hunter2hunter2", 1.5], "n": 3,
           "t": ("plainvalue-no-shape-42",)}
    once = redact_obj(doc)
    assert once == {"reason": "at $PROJECT_DATA_DIR", "list": [REDACTED, 1.5], "n": 3, "t": (REDACTED,)}
    assert redact_obj(once) == once
    assert redact("") == ""


def test_a_variable_set_or_changed_after_a_redaction_is_redacted_too(env, monkeypatch):
    """The rules are kept between calls while the environment is unchanged, and rebuilt when it changes."""
    assert "later-secret-value-77" in redact("x later-secret-value-77")
    monkeypatch.setenv("LATER_API_TOKEN", "later-secret-value-77")
    assert "later-secret-value-77" not in redact("x later-secret-value-77")
    monkeypatch.setenv("LATER_API_TOKEN", "changed-secret-value-88")
    out = redact("x later-secret-value-77 changed-secret-value-88")
    assert "changed-secret-value-88" not in out and "later-secret-value-77" in out
