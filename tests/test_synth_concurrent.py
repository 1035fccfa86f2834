"""Problems synthesized at once: their LLM requests overlap, their evaluations never do, budgets hold
over all of them, and Ctrl-C stops them all (fast tier: nothing compiles)."""
from __future__ import annotations

import threading
import time

import pytest
from torch import nn

from metal_accel.cli import synth as cli_synth
from metal_accel.cli.main import main
from metal_accel.synth.budget import Limits
from metal_accel.synth.lanes import DeviceLane, lane_for
from metal_accel.synth.loop import SynthesisLoop

from llm_server import Recorded, Reply
from synth_harness import FAST, candidate, fake_evaluate, llm, request_for  # noqa: F401
from test_synth_problems import PROBLEM

pytest.importorskip("openai")


class Double(nn.Module):
    def forward(self, x):
        return x * 2


class Triple(nn.Module):
    def forward(self, x):
        return x * 3


def meeting(parties: int, answer: str, timeout: float = 20.0):
    """A script whose first `parties` requests are answered only once all of them have arrived (with an
    error if they never are all in flight at once); later requests at once."""
    barrier = threading.Barrier(parties, timeout=timeout)
    met: list[bool] = []

    def script(rec: Recorded) -> Reply:
        if len(met) < parties:
            try:
                barrier.wait()
                met.append(True)
            except threading.BrokenBarrierError:
                return Reply(status=400, error="requests were not in flight at once")
        return Reply(answer)

    script.met = met  # type: ignore[attr-defined]
    return script


class Watch:
    """An evaluate that notes how many evaluations run at once (each lasts a moment, so overlap would show)."""

    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, cand):
        with self._lock:
            self.active += 1
            self.calls += 1
            self.most = max(self.most, self.active)
        time.sleep(0.2)
        with self._lock:
            self.active -= 1
        return fake_evaluate(cand)


def synthesize_at_once(loop: SynthesisLoop, requests: list, evaluate) -> list:
    results: list = [None] * len(requests)

    def one(i: int) -> None:
        try:
            results[i] = loop.synthesize(requests[i], evaluate)
        except Exception as exc:  # SynthesisError: nothing to evaluate
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_two_modules_requests_overlap_and_evaluations_take_turns(llm):
    server = llm(meeting(2, candidate("GOOD")))
    watch = Watch()
    loop = SynthesisLoop(["openai:gpt-4o"], FAST.with_(samples=1, repair_rounds=0, speed_rounds=0))
    results = synthesize_at_once(loop, [request_for(Double()), request_for(Triple())], watch)
    assert len(server.script.met) == 2  # both modules' first requests were in flight at once
    assert all(isinstance(r, list) and r[0].verdict.accepted for r in results), results
    assert watch.calls == 2 and watch.most == 1  # evaluated one after the other
    assert loop.run_meter.requests == 2 and len(loop.records) == 2


def test_a_request_waits_for_budget_held_by_another_module(llm):
    llm({"gpt-4o": [Reply(candidate("BAD"), delay=0.2)]})
    # a request may cost $0.084-0.093 at most (8,192 output tokens at $10/M and the conversation): two fit
    # under $0.22 reserved at once, not three. Each costs $0.0075: all 16 answers fit once settled, so a
    # module whose requests wait for the other module's to settle must wait, not stop
    settings = FAST.with_(samples=2, repair_rounds=3, speed_rounds=0, concurrency=4,
                          run_limits=Limits(cost_usd=0.22))
    loop = SynthesisLoop(["openai:gpt-4o"], settings)
    results = synthesize_at_once(loop, [request_for(Double()), request_for(Triple())], Watch())
    assert [r.stop_reason for r in loop.records] == ["", ""], results
    assert loop.run_meter.requests == 16 and loop.run_meter.reserved_cost < 1e-9


def test_run_cost_cap_holds_over_modules(llm):
    llm({"gpt-4o": [Reply(candidate("BAD"), delay=0.2, usage=(1000, 8000))]})  # $0.0825 an answer
    settings = FAST.with_(samples=2, repair_rounds=3, speed_rounds=0, concurrency=4, run_limits=Limits(cost_usd=0.3))
    loop = SynthesisLoop(["openai:gpt-4o"], settings)
    watch = Watch()
    synthesize_at_once(loop, [request_for(Double()), request_for(Triple())], watch)
    assert loop.run_meter.requests == 3 and loop.run_meter.cost_usd <= 0.3  # four asked at once; three fit
    assert loop.run_meter.reserved_cost < 1e-9 and watch.most == 1
    assert all("run cost budget reached" in r.stop_reason for r in loop.records)


def test_requests_in_flight_never_exceed_the_bound_over_modules(llm):
    active = {"n": 0, "most": 0}
    lock = threading.Lock()

    def script(rec):
        with lock:
            active["n"] += 1
            active["most"] = max(active["most"], active["n"])
        time.sleep(0.2)
        with lock:
            active["n"] -= 1
        return Reply(candidate("BAD"))

    llm(script)
    loop = SynthesisLoop(["openai:gpt-4o"], FAST.with_(samples=2, repair_rounds=1, speed_rounds=0, concurrency=3))
    results = synthesize_at_once(loop, [request_for(Double()), request_for(Triple())], Watch())
    assert loop.run_meter.requests == 8 and active["most"] <= 3, (results, [r.summary() for r in loop.records])


def test_interrupt_stops_every_module_in_flight(llm):
    llm({"gpt-4o": [Reply(candidate("BAD"), delay=30.0)]})
    loop = SynthesisLoop(["openai:gpt-4o"], FAST.with_(samples=1, repair_rounds=0, speed_rounds=0))
    done = threading.Event()
    results: list = []

    def run() -> None:
        results.extend(synthesize_at_once(loop, [request_for(Double()), request_for(Triple())], Watch()))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    for _ in range(200):  # both requests sent
        if loop._gate.in_flight == 2:
            break
        time.sleep(0.05)
    loop.interrupt()
    assert done.wait(20)  # long before the answers would come
    assert loop.interrupted and all("interrupted" in r.stop_reason for r in loop.records)
    assert loop.run_meter.reserved_cost < 1e-9 and loop.run_meter.requests == 2  # abandoned requests charged


def test_device_lane_is_lent_while_waiting():
    lane = DeviceLane("test")
    order: list[str] = []
    with lane.hold():
        assert lane.held_here
        with lane.hold():  # re-entrant for its holder
            pass
        with lane.lent():
            assert not lane.held_here

            def other() -> None:
                with lane.hold():
                    order.append("other")

            t = threading.Thread(target=other)
            t.start()
            t.join(5)
        assert lane.held_here
        order.append("back")
    assert order == ["other", "back"]


def test_cli_runs_problems_at_once_with_device_work_in_turns(llm, tmp_path, monkeypatch, capsys):
    for i in (1, 2):
        (tmp_path / f"{i}_poly.py").write_text(PROBLEM.replace("16", str(i + 3)))
    server = llm(meeting(2, candidate("BAD")))
    lane = lane_for("cpu")
    held: list[bool] = []
    watch = Watch()
    real = cli_synth.optimize

    def optimize(model, *a, **k):
        held.append(lane.held_here)  # the problem's own device work (profiling, baselines) is under the lane
        return real(model, *a, **k)

    def evaluate(self, call, key, cand):
        held.append(lane.held_here)
        return watch(cand)

    monkeypatch.setattr(cli_synth, "optimize", optimize)
    monkeypatch.setattr("metal_accel.pipeline.Pipeline.evaluate", evaluate)
    code = main(["synth", str(tmp_path), "--models", "openai:gpt-4o", "--samples", "1", "--rounds", "0",
                 "--no-profile", "--backend", "cpu", "--problems", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert len(server.script.met) == 2  # problem 2's request went out before problem 1's was answered
    assert "# 1_poly" in out and "# 2_poly" in out and "2 requests" in out
    assert watch.calls == 2 and watch.most == 1 and all(held)


def test_cli_says_when_the_runs_cap_cut_problems_short(llm, tmp_path, monkeypatch, capsys):
    for i in (1, 2, 3):
        (tmp_path / f"{i}_poly.py").write_text(PROBLEM.replace("16", str(i + 3)))
    llm({"gpt-4o": [Reply(candidate("BAD"), usage=(1000, 8000))]})  # $0.0825 an answer: one fits under $0.1
    monkeypatch.setattr("metal_accel.pipeline.Pipeline.evaluate", lambda self, call, key, cand: Watch()(cand))
    code = main(["synth", str(tmp_path), "--models", "openai:gpt-4o", "--samples", "1", "--rounds", "0",
                 "--no-profile", "--backend", "cpu", "--problems", "1", "--max-cost", "0.1"])
    err = capsys.readouterr().err
    assert code == 0
    assert "stopped early (run cost budget reached): 2 problem(s) not finished" in err, err
    assert "--max-cost" in err
