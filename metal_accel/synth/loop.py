"""The LLM provider: best-of-N synthesis with repair rounds, as an InteractiveProvider of the pipeline."""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from ..backends import get_backend
from ..core.candidate import Candidate
from ..core.errors import MetalAccelError
from ..core.keys import entry_key
from ..core.provider import Evaluate, Evaluation, SynthesisRequest
from ..core.specs import TensorSpec
from .bridge import EventLoopThread, Interrupts, run_with_evaluator
from .budget import Budget, Meter, UnknownPriceError, price_of
from .clients import check_configured, make_client
from .context import find_references, profile_breakdown
from .lanes import lane_for
from .facts import device_facts, eager_time_us, op_multiset, proof_facts, signature
from .memo import AnswerCache
from .models import MODELS_ENV, ModelSpec, ProviderConfigError, resolve_models
from .profile import kernel_profile
from .prompts import Prompt, build_prompt
from .session import ClientFactory, ModuleSession, RequestGate
from .settings import SynthSettings
from .stats import ModuleRecord

log = logging.getLogger(__name__)


class SynthesisError(MetalAccelError):
    """Synthesis ran (or could not start) and produced no candidate to evaluate; the message says why."""


NO_MODELS = (f"synthesis requested but no LLM is configured: name models (optimize(..., models=[...]) or "
             f"`metal-accel synth --models ...`) or set {MODELS_ENV}, e.g. 'openai:gpt-5,anthropic:claude-sonnet-4-5' "
             "or 'openai-compatible:http://localhost:11434/v1#qwen2.5-coder'")


class SynthesisLoop:
    """Writes kernels with LLMs. For each module call without a cached kernel: `samples`
    conversations per model run concurrently, each answer is proven by the pipeline's `evaluate`
    (one at a time) and its verdict fed back for up to `repair_rounds` repairs; every evaluation is
    returned, so the pipeline installs the fastest proven one. Token, cost and time budgets hold per
    module and over the loop's lifetime (one optimize() run when optimize builds it).

    `records` keeps one ModuleRecord per synthesized module (attempts, time split, concurrency).
    Ctrl-C during a module's synthesis returns what was evaluated so far (the pipeline installs and
    caches the best) and sets `interrupted`: later modules are not synthesized.

    Several threads may synthesize at once (`metal-accel synth` runs problems concurrently): their
    requests share one event loop and the `concurrency` bound, their evaluations take turns on the
    device's lane (lanes.py), and `interrupt()` stops them all as Ctrl-C would.
    """

    def __init__(self, models: Sequence[str | ModelSpec] | str | None = None, settings: SynthSettings | None = None,
                 *, client_factory: ClientFactory | None = None) -> None:
        self.settings = settings or SynthSettings.from_env()
        self.models = resolve_models(models)
        self.name = "llm:" + ",".join(m.label for m in self.models) if self.models else "llm"
        self.client_factory: ClientFactory = client_factory or make_client
        self.dead: dict[ModelSpec, str] = {}  # model -> why it is unusable (credentials, unknown model or price)
        for m in self.models:  # configuration is checked before any work: nothing is profiled or sent yet
            try:
                price_of(m.model, self.settings.prices, base_url=m.base_url)
                if client_factory is None:
                    check_configured(m, self.settings)
            except ProviderConfigError as exc:
                self.dead[m] = f"{m.label}: {exc}" if isinstance(exc, UnknownPriceError) else str(exc)
                log.warning("metal_accel: %s", self.dead[m])
        self.run_meter = Meter("run", self.settings.run_limits)
        self.records: list[ModuleRecord] = []
        self.interrupted = False  # Ctrl-C during synthesis: what was evaluated is kept, nothing more is asked
        self._done: dict[str, str] = {}  # entry key -> summary of its synthesis in this loop's lifetime
        self._lock = threading.Lock()
        self._local = threading.local()  # this thread's record sink (`collect`)
        self._loop_thread = EventLoopThread()
        self._gate = RequestGate(self.settings.concurrency)
        self._interrupts = Interrupts()

    def interrupt(self) -> None:
        """Stop synthesis from any thread, as Ctrl-C on each synthesizing thread would: what was evaluated
        is kept, nothing more is asked in this loop's lifetime."""
        self.interrupted = True
        self._interrupts.fire()

    @contextmanager
    def collect(self) -> Iterator[list[ModuleRecord]]:
        """The records of the modules this thread synthesizes during the block (also kept in `records`)."""
        sink: list[ModuleRecord] = []
        outer = getattr(self._local, "sink", None)
        self._local.sink = sink
        try:
            yield sink
        finally:
            self._local.sink = outer

    @property
    def configuration_error(self) -> str:
        """'' when at least one model is usable, else why synthesis cannot run."""
        if not self.models:
            return NO_MODELS
        if all(m in self.dead for m in self.models):
            return "no usable LLM: " + "; ".join(self.dead[m] for m in self.models)
        return ""

    def synthesize(self, request: SynthesisRequest, evaluate: Evaluate) -> list[Evaluation]:
        s = self.settings
        if not s.wants(request.class_name, request.module_class):
            return []
        problem = self.configuration_error
        if problem:
            raise ProviderConfigError(problem)
        if self.interrupted:
            raise SynthesisError("not synthesized: synthesis was interrupted (Ctrl-C)")
        why = self.run_meter.exceeded()
        if why:
            raise SynthesisError(f"not synthesized: {why}")
        key = entry_key(request.fingerprint, request.input_spec, request.backend)
        with self._lock:
            if key in self._done:  # e.g. the same layer repeated in a model: its verdicts are cached already
                raise SynthesisError(f"synthesized earlier in this run: {self._done[key]}")
            self._done[key] = "being synthesized by another problem"
        models = [m for m in self.models if m not in self.dead]
        record = ModuleRecord(request.module_class, request.backend, [m.label for m in models])
        start = time.monotonic()
        answers = AnswerCache(request.backend, key) if s.answer_cache else None
        prompt = self._stored_prompt(request, answers)
        record.prompt_s = time.monotonic() - start
        session = ModuleSession(request, prompt, models, s, Budget(Meter("module", s.module_limits), self.run_meter),
                                record, self.client_factory, self.dead, answers, gate=self._gate)
        lane = lane_for(request.backend)

        done: list[Evaluation] = []

        def timed(cand: Candidate) -> Evaluation:
            with lane.hold():  # one evaluation at a time on the device, whichever problem it is of
                t0 = time.monotonic()
                session.inflight.set_evaluating(True)
                try:
                    ev = evaluate(cand)
                finally:
                    session.inflight.set_evaluating(False)
                record.add_evaluation(ev, time.monotonic() - t0)
                if s.profile and s.speed_rounds > 0 and ev.verdict.accepted and ev.op is not None:
                    session.profiles[cand.digest] = kernel_profile(request.module, request.input_spec, ev.op,
                                                                   request.backend)
            done.append(ev)
            return ev

        try:
            with lane.lent():  # while answers are awaited, other problems may use the device
                run_with_evaluator(session.run, timed, loop_thread=self._loop_thread, interrupts=self._interrupts)
        except KeyboardInterrupt:  # keep what was proven; no more synthesis in this loop's lifetime
            self.interrupt()  # the modules other threads synthesize stop too
            record.stop_reason = record.stop_reason or "interrupted (Ctrl-C)"
            log.warning("metal_accel: synthesis interrupted: %d evaluated candidate(s) of %s kept; no more "
                        "synthesis in this run (Ctrl-C again stops it)", len(done), request.class_name)
        finally:  # whatever happened (a failure, Ctrl-C), what was spent and evaluated is recorded
            evaluations = list(done)
            record.wall_s = time.monotonic() - start
            record.llm_busy_s, record.concurrency = session.inflight.busy_s, session.inflight.average
            record.peak_in_flight, record.overlap_s = session.inflight.peak, session.inflight.overlap_s
            if not record.stop_reason and models and all(m in self.dead for m in models):
                record.stop_reason = "no usable model left: " + "; ".join(self.dead[m] for m in models)
            totals = record.totals()
            for ev in evaluations:
                provenance = {**session.provenance.get(ev.candidate.digest, {}), "module": totals}
                ev.verdict.details = {**ev.verdict.details, "provenance": provenance}
            with self._lock:
                self.records.append(record)
                self._done[key] = record.summary()
            sink = getattr(self._local, "sink", None)
            if sink is not None:
                sink.append(record)
            log.info("metal_accel: synth %s", record.summary())
        if not evaluations:
            raise SynthesisError(self._nothing_to_evaluate(record))
        return evaluations

    def _stored_prompt(self, request: SynthesisRequest, answers: AnswerCache | None) -> Prompt:
        """The prompt this module was asked with before, else a new one (saved): measured times vary from run
        to run, and a rerun must send the same requests to find their answers."""
        wants = {"language": request.language, "profile": self.settings.profile,
                 "references": self.settings.references}
        prompt = answers.load_prompt(wants) if answers is not None else None
        if prompt is None:
            prompt = self.prompt_for(request, answers)
            if answers is not None:
                answers.save_prompt(prompt, wants)
        return prompt

    def prompt_for(self, request: SynthesisRequest, answers: AnswerCache | None = None) -> Prompt:
        """The prompt for one request, with profile and references as the settings ask. The module's op
        signature (what it computes) picks references and is saved with `answers` for later modules."""
        device = _device(request)
        try:
            device_name = get_backend(request.backend).environment().device_name
        except Exception:
            device_name = str(device)
        s = self.settings
        eager_runs = 0
        if s.profile and not request.eager_benchmarked:  # one capture sample is no timing: measure it
            measured = eager_time_us(request.module, request.input_spec, device)
            if measured is not None:
                request.eager_us, eager_runs = measured
        profile = profile_breakdown(request.module, request.input_spec, device) if s.profile else ""
        ops = op_multiset(request.module, request.input_spec, device) if (s.references or answers) else {}
        sig = signature(ops, request.input_spec)
        if answers is not None:
            answers.save_signature(sig, ops)
        references = find_references(request.fingerprint, sig, request.backend,
                                     entry_key(request.fingerprint, request.input_spec, request.backend)) \
            if s.references else []
        return build_prompt(request, device=device_name, profile=profile, references=references,
                            device_facts=device_facts(device),
                            proof=proof_facts(request.module, request.input_spec,
                                              [t.dtype for t in request.output_spec.tensors]),
                            eager_runs=eager_runs)

    @staticmethod
    def _nothing_to_evaluate(record: ModuleRecord) -> str:
        last: dict[str, str] = {}
        for a in record.attempts:
            last[a.model] = a.outcome
        parts = [f"{m}: {o}" for m, o in last.items()] or ["no answer"]
        n = len(record.attempts)
        stop = record.stop_reason
        stop = f"; stopped: {stop}" if stop and not stop.startswith("no usable model left") else ""
        return f"no candidate to evaluate after {n} request{'s' if n != 1 else ''} ({'; '.join(parts)}){stop}"


def _device(request: SynthesisRequest) -> torch.device:
    for spec in request.input_spec.tensor_specs():
        if isinstance(spec, TensorSpec):
            return torch.device(spec.device)
    for p in request.module.parameters():
        return p.device
    return torch.device("cpu")
