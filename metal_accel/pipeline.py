"""The pipeline for one captured call: key -> cache -> candidates -> prove -> store -> install."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from torch import nn

from .backends.base import Backend, Environment
from .candidates.compile import (
    CompiledOp,
    builtin_kinds,
    candidate_op,
    compile_candidate,
    generated_code,
    graph_variant_futile,
    prove_candidate,
    supports_compile,
)
from .candidates.triage import compile_not_worth_it
from .core import config
from .core.candidate import Candidate, parse_candidate
from .core.errors import MetalAccelError
from .core.keys import class_path, class_source_sha, entry_key, generic_key, module_fingerprint
from .core.provider import Evaluation, InteractiveProvider, Provider, SynthesisRequest
from .core.redact import redact
from .core.specs import UnsupportedCall
from .proof.prove import ProofSettings, declared_shape_generic, device_of
from .proof.worker import shared_worker
from .library.trusted import is_library_candidate
from .proof.speed import implausible_verdict
from .report import COVERED, ModuleReport, clock
from .runtime.capture import ModuleCall
from .runtime.dispatch import install
from .runtime.graph import GraphedOp
from .runtime.ops import KernelOp
from .store import cache as cache_mod
from .store.cache import CacheEntry, Verdict

log = logging.getLogger(__name__)
GENERIC_KINDS = ("rows", "kv", "rope")  # SHAPE_GENERIC values whose verdicts are also stored under keys.generic_key


@dataclass
class Pipeline:
    backend: Backend
    providers: Sequence[Provider] = ()
    settings: ProofSettings = field(default_factory=ProofSettings)
    strict: bool = False
    try_compile: bool = field(default_factory=config.compile_enabled)  # torch.compile is a candidate too
    installed: set[int] = field(default_factory=set)  # ids of modules that run a kernel
    _parents: dict[int, list[nn.Module]] = field(default_factory=dict)
    stage_s: dict[str, float] = field(default_factory=dict)  # seconds spent proving, by kind of candidate

    @property
    def _compiles(self) -> bool:
        return self.try_compile and supports_compile(self.backend)

    @property
    def _asks_llms(self) -> bool:
        """Some provider writes candidates from prompts (and so is bound by the prompt size limit)."""
        return any(isinstance(p, InteractiveProvider) for p in self.providers)

    @property
    def _reads_files(self) -> bool:
        """Some provider proposes candidates up front (files), which no prompt size limits."""
        return not all(isinstance(p, InteractiveProvider) for p in self.providers)

    @property
    def env(self) -> Environment:
        return self.backend.environment()

    def process(self, call: ModuleCall) -> ModuleReport:
        """Decide one captured call; never raises unless strict."""
        rep = ModuleReport(call.name, class_path(type(call.module)),
                           call.spec.describe() if call.spec else "?", "eager", "", calls=call.calls,
                           eager_us=call.eager_s / max(call.calls, 1) * 1e6)
        t0 = time.perf_counter()
        try:
            self._process(call, rep)
        except Exception as exc:
            if self.strict:
                raise
            rep.status, rep.reason = "eager", redact(f"internal error: {type(exc).__name__}: {exc}")
            log.warning("metal_accel: %s (%s) stays eager after an %s", call.name, rep.module_class, rep.reason)
            log.debug("metal_accel: the internal error's traceback", exc_info=True)
        _scrub_report(rep)
        rep.elapsed_s = time.perf_counter() - t0
        return rep

    def _process(self, call: ModuleCall, rep: ModuleReport) -> None:
        if not call.replaceable:
            rep.reason = call.unsupported
            return
        if call.compile_only and not self._compiles and not self._reads_files:
            rep.reason = call.compile_only
            return
        # an ancestor installed for the example's call covers the calls it makes there; a workload's call
        # (a decode step) comes from the ancestor's other signatures, which stay eager
        covering = [a for a in self._ancestors(call) if id(a) in self.installed] if not call.from_workload else []
        if covering:
            rep.reason = COVERED
            return
        try:
            fingerprint = module_fingerprint(call.module)
        except UnsupportedCall as exc:
            rep.reason = str(exc)
            return
        assert call.spec is not None and call.output_spec is not None
        key = entry_key(fingerprint, call.spec, self.backend.name)
        rep.key = key
        entry = cache_mod.lookup(self.backend.name, key)
        user = cache_mod.user_cache()
        if entry is None and self._generic_hit(call, key, fingerprint, rep):
            return
        if entry is not None and entry.candidate is not None:
            verdict = entry.verdict_for(self.env)
            doubt = implausible_verdict(verdict.speedup, verdict.reason, verdict.details.get("bench")) \
                if verdict is not None and verdict.accepted else ""
            if doubt:  # measured once, on what may have been a busy machine: prove and time it again
                log.info("metal_accel: %s: the cached verdict is timed again: %s", call.name, doubt)
                verdict = None
            if verdict is not None and verdict.accepted and verdict.candidate_digest == entry.candidate.digest:
                self._install(call, key, entry.candidate, verdict=verdict)
                self._accept(rep, entry.candidate, verdict, f"cache:{entry.origin}")
                return
            if verdict is None:  # proven elsewhere (or shipped): prove it again here, once
                ev = self.evaluate(call, key, entry.candidate)
                entry.verdicts[self.env.id] = ev.verdict
                if not ev.verdict.accepted:
                    entry.rejected.append(_rejection(ev))
                user.put(entry)
                if ev.verdict.accepted:
                    self._install(call, key, entry.candidate, ev.op)
                    self._accept(rep, entry.candidate, ev.verdict, f"cache:{entry.origin} (re-validated here)")
                    return
                rep.rejected.append(f"{entry.candidate.origin}: {ev.verdict.reason}")
            elif not verdict.accepted:
                rep.rejected.append(f"{entry.candidate.origin}: {verdict.reason}")
        tried = {r.get("digest") for r in (entry.rejected if entry else [])}
        request = SynthesisRequest(call.module, class_path(type(call.module)), type(call.module).__name__,
                                   fingerprint, call.spec, call.output_spec, self.backend.name,
                                   self.backend.language, eager_us=rep.eager_us or 0.0,
                                   rejected={str(r.get("digest")): str(r.get("reason", ""))
                                             for r in (entry.rejected if entry else []) if r.get("digest")})
        skip_compile = compile_not_worth_it(call.module, tuple(call.args), dict(call.kwargs)) \
            if self._compiles else ""
        evaluations = self._collect(call, key, request, rep, tried, skip_compile)
        if not evaluations and entry is not None:
            rep.reason = f"cached verdict: {entry.verdict_for(self.env).reason}" if entry.verdict_for(self.env) \
                else "no kernel for this module and input spec"
            if rep.rejected:
                rep.reason = "cached candidate rejected here: " + rep.rejected[-1]
            return
        if not evaluations:
            rep.reason = "no kernel in the caches and no provider candidate" if not rep.rejected else \
                "no candidate passed: " + rep.rejected[-1]
            if not rep.rejected and skip_compile:  # nothing was proven: say why torch.compile was not
                rep.reason = skip_compile
            return
        winners = sorted((e for e in evaluations if e.verdict.accepted), key=lambda e: -(e.verdict.speedup or 0))
        losers = [e for e in evaluations if not e.verdict.accepted]
        _record_times(rep, evaluations)
        rep.rejected += [f"{e.candidate.origin}: {e.verdict.reason}" for e in losers]
        new = CacheEntry(key=key, backend=self.backend.name, module_class=rep.module_class,
                         module_fingerprint=fingerprint, input_spec=call.spec, output_spec=call.output_spec,
                         candidate=winners[0].candidate if winners else None,
                         sandbox={"ok": True} if winners else {},
                         rejected=(entry.rejected if entry else []) + [_rejection(e) for e in losers],
                         class_source_sha=class_source_sha(type(call.module)))
        if winners:
            verdict = winners[0].verdict
        else:
            best = max(losers, key=lambda e: e.verdict.speedup or 0)
            verdict = Verdict(self.env, False, best.verdict.reason, best.candidate.digest,
                              best.verdict.speedup, best.verdict.eager_us, best.verdict.kernel_us)
        new.verdicts[self.env.id] = verdict
        kind = declared_shape_generic(winners[0].candidate.code) if winners else None
        generic = generic_key(fingerprint, call.spec, self.backend.name, kind) if kind in GENERIC_KINDS else None
        if generic:  # every other shape of this input finds it there (proven on several: the proof's sweep)
            user.put(dataclasses.replace(new, key=generic, verdicts={self.env.id: dataclasses.replace(verdict)}))
        user.put(new)  # may re-key the verdicts (sealed): read VERDICT, not new.verdicts, from here on
        rep.outpaced = [f"{e.candidate.origin}: {e.verdict.reason}" for e in winners[1:]]
        if winners:
            self._install(call, key, winners[0].candidate, winners[0].op)
            self._accept(rep, winners[0].candidate, winners[0].verdict, winners[0].candidate.origin)
        else:
            rep.reason = f"all {len(losers)} candidates rejected; best: {verdict.reason}"

    def _generic_hit(self, call: ModuleCall, key: str, fingerprint: str, rep: ModuleReport) -> bool:
        """Install a kernel proven here for another shape of this call's one input, when it was proven for any
        leading dimensions (SHAPE_GENERIC = "rows"; keys.generic_key): a decode step's shape, a new batch; or for any
        batch and kv length of an attention call (SHAPE_GENERIC = "kv")."""
        assert call.spec is not None
        for kind in GENERIC_KINDS:
            generic = generic_key(fingerprint, call.spec, self.backend.name, kind)
            entry = cache_mod.lookup(self.backend.name, generic) if generic else None
            if entry is not None and entry.candidate is not None \
                    and declared_shape_generic(entry.candidate.code) == kind:
                break
        else:
            return False
        verdict = entry.verdict_for(self.env)
        if verdict is None or not verdict.accepted or verdict.candidate_digest != entry.candidate.digest:
            return False
        proven = "x".join(map(str, entry.input_spec.tensor_specs()[0].shape))
        if not is_library_candidate(entry.candidate, call.module, call.spec, self.backend.name):
            # an untrusted kernel's claim to serve every shape is a claim: proven at this shape before it runs here
            ev = self.evaluate(call, key, entry.candidate)
            if not ev.verdict.accepted:
                rep.rejected.append(f"{entry.candidate.origin} (shape-generic, proven at {proven}): {ev.verdict.reason}")
                return False
            cache_mod.user_cache().put(dataclasses.replace(
                entry, key=key, input_spec=call.spec, output_spec=call.output_spec, rejected=[],
                verdicts={self.env.id: ev.verdict}))
            self._install(call, key, entry.candidate, ev.op)
            self._accept(rep, entry.candidate, ev.verdict, f"cache:{entry.origin} (shape-generic, proven here at "
                         "this shape too)")
            return True
        self._install(call, key, entry.candidate, verdict=verdict)
        self._accept(rep, entry.candidate, verdict, f"cache:{entry.origin} (shape-generic, proven at {proven})")
        return True

    def _collect(self, call: ModuleCall, key: str, request: SynthesisRequest, rep: ModuleReport,
                 tried: set[Any], skip_compile: str = "") -> list[Evaluation]:
        """torch.compile first (its time and code become context), then every provider's candidates;
        interactive providers get each verdict back."""
        evaluations: list[Evaluation] = []
        proposed = {id(p): self._proposals(p, request, rep, tried) for p in self.providers
                    if not isinstance(p, InteractiveProvider)}
        asks = any(isinstance(p, InteractiveProvider) for p in self.providers) and not call.compile_only
        if self.settings.isolate and (asks or any(proposed.values())):
            shared_worker().prestart(self.backend.name, str(device_of(call)))  # overlaps torch.compile's proofs
        for kind in builtin_kinds(self.backend) if self.try_compile and not skip_compile else []:
            builtin = compile_candidate(self.backend, kind)
            if builtin.digest in tried:
                continue
            futile = graph_variant_futile(evaluations[-1].verdict) \
                if kind == "cuda-graph" and evaluations and evaluations[-1].candidate.kind == "inductor" else ""
            if futile:  # recorded as rejected, so that a later run does not prove it either
                evaluations.append(Evaluation(builtin, Verdict(self.env, False, futile, builtin.digest)))
                continue
            ev = self.evaluate(call, key, builtin)
            evaluations.append(ev)
            if kind != "inductor":
                continue
            request.compile_us = ev.verdict.kernel_us
            if ev.verdict.eager_us:  # the benchmark's eager time, not one capture sample
                request.eager_us, request.eager_benchmarked = ev.verdict.eager_us, True
            if ev.verdict.kernel_us is not None and self._asks_llms:
                request.compiled_code = generated_code(call.module, tuple(call.args), dict(call.kwargs))
        if call.compile_only and self._asks_llms:
            rep.rejected.append(f"LLM providers not asked: {call.compile_only}")
        for provider in self.providers:
            if isinstance(provider, InteractiveProvider):
                if call.compile_only:  # too large for a prompt; files of candidates have no such limit
                    continue
                try:
                    evaluations += provider.synthesize(request, lambda cand: self.evaluate(call, key, cand))
                except MetalAccelError as exc:  # not configured, out of budget, no usable answer
                    if self.strict:
                        raise
                    rep.rejected.append(f"{provider.name}: {exc}")
            else:
                evaluations += [self.evaluate(call, key, c) for c in proposed[id(provider)]]
        return evaluations

    def _proposals(self, provider: Provider, request: SynthesisRequest, rep: ModuleReport,
                   tried: set[Any]) -> list[Candidate]:
        out = []
        for proposal in provider.propose(request):
            try:
                cand = parse_candidate(proposal.text, self.backend.name, proposal.origin)
            except MetalAccelError as exc:
                rep.rejected.append(f"{proposal.origin}: malformed candidate: {exc}")
                continue
            if cand.digest not in tried:
                out.append(cand)
        return out

    def evaluate(self, call: ModuleCall, key: str, cand: Candidate) -> Evaluation:
        """Sandbox, compile, validate and benchmark one candidate on this device."""
        with clock(self.stage_s, proof_stage(cand)):
            return prove_candidate(call, key, cand, self.backend, self.settings)

    def _install(self, call: ModuleCall, key: str, cand: Candidate,
                 op: KernelOp | CompiledOp | GraphedOp | None = None, verdict: Verdict | None = None) -> None:
        assert call.spec is not None and call.output_spec is not None
        if op is None:
            op = candidate_op(cand, key, call.module, call.spec, call.output_spec, self.backend, verdict)
        install(call.module, call.spec.signature(), op, strict=self.strict)
        self.installed.add(id(call.module))

    @staticmethod
    def _accept(rep: ModuleReport, cand: Candidate, verdict: Verdict, source: str) -> None:
        inductor = cand.kind == "inductor"
        rep.status = {"inductor": "compile", "cuda-graph": "graph"}.get(cand.kind, "kernel")
        rep.source, rep.reason = source, verdict.reason
        rep.speedup = verdict.speedup
        if inductor:
            rep.compile_us = verdict.kernel_us
        elif cand.kind == "cuda-graph":
            rep.graph_us = verdict.kernel_us
        else:
            rep.kernel_us = verdict.kernel_us
        if verdict.eager_us is not None:
            rep.eager_us = verdict.eager_us

    def _ancestors(self, call: ModuleCall) -> list[nn.Module]:
        return self._parents.get(id(call.module), [])

    def set_model(self, model: nn.Module) -> None:
        """Index each module's ancestors in `model` (a kernel on an ancestor covers its calls)."""
        self._parents = {}
        def walk(m: nn.Module, chain: list[nn.Module]) -> None:
            for child in m.children():
                self._parents.setdefault(id(child), []).extend(chain + [m])
                walk(child, chain + [m])
        walk(model, [])


def proof_stage(cand: Candidate) -> str:
    """The part of optimize()'s module decisions that proving CAND counts toward."""
    if cand.kind in ("inductor", "cuda-graph"):
        return {"inductor": "torch.compile candidates", "cuda-graph": "CUDA graph candidates"}[cand.kind]
    return "shipped library kernels" if cand.origin.startswith("library:") else "kernel candidates"


def _record_times(rep: ModuleReport, evaluations: list[Evaluation]) -> None:
    """The report's side-by-side times: torch.compile's, and the fastest measured kernel's."""
    for ev in evaluations:
        us = ev.verdict.kernel_us
        if us is None:
            continue
        if ev.verdict.eager_us is not None:  # the benchmark's eager time beats capture's estimate
            rep.eager_us = ev.verdict.eager_us
        if ev.candidate.kind == "inductor":
            rep.compile_us = us
        elif ev.candidate.kind == "cuda-graph":
            rep.graph_us = us
        elif rep.kernel_us is None or us < rep.kernel_us:
            rep.kernel_us = us


def _scrub_report(rep: ModuleReport) -> None:
    """The report's reasons are printed by explain(): no environment values, home paths or credentials."""
    rep.reason = redact(rep.reason) if rep.reason else rep.reason
    rep.rejected = [redact(r) for r in rep.rejected]
    rep.outpaced = [redact(r) for r in rep.outpaced]
    rep.notes = [redact(r) for r in rep.notes]


def _rejection(ev: Evaluation) -> dict[str, str]:
    return {"digest": ev.candidate.digest, "origin": ev.candidate.origin, "reason": ev.verdict.reason}

