"""The evaluation bridge: LLM work runs concurrently, evaluations one at a time on the caller's thread."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from metal_accel.synth.bridge import run_with_evaluator


def test_evaluations_are_serialized_on_the_calling_thread_while_requests_overlap():
    caller = threading.get_ident()
    busy, seen = [0], []
    requests, peak = [0], [0]

    def evaluate(cand):
        busy[0] += 1
        seen.append((threading.get_ident(), busy[0]))
        time.sleep(0.05)
        busy[0] -= 1
        return f"verdict {cand}"

    async def main(submit):
        async def conversation(i):
            requests[0] += 1
            peak[0] = max(peak[0], requests[0])
            await asyncio.sleep(0.1)  # an LLM request
            requests[0] -= 1
            return await submit(i)
        return await asyncio.gather(*(conversation(i) for i in range(6)))

    result, done = run_with_evaluator(main, evaluate)
    assert result == [f"verdict {i}" for i in range(6)]
    assert sorted(done) == sorted(result)
    assert all(tid == caller and n == 1 for tid, n in seen)  # never two at once, always on this thread
    assert peak[0] == 6  # the six "requests" overlapped


def test_errors_reach_the_caller():
    def evaluate(cand):
        raise ValueError("compiler crashed")

    async def main(submit):
        with pytest.raises(ValueError, match="compiler crashed"):
            await submit("x")
        raise RuntimeError("loop failed")

    with pytest.raises(RuntimeError, match="loop failed"):
        run_with_evaluator(main, evaluate)


def test_works_inside_a_running_event_loop():
    async def notebook_cell():
        async def main(submit):
            return await submit(1)
        return run_with_evaluator(main, lambda c: c + 1)[0]

    assert asyncio.run(notebook_cell()) == 2
