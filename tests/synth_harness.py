"""Synthesis without proofs: the real SDKs against the scripted local server, a stand-in `evaluate`.

    loop, evaluated = run_loop(["openai:gpt-4o"], settings)   # evaluate accepts blocks whose SOURCE says GOOD

Fast (nothing compiles), so the loop's request handling is tested in the fast tier.
"""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from metal_accel.backends import get_backend
from metal_accel.core.candidate import Candidate
from metal_accel.core.keys import class_path, module_fingerprint
from metal_accel.core.provider import Evaluation, SynthesisRequest
from metal_accel.core.specs import InputSpec, OutputSpec
from metal_accel.core.verdict import Verdict
from metal_accel.synth.loop import SynthesisLoop
from metal_accel.synth.settings import SynthSettings

from llm_server import ScriptedLLM

SECRET = "sk-test-SECRET-0123456789"
FAST = SynthSettings(samples=1, repair_rounds=2, concurrency=4, request_timeout_s=60.0, sdk_max_retries=0,
                     extra_retries=0, retry_backoff_s=0.05, profile=False, references=False, progress=False,
                     prices={"claude-test": (3.0, 15.0)})


def candidate(tag: str = "GOOD", fence: str = "```python", newline: str = "\n") -> str:
    """An answer holding one block; `evaluate` below accepts it when `tag` is GOOD."""
    code = f'SOURCE = r"""\n// {tag}\nextern "C" void k() {{}}\n"""\n\ndef forward(module, x):\n    return x\n'
    return f"Here it is.\n\n{fence}\n{code}```\n".replace("\n", newline)


class Tiny(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def request_for(module: nn.Module | None = None, x: torch.Tensor | None = None) -> SynthesisRequest:
    module = module or Tiny()
    x = torch.randn(4, 8) if x is None else x
    with torch.no_grad():
        out = module(x)
    return SynthesisRequest(module, class_path(type(module)), type(module).__name__, module_fingerprint(module),
                            InputSpec.of((x,), {}), OutputSpec.of(out), "cpu", "c++", eager_us=10.0)


def fake_evaluate(cand: Candidate) -> Evaluation:
    env = get_backend("cpu").environment()
    if "GOOD" in cand.source:
        return Evaluation(cand, Verdict(env, True, "accepted: 2.00x eager", cand.digest, 2.0, 10.0, 5.0))
    return Evaluation(cand, Verdict(env, False, "incorrect: output 0 differs", cand.digest))


def run_loop(models: list[str], settings: SynthSettings = FAST, loop: SynthesisLoop | None = None,
             request: SynthesisRequest | None = None) -> tuple[SynthesisLoop, list[Evaluation]]:
    loop = loop or SynthesisLoop(models, settings)
    try:
        evaluations = loop.synthesize(request or request_for(), fake_evaluate)
    except Exception as exc:  # SynthesisError: nothing to evaluate
        loop.last_error = str(exc)  # type: ignore[attr-defined]
        evaluations = []
    return loop, evaluations


@pytest.fixture
def llm(monkeypatch, caplog):
    """Start a scripted server and point both SDKs at it with a fake key; afterwards, check that the
    key is in no log record."""
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
