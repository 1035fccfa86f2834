"""Model names, settings from the environment, budgets and prices, credential scrubbing."""
from __future__ import annotations


import pytest

from metal_accel.synth.budget import Budget, Limits, Meter, cost_of, price_of
from metal_accel.synth.models import ModelSpec, ProviderConfigError, is_model_spec, parse_model, resolve_models
from metal_accel.candidates.providers import build_providers
from metal_accel.core.scrub import REDACTED, register_secret, scrub, scrub_exception
from metal_accel.synth.settings import SynthSettings


def test_model_names():
    assert parse_model("openai:gpt-5") == ModelSpec("openai", "gpt-5")
    assert parse_model(" anthropic:claude-opus-4-5 ") == ModelSpec("anthropic", "claude-opus-4-5")
    m = parse_model("openai-compatible:http://localhost:11434/v1#qwen2.5-coder:7b")
    assert (m.kind, m.base_url, m.model) == ("openai-compatible", "http://localhost:11434/v1", "qwen2.5-coder:7b")
    assert m.label == "openai-compatible:http://localhost:11434/v1#qwen2.5-coder:7b"
    assert is_model_spec("openai:x") and not is_model_spec("dir:/tmp")
    for bad in ("gpt-5", "google:gemini", "openai:", "openai-compatible:localhost#m", "openai-compatible:http://h/v1"):
        with pytest.raises(ProviderConfigError, match="expected"):
            parse_model(bad)


def test_labels_never_carry_credentials():
    m = parse_model("openai-compatible:https://user:sk-SECRET-pw@llm.example.com:8443/v1?api_key=SECRETX#coder")
    assert m.label == "openai-compatible:https://llm.example.com:8443/v1#coder"
    with pytest.raises(ProviderConfigError) as err:
        parse_model("openai-compatible:https://user:sk-SECRET-pw@llm.example.com/v1")
    assert "SECRET" not in str(err.value)


def test_models_from_argument_or_environment(monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_MODELS", "openai:gpt-5, anthropic:claude-x,openai:gpt-5")
    assert resolve_models(None) == [ModelSpec("openai", "gpt-5"), ModelSpec("anthropic", "claude-x")]
    assert resolve_models("openai:o3") == [ModelSpec("openai", "o3")]
    assert resolve_models(["anthropic:a", ModelSpec("openai", "b")]) == [ModelSpec("anthropic", "a"),
                                                                       ModelSpec("openai", "b")]


def test_build_providers(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-xyz")
    monkeypatch.delenv("METAL_ACCEL_MODELS", raising=False)
    (tmp_path / "cpu").mkdir()
    out = build_providers([f"dir:{tmp_path}", "openai:gpt-4o"], models=["anthropic:claude-x"])
    assert [type(p).__name__ for p in out] == ["DirectoryProvider", "SynthesisLoop"]
    assert [m.label for m in out[1].models] == ["anthropic:claude-x", "openai:gpt-4o"]  # one loop: they race
    assert build_providers([], synthesize=False, models=["openai:gpt-4o"]) == []
    assert build_providers([]) == []
    with pytest.raises(ProviderConfigError, match="no LLM is configured"):
        build_providers([], synthesize=True, strict=True)


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_SAMPLES", "3")
    monkeypatch.setenv("METAL_ACCEL_REPAIR_ROUNDS", "1")
    monkeypatch.setenv("METAL_ACCEL_MAX_COST_USD", "2.5")
    monkeypatch.setenv("METAL_ACCEL_MODULE_MAX_TOKENS", "none")
    s = SynthSettings.from_env(concurrency=7)
    assert (s.samples, s.repair_rounds, s.concurrency) == (3, 1, 7)
    assert s.run_limits.cost_usd == 2.5 and s.module_limits.tokens is None
    assert s.wants("Chain", "toymodels.Chain")
    only = s.with_(only_classes=("Model",))
    assert only.wants("Model", "p.Model") and not only.wants("Linear", "torch.nn.Linear")


def test_prices_and_costs():
    assert price_of("gpt-4o-2024-08-06") == (2.50, 10.00)
    assert price_of("gpt-4o-mini") == (0.15, 0.60)
    with pytest.raises(ProviderConfigError, match="no price known"):
        price_of("my-local-model")
    assert cost_of("gpt-4o", 1_000_000, 100_000) == pytest.approx(3.5)
    assert cost_of("my-local-model", 10**6, 0, {"my-local*": (1.0, 2.0)}) == pytest.approx(1.0)


def test_budget_caps():
    run = Meter("run", Limits(cost_usd=1.0))
    module = Meter("module", Limits(tokens=1000, wall_s=3600))
    budget = Budget(module, run)
    assert budget.exceeded() == ""
    budget.charge(600, 300, 0.25)
    assert budget.exceeded() == ""
    budget.charge(100, 0, 0.0)
    assert budget.exceeded() == "module token budget reached (1000 of 1000)"
    budget2 = Budget(Meter("module", Limits()), run)
    assert "run cost budget reached" not in budget2.exceeded()
    run.charge(0, 0, 0.80)
    assert budget2.exceeded().startswith("run cost budget reached ($1.0500 of $1")
    assert Meter("m", Limits(wall_s=0.0)).exceeded().startswith("m time budget reached")
    assert budget.remaining_s() is not None and Budget(Meter("a", Limits()), Meter("b", Limits())).remaining_s() is None


def test_scrub(monkeypatch, caplog):
    monkeypatch.setenv("SOME_SERVICE_API_KEY", "plain-looking-credential-42")
    register_secret("registered-token-value")
    text = ("key plain-looking-credential-42, registered-token-value, sk-ant-api03-abcdefgh, "
            "Authorization: Bearer abc.def.ghi123, url?api_key=zzzzzzzz&x=1")
    out = scrub(text)
    for secret in ("plain-looking-credential-42", "registered-token-value", "sk-ant-api03", "abc.def.ghi123", "zzzzzzzz"):
        assert secret not in out
    assert out.count(REDACTED) == 5
    assert scrub_exception(RuntimeError("bad key sk-test-SECRET-1")) == f"RuntimeError: bad key {REDACTED}"
