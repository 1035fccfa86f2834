"""The in-process torch.compile candidate's first compile has a time limit (Settings.compile_timeout_s): past
it the candidate is given up, eager stays and the reason says why, without stopping the user's process."""
from __future__ import annotations

import threading

import torch
from torch import nn

from metal_accel.backends import get_backend
from metal_accel.candidates import compile as compile_mod
from metal_accel.core import config
from metal_accel.runtime.capture import capture


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


def test_slow_first_compile_is_given_up(monkeypatch):
    release, started = threading.Event(), threading.Event()

    def never_done(self, args, kwargs, state):  # a compile that runs until the test lets it go
        started.set()
        release.wait()
        return args[0] * 2 + 1
    monkeypatch.setattr(compile_mod.CompiledOp, "__call__", never_done)
    model, x = Scale().eval(), torch.randn(64)
    call = capture(model, (x,))[0]
    backend = get_backend("cpu")
    try:
        with config.using(config.current().with_(compile_timeout_s=0.05)):
            ev = compile_mod.prove_compiled(call, "k" * 16, backend, margin=0.05, budget_s=0.1)
        assert started.is_set()
        assert not ev.verdict.accepted and "ran past 0.05 s (compile_timeout_s)" in ev.verdict.reason
        assert "eager stays" in ev.verdict.reason and ev.op is None
        # while the abandoned compile runs, no other compile candidate is tried (it would wait on dynamo's lock)
        again = compile_mod.prove_compiled(call, "k" * 16, backend, margin=0.05, budget_s=0.1)
        assert not again.verdict.accepted and "still running in the background" in again.verdict.reason
    finally:
        release.set()
    for t in list(compile_mod._abandoned):
        t.join()
    assert compile_mod.still_compiling() == ""


def test_no_limit_runs_the_compile_on_the_callers_thread(monkeypatch):
    threads = []

    def record(self, args, kwargs, state):
        threads.append(threading.current_thread())
        return args[0] * 2 + 1
    monkeypatch.setattr(compile_mod.CompiledOp, "__call__", record)
    op = compile_mod.CompiledOp(Scale(), "compile_test")
    compile_mod.first_call(op, (torch.randn(4),), {}, torch.device("cpu"), 0)
    compile_mod.first_call(op, (torch.randn(4),), {}, torch.device("cpu"), 60)
    assert threads[0] is threading.current_thread() and threads[1] is not threading.current_thread()


def test_a_failing_compile_in_the_thread_is_reported(monkeypatch):
    def boom(self, args, kwargs, state):
        raise RuntimeError("inductor failed")
    monkeypatch.setattr(compile_mod.CompiledOp, "__call__", boom)
    model, x = Scale().eval(), torch.randn(64)
    ev = compile_mod.prove_compiled(capture(model, (x,))[0], "k" * 16, get_backend("cpu"), margin=0.05,
                                    budget_s=0.1)
    assert not ev.verdict.accepted and "inductor failed" in ev.verdict.reason
