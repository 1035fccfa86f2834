"""Run the asyncio side of synthesis in a helper thread while candidates are evaluated, one at a
time, on the caller's thread.

LLM requests are I/O and run concurrently on an event loop in a background thread; evaluation
(compile, validate, benchmark) touches the device and is serialized on the thread that called
`optimize`, so measurements never overlap and device state stays on that thread. This also works
when the caller already runs an event loop (Jupyter).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Awaitable, Callable, TypeVar

from ..core.candidate import Candidate
from ..core.provider import Evaluation

log = logging.getLogger(__name__)
T = TypeVar("T")
AsyncEvaluate = Callable[[Candidate], Awaitable[Evaluation]]


def _settle(fut: "asyncio.Future[Any]", value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def run_with_evaluator(main: Callable[[AsyncEvaluate], Awaitable[T]], evaluate: Callable[[Candidate], Evaluation],
                       ) -> tuple[T, list[Evaluation]]:
    """Run `main(submit)` on a fresh event loop in a helper thread; every `await submit(candidate)`
    is served by `evaluate(candidate)` on this thread, one at a time, in submission order.

    Returns main's result and every evaluation made (also those whose waiter was cancelled).
    """
    jobs: "queue.Queue[tuple[Candidate, asyncio.Future[Evaluation], asyncio.AbstractEventLoop] | None]" = queue.Queue()
    outcome: dict[str, Any] = {}
    started = threading.Event()

    async def submit(cand: Candidate) -> Evaluation:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Evaluation] = loop.create_future()
        jobs.put((cand, fut, loop))
        return await fut

    async def runner() -> T:
        outcome["loop"] = asyncio.get_running_loop()
        outcome["task"] = asyncio.current_task()
        started.set()
        return await main(submit)

    def thread_main() -> None:
        try:
            outcome["value"] = asyncio.run(runner())
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc
        finally:
            started.set()
            jobs.put(None)

    thread = threading.Thread(target=thread_main, name="metal_accel-synth", daemon=True)
    thread.start()
    done: list[Evaluation] = []
    try:
        while True:
            job = jobs.get()
            if job is None:
                break
            cand, fut, loop = job
            if fut.cancelled():
                continue
            value, error = None, None
            try:
                value = evaluate(cand)
                done.append(value)
            except Exception as exc:
                error = exc
            try:
                loop.call_soon_threadsafe(_settle, fut, value, error)
            except RuntimeError:  # the loop has closed: nobody waits any more
                pass
    except BaseException:
        started.wait(5)
        loop, task = outcome.get("loop"), outcome.get("task")
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass
        thread.join(10)
        raise
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], done
