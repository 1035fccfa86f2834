"""The model-level proof of speed: after every call was decided alone, the whole model is timed as it runs.

Per-module gates time each call alone, between device synchronizations; in a running model launch time
overlaps with device work and a saving measured alone can vanish, or turn into a loss (each CUDA-graph
replay adds copies). So the optimized model is timed end to end against eager on the user's example
inputs: blocks of back-to-back calls with one synchronization each, the contenders in a balanced order
(every contender after every other equally often), eager also against itself for the noise. Where the
optimized model is not faster, module choices are dropped group by group (one group: the modules of one
class that run the same kind of thing), each kept only if the model without it is slower, and if it is
still slower than eager, every choice goes: the model is never left slower than eager, beyond the noise of
timing eager against itself (at least 2%: differences smaller than that are not acted on).
"""
from __future__ import annotations

import logging
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from .report import COVERED, OptimizeReport
from .core.specs import call_signature
from .proof.rotation import time_blocks
from .runtime.dispatch import dispatcher_of, eager_only, install, uninstall
from .whole_model import check_on_workload, set_everywhere

log = logging.getLogger(__name__)

MIN_ROUNDS = 6
MAX_ROUNDS = 16
BLOCK_TARGET_S = 0.02   # a block of back-to-back calls lasts at least this long (timer resolution, launch overlap)
MIN_NOISE = 0.02      # below this a difference is not acted on, whatever eager against itself showed
RETIME_NOISE = 0.25   # eager against itself straying more than this: the machine was busy; the stage is timed again
WHOLE = "whole-model torch.compile"
EVERYWHERE = "everywhere"  # the workload stage's outcome when the whole-model compile takes every call
DROPPED = "dropped: the whole model ran faster without it (end to end)"


@dataclass
class EndToEnd:
    """How the optimized model compared with eager, end to end, and what that changed."""

    eager_us: float
    optimized_us: float
    speedup: float                  # median over rounds of eager / optimized, per call
    self_noise: float               # eager / eager-again over the same rounds: half its IQR in log space, as a factor - 1
    rounds: int
    calls_per_block: int
    dropped: list[str] = field(default_factory=list)   # groups whose removal made the whole faster
    final_speedup: float | None = None                 # after drops, when any
    whole_speedup: float | None = None                 # the model compiled whole, when tried
    decision: str = ""
    outcome: str = "modules"                           # "whole", "modules" (some maybe dropped) or "eager"
    workload: dict[str, Any] | None = None             # the workload's own stage, when one was given
    cached: bool = False                               # applied from a model-level verdict this user's library made
    whole_with_kernels: bool = False                   # the whole-model compile chosen has our kernels in its graph
    with_kernels_speedup: float | None = None          # that variant's, when tried
    inconclusive: bool = False                         # eager against itself strayed past RETIME_NOISE, timed twice

    @property
    def remembered(self) -> bool:
        """Whether this verdict may be stored for later runs: not when the timing could not tell (a busy machine)."""
        return not self.inconclusive and not (self.workload or {}).get("inconclusive")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def describe(self) -> str:
        final = self.final_speedup if self.final_speedup is not None else self.speedup
        text = f"end to end: {final:.2f}x eager (self-noise ±{self.self_noise * 100:.1f}%, {self.rounds} rounds)"
        text += f"; {self.decision}" if self.decision else ""
        if not self.remembered:
            text += ("; inconclusive: eager timed against itself strayed too far (a busy machine), so the choices "
                     "made alone stand where no difference showed beyond that noise, and the verdict is not "
                     "remembered: the next optimize() times it again")
        w = self.workload or {}
        if w.get("decision") or w.get("final_speedup") or w.get("speedup"):
            text += f"; on the workload: {w.get('final_speedup') or w.get('speedup') or 1.0:.2f}x eager"
            text += f" ({w['decision']})" if w.get("decision") else ""
        return text


def time_contenders(contenders: dict[str, Callable[[], Any]], sync: Callable[[], None], budget_s: float,
                    min_rounds: int = MIN_ROUNDS) -> tuple[dict[str, list[float]], int]:
    """Per-call seconds of each contender per round: blocks of back-to-back calls, one sync per block, in
    proof/rotation.py's balanced order (each contender right after each other equally often)."""
    with torch.inference_mode():
        for fn in contenders.values():  # warm-up: first calls compile, allocate, fill caches
            fn()
        sync()
        t0 = time.perf_counter()
        for fn in contenders.values():
            fn()
        sync()
        per_call = max((time.perf_counter() - t0) / len(contenders), 1e-6)
        block = max(1, min(64, int(BLOCK_TARGET_S / per_call)))
        rounds = int(budget_s / (per_call * block * len(contenders)))
        rounds = max(min_rounds, min(MAX_ROUNDS, rounds))
        return time_blocks(contenders, block, rounds, sync), block


def _paired_median(a: list[float], b: list[float]) -> float:
    """Median over rounds of a / b (both timed in the same round)."""
    return statistics.median(x / y for x, y in zip(a, b) if y > 0)


def _log_noise(ratios: list[float]) -> float:
    """Half the interquartile range of log(ratio): how far eager timed against itself strays, as a factor
    (symmetric: 2x slower and 2x faster are the same distance)."""
    logs = [math.log(r) for r in ratios if r > 0]
    q = statistics.quantiles(logs, n=4) if len(logs) >= 2 else [0.0, 0.0, 0.0]
    return max((q[2] - q[0]) / 2, 0.0)


@contextmanager
def suspended(modules: Sequence[nn.Module]) -> Iterator[None]:
    """MODULES run their own forward inside the block; their dispatchers are put back afterwards."""
    saved = [(m, dispatcher_of(m)) for m in modules]
    for m, disp in saved:
        if disp is not None:
            del m.__dict__["forward"]
    try:
        yield
    finally:
        for m, disp in saved:
            if disp is not None:
                m.forward = disp


def choice_groups(model: nn.Module, report: OptimizeReport) -> dict[str, list[nn.Module]]:
    """The installed choices grouped by class and kind ("RMSNorm: compile"), largest saving last."""
    by_name = {name or type(model).__name__: m for name, m in model.named_modules()}
    groups: dict[str, list[nn.Module]] = {}
    for rep in report.modules:
        module = by_name.get(rep.name)
        if rep.status == "eager" or module is None or dispatcher_of(module) is None:
            continue
        group = groups.setdefault(f"{rep.module_class.rsplit('.', 1)[-1]}: {rep.status}", [])
        if not any(m is module for m in group):  # one module, several signatures (the example's, a decode step's)
            group.append(module)
    return groups


def prove_end_to_end(model: nn.Module, args: tuple, kwargs: dict[str, Any], report: OptimizeReport,
                     sync: Callable[[], None], budget_s: float, whole: Any = None,
                     workload: Callable[[nn.Module], Any] | None = None,
                     whole_with_kernels: Any = None, fresh_whole: Callable[[], Any] | None = None,
                     decide_later: Callable[[], None] | None = None) -> EndToEnd | None:
    """Time the optimized MODEL against eager on its example inputs; drop choices that make it slower.
    WHOLE: the model compiled whole (whole_model.prove_whole_model), proven, timed in the same rotation and
    installed for the example's call signature when it beats both eager and the per-module choices.
    WORKLOAD: the model run as the application runs it (a short generate()); when given, the per-module
    choices left after that are timed on it too (its decode steps included) and dropped where they slow it.
    DECIDE_LATER: decides the workload's own calls (decode steps); called only when the model compiled whole
    does not take every call of the workload, so their proofs are not paid for where it does."""
    groups = choice_groups(model, report)
    if not groups and whole is None:
        return None
    try:
        result = _prove(model, args, kwargs, report, sync, budget_s, groups, whole, with_kernels=whole_with_kernels)
        if result.whole_with_kernels:
            whole = whole_with_kernels  # the variant that won is the one the workload stage may spread
        if workload is None:
            return result
        # the workload's calls are mostly others than the example's (decode steps): its own stage judges the
        # per-module choices on it; a whole-model compile installed for the example's signature stays
        per_module = _groups(model, report)
        # the model compiled whole for every call, decode steps included, proven on the workload first. Its own
        # compiled code: the decode steps' shapes make dynamo recompile it shape-generic, which must not
        # replace the static graph the example's signature runs (FRESH_WHOLE makes one; WHOLE itself otherwise)
        everywhere, why_not = (fresh_whole() if fresh_whole is not None else whole) if whole is not None else None, ""
        if everywhere is not None:
            why_not = check_on_workload(model, everywhere, workload)
            everywhere = None if why_not else everywhere
        if decide_later is not None:
            if everywhere is not None:  # first without the workload's own per-module decisions
                w = _prove(model, args, kwargs, report, sync, budget_s, per_module, None, workload, everywhere)
                result.workload = _workload_summary(w)
                result.inconclusive |= w.inconclusive  # the whole model was judged on it for every call
                result.dropped += [d for d in w.dropped if d not in result.dropped]
                if w.outcome == EVERYWHERE:
                    return result
                why_not = (f"{w.whole_speedup:.2f}x eager on it, per-module choices {w.final_speedup or w.speedup:.2f}x"
                           if w.whole_speedup else "")
                everywhere = None
            decide_later()
            per_module = _groups(model, report)
        if not per_module and everywhere is None:
            if why_not:
                result.workload = {**(result.workload or {}), "decision": f"{WHOLE} not used for the workload: {why_not}"}
            return result
        w = _prove(model, args, kwargs, report, sync, budget_s, per_module, None, workload, everywhere)
        result.workload = _workload_summary(w)
        if why_not:
            result.workload["decision"] += f"; {WHOLE} not used for the workload: {why_not}"
        if w.outcome == EVERYWHERE:
            return result
        result.dropped += [d for d in w.dropped if d not in result.dropped]
        if result.outcome != "whole" and not _groups(model, report):
            result.outcome, result.final_speedup = "eager", 1.0
        log.info("metal_accel: end to end on the workload: %.2fx eager%s", w.final_speedup or w.speedup,
                 f" ({w.decision})" if w.decision else "")
        return result
    finally:
        _reset_counters(model.modules())  # the dispatchers' counters are the user's calls, not these


def _workload_summary(w: EndToEnd) -> dict[str, Any]:
    return {k: getattr(w, k) for k in ("eager_us", "optimized_us", "speedup", "self_noise", "rounds", "final_speedup",
                                       "whole_speedup", "decision", "outcome", "inconclusive")}


def _reset_counters(modules: Iterable[nn.Module]) -> None:
    for m in modules:
        disp = dispatcher_of(m)
        if disp is not None:
            disp.hits = disp.misses = 0


def _was_hit(modules: Sequence[nn.Module]) -> bool:
    return any((disp := dispatcher_of(m)) is not None and disp.hits > 0 for m in modules)


def _groups(model: nn.Module, report: OptimizeReport) -> dict[str, list[nn.Module]]:
    """The installed per-module choices: choice_groups without the model's own call (a whole-model compile)."""
    out = {name: [m for m in mods if m is not model] for name, mods in choice_groups(model, report).items()}
    return {name: mods for name, mods in out.items() if mods}


def _prove(model: nn.Module, args: tuple, kwargs: dict[str, Any], report: OptimizeReport,
           sync: Callable[[], None], budget_s: float, groups: dict[str, list[nn.Module]], whole: Any,
           workload: Callable[[nn.Module], Any] | None = None, everywhere: Any = None,
           with_kernels: Any = None) -> EndToEnd:
    """One stage: the example call (WORKLOAD None) or the workload, timed with GROUPS installed; whole-model
    compile, when given, in the same rotation: WHOLE for the example call, EVERYWHERE (proven on the workload)
    taking every call of the workload."""

    def run() -> Any:
        return model(*args, **kwargs) if workload is None else workload(model)

    def run_eager() -> Any:
        with eager_only():
            return model(*args, **kwargs) if workload is None else workload(model)

    contenders: dict[str, Callable[[], Any]] = {"eager": run_eager, "eager_again": run_eager}
    if groups:
        contenders["optimized"] = run
    if whole is not None:
        contenders["whole"] = lambda: whole(args, kwargs, [])
    if with_kernels is not None:
        contenders["with_kernels"] = lambda: with_kernels(args, kwargs, [])
    if everywhere is not None and workload is not None:
        def run_everywhere() -> Any:
            set_everywhere(model, everywhere)
            try:
                return workload(model)
            finally:
                set_everywhere(model, None)
        contenders["whole"] = run_everywhere
    for mods in groups.values():
        _reset_counters(mods)
    samples, block = time_contenders(contenders, sync, budget_s)
    # a choice no call of this stage reached (a decode-step signature, timed on the example call) is not judged by it
    idle = {name for name, mods in groups.items() if not _was_hit(mods)}
    if idle:
        log.info("metal_accel: end to end: %s not reached by %s; judged only where they run", ", ".join(sorted(idle)),
                 "the example call" if workload is None else "the workload")
        groups = {name: mods for name, mods in groups.items() if name not in idle}
    log_noise = _log_noise([a / b for a, b in zip(samples["eager"], samples["eager_again"]) if b > 0])
    if math.expm1(log_noise) > RETIME_NOISE:  # other work stalled the rounds: once more, longer, before deciding
        log.info("metal_accel: end to end: eager against itself strayed ±%.0f%%; timed again", math.expm1(log_noise) * 100)
        samples, block = time_contenders(contenders, sync, 2 * budget_s, min_rounds=2 * MIN_ROUNDS)
        log_noise = _log_noise([a / b for a, b in zip(samples["eager"], samples["eager_again"]) if b > 0])
    noise = math.exp(log_noise) - 1
    speedup = _paired_median(samples["eager"], samples["optimized"]) if groups else 1.0
    optimized = samples["optimized"] if groups else samples["eager"]
    result = EndToEnd(statistics.median(samples["eager"]) * 1e6, statistics.median(optimized) * 1e6,
                      speedup, noise, len(samples["eager"]), block, inconclusive=noise > RETIME_NOISE)
    if result.inconclusive:
        log.warning("metal_accel: end to end: eager against itself strayed ±%.0f%% twice (a busy machine); the "
                    "verdict is not remembered", noise * 100)
    tolerance = max(log_noise, math.log1p(MIN_NOISE))  # as a log ratio: what eager against itself shows

    def slower(ratio: float) -> bool:  # ratio = eager-like / contender; below 1 beyond the noise
        return math.log(ratio) < -tolerance
    if everywhere is not None and "whole" in samples:
        result.whole_speedup = _paired_median(samples["eager"], samples["whole"])
        log.info("metal_accel: end to end on the workload: %s for every call %.2fx eager, per-module choices %.2fx",
                 WHOLE, result.whole_speedup, speedup)
        if slower(_paired_median(samples["whole"], optimized)) and slower(1 / result.whole_speedup):
            set_everywhere(model, everywhere)
            result.final_speedup = result.whole_speedup
            result.decision = (f"{WHOLE} takes every call (proven on the workload, its decode steps included): "
                               f"{result.whole_speedup:.2f}x eager on it (per-module choices: {speedup:.2f}x)")
            result.outcome = EVERYWHERE
            _mark_whole(model, report, result.whole_speedup)
            return result
    elif whole is not None:
        result.whole_speedup = _paired_median(samples["eager"], samples["whole"])
        if "with_kernels" in samples:
            result.with_kernels_speedup = _paired_median(samples["eager"], samples["with_kernels"])
            log.info("metal_accel: end to end: %s with our kernels inside %.2fx eager", WHOLE,
                     result.with_kernels_speedup)
            if slower(_paired_median(samples["with_kernels"], samples["whole"])):  # beats the plain compile
                whole, samples["whole"] = with_kernels, samples["with_kernels"]
                result.whole_speedup, result.whole_with_kernels = result.with_kernels_speedup, True
        log.info("metal_accel: end to end: %s %.2fx eager, per-module choices %.2fx", WHOLE, result.whole_speedup,
                 speedup)
        # installed when faster than the per-module choices and than eager, both beyond the noise
        if slower(_paired_median(samples["whole"], optimized)) and slower(1 / result.whole_speedup):
            install(model, call_signature(args, kwargs), whole)
            result.final_speedup = result.whole_speedup
            result.decision = (f"{WHOLE}{' with our kernels inside' if result.whole_with_kernels else ''} installed "
                               f"for the example's call signature: {result.whole_speedup:.2f}x "
                               f"eager (per-module choices: {speedup:.2f}x)")
            result.outcome = "whole"
            _mark_whole(model, report, result.whole_speedup)
            return result
    log.info("metal_accel: end to end on %s: per-module choices %.2fx eager (self-noise ±%.1f%%)",
             "the example inputs" if workload is None else "the workload", speedup, noise * 100)
    if not groups or not slower(speedup):
        return result
    for name, modules in sorted(groups.items(), key=lambda kv: len(kv[1])):
        trial, _ = time_contenders({"with": run, "without": _without(run, modules)}, sync, budget_s / 2)
        if slower(_paired_median(trial["without"], trial["with"])):  # the model is faster without this group
            for m in modules:
                uninstall(m)
            result.dropped.append(name)
            log.info("metal_accel: dropped %s: the model ran faster without it", name)
    result.final_speedup = speedup
    if result.dropped and _groups(model, report):
        final, _ = time_contenders({"eager": run_eager, "optimized": run}, sync, budget_s / 2)
        result.final_speedup = _paired_median(final["eager"], final["optimized"])
    if slower(result.final_speedup):
        for name, modules in _groups(model, report).items():
            if name in idle:
                continue
            for m in modules:
                uninstall(m)
            result.dropped.append(name)
        result.decision = (f"every module choice {'this call reaches ' if idle else ''}dropped: the optimized model "
                           f"ran {result.final_speedup:.2f}x eager")
        if not idle:
            result.outcome = "eager"
    elif result.dropped:
        result.decision = "dropped " + ", ".join(result.dropped)
    if not _groups(model, report):
        result.final_speedup = 1.0  # eager, as it is
        result.outcome = "eager"
    _mark_dropped(model, report)
    return result


def apply_verdict(model: nn.Module, args: tuple, kwargs: dict[str, Any], report: OptimizeReport,
                  outcome: str, dropped: Sequence[str], made: dict[str, Any],
                  whole: Callable[[], Any]) -> EndToEnd:
    """Do what an earlier end-to-end stage decided for this model (store/model_verdicts.py), without timing:
    install WHOLE() (the model compiled whole; it compiles at its first call), drop the DROPPED groups, or
    drop every choice. MADE: that stage's EndToEnd.to_dict(), reported as it was measured then."""
    fields = {k: made[k] for k in EndToEnd.__dataclass_fields__ if k in made}
    result = EndToEnd(**{"eager_us": 0.0, "optimized_us": 0.0, "speedup": 1.0, "self_noise": 0.0, "rounds": 0,
                         "calls_per_block": 0, **fields})
    result.cached, result.outcome = True, outcome
    if outcome == "whole":
        install(model, call_signature(args, kwargs), whole())
        _mark_whole(model, report, result.whole_speedup or result.final_speedup or 1.0)
    if (result.workload or {}).get("outcome") == EVERYWHERE:
        set_everywhere(model, whole())  # its own compiled code (see prove_end_to_end)
        _mark_whole(model, report, result.workload.get("final_speedup") or 1.0)
    for name, modules in _groups(model, report).items():
        if outcome == "eager" or name in dropped:
            for m in modules:
                uninstall(m)
    _mark_dropped(model, report)
    result.decision = (result.decision + "; " if result.decision else "") + \
        "as decided by an earlier optimize() of this model here (model-level verdict, not timed again)"
    return result


def _mark_whole(model: nn.Module, report: OptimizeReport, speedup: float) -> None:
    """The model's own row runs the whole-model compile now (for the example's call signature)."""
    root = type(model).__name__
    for rep in report.modules:
        if rep.name == root:
            rep.status, rep.source, rep.speedup = "compile", f"builtin:{WHOLE}", speedup
            rep.reason = f"{WHOLE}: {speedup:.2f}x eager end to end (model_choice)"


def _without(run: Callable[[], Any], modules: Sequence[nn.Module]) -> Callable[[], Any]:
    def call() -> Any:
        with suspended(modules):
            return run()
    return call


def _mark_dropped(model: nn.Module, report: OptimizeReport) -> None:
    """Reports of choices no longer installed say so, and so do the calls they covered."""
    by_name = {name or type(model).__name__: m for name, m in model.named_modules()}
    for rep in report.modules:
        module = by_name.get(rep.name)
        if rep.status != "eager" and module is not None and dispatcher_of(module) is None:
            rep.rejected.append(f"{rep.status} ({rep.reason}): {DROPPED}")
            rep.status, rep.reason = "eager", DROPPED
    for rep in report.modules:
        if rep.reason != COVERED:
            continue
        covering = [r for r in report.modules if r.status != "eager" and r is not rep
                    and (by_name.get(r.name) is model or rep.name.startswith(r.name + "."))]
        if not covering:
            rep.reason = "eager: the module that covered it was dropped end to end (not decided alone)"
