"""Speed rounds (issue 30, deliver 2): after a correct kernel the conversation goes on while it is not the
fastest of eager, torch.compile and the other candidates, telling the model where it stands."""
from __future__ import annotations

import re

import pytest

from metal_accel.backends import get_backend
from metal_accel.core.provider import Evaluation
from metal_accel.core.verdict import Verdict
from metal_accel.synth.loop import SynthesisLoop
from metal_accel.synth.settings import SynthSettings

from synth_harness import FAST, candidate, llm, request_for  # noqa: F401

pytest.importorskip("openai")
EAGER_US = 10.0
QUICK = FAST.with_(answer_cache=False)


def timed_evaluate(cand):
    """GOOD<us>: correct, `us` µs per call against eager's 10; anything else: wrong."""
    env = get_backend("cpu").environment()
    m = re.search(r"GOOD([\d.]+)", cand.source)
    if not m:
        return Evaluation(cand, Verdict(env, False, "incorrect: output 0 differs", cand.digest))
    us = float(m.group(1))
    return Evaluation(cand, Verdict(env, True, f"accepted: {EAGER_US / us:.2f}x eager", cand.digest,
                                    EAGER_US / us, EAGER_US, us))


def synth(settings: SynthSettings, compile_us: float | None):
    req = request_for()
    req.compile_us = compile_us
    loop = SynthesisLoop(["openai:gpt-4o"], settings)
    return loop, loop.synthesize(req, timed_evaluate)


def test_a_kernel_that_loses_to_torch_compile_gets_speed_rounds(llm):
    server = llm({"gpt-4o": [candidate("GOOD8"), candidate("GOOD4"), candidate("GOOD2")]})
    loop, evs = synth(QUICK, compile_us=6.0)
    assert len(server.requests) == 2  # the second kernel beats torch.compile: the fastest, so it stops there
    told = server.requests[1].last_user()
    assert "8.0 µs" in told and "1.25x eager" in told and "torch.compile: 6.0 µs" in told
    assert "slower" in told and "loses to torch.compile" in told
    assert [e.verdict.kernel_us for e in evs] == [8.0, 4.0]
    assert loop.records[0].best_speedup == 2.5


def test_speed_rounds_are_capped_by_the_setting(llm):
    server = llm({"gpt-4o": [candidate("GOOD8"), candidate("GOOD7.5"), candidate("GOOD7"), candidate("GOOD6.5")]})
    synth(QUICK.with_(speed_rounds=2), compile_us=1.0)
    assert len(server.requests) == 3
    assert "1 more answer for speed" in server.requests[2].last_user()
    server2 = llm({"gpt-4o": [candidate("GOOD8"), candidate("GOOD7.5")]})
    synth(QUICK.with_(speed_rounds=0), compile_us=1.0)
    assert len(server2.requests) == 1


def test_no_speed_round_for_the_fastest(llm):
    server = llm({"gpt-4o": [candidate("GOOD8"), candidate("GOOD4")]})
    synth(QUICK, compile_us=20.0)  # faster than eager and torch.compile, the only candidate
    assert len(server.requests) == 1
    server2 = llm({"gpt-4o": [candidate("GOOD8"), candidate("GOOD4")]})
    synth(QUICK, compile_us=None)  # torch.compile not measured: eager and the other candidates only
    assert len(server2.requests) == 1


def test_speed_rounds_come_after_repairs(llm):
    server = llm({"gpt-4o": [candidate("BAD"), candidate("GOOD8"), candidate("GOOD7"), candidate("GOOD6")]})
    synth(QUICK.with_(repair_rounds=1, speed_rounds=1), compile_us=1.0)
    assert len(server.requests) == 3  # a repair, then one speed round beyond the repair rounds
