"""Keys and URLs out of every log line (the HTTP stack's own included), a line per request sent and
retried, a heartbeat while waiting, configuration checked before work, exit codes and Ctrl-C."""
from __future__ import annotations

import logging

import pytest

from metal_accel.cli import synth as cli_synth
from metal_accel.cli.main import main
from metal_accel.core.scrub import scrub
from metal_accel.synth import session as session_mod
from metal_accel.synth.loop import SynthesisError, SynthesisLoop

from llm_server import Reply
from synth_harness import FAST, candidate, fake_evaluate, llm, request_for, run_loop  # noqa: F401 (llm: fixture)

pytest.importorskip("openai")
pytest.importorskip("anthropic")
PROBLEM = '''import torch
from torch import nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2

def get_inputs():
    return [torch.randn(8, 16)]

def get_init_inputs():
    return []
'''


def test_query_tokens_and_url_passwords_are_scrubbed():
    text = "GET https://bob:hunter2-pw@h.example/v1?token=abcd1234&x=1&api-key=zz99zz99&sig=QQQQ"
    out = scrub(text)
    for secret in ("hunter2-pw", "abcd1234", "zz99zz99", "QQQQ"):
        assert secret not in out, out
    assert "x=1" in out and "h.example/v1" in out


def test_base_url_credentials_never_reach_a_log_line(llm, caplog):
    server = llm({"coder": [candidate("GOOD")]})
    host = server.url.removeprefix("http://")
    model = f"openai-compatible:http://alice:PW-SECRET-1@{host}/v1?token=TOKSECRET9#coder"
    logging.getLogger("httpx2").setLevel(logging.DEBUG)
    loop, evaluated = run_loop([model])
    assert evaluated and evaluated[0].verdict.accepted and server.requests
    assert any(r.name.startswith("httpx") for r in caplog.records)  # the HTTP library did log the request
    assert "PW-SECRET-1" not in caplog.text and "TOKSECRET9" not in caplog.text
    assert "request sent" in caplog.text  # our own line per request


def test_a_heartbeat_while_waiting(llm, caplog, monkeypatch):
    monkeypatch.setattr(session_mod, "HEARTBEAT_S", 0.0)
    llm({"gpt-4o": [Reply(candidate("GOOD"), delay=2.5)]})
    run_loop(["openai:gpt-4o"])
    assert "waiting for 1 answer" in caplog.text


def test_missing_anthropic_key_is_found_before_any_work(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("ANTHROPIC_CONFIG_DIR", raising=False)
    monkeypatch.delenv("ANTHROPIC_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    loop = SynthesisLoop(["anthropic:claude-sonnet-4-5"], FAST)
    assert "ANTHROPIC_API_KEY" in loop.configuration_error
    calls = []
    monkeypatch.setattr(cli_synth, "load_problems", lambda *a, **k: calls.append(a) or [])
    assert main(["synth", str(tmp_path), "--models", "anthropic:claude-sonnet-4-5"]) == 2
    assert calls == [] and "ANTHROPIC_API_KEY" in capsys.readouterr().err  # nothing loaded, profiled or sent


def test_ctrl_c_keeps_what_was_evaluated(llm):
    llm({"gpt-4o": [candidate("GOOD"), candidate("BAD")]})
    seen = []

    def evaluate(cand):
        seen.append(cand)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return fake_evaluate(cand)

    loop = SynthesisLoop(["openai:gpt-4o"], FAST.with_(samples=2))
    evaluated = loop.synthesize(request_for(), evaluate)
    assert len(evaluated) == 1 and evaluated[0].verdict.accepted  # the first, proven before Ctrl-C, is kept
    assert loop.interrupted and "interrupted" in loop.records[0].stop_reason
    assert loop.records[0].cost_usd > 0  # its spend recorded
    with pytest.raises(SynthesisError, match="interrupted"):
        loop.synthesize(request_for(), fake_evaluate)


@pytest.mark.slow
def test_cli_exit_codes_and_spend_summary(llm, tmp_path, capsys, monkeypatch, isolated_user_cache):
    (tmp_path / "relu.py").write_text(PROBLEM)
    server = llm({"gpt-4o": [Reply(status=500)]})
    args = ["synth", str(tmp_path), "--models", "openai:gpt-4o", "--samples", "1", "--rounds", "0", "--no-profile"]
    monkeypatch.setenv("METAL_ACCEL_CONCURRENCY", "1")
    assert main(args + ["--backend", "cpu"]) == 1  # every request failed
    err = capsys.readouterr()
    assert "every LLM request failed" in err.err and "1 failed" in err.out and len(server.requests) >= 1

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_synth, "optimize", interrupted)
    assert main(args + ["--backend", "cpu"]) == 130
    err = capsys.readouterr()
    assert "interrupted" in err.err and "Traceback" not in err.err and "requests" in err.out
