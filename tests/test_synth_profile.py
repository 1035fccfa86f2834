"""The candidate's profile in the speed-round message (issue 30, deliver 2): torch.profiler's CPU op table for
real, CUDA kernel rows and Metal command-buffer times through fakes (for real where the device is here),
the emulator's note, and a profile that fails leaving the round as it was. No wall-clock assertions."""
from __future__ import annotations

import itertools
import logging
import re
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from metal_accel.backends import get_backend
from metal_accel.core.provider import Evaluation
from metal_accel.core.specs import InputSpec, OutputSpec
from metal_accel.core.verdict import Verdict
from metal_accel.runtime.ops import kernel_op
from metal_accel.synth import profile as prof
from metal_accel.synth.loop import SynthesisLoop

from synth_harness import FAST, candidate, llm, request_for  # noqa: F401

_names = itertools.count()


class LinearGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x))


def host_op(module: nn.Module, x: torch.Tensor, host=None):
    """A real KernelOp (custom op, module view) whose host code is plain torch: what the profiler sees of a
    proven candidate, minus the native library."""
    def default(m, x):
        return torch.nn.functional.gelu(torch.addmm(m.fc.bias, x, m.fc.weight.t()))

    with torch.no_grad():
        out = module(x)
    n = next(_names)
    return kernel_op(f"{n:016d}" * 4, f"{n:08x}" * 8, lambda: host or default, InputSpec.of((x,), {}),
                     OutputSpec.of(out), module, x.device.type)


def test_cpu_profile_is_torch_profilers_op_table_for_both_sides():
    m, x = LinearGelu(), torch.randn(8, 16)
    text = prof.kernel_profile(m, InputSpec.of((x,), {}), host_op(m, x), "cpu")
    lines = text.splitlines()
    assert lines[0].startswith("Profile (torch.profiler, CPU self time of ops")
    yours = next(i for i, l in enumerate(lines) if l.startswith("yours: wall "))
    eager = next(i for i, l in enumerate(lines) if l.startswith("eager: wall "))
    assert yours < eager
    assert "your op (its kernel and host code)" in "\n".join(lines[yours:eager])
    assert any("aten::gelu" in l for l in lines[eager:])
    assert re.search(r"aten::\w+: 1 per call, [\d.]+ µs \(\d+%\)", text)
    assert len(text) <= prof.MAX_CHARS


def test_the_emulator_gives_no_numbers():
    m, x = LinearGelu(), torch.randn(8, 16)
    text = prof.kernel_profile(m, InputSpec.of((x,), {}), host_op(m, x), "mps-emu")
    assert text == prof.EMULATOR_NOTE and "µs" not in text


def test_a_failing_profile_is_empty_and_logged_at_debug(caplog):
    def broken(m, x):
        raise RuntimeError("kernel exploded")

    m, x = LinearGelu(), torch.randn(8, 16)
    caplog.set_level(logging.DEBUG, logger="metal_accel.synth.profile")
    assert prof.kernel_profile(m, InputSpec.of((x,), {}), host_op(m, x, broken), "cpu") == ""
    assert any("kernel exploded" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)


def test_render_is_bounded_and_names_launch_time():
    rows = [prof.Row("k" * 200 + str(i), 3, 30.0 + i) for i in range(40)]
    side = prof.Side(100.0, 25.0, rows, 3)
    text = prof.render("head", "GPU busy", side, side, 4, device_side=True)
    assert len(text) <= prof.MAX_CHARS
    assert "GPU busy 25.0 µs (75% of the wall time is launch/host time)" in text
    assert all(len(l) < 120 for l in text.splitlines())
    assert text.count("\n  ") == 8  # top 4 rows per side


def test_cuda_rows_are_the_device_events():
    cuda, cpu = object(), object()
    events = [SimpleNamespace(key="my_kernel", count=3, self_device_time_total=30.0, device_type=cuda),
              SimpleNamespace(key="Memset (Device)", count=3, self_device_time_total=3.0, device_type=cuda),
              SimpleNamespace(key="aten::mm", count=3, self_device_time_total=30.0, device_type=cpu),
              SimpleNamespace(key="idle", count=1, self_device_time_total=0.0, device_type=cuda)]
    busy, rows = prof.device_rows(events, 3, cuda)
    assert busy == pytest.approx(11.0)
    assert [r.name for r in rows] == ["my_kernel", "Memset (Device)"]


class FakeTimer:
    """The extension's gpu_time_* ops: each mark adds 2 ms of one command buffer."""

    def __init__(self) -> None:
        self.seconds, self.buffers = 0.0, 0

    def gpu_time_mark(self) -> None:
        self.seconds, self.buffers = self.seconds + 0.002, self.buffers + 1

    def gpu_time_take(self) -> list[float]:
        out, self.seconds, self.buffers = [self.seconds, float(self.buffers)], 0.0, 0
        return out


def test_mps_gpu_time_from_command_buffers(monkeypatch):
    monkeypatch.setattr(torch.mps, "synchronize", lambda: None)
    timer = FakeTimer()
    monkeypatch.setattr(prof, "mps_gpu_timer", lambda: timer)
    text = prof.profile_mps_text(lambda: None, lambda: None, 3)
    assert text.startswith("Profile (Metal command-buffer GPUStartTime/GPUEndTime")
    assert "yours: wall" in text and "GPU busy 2000.0 µs" in text and "command buffers: 1 per call" in text
    monkeypatch.setattr(prof, "mps_gpu_timer", lambda: None)
    assert "No GPU profile" in prof.profile_mps_text(lambda: None, lambda: None, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_profile_for_real():
    m, x = LinearGelu().cuda(), torch.randn(64, 16, device="cuda")
    text = prof.kernel_profile(m, InputSpec.of((x,), {}), host_op(m, x), "cuda")
    assert text.startswith("Profile (torch.profiler, CUDA kernels") and "GPU busy" in text
    assert "yours: wall" in text and "eager: wall" in text and "launch/host time" in text


@pytest.mark.skipif(not (torch.backends.mps.is_available() and prof.mps_gpu_timer() is not None),
                    reason="needs an Apple GPU and metal_accel._mps_ext with gpu_time_*")
def test_mps_profile_for_real():
    m, x = LinearGelu().to("mps"), torch.randn(64, 16, device="mps")
    text = prof.kernel_profile(m, InputSpec.of((x,), {}), host_op(m, x), "mps")
    assert "GPU busy" in text and "command buffers" in text


# ---------------------------------------------------------------- through the loop (scripted LLM server)

def evaluate_with_op(host=None):
    """GOOD: accepted at 1.25x with a real op (torch.compile at 1 µs keeps it from being the fastest)."""
    def evaluate(cand):
        env = get_backend("cpu").environment()
        req = evaluate.request
        op = host_op(req.module, torch.randn(4, 16), host)
        return Evaluation(cand, Verdict(env, True, "accepted: 1.25x eager", cand.digest, 1.25, 10.0, 8.0), op)
    return evaluate


def synth_with(llm, host=None, **settings):  # noqa: F811
    server = llm({"gpt-4o": [candidate("GOOD"), candidate("GOOD2")]})
    req = request_for(LinearGelu(), torch.randn(4, 16))
    req.compile_us = 1.0
    evaluate = evaluate_with_op(host)
    evaluate.request = req
    SynthesisLoop(["openai:gpt-4o"], FAST.with_(answer_cache=False, speed_rounds=1, **settings)).synthesize(
        req, evaluate)
    return server


def test_the_speed_round_message_holds_the_profile(llm):  # noqa: F811
    pytest.importorskip("openai")
    server = synth_with(llm, profile=True)
    told = server.requests[1].last_user()
    assert "Accepted: correct. Yours: 8.0 µs" in told
    assert "Profile (torch.profiler, CPU self time of ops" in told
    assert "yours: wall" in told and "eager: wall" in told and "aten::gelu" in told
    assert told.index("Profile (") < told.index("Make it faster")


def test_a_failing_profile_leaves_the_round(llm):  # noqa: F811
    pytest.importorskip("openai")

    def broken(m, x):
        raise RuntimeError("no")

    server = synth_with(llm, host=broken, profile=True)
    assert len(server.requests) == 2
    told = server.requests[1].last_user()
    assert "Accepted: correct. Yours: 8.0 µs" in told and "Profile (" not in told and "Make it faster" in told


def test_no_profile_when_profiling_is_off(llm):  # noqa: F811
    pytest.importorskip("openai")
    server = synth_with(llm, profile=False)
    assert "Profile (" not in server.requests[1].last_user()
