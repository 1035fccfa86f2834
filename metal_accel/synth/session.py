"""One module's synthesis: concurrent conversations (models x samples), each with repair rounds."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Callable

from tqdm.auto import tqdm

from ..core.candidate import Candidate
from ..core.errors import CandidateFormatError
from ..core.provider import Evaluation, SynthesisRequest
from ..core.redact import redact
from ..core.scrub import scrub
from ..core.verdict import Verdict
from ..backends import get_backend
from .answers import AnswerProblem, read_answer
from .bridge import AsyncEvaluate
from .budget import Budget, Reservation, cost_of
from .clients import ChatClient, Completion, Message, RequestFailed
from .memo import AnswerCache, request_key
from .models import ModelSpec, ProviderConfigError
from .prompts import (Best, Prompt, feedback_empty, feedback_for, feedback_malformed, feedback_speed,
                      feedback_truncated)
from .settings import SynthSettings
from .stats import Attempt, InFlight, ModuleRecord

log = logging.getLogger(__name__)
ClientFactory = Callable[[ModelSpec, SynthSettings], ChatClient]
HEARTBEAT_S = 30.0  # a log line this often while answers are awaited
_PROBLEM_LABELS = {"empty": "empty answer", "thinking-only": "empty answer", "truncated": "truncated answer",
                   "malformed": "malformed answer"}


class RequestGate:
    """What the modules synthesized at once (on one shared event loop) share: the bound on LLM requests
    in flight over all of them, a count of those in flight, and a signal when one settles its reservation
    (a request waiting for budget may then fit). Bound to the running loop on first use in it."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        self._settled: asyncio.Event | None = None

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new loop (the last user of the old one has ended): fresh primitives
            self._loop, self._sem, self._settled = loop, asyncio.Semaphore(self.limit), asyncio.Event()
            self.in_flight = 0

    @property
    def semaphore(self) -> asyncio.Semaphore:
        self._bind()
        assert self._sem is not None
        return self._sem

    async def wait_settled(self) -> None:
        self._bind()
        assert self._settled is not None
        await self._settled.wait()

    def settled(self) -> None:
        self._bind()
        assert self._settled is not None
        self._settled.set()
        self._settled = asyncio.Event()


class ModuleSession:
    """Best-of-N for one module: every model runs `samples` conversations at once (at most
    `concurrency` requests in flight, over every module that shares `gate`); each answer is evaluated (serialized, through `submit`) and
    its verdict fed back, up to `repair_rounds` times. A conversation ends when its candidate is
    accepted, its rounds are used up, a request fails for good, or a budget is reached."""

    def __init__(self, request: SynthesisRequest, prompt: Prompt, models: list[ModelSpec], settings: SynthSettings,
                 budget: Budget, record: ModuleRecord, client_factory: ClientFactory,
                 dead_models: dict[ModelSpec, str], answers: AnswerCache | None = None,
                 gate: RequestGate | None = None) -> None:
        self.request = request
        self.answers = answers  # answers paid for earlier, by exact request (None: not kept)
        self.prompt = prompt
        self.models = models
        self.settings = settings
        self.budget = budget
        self.record = record
        self.client_factory = client_factory
        self.dead = dead_models
        self.best: Best | None = None
        self.provenance: dict[str, dict] = {}          # candidate digest -> attempt provenance
        self.inflight = InFlight()
        self._seen: dict[str, asyncio.Future[Evaluation]] = {}
        self._submit: AsyncEvaluate | None = None
        self.gate = gate or RequestGate(settings.concurrency)
        self._bar: tqdm | None = None
        self._stored: dict[str, dict] = {}  # request key -> the stored answer's document (replayed answers)
        self.profiles: dict[str, str] = {}  # candidate digest -> its profile next to eager's (profile.py), if any

    async def run(self, submit: AsyncEvaluate) -> None:
        self._submit = submit
        s = self.settings
        clients: dict[ModelSpec, ChatClient] = {}
        for m in self.models:
            try:
                clients[m] = self.client_factory(m, s)
            except ProviderConfigError as exc:
                self.dead[m] = str(exc)
        total = len(clients) * s.samples * (s.repair_rounds + 1 + s.speed_rounds)
        self._bar = tqdm(total=total, desc=f"synth {self.request.class_name}", unit="answer", leave=False,
                         disable=None if s.progress is None else not s.progress)
        beat = asyncio.create_task(self._heartbeat())
        tasks: list[asyncio.Task] = []
        try:
            tasks = [asyncio.create_task(self._sample(c, m, i)) for m, c in clients.items() for i in range(s.samples)]
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=self.budget.remaining_s())
                if pending:
                    self._stop(self.budget.exceeded() or "time budget reached")
                    for t in pending:
                        t.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                for t in tasks:
                    if not t.cancelled() and t.exception() is not None:
                        log.warning("metal_accel: synth %s: a conversation failed: %s", self.request.class_name,
                                    scrub(t.exception()))
        finally:  # cancelled (Ctrl-C): the shared loop goes on, so this module's conversations end here
            beat.cancel()
            left = [t for t in tasks if not t.done()]
            for t in left:
                t.cancel()
            if left:
                await asyncio.gather(*left, return_exceptions=True)
            for c in clients.values():
                await c.close()
            self._bar.total = self._bar.n
            self._bar.close()

    async def _heartbeat(self) -> None:
        """While answers are awaited: the bar shows the wait each second; a log line every `HEARTBEAT_S`."""
        started = time.monotonic()
        last_log = started
        while True:
            await asyncio.sleep(1.0)
            n = self.inflight.n
            if not n:
                continue
            waited = time.monotonic() - started
            if self._bar is not None:
                self._bar.set_postfix_str(f"waiting for {n} answer{'s' if n != 1 else ''}, {waited:.0f} s, "
                                          f"${self.record.cost_usd:.3f}", refresh=True)
            if time.monotonic() - last_log >= HEARTBEAT_S:
                last_log = time.monotonic()
                log.info("metal_accel: synth %s: waiting for %d answer%s (%.0f s so far, %d answers received)",
                         self.request.class_name, n, "s" if n != 1 else "", waited, len(self.record.attempts))

    def _stop(self, reason: str) -> None:
        if reason and not self.record.stop_reason:
            self.record.stop_reason = reason
            log.warning("metal_accel: synth %s: stopped: %s", self.request.class_name, reason)

    def _deadline(self) -> float | None:
        left = self.budget.remaining_s()
        return None if left is None else time.monotonic() + left

    def _worst_case(self, model: ModelSpec, messages: list[Message]) -> tuple[int, int, float]:
        """(input tokens, output tokens, USD) a request may cost at most: its text at 3 characters a
        token (code runs 3 to 4), its whole output budget, at the model's price."""
        chars = len(self.prompt.system) + sum(len(m["content"]) for m in messages)
        t_in, t_out = -(-chars // 3), self.settings.output_budget(model.kind, model.model)
        return t_in, t_out, cost_of(model.model, t_in, t_out, self.settings.prices, base_url=model.base_url)

    async def _reserve(self, model: ModelSpec, messages: list[Message]) -> Reservation | None:
        """Reserve the request's worst case on the budget; wait while it would fit once the requests in
        flight settle; None (and the session stops) when it cannot fit."""
        t_in, t_out, cost = self._worst_case(model, messages)
        while True:
            res, why, later = self.budget.reserve(t_in + t_out, cost)
            if res is not None:
                return res
            if not later or self.gate.in_flight == 0:  # nothing in flight anywhere will free budget
                self._stop(why)
                return None
            await self.gate.wait_settled()

    def _settle(self, res: Reservation, t_in: int, t_out: int, cost: float, *, failed: bool = False) -> None:
        self.budget.settle(res, t_in, t_out, cost, failed=failed)
        self.gate.settled()

    async def _ask(self, client: ChatClient, model: ModelSpec, attempt: Attempt,
                   messages: list[Message]) -> Completion | None:
        """One request under the concurrency bound, its worst case reserved on the budget first; None
        when the conversation must end. An answer stored for the exact same request is replayed, free."""
        args: dict | None = None
        if self.answers is not None:
            args = _request_args(client, self.prompt.system, messages)
            attempt.request = request_key(model.label, args, attempt.sample)
            hit = self.answers.get(attempt.request)
            if hit is not None:
                comp, self._stored[attempt.request] = hit
                attempt.cached = True
                log.info("metal_accel: synth %s: %s: answer replayed from the answer cache (no request sent)",
                         self.request.class_name, attempt.tag)
                return comp
        async with self.gate.semaphore:
            if model in self.dead:
                return None
            res = await self._reserve(model, messages)
            if res is None:
                return None
            self.inflight.enter()
            self.gate.in_flight += 1
            log.info("metal_accel: synth %s: %s: request sent (%d messages, up to %d output tokens, $%.4f reserved)",
                     self.request.class_name, attempt.tag, len(messages),
                     self.settings.output_budget(model.kind, model.model), res.cost_usd)
            try:
                comp = await client.complete(self.prompt.system, messages, deadline=self._deadline())
            except RequestFailed as exc:
                self._charge_abandoned(res, model, messages, attempt, billable=exc.billable)
                # the module's time ran out while waiting: the same end as the cancellation below, whichever of
                # the request's deadline and the module's stop fired first
                attempt.outcome = f"request cancelled: {exc}" if exc.out_of_budget else f"request failed: {exc}"
                self._note(attempt)
                if exc.fatal:
                    self.dead.setdefault(model, f"{model.label}: {exc}")
                return None
            except asyncio.CancelledError:  # the module's time is up: the server may still bill the request
                self._charge_abandoned(res, model, messages, attempt, billable=True)
                attempt.outcome = "request cancelled: " + (self.record.stop_reason or "stopped")
                self._note(attempt)
                raise
            finally:
                self.inflight.exit()
                self.gate.in_flight -= 1
        attempt.tokens_in, attempt.tokens_out = comp.tokens_in, comp.tokens_out
        attempt.cost_usd = cost_of(model.model, comp.tokens_in, comp.tokens_out, self.settings.prices,
                                   base_url=model.base_url)
        attempt.llm_s, attempt.retries, attempt.estimated_tokens = comp.latency_s, comp.retries, comp.estimated_tokens
        self._settle(res, comp.tokens_in, comp.tokens_out, attempt.cost_usd)
        if self.answers is not None and args is not None:
            self.answers.put(attempt.request, model.label, attempt.tag, args, comp, attempt.cost_usd)
        return comp

    def _charge_abandoned(self, res: Reservation, model: ModelSpec, messages: list[Message], attempt: Attempt, *,
                          billable: bool) -> None:
        """Settle a request that brought no answer: free if the server refused it, else (a timeout, a
        cancel) its worst case, marked estimated, since the provider may bill the work it did."""
        if billable:
            t_in, t_out, cost = self._worst_case(model, messages)
            attempt.tokens_in, attempt.tokens_out, attempt.cost_usd = t_in, t_out, cost
            attempt.estimated_tokens = True
        self._settle(res, attempt.tokens_in, attempt.tokens_out, attempt.cost_usd, failed=True)

    async def _sample(self, client: ChatClient, model: ModelSpec, sample: int) -> None:
        """One conversation: answer, verdict, repaired answer, ... ."""
        messages: list[Message] = [{"role": "user", "content": self.prompt.user}]
        user_base = self.prompt.user  # the last user turn without the note about an unusable reply

        def reply(answer: str, feedback: str) -> None:
            nonlocal user_base
            user_base = feedback
            if self.answers is not None and attempt.request:
                self.answers.note(attempt.request, feedback=feedback)
            messages.extend([{"role": "assistant", "content": answer}, {"role": "user", "content": feedback}])

        limit = self.settings.repair_rounds + 1  # answers this conversation may take (speed rounds add some)
        speed = False
        for rnd in itertools.count():
            if rnd >= limit:
                return
            attempt = Attempt(model.label, sample, rnd)
            if model in self.dead:
                return
            why = self.budget.exceeded()
            if why:
                self._stop(why)
                return
            comp = await self._ask(client, model, attempt, messages)
            if comp is None:
                return
            try:
                cand = read_answer(comp.text, self.request.backend, origin=attempt.tag, truncated=comp.truncated)
            except AnswerProblem as exc:
                attempt.outcome = f"{_PROBLEM_LABELS[exc.kind]}: {exc}"
                self._note(attempt)
                if exc.kind == "malformed":
                    reply(comp.text, feedback_malformed(exc))
                else:  # nothing to show back (never an empty or cut-off assistant turn): say so in the user turn
                    note = feedback_truncated(comp.output_limit, comp.reasoning_tokens) if exc.kind == "truncated" \
                        else feedback_empty(exc.kind)
                    messages[-1] = {"role": "user", "content": f"{user_base}\n\n{note}"}
                continue
            except CandidateFormatError as exc:
                attempt.outcome = f"malformed answer: {exc}"
                self._note(attempt)
                reply(comp.text, redact(feedback_malformed(exc)))
                continue
            attempt.digest = cand.digest
            known = self.request.rejected.get(cand.digest)
            if known is not None and cand.digest not in self._seen:  # rejected in an earlier run: not proven again
                attempt.outcome = "rejected earlier: " + known.split("\n", 1)[0][:200]
                self._note(attempt)
                stored = self._stored.get(attempt.request, {})
                if attempt.cached and stored.get("digest") == cand.digest and stored.get("feedback"):
                    reply(comp.text, str(stored["feedback"]))  # word for word, so the next request is the same
                else:
                    env = get_backend(self.request.backend).environment()
                    ev = Evaluation(cand, Verdict(env, False, known, cand.digest))
                    reply(comp.text, redact(feedback_for(ev, self.best, duplicate=True)))
                continue
            try:
                ev, duplicate = await self._evaluate(cand, attempt)
            except Exception as exc:
                attempt.outcome = f"evaluation failed: {redact(scrub(exc))}"
                self._note(attempt)
                return
            except asyncio.CancelledError:  # stopped (Ctrl-C): the answer was paid for, and may be proven already
                fut = self._seen.get(cand.digest)
                if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
                    self._judged(attempt, fut.result(), False)
                else:
                    attempt.outcome = "evaluation cancelled: " + (self.record.stop_reason or "stopped")
                    self._note(attempt)
                raise
            self._judged(attempt, ev, duplicate)
            if ev.verdict.accepted:
                if not speed:  # the first correct kernel: speed rounds may follow, up to `speed_rounds` answers
                    speed, limit = True, rnd + 1 + max(0, self.settings.speed_rounds)
                if rnd + 1 >= limit or self._is_fastest(ev) or self.budget.exceeded():
                    return
                reply(comp.text, redact(feedback_speed(ev, self.best, self.request.compile_us, limit - rnd - 1,
                                                       duplicate=duplicate,
                                                       profile=self.profiles.get(cand.digest, ""))))
                continue
            # verdict reasons may quote compiler output or a crash: nothing of this machine goes to the LLM
            reply(comp.text, redact(feedback_for(ev, self.best, duplicate=duplicate)))

    def _judged(self, attempt: Attempt, ev: Evaluation, duplicate: bool) -> None:
        self._update_best(ev)
        attempt.outcome = ("duplicate: " if duplicate else "") + \
            ("accepted: " if ev.verdict.accepted else "rejected: ") + ev.verdict.reason.split("\n", 1)[0][:200]
        self._note(attempt)

    async def _evaluate(self, cand: Candidate, attempt: Attempt) -> tuple[Evaluation, bool]:
        """Evaluate once per distinct candidate; a repeat waits for (or reuses) the first verdict."""
        assert self._submit is not None
        fut = self._seen.get(cand.digest)
        if fut is not None:
            return await asyncio.shield(fut), True
        fut = asyncio.ensure_future(self._submit(cand))
        self._seen[cand.digest] = fut
        self.provenance[cand.digest] = attempt.provenance()
        if self._bar is not None:
            self._bar.set_postfix_str(f"evaluating {attempt.tag}", refresh=True)
        return await asyncio.shield(fut), False

    def _is_fastest(self, ev: Evaluation) -> bool:
        """Whether an accepted candidate beats eager (it does, being accepted), torch.compile (when it was
        measured) and every other candidate of this module so far (ties included)."""
        v = ev.verdict
        if v.kernel_us is None or (self.request.compile_us is not None and v.kernel_us >= self.request.compile_us):
            return False
        return self.best is None or (v.speedup or 0.0) >= self.best.speedup * (1 - 1e-9)

    def _update_best(self, ev: Evaluation) -> None:
        v = ev.verdict
        if v.accepted and v.speedup and (self.best is None or v.speedup > self.best.speedup):
            self.best = Best(v.speedup, v.kernel_us, ev.candidate.origin)
            self.record.best_speedup, self.record.best_origin = v.speedup, ev.candidate.origin

    def _note(self, attempt: Attempt) -> None:
        if attempt.digest and attempt.digest in self.provenance and not attempt.outcome.startswith("duplicate"):
            self.provenance[attempt.digest]["outcome"] = attempt.outcome
        self.record.add_attempt(attempt)
        if self.answers is not None and attempt.request:
            self.answers.note(attempt.request, outcome=attempt.outcome, digest=attempt.digest)
        level = logging.WARNING if attempt.outcome.startswith("request failed") else logging.INFO
        log.log(level, "metal_accel: synth %s: %s: %s", self.request.class_name, attempt.tag, attempt.outcome)
        if self._bar is not None:
            best = f"best {self.best.speedup:.2f}x" if self.best else "none accepted"
            self._bar.set_postfix_str(f"{best}, {self.record.tokens_in + self.record.tokens_out} tok, "
                                      f"${self.record.cost_usd:.3f}", refresh=False)
            self._bar.update(1)


def _request_args(client: ChatClient, system: str, messages: list[Message]) -> dict:
    """The SDK call's arguments (a client without `request_args`: the model, system prompt and messages)."""
    fn = getattr(client, "request_args", None)
    msgs = [dict(m) for m in messages]
    if callable(fn):
        return fn(system, msgs)
    return {"model": client.spec.model, "system": system, "messages": msgs}
