"""Money and time: prices by exact name, an error for an unpriced model, costs reserved before a
request is sent (concurrent requests cannot pass a cap), a deadline per request, and spend recorded
whatever happens; through the real SDKs against the scripted local server."""
from __future__ import annotations

import pytest

from metal_accel.synth.budget import (Budget, Limits, Meter, UnknownPriceError, cost_of, parse_prices,
                                      price_of)
from metal_accel.synth.loop import SynthesisLoop
from metal_accel.synth.models import ProviderConfigError
from metal_accel.synth.settings import SynthSettings

from llm_server import Reply
from synth_harness import FAST, candidate, fake_evaluate, llm, request_for, run_loop  # noqa: F401 (llm: fixture)

pytest.importorskip("openai")
pytest.importorskip("anthropic")
# $1 per million output tokens, input free, 1000-token answers: each request reserves exactly $0.001
# and, answered with the server's 1000 in / 500 out, costs $0.0005
METERED = FAST.with_(prices={"gpt-4o": (0.0, 1.0)}, max_output_tokens=1000, reasoning_tokens=0)


def test_prices_by_exact_name():
    assert price_of("gpt-5") == (1.25, 10.0)
    assert price_of("gpt-5-pro") == (15.0, 120.0) and price_of("o3-pro") == (20.0, 80.0)  # not their base model's
    assert price_of("gpt-4o-2024-08-06") == (2.50, 10.00) and price_of("gpt-4o-mini") == (0.15, 0.60)
    assert price_of("claude-sonnet-4-5-20250929") == (3.0, 15.0) and price_of("claude-3-7-sonnet-latest") == (3.0, 15.0)
    for unknown in ("gpt-5-ultra", "o3-deep-research", "gpt-4o-audio-preview", "claude-test", "my-local-model"):
        with pytest.raises(UnknownPriceError, match="METAL_ACCEL_PRICES='.*=IN/OUT'"):
            price_of(unknown)
    assert price_of("gpt-5-ultra", {"gpt-5-ultra": (1.0, 2.0)}) == (1.0, 2.0)
    assert price_of("gpt-5", {"gpt-5": (9.0, 9.0)}) == (9.0, 9.0)  # the user's price first
    assert price_of("qwen3:8b", {"qwen3*": (0.1, 0.2)}) == (0.1, 0.2)
    assert price_of("qwen2.5-coder", base_url="http://localhost:11434/v1") == (0.0, 0.0)  # on this machine: free
    assert price_of("qwen2.5-coder", base_url="http://127.0.0.1:8000/v1") == (0.0, 0.0)
    with pytest.raises(UnknownPriceError):
        price_of("qwen2.5-coder", base_url="https://llm.example.com/v1")
    assert cost_of("gpt-4o", 1_000_000, 100_000) == pytest.approx(3.5)


def test_prices_from_the_environment(monkeypatch):
    assert parse_prices("a=1/2, b*=0/0") == {"a": (1.0, 2.0), "b*": (0.0, 0.0)}
    for bad in ("a=1", "a", "=1/2", "a=x/2"):
        with pytest.raises(ProviderConfigError, match="NAME=IN/OUT"):
            parse_prices(bad)
    monkeypatch.setenv("METAL_ACCEL_PRICES", "my-model=0.5/1.5")
    assert SynthSettings.from_env().prices == {"my-model": (0.5, 1.5)}


def test_unpriced_model_is_a_configuration_error_before_anything_is_sent(llm):
    server = llm({"gpt-5-ultra": [candidate("GOOD")]})
    loop = SynthesisLoop(["openai:gpt-5-ultra"], FAST)
    assert "no price known for model 'gpt-5-ultra'" in loop.configuration_error
    assert "openai:gpt-5-ultra" in loop.configuration_error
    with pytest.raises(ProviderConfigError, match="METAL_ACCEL_PRICES"):
        loop.synthesize(request_for(), fake_evaluate)
    assert server.requests == []
    loop, evaluated = run_loop(["openai:gpt-5-ultra"], FAST.with_(prices={"gpt-5-ultra": (1.0, 1.0)}))
    assert evaluated and evaluated[0].verdict.accepted


def test_a_reservation_is_held_until_settled():
    run = Meter("run", Limits(cost_usd=1.0))
    budget = Budget(Meter("module", Limits()), run)
    first, why, _ = budget.reserve(100, 0.8)
    assert first is not None and why == ""
    second, why, later = budget.reserve(100, 0.8)  # four concurrent answers: only one is admitted
    assert second is None and later and "run cost budget reached" in why and "$0.8000 reserved" in why
    budget.settle(first, 1000, 500, 0.3)
    assert run.cost_usd == pytest.approx(0.3) and run.reserved_cost == 0.0
    third, why, later = budget.reserve(100, 0.8)
    assert third is None and not later  # 0.3 spent + 0.8 > 1.0 even with nothing in flight
    assert budget.reserve(100, 0.7)[0] is not None


def test_concurrent_requests_never_pass_the_cost_cap(llm):
    # four conversations at once, answers slow enough that all four would be in flight without reservations
    server = llm({"gpt-4o": [Reply(candidate("BAD"), delay=0.3)]})
    settings = METERED.with_(samples=4, repair_rounds=5, run_limits=Limits(cost_usd=0.0025))
    loop, _ = run_loop(["openai:gpt-4o"], settings)
    meter = loop.run_meter
    assert meter.cost_usd <= 0.0025 + 1e-12 and meter.reserved_cost == pytest.approx(0.0)
    assert loop.records[0].peak_in_flight == 2  # $0.001 reserved each: two fit under $0.0025
    # the cap is used while answers settle: 0.0005 each, up to the last request whose worst case still fits
    assert len(server.requests) == meter.requests == 4 and meter.cost_usd == pytest.approx(0.002)
    assert "run cost budget reached" in loop.records[0].stop_reason


def test_a_hung_server_costs_one_request_deadline_not_attempts_times_timeout(llm):
    server = llm({"gpt-4o": [Reply(delay=600.0)]})  # held until the server stops
    settings = METERED.with_(request_timeout_s=600.0, request_deadline_s=1.0, sdk_max_retries=3, extra_retries=3)
    loop, _ = run_loop(["openai:gpt-4o"], settings)
    (attempt,) = loop.records[0].attempts
    assert "no answer within the request deadline (1 s, all attempts together)" in attempt.outcome
    assert len(server.requests) == 1
    # abandoned after the server may have done the work: charged its reservation, marked estimated
    assert attempt.cost_usd == pytest.approx(0.001) and attempt.estimated_tokens
    assert loop.run_meter.failed == 1 and loop.run_meter.cost_usd == pytest.approx(0.001)


def test_attempt_timeouts_are_retried_within_the_deadline(llm, caplog):
    server = llm({"gpt-4o": [Reply(delay=600.0), Reply(delay=600.0), candidate("GOOD")]})
    settings = METERED.with_(request_timeout_s=0.5, request_deadline_s=300.0, sdk_max_retries=0, extra_retries=2)
    loop, evaluated = run_loop(["openai:gpt-4o"], settings)
    assert evaluated and evaluated[0].verdict.accepted and len(server.requests) == 3
    assert "retry 1 of 2" in caplog.text and "retry 2 of 2" in caplog.text
    assert loop.records[0].attempts[0].retries == 2


def test_spend_is_recorded_when_the_module_runs_out_of_time(llm):
    server = llm({"gpt-4o": [Reply(delay=600.0)]})
    loop, evaluated = run_loop(["openai:gpt-4o"], METERED.with_(samples=2, module_limits=Limits(wall_s=1.0)))
    record = loop.records[0]
    assert evaluated == [] and len(server.requests) == 2
    assert [a.outcome.split(":")[0] for a in record.attempts] == ["request cancelled"] * 2
    assert record.cost_usd == pytest.approx(0.002) and loop.run_meter.cost_usd == pytest.approx(0.002)
    assert "time budget" in record.stop_reason
    assert "$0.0020" in record.summary() and "no candidate to evaluate after 2 requests" in loop.last_error


def test_refused_requests_cost_nothing_and_count_as_failed(llm):
    llm({"gpt-4o": [Reply(status=400, error="bad request")]})
    loop, _ = run_loop(["openai:gpt-4o"], METERED)
    assert loop.run_meter.failed == 1 and loop.run_meter.cost_usd == 0.0 and loop.records[0].cost_usd == 0.0
