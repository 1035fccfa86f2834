"""Keeping what was paid for (issue 30, deliver 5): answers by exact request, transcripts, resumable runs,
configuration checked first. The real SDKs against the scripted local server; nothing compiles."""
from __future__ import annotations

import json

import pytest

from metal_accel.cli import synth as cli_synth
from metal_accel.cli.main import main
from metal_accel.core.keys import entry_key
from metal_accel.synth.loop import SynthesisLoop
from metal_accel.synth.memo import AnswerCache, synth_root
from metal_accel.synth.models import ProviderConfigError, parse_model

from synth_harness import FAST, SECRET, candidate, fake_evaluate, llm, request_for, run_loop  # noqa: F401
from test_synth_problems import PROBLEM

pytest.importorskip("openai")
pytest.importorskip("anthropic")


def counting(seen: list):
    def evaluate(cand):
        seen.append(cand.digest)
        return fake_evaluate(cand)
    return evaluate


def rejected_by(evaluations) -> dict[str, str]:
    """What the pipeline hands a rerun: the cache entry's rejections (digest -> reason)."""
    return {e.candidate.digest: e.verdict.reason for e in evaluations if not e.verdict.accepted}


@pytest.mark.parametrize("model", ["openai:gpt-4o", "anthropic:claude-test"])
def test_a_rerun_asks_nothing_again_and_rechecks_no_rejected_kernel(llm, model):
    name = model.split(":")[1]
    server = llm({name: [candidate("BAD1"), candidate("BAD2"), candidate("BAD3"), candidate("BAD4")]})
    seen: list[str] = []
    first = request_for()
    loop = SynthesisLoop([model], FAST)
    evaluations = loop.synthesize(first, counting(seen))
    assert len(server.requests) == 3 and len(seen) == 3 and all(not e.verdict.accepted for e in evaluations)

    # the rerun: another process, the eager time measured differently, the rejections read from the cache
    again = request_for()
    again.eager_us = 999.0
    again.rejected = rejected_by(evaluations)
    seen.clear()
    loop2 = SynthesisLoop([model], FAST)
    with pytest.raises(Exception, match="no candidate to evaluate"):
        loop2.synthesize(again, counting(seen))
    assert len(server.requests) == 3, "a request was sent again"
    assert seen == [], "a rejected kernel was checked again"
    rec = loop2.records[0]
    assert rec.replayed == 3 and rec.cost_usd == 0 and loop2.run_meter.requests == 0
    assert all(a.outcome.startswith("rejected earlier") for a in rec.attempts)
    assert "3 replayed from the answer cache" in rec.summary()

    # one more round: the three answers replay, one new request continues the same conversation
    loop3 = SynthesisLoop([model], FAST.with_(repair_rounds=3))
    loop3.synthesize(again, counting(seen))
    assert len(server.requests) == 4 and seen == [loop3.records[0].attempts[-1].digest]
    last, third = server.requests[3], server.requests[2]
    assert len(last.messages) == len(third.messages) + 2
    assert last.messages[:len(third.messages)] == third.messages  # word for word, feedback included


def test_samples_are_independent_answers_and_a_changed_parameter_asks_again(llm):
    answers = iter([candidate(f"BAD{i}") for i in range(20)])
    server = llm(lambda rec: next(answers))
    settings = FAST.with_(samples=2, repair_rounds=0)
    _, evs = run_loop(["openai:gpt-4o"], settings)
    assert len(server.requests) == 2 and len({e.candidate.digest for e in evs}) == 2  # not one answer twice
    run_loop(["openai:gpt-4o"], settings)
    assert len(server.requests) == 2
    run_loop(["openai:gpt-4o"], settings.with_(temperature=0.3))  # another request: asked
    assert len(server.requests) == 4


def test_transcripts_are_kept_beside_the_entry_without_credentials(llm, isolated_user_cache):
    llm({"gpt-4o": [candidate("BAD"), candidate("GOOD")]})
    req = request_for()
    run_loop(["openai:gpt-4o"], request=req)
    store = AnswerCache(req.backend, entry_key(req.fingerprint, req.input_spec, req.backend))
    docs = store.transcripts()
    assert [d["tag"] for d in docs] == ["openai:gpt-4o#s0r0", "openai:gpt-4o#s0r1"]
    first, second = docs
    assert first["request"]["messages"][0]["role"] == "system" and "Tiny" in first["request"]["messages"][1]["content"]
    assert "BAD" in first["answer"]["text"] and first["outcome"].startswith("rejected")
    assert "results are wrong" in first["feedback"]
    assert second["outcome"].startswith("accepted") and second["request"]["messages"][-1]["content"] == first["feedback"]
    assert (store.dir / "prompt.json").is_file()
    for f in synth_root().rglob("*"):
        if f.is_file():
            text = f.read_text()
            assert SECRET not in text and "authorization" not in text.lower() and "api_key" not in text


def test_the_answer_cache_can_be_turned_off(llm, isolated_user_cache):
    server = llm({"gpt-4o": [candidate("BAD")]})
    off = FAST.with_(answer_cache=False, repair_rounds=0)
    run_loop(["openai:gpt-4o"], off)
    run_loop(["openai:gpt-4o"], off)
    assert len(server.requests) == 2 and not synth_root().exists()


def test_a_known_rejected_kernel_in_a_new_conversation_is_not_checked_again(llm):
    server = llm({"gpt-4o": [candidate("BAD"), candidate("GOOD")]})
    req = request_for()
    bad = request_for()
    seen: list[str] = []
    _, evs = run_loop(["openai:gpt-4o"], FAST.with_(repair_rounds=0, answer_cache=False), request=bad)
    req.rejected = rejected_by(evs)
    loop = SynthesisLoop(["openai:gpt-4o"], FAST.with_(answer_cache=False))
    server.script["gpt-4o"] = [candidate("BAD"), candidate("GOOD")]
    server._served.clear()
    out = loop.synthesize(req, counting(seen))
    assert len(seen) == 1 and out[0].verdict.accepted  # only the new kernel was proven
    assert "identical to a candidate already evaluated" in server.requests[-1].last_user()


def test_configuration_is_checked_before_any_work(monkeypatch, tmp_path, capsys):
    with pytest.raises(ProviderConfigError):
        parse_model("openai-compatible:ftp://host/v1#m")
    with pytest.raises(ProviderConfigError):
        parse_model("openai-compatible:http://host:port/v1#m")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    calls = []
    monkeypatch.setattr(cli_synth, "load_problems", lambda *a, **k: calls.append(a) or [])
    # one usable model and one without a price: an error, not a run with the rest
    assert main(["synth", str(tmp_path), "--models", "openai:gpt-4o,openai:no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert main(["synth", str(tmp_path), "--models", "openai:gpt-4o,bogus:x"]) == 2
    assert "bad model name" in capsys.readouterr().err and calls == []


def test_synth_resumes_where_an_interrupted_run_stopped(llm, tmp_path, capsys, monkeypatch):
    for i in (1, 2, 3):
        (tmp_path / f"{i}_poly.py").write_text(PROBLEM.replace("16", str(i + 3)))
    server = llm({"gpt-4o": ["no code here"]})
    args = ["synth", str(tmp_path), "--models", "openai:gpt-4o", "--samples", "1", "--rounds", "0",
            "--no-profile", "--backend", "cpu", "--problems", "1"]  # one at a time: Ctrl-C on the second
    real = cli_synth.optimize
    done: list[str] = []

    def ctrl_c_on_the_second(model, *a, **k):
        if len(done) == 1:
            raise KeyboardInterrupt
        done.append(type(model).__name__)
        return real(model, *a, **k)

    monkeypatch.setattr(cli_synth, "optimize", ctrl_c_on_the_second)
    assert main(args) == 130
    assert len(server.requests) == 1
    capsys.readouterr()
    monkeypatch.setattr(cli_synth, "optimize", real)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1_poly: finished by an earlier run" in out and "# 2_poly" in out and "# 3_poly" in out
    assert len(server.requests) == 3  # problems 2 and 3 only
    assert main(args) == 0 and len(server.requests) == 3  # all finished: nothing asked
    assert main(args + ["--restart"]) == 0 and len(server.requests) == 3  # redone, every answer replayed
    assert "replayed from the answer cache" in capsys.readouterr().out
