"""Run the asyncio side of synthesis on a shared event loop in a helper thread while candidates are
evaluated, one at a time, on the caller's thread.

LLM requests are I/O: the requests of every module being synthesized at once (several problems of
`metal-accel synth`, each on its own thread) run concurrently on one event loop in a background thread.
Evaluation (compile, validate, benchmark) touches the device and is served on the thread whose module it
is, under that device's lane (lanes.py), so measurements never overlap and device state stays on the
caller's thread. This also works when the caller already runs an event loop (Jupyter).
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
_DONE, _INTERRUPT = "done", "interrupt"


class EventLoopThread:
    """One asyncio event loop in a daemon thread, shared by the syntheses that run at once: started by
    the first user (`acquire`), stopped when the last one `release`s it."""

    def __init__(self, name: str = "metal_accel-synth") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._users = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def acquire(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    try:
                        loop.run_forever()
                    finally:
                        _shut_down(loop)

                self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            self._users += 1
            return self._loop

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0 or self._loop is None:
                return
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)


class Interrupts:
    """Ctrl-C for every run_with_evaluator in progress, from any thread; one that starts after `fire`
    is stopped at once."""

    def __init__(self) -> None:
        self.fired = False
        self._stops: set[Callable[[], None]] = set()
        self._lock = threading.Lock()

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            stops = list(self._stops)
        for stop in stops:
            stop()

    def add(self, stop: Callable[[], None]) -> None:
        with self._lock:
            self._stops.add(stop)
            fired = self.fired
        if fired:
            stop()

    def discard(self, stop: Callable[[], None]) -> None:
        with self._lock:
            self._stops.discard(stop)


def _shut_down(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio.run does at the end: cancel what is left, finish async generators, close."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def _settle(fut: "asyncio.Future[Any]", value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def run_with_evaluator(main: Callable[[AsyncEvaluate], Awaitable[T]], evaluate: Callable[[Candidate], Evaluation],
                       *, loop_thread: EventLoopThread | None = None,
                       interrupts: Interrupts | None = None) -> tuple[T, list[Evaluation]]:
    """Run `main(submit)` on `loop_thread`'s event loop (a private one if None); every
    `await submit(candidate)` is served by `evaluate(candidate)` on this thread, one at a time, in
    submission order. `interrupts.fire()` (from any thread) stops it as Ctrl-C on this thread would:
    main is cancelled and KeyboardInterrupt raised here, after the evaluation in progress.

    Returns main's result and every evaluation made (also those whose waiter was cancelled).
    """
    owner = loop_thread or EventLoopThread()
    loop = owner.acquire()
    jobs: "queue.Queue[Any]" = queue.Queue()
    outcome: dict[str, Any] = {}

    async def submit(cand: Candidate) -> Evaluation:
        fut: asyncio.Future[Evaluation] = asyncio.get_running_loop().create_future()
        jobs.put((cand, fut))
        return await fut

    async def runner() -> None:
        outcome["started"] = True
        try:
            outcome["value"] = await main(submit)
        except BaseException as exc:  # handed to the caller's thread (CancelledError included)
            outcome["error"] = exc
        finally:
            jobs.put(_DONE)

    def interrupt() -> None:
        jobs.put(_INTERRUPT)

    task = asyncio.run_coroutine_threadsafe(runner(), loop)
    task.add_done_callback(lambda _: None if "started" in outcome else jobs.put(_DONE))  # cancelled before it ran
    if interrupts is not None:
        interrupts.add(interrupt)
    done: list[Evaluation] = []
    try:
        while True:
            job = jobs.get()
            if job == _DONE:
                break
            if job == _INTERRUPT:
                raise KeyboardInterrupt
            cand, fut = job
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
        task.cancel()
        _drain(jobs, 10.0)  # main's cleanup (closing its clients) runs before the caller goes on
        raise
    finally:
        if interrupts is not None:
            interrupts.discard(interrupt)
        owner.release()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], done


def _drain(jobs: "queue.Queue[Any]", timeout: float) -> None:
    """Wait (at most `timeout` s) for a cancelled main to end, refusing the evaluations it still asks for."""
    try:
        while True:
            job = jobs.get(timeout=timeout)
            if job == _DONE:
                return
            if isinstance(job, tuple):
                cand, fut = job
                try:
                    fut.get_loop().call_soon_threadsafe(fut.cancel)
                except RuntimeError:
                    pass
    except queue.Empty:
        log.warning("metal_accel: synthesis did not stop within %.0f s of being cancelled", timeout)
