"""Synthesis end to end through the real OpenAI and Anthropic SDKs, against scripted local servers."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.store import cache as cache_mod
from metal_accel.synth.budget import Limits
from metal_accel.synth.loop import SynthesisLoop
from metal_accel.synth.models import ProviderConfigError
from metal_accel.synth.settings import SynthSettings

from llm_server import Reply, ScriptedLLM
from toymodels import GOOD, NO_COMPILE, SLOW, WRONG, Chain
from limits import HANG_S

# slow: synthesis end to end: each test compiles and proves LLM answers
pytestmark = [pytest.mark.slow, pytest.mark.needs_cxx]
pytest.importorskip("openai")
pytest.importorskip("anthropic")
SECRET = "sk-test-SECRET-0123456789"
QUICK = SynthSettings(samples=1, repair_rounds=2, speed_rounds=0, concurrency=4, request_timeout_s=120.0, sdk_max_retries=1,
                      extra_retries=0, retry_backoff_s=0.05, profile=False, references=False, progress=False,
                      prices={"claude-test": (3.0, 15.0)})


def fence(code: str) -> str:
    return f"Here is a fused kernel.\n\n```python\n{code}```\n"


class Poly(nn.Module):
    """Sixteen dependent multiply-adds: eager pays 32 dispatches, one fused kernel wins big."""

    def __init__(self) -> None:
        super().__init__()
        self.a = 1.01
        self.b = 0.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(16):
            y = y * self.a + self.b
        return y


def poly_candidate(spin: int = 0) -> str:
    """A correct Poly kernel; `spin` adds a busy loop so that it is slower (but still faster than eager)."""
    extra = f"  for (volatile int s = 0; s < {spin}; ++s) {{}}\n" if spin else ""
    return ('SOURCE = r"""\n#include <cstdint>\n'
            'extern "C" void poly(const float* x, float* out, int64_t n, float a, float b) {\n' + extra +
            "  #pragma omp simd\n"
            "  for (int64_t i = 0; i < n; ++i) { float y = x[i]; for (int k = 0; k < 16; ++k) y = y * a + b; out[i] = y; }\n"
            '}\n"""\n\n'
            "def forward(module, x):\n    out = torch.empty_like(x)\n"
            "    lib.poly(x.contiguous(), out, x.numel(), float(module.a), float(module.b))\n    return out\n")


@pytest.fixture
def llm(monkeypatch, caplog, isolated_user_cache):
    """Start a scripted server and point both SDKs at it with a fake key; afterwards, check that the
    key is in no log record and no cache file."""
    caplog.set_level(logging.DEBUG)
    servers: list[ScriptedLLM] = []

    def start(script) -> ScriptedLLM:
        server = ScriptedLLM(script).__enter__()
        servers.append(server)
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        monkeypatch.setenv("METAL_ACCEL_COMPATIBLE_API_KEY", SECRET)
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.delenv("METAL_ACCEL_MODELS", raising=False)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)
    assert SECRET not in caplog.text
    for f in isolated_user_cache.rglob("*"):
        if f.is_file():
            assert b"SECRET" not in f.read_bytes(), f


def synth(model: nn.Module, models: list[str], settings: SynthSettings = QUICK, x: torch.Tensor | None = None,
          **kw) -> metal_accel.ModuleReport:
    x = torch.randn(4, 256) if x is None else x
    metal_accel.optimize(model, (x,), backend="cpu", models=models, synth_settings=settings, bench_budget_s=0.3,
                         progress=False, **kw)
    return metal_accel.explain(model).modules[0]


def assert_no_secret(caplog, cache_dir: Path, model: nn.Module) -> None:
    assert SECRET not in caplog.text
    assert "SECRET" not in json.dumps(metal_accel.explain(model).to_dict())
    for f in cache_dir.rglob("*"):
        if f.is_file():
            assert b"SECRET" not in f.read_bytes(), f


def provenance(rep: metal_accel.ModuleReport) -> dict:
    entry = cache_mod.user_cache().get("cpu", rep.key)
    assert entry is not None and entry.candidate is not None
    return next(iter(entry.verdicts.values())).details["provenance"]


def test_correct_candidate_is_installed_with_provenance(llm, caplog, isolated_user_cache):
    server = llm({"gpt-4o": [fence(GOOD)]})
    model = Chain().eval()
    rep = synth(model, ["openai:gpt-4o"])
    assert rep.status == "kernel", rep
    assert rep.source == "openai:gpt-4o#s0r0"
    assert len(server.requests) == 1
    req = server.requests[0]
    assert req.headers["authorization"] == f"Bearer {SECRET}"  # the SDK sent the key from the environment
    assert "toymodels.Chain" in req.last_user() and "float32[4,256]" in req.last_user()
    prov = provenance(rep)
    assert (prov["model"], prov["sample"], prov["round"]) == ("openai:gpt-4o", 0, 0)
    assert (prov["tokens_in"], prov["tokens_out"]) == (1000, 500)
    assert prov["cost_usd"] == pytest.approx(1000 * 2.5e-6 + 500 * 10e-6)
    assert prov["module"]["evaluations"] == 1 and prov["module"]["models"] == ["openai:gpt-4o"]
    assert_no_secret(caplog, isolated_user_cache, model)


def test_compile_error_then_fix_feeds_the_compiler_error_back(llm, caplog, isolated_user_cache):
    server = llm({"claude-test": [fence(NO_COMPILE), fence(GOOD)]})
    model = Chain().eval()
    rep = synth(model, ["anthropic:claude-test"])
    assert rep.status == "kernel" and rep.source == "anthropic:claude-test#s0r1"
    assert len(server.requests) == 2
    second = server.requests[1]
    assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
    assert second.messages[1]["content"] == fence(NO_COMPILE)
    feedback = second.last_user()
    assert "did not compile" in feedback and "flot" in feedback
    assert "## Answer format" in second.system and "ma_vecmath.h" in second.system
    assert provenance(rep)["round"] == 1
    assert any("compile error" in r for r in rep.rejected)
    assert_no_secret(caplog, isolated_user_cache, model)


def test_wrong_result_then_fix_on_an_openai_compatible_server(llm, caplog, isolated_user_cache):
    server = llm({"qwen-coder": [fence(WRONG), fence(GOOD)]})
    model = Chain().eval()
    rep = synth(model, [f"openai-compatible:{server.url}/v1#qwen-coder"])
    assert rep.status == "kernel" and rep.source.endswith("#qwen-coder#s0r1")
    feedback = server.requests[1].last_user()
    assert "results are wrong" in feedback and "max abs err" in feedback and "normal inputs" in feedback
    assert server.requests[0].body["max_tokens"] == QUICK.max_output_tokens
    assert_no_secret(caplog, isolated_user_cache, model)


def test_slower_candidate_gets_timing_feedback_and_stays_eager(llm, caplog, isolated_user_cache):
    server = llm({"gpt-4o": [fence(SLOW)]})
    model = Chain().eval()
    rep = synth(model, ["openai:gpt-4o"])
    assert rep.status == "eager" and "not faster" in rep.reason
    assert len(server.requests) == 3  # first answer + 2 repair rounds
    feedback = server.requests[1].last_user()
    assert "not fast enough" in feedback and "Eager:" in feedback and "µs" in feedback
    assert "No candidate has been accepted yet" in feedback
    assert "identical to a candidate already evaluated" in server.requests[2].last_user()
    assert len(rep.rejected) == 1  # the repeated answer was evaluated once
    assert_no_secret(caplog, isolated_user_cache, model)


def test_unparseable_answer_counts_as_an_attempt_with_feedback(llm, caplog, isolated_user_cache):
    server = llm({"gpt-4o": ["Sorry, I cannot write kernels today.", fence(GOOD)]})
    model = Chain().eval()
    rep = synth(model, ["openai:gpt-4o"])
    assert rep.status == "kernel" and rep.source == "openai:gpt-4o#s0r1"
    assert "no ```python block defining SOURCE and forward" in server.requests[1].last_user()
    assert_no_secret(caplog, isolated_user_cache, model)


def test_only_unparseable_answers_give_a_reason(llm, caplog, isolated_user_cache):
    server = llm({"gpt-4o": ["no code here"]})
    model = Chain().eval()
    rep = synth(model, ["openai:gpt-4o"])
    assert rep.status == "eager" and "no candidate to evaluate after 3 requests" in rep.reason
    assert "malformed answer" in rep.reason
    assert len(server.requests) == 3


@pytest.mark.parametrize("model", ["openai:gpt-4o", "anthropic:claude-test"])
def test_rate_limit_with_retry_after_then_success(llm, caplog, isolated_user_cache, model):
    name = model.split(":")[1]
    server = llm({name: [Reply(status=429, headers={"retry-after": "0.5"}, error="slow down"), fence(GOOD)]})
    chain = Chain().eval()
    rep = synth(chain, [model])
    assert rep.status == "kernel" and rep.source == f"{model}#s0r0"
    assert len(server.requests) == 2
    assert server.requests[1].t - server.requests[0].t >= 0.45  # the SDK honoured retry-after
    assert_no_secret(caplog, isolated_user_cache, chain)


def test_server_errors_are_retried_by_the_sdk_then_by_us(llm, caplog, isolated_user_cache):
    # the SDK retries once (sdk_max_retries=1), then our own bounded retry takes over
    server = llm({"gpt-4o": [Reply(status=503), Reply(status=500), Reply(status=502), fence(GOOD)]})
    rep = synth(Chain().eval(), ["openai:gpt-4o"], QUICK.with_(extra_retries=1))
    assert rep.status == "kernel" and len(server.requests) == 4
    assert "retry 1" in caplog.text


def test_timeout_is_retried_and_a_hanging_model_is_reported(llm, caplog, isolated_user_cache):
    # a hanging reply is held until the server stops; a prompt one must come within the (short) timeout even on
    # a busy machine
    server = llm({"claude-test": [Reply(fence(GOOD), delay=600.0), fence(GOOD)], "gpt-4o": [Reply(delay=600.0)]})
    settings = QUICK.with_(request_timeout_s=3.0)
    model = Chain().eval()
    rep = synth(model, ["anthropic:claude-test"], settings)
    assert rep.status == "kernel" and len(server.requests) == 2
    hanging = Chain().eval()  # another input shape: another cache key
    rep = synth(hanging, ["openai:gpt-4o"], settings.with_(sdk_max_retries=0), x=torch.randn(3, 256))
    assert rep.status == "eager" and "request failed" in rep.reason and "Timeout" in rep.reason, rep.reason
    assert len(server.for_model("gpt-4o")) == 1


def test_two_models_race_and_the_faster_kernel_wins(llm, caplog, isolated_user_cache):
    # gpt-4o answers at once with a slower kernel; claude answers later with the faster one
    server = llm({"gpt-4o": [fence(poly_candidate(spin=15000))],
                  "claude-test": [Reply(fence(poly_candidate()), delay=0.4)]})
    model = Poly().eval()
    loop = SynthesisLoop(["openai:gpt-4o", "anthropic:claude-test"], QUICK)
    metal_accel.optimize(model, (torch.randn(4, 256),), backend="cpu", providers=[loop], bench_budget_s=0.3,
                         progress=False)
    rep = metal_accel.explain(model).modules[0]
    record = loop.records[0]
    assert record.accepted == 2, record.attempts
    assert rep.status == "kernel" and rep.source == "anthropic:claude-test#s0r0"
    assert len(server.requests) == 2  # both accepted at once: no repair rounds
    assert record.peak_in_flight == 2
    speeds = {a.model: float(a.outcome.split("accepted: ")[1].split("x")[0]) for a in record.attempts}
    assert speeds["anthropic:claude-test"] > speeds["openai:gpt-4o"]
    assert_no_secret(caplog, isolated_user_cache, model)


def test_token_budget_stops_the_module(llm, caplog, isolated_user_cache):
    server = llm({"gpt-4o": [fence(WRONG)]})  # each answer: 1000 + 500 tokens
    settings = QUICK.with_(repair_rounds=5, max_output_tokens=1000)
    metal_accel.optimize(Chain().eval(), (torch.randn(4, 256),), backend="cpu", models=["openai:gpt-4o"],
                         synth_settings=settings, bench_budget_s=0.3, progress=False)
    assert len(server.requests) == 6
    # a request reserves its text at 3 characters a token and its 1000 output tokens before it is sent:
    # a cap that fits the first request's worst case and its real 1500 tokens cannot fit the longer second
    first = server.requests[0]
    worst = -(-(len(first.system) + len(first.last_user())) // 3) + 1000
    loop = SynthesisLoop(["openai:gpt-4o"], settings.with_(module_limits=Limits(tokens=worst + 1500 + 100)))
    metal_accel.optimize(Chain().eval(), (torch.randn(3, 256),), backend="cpu", providers=[loop],
                         bench_budget_s=0.3, progress=False)
    assert len(server.requests) == 6 + 1
    assert "module token budget reached" in loop.records[0].stop_reason
    assert loop.run_meter.tokens <= worst + 1600
    assert "token budget" in caplog.text


def test_time_budget_stops_a_module_waiting_for_answers(llm, caplog, isolated_user_cache):
    server = llm({"gpt-4o": [Reply(fence(GOOD), delay=600.0)]})  # held until the server stops
    loop = SynthesisLoop(["openai:gpt-4o"], QUICK.with_(samples=2, module_limits=Limits(wall_s=3.0)))
    model = Chain().eval()
    metal_accel.optimize(model, (torch.randn(4, 256),), backend="cpu", providers=[loop], progress=False)
    record = loop.records[0]
    assert record.wall_s < 300 and len(server.requests) == 2  # stopped at its budget, not at an answer
    assert "time budget" in (record.stop_reason + " ".join(a.outcome for a in record.attempts))
    assert metal_accel.explain(model).modules[0].status == "eager"


class TwoChains(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Chain(256)
        self.b = Chain(128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x[:, :128].contiguous())], -1)


def test_run_cost_budget_stops_later_modules(llm, caplog, isolated_user_cache):
    server = llm({"gpt-4o": [fence(WRONG)]})  # $0.0005 per answer at $1 per million output tokens
    settings = QUICK.with_(only_classes=("Chain",), repair_rounds=0, max_output_tokens=1000,
                           prices={"gpt-4o": (0.0, 1.0)}, run_limits=Limits(cost_usd=0.0014))
    model = TwoChains().eval()
    metal_accel.optimize(model, (torch.randn(4, 256),), backend="cpu", models=["openai:gpt-4o"],
                         synth_settings=settings, bench_budget_s=0.3, progress=False)
    assert len(server.requests) == 1  # $0.001 reserved for the second: 0.0005 + 0.001 > 0.0014
    reasons = " ".join(m.reason for m in metal_accel.explain(model).modules)
    assert "run cost budget reached" in reasons, reasons


def test_rejected_credentials_are_reported_without_the_key(llm, caplog, isolated_user_cache):
    server = llm({"gpt-4o": [Reply(status=401, error=f"Incorrect API key provided: {SECRET}")]})
    model = Chain().eval()
    rep = synth(model, ["openai:gpt-4o"])
    assert rep.status == "eager" and "AuthenticationError" in rep.reason and "[redacted]" in rep.reason
    assert len(server.requests) == 1  # not retried: the model is unusable
    assert_no_secret(caplog, isolated_user_cache, model)


def test_no_model_configured_gives_a_clear_reason(monkeypatch, caplog):
    monkeypatch.delenv("METAL_ACCEL_MODELS", raising=False)
    model = Chain().eval()
    rep = synth(model, [], synthesize=True)
    assert rep.status == "eager" and "no LLM is configured" in rep.reason and "METAL_ACCEL_MODELS" in rep.reason
    with pytest.raises(ProviderConfigError, match="no LLM is configured"):
        metal_accel.optimize(Chain().eval(), (torch.randn(4, 256),), backend="cpu", synthesize=True, strict=True,
                             progress=False)


def test_missing_key_gives_a_clear_reason(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    monkeypatch.setenv("METAL_ACCEL_MODELS", "openai:gpt-4o")
    model = Chain().eval()
    rep = synth(model, [], synthesize=True)
    assert rep.status == "eager" and "OPENAI_API_KEY" in rep.reason, rep.reason


def test_cli_synth_recorded_runs_the_llm_on_recorded_calls(llm, capsys, isolated_user_cache):
    import os
    import subprocess
    import sys
    from metal_accel.cli.main import main
    here = Path(__file__).parent
    server = llm({"gpt-4o": [fence(GOOD)]})
    assert main(["synth", "--recorded", "--models", "openai:gpt-4o"]) == 1  # nothing recorded yet
    script = (f"import sys, torch\nsys.path.insert(0, {str(here)!r})\nimport metal_accel\n"
              "from toymodels import Chain\nm = Chain().eval()\n"
              "with torch.inference_mode():\n    m(torch.randn(4, 256))\n")
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(isolated_user_cache), "METAL_ACCEL_RECORD": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    capsys.readouterr()
    assert main(["synth", "--recorded", "--top", "1", "--models", "openai:gpt-4o"]) == 0
    printed = capsys.readouterr().out
    assert "toymodels.Chain float32[4,256]" in printed and "kernel" in printed
    assert len(server.requests) >= 1
