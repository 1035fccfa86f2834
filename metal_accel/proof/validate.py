"""Correctness: a candidate must match the eager module on fresh inputs, every trial.

The candidate side (`run_trial`) is what runs where the candidate is: in the isolated worker for
new or foreign candidates. The judging side (`judge`) runs in the caller's process, against
references the candidate never sees.
"""
from __future__ import annotations

import functools
import logging
import math
import secrets
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch.utils import _pytree

from ..core import config
from ..core.specs import InputSpec, input_tensors, output_tensors
from .compare import Mismatch, compare_output
from .precision import FLOAT32_DEFAULT, PrecisionRule, recorded_call, rule_for
from .testdata import (
    DISTRIBUTIONS,
    EXTREMES,
    ROW_KINDS,
    SPECIAL,
    STRUCTURED,
    make_inputs,
)
from .trial_buffers import input_copies, input_violation, next_fill, proof_call

log = logging.getLogger(__name__)

Forward = Callable[..., Any]


@dataclass
class ValidationResult:
    ok: bool
    reason: str
    trials: int = 0
    max_abs_err: float = 0.0
    max_norm_err: float = 0.0
    mismatch_fraction: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    degenerate: bool = False  # every trial also passed with a trivial output: not a proof (see perturb.py)
    precision: PrecisionRule | None = None  # the rule the outputs were judged by (precision.py)


@dataclass
class Trial:
    """One set of fresh inputs; `ref_args`/`ref_kwargs` are what the references run on: private copies
    where the candidate runs in this process, else the same tensors (the worker gets copies)."""

    dist: str
    args: tuple
    kwargs: dict[str, Any]
    ref_args: tuple = ()
    ref_kwargs: dict[str, Any] = field(default_factory=dict)


TrialPlan = Sequence[tuple[InputSpec, str]]  # (input spec, distribution) per trial, in order
RunTrials = Callable[[list[Trial]], list[dict[str, Any]] | str]  # the candidate's results, or why it could not run


def default_dists(spec: InputSpec) -> tuple[str, ...]:
    """The random distributions, special values, values at the dtype's extremes and structured rows: two
    structured trials where the first tensor has fewer rows than there are ROW_KINDS, so more kinds meet
    the candidate."""
    tensors = spec.tensor_specs()
    shape = tensors[0].shape if tensors else ()
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    return (*DISTRIBUTIONS, SPECIAL, EXTREMES, STRUCTURED) + ((STRUCTURED,) if rows < len(ROW_KINDS) else ())


def trial_plan(spec: InputSpec, dists: Sequence[str] | None = None) -> list[tuple[InputSpec, str]]:
    """(SPEC, distribution) per trial: DISTS, or default_dists(SPEC)."""
    return [(spec, d) for d in (default_dists(spec) if dists is None else dists)]


def spec_bytes(spec: InputSpec) -> int:
    """Bytes of one trial's tensors (known before any is made)."""
    return sum(math.prod(s.shape) * torch.empty((), dtype=s.torch_dtype).element_size()
               for s in spec.tensor_specs())


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def new_trial(spec: InputSpec, dist: str, gen: torch.Generator, device: torch.device | str,
              copies: bool = True) -> Trial:
    args, kwargs = make_inputs(spec, dist, gen, device)
    if not copies:
        return Trial(dist, args, kwargs, args, kwargs)
    return Trial(dist, args, kwargs, tuple(_clone(a) for a in args), {k: _clone(v) for k, v in kwargs.items()})


def make_trials(spec: InputSpec, device: torch.device | str, seed: int | None = None,
                dists: Sequence[str] | None = None) -> list[Trial]:
    """Fresh inputs per distribution (default_dists unless given), from a secret seed unless one is given."""
    gen = torch.Generator().manual_seed(secrets.randbits(62) if seed is None else seed)
    return [new_trial(spec, dist, gen, device) for dist in (default_dists(spec) if dists is None else dists)]


def trial_batches(plan: TrialPlan, device: torch.device | str, *, copies: bool, max_bytes: int,
                  seed: int | None = None) -> Iterator[list[Trial]]:
    """The plan's trials, made a batch at a time: as many as fit in MAX_BYTES of inputs (one at least),
    so a proof holds one batch of large inputs at a time, never all of them."""
    gen = torch.Generator().manual_seed(secrets.randbits(62) if seed is None else seed)
    start = 0
    while start < len(plan):
        end, size = start + 1, spec_bytes(plan[start][0])
        while end < len(plan) and size + spec_bytes(plan[end][0]) <= max_bytes:
            size += spec_bytes(plan[end][0])
            end += 1
        yield [new_trial(spec, dist, gen, device, copies) for spec, dist in plan[start:end]]
        start = end


def _as_tuple(out: Any) -> tuple:
    """A call's output tensors: containers (tuples with None, ModelOutput) walked, None left out."""
    return tuple(output_tensors(out))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.detach()  # 0-dim too


def tensors_of(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return input_tensors(args, kwargs)  # tensors inside tuples, lists and dicts included


def run_trial(candidate: Forward, args: tuple, kwargs: dict, state: Sequence[torch.Tensor], *,
              repeat: bool = False, sync: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Call the candidate once (twice with `repeat`) and report what it did, in plain data.

    Checked here, next to the candidate, after every call: no byte written outside any buffer the host
    code allocated or outside an input (each is fenced by guard regions, trial_buffers.py), inputs and
    state bit-identical, outputs fresh tensors that alias nothing but maybe an input (the judge allows it where
    eager's output aliases that input too); a repeated call gives bit-identical outputs. The values of
    inputs it changed come back (`inputs_after`), to be judged against eager's own change of them. The candidate gets fenced copies of ARGS and KWARGS (the originals are the reference for
    "unchanged"), and its allocations get this call's fill (next_fill: plain, noise or leftover); the
    repeat always gets fresh noise, so an element left unwritten differs between the two calls.
    """
    gen = torch.Generator().manual_seed(secrets.randbits(62))
    originals = tensors_of(args, kwargs)
    args = tuple(input_copies(args, gen))
    kwargs = dict(zip(kwargs, input_copies(list(kwargs.values()), gen)))
    inputs = tensors_of(args, kwargs)
    state_before = [_bits(t).clone() for t in state]
    sources = [*inputs, *state]

    def call(fill: str) -> tuple[tuple, str]:
        with proof_call(fill, sources) as bufs:
            outs = _as_tuple(candidate(*args, **kwargs))
            sync()
        tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        return outs, (bufs.violations(tensors) or input_violation(inputs, "input")
                      or input_violation(list(state), "parameter/buffer"))

    def changed() -> tuple[list[int], list[int]]:
        return ([i for i, (b, t) in enumerate(zip(originals, inputs)) if not torch.equal(_bits(b), _bits(t))],
                [i for i, (b, t) in enumerate(zip(state_before, state)) if not torch.equal(b, _bits(t))])
    try:
        outs, oob = call(next_fill())
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}
    result: dict[str, Any] = {"error": "", "out_of_bounds": oob}
    bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
    if bad:
        return {"error": f"forward returned {', '.join(bad)} where tensors were expected"}
    result["inputs_changed"], result["state_changed"] = changed()
    result["inputs_after"] = {i: inputs[i].detach().clone() for i in result["inputs_changed"]}
    input_ptrs = {t.untyped_storage().data_ptr(): j for j, t in enumerate(inputs) if t.numel()}
    protected = {t.untyped_storage().data_ptr() for t in state if t.numel()}
    seen: set[int] = set()
    result["alias"], result["input_aliases"] = "", []
    for i, o in enumerate(outs):
        p = o.untyped_storage().data_ptr() if o.numel() else None
        if p is not None and p in protected:
            result["alias"] = f"output {i} shares memory with a parameter"
        elif p is not None and p in input_ptrs:
            result["input_aliases"].append([i, input_ptrs[p]])
        elif p is not None and p in seen:
            result["alias"] = f"output {i} shares memory with another output"
        if p is not None:
            seen.add(p)
    result["repeat_equal"] = True
    if repeat and not (oob or result["inputs_changed"] or result["state_changed"]):
        try:
            again, oob = call("noise")
        except Exception as exc:
            return {"error": f"second call raised {type(exc).__name__}: {exc}"}
        result["out_of_bounds"] = oob
        result["inputs_changed"], result["state_changed"] = changed()
        result["repeat_equal"] = len(again) == len(outs) and all(
            isinstance(a, torch.Tensor) and a.shape == o.shape and a.dtype == o.dtype
            and torch.equal(_bits(a), _bits(o)) for a, o in zip(again, outs))
    result["devices"] = [str(o.device) for o in outs]
    result["strides"] = [list(o.stride()) for o in outs]
    result["outputs"] = [o.detach() for o in outs]
    return result


def _passes(out: torch.Tensor, ref: torch.Tensor, rule: PrecisionRule) -> bool:
    try:
        compare_output(out, ref, "trivial", first_failure=True, rule=rule)
        return True
    except Mismatch:
        return False


def trivial_outputs(trial: Trial, refs: tuple, rule: PrecisionRule = FLOAT32_DEFAULT) -> list[str]:
    """Names of trivial answers (zeros, ones, an input copy) that would pass this trial."""
    def guesses(r: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:  # one at a time: each is as large as r
        yield "zeros", torch.zeros_like(r)
        yield "ones", torch.ones_like(r)
        for j, t in enumerate(tensors_of(trial.ref_args, trial.ref_kwargs)):
            if t.shape == r.shape and t.dtype == r.dtype:
                yield f"a copy of input {j}", t
    passing = []
    for i, r in enumerate(refs):
        if not isinstance(r, torch.Tensor):
            continue
        for name, g in guesses(r):
            if _passes(g, r, rule):
                passing.append(f"output {i} = {name}")
            del g  # before the next guess is made
    return passing


class Judge:
    """Compares trials' candidate results with eager (and float64) references computed here, one
    trial at a time as they come; `result()` is the verdict once every trial has passed.

    The precision rule (precision.py) is PRECISION's ("eager" or "compile"; default: the settings'),
    made from the float32 ops eager's first call runs and the user's flags now. Eager runs on a copy
    of the first trial's inputs: where it changes an input in place, the candidate must leave that input
    as eager leaves it (later trials are then copied too); an input eager leaves alone must stay as it was.
    """

    def __init__(self, reference: Forward, reference64: Forward | None = None, precision: str | None = None) -> None:
        self.reference, self.reference64 = reference, reference64
        self.precision = precision or config.current().precision
        self.rule: PrecisionRule | None = None
        self.eager_inplace: bool | None = None  # None until the first trial shows whether eager changes inputs
        self.count = 0
        self.strong = 0
        self.weak: list[str] = []
        self.worst = {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}

    def add(self, trial: Trial, res: dict[str, Any]) -> ValidationResult | None:
        """None if the candidate passed this trial, else the failed verdict."""
        n, worst = self.count, self.worst
        label = f"trial {n} ({trial.dist} inputs)"
        if res.get("error"):
            return ValidationResult(False, f"{label}: candidate raised {res['error']}", n,
                                    details={"traceback": res.get("traceback", "")})
        try:
            self._check(trial, res, label)
        except Mismatch as exc:
            return ValidationResult(False, f"{label}: {exc}", n, worst["max_abs_err"], worst["norm_err"],
                                    worst["mismatch_fraction"], precision=self.rule)
        self.count += 1
        return None

    def _check(self, trial: Trial, res: dict[str, Any], label: str) -> None:
        if res.get("out_of_bounds"):
            raise Mismatch(res["out_of_bounds"])
        if res["state_changed"]:
            raise Mismatch(f"parameter/buffer {res['state_changed'][0]} was modified by the candidate")
        if res["alias"]:
            raise Mismatch(res["alias"])
        refs, eager_after, eager_aliases = self._eager(trial)
        _check_inputs(res, eager_after, eager_aliases)
        refs64 = functools.cache(lambda: _reference64(self.reference64, trial))
        outs = res["outputs"]
        if len(outs) != len(refs):
            raise Mismatch(f"{len(outs)} outputs, eager returns {len(refs)}")
        assert self.rule is not None
        for i, (o, r) in enumerate(zip(outs, refs)):
            o = o.to(r.device) if res["devices"][i] == str(r.device) else o
            stats = compare_or_float64(o, r, f"output {i}", refs64, i, self.rule)
            if r.dim() and [s for s, d in zip(res["strides"][i], r.shape) if d > 1] != \
                    [s for s, d in zip(r.stride(), r.shape) if d > 1]:
                raise Mismatch(f"output {i}: strides {tuple(res['strides'][i])} != eager {r.stride()}")
            for k in self.worst:
                self.worst[k] = max(self.worst[k], stats[k])
        if not res["repeat_equal"]:
            ref_again = _as_tuple(self.reference(*trial.ref_args, **trial.ref_kwargs))
            if all(torch.equal(_bits(a), _bits(b)) for a, b in zip(refs, ref_again)):
                raise Mismatch("two calls on the same inputs gave different outputs (eager is deterministic; the "
                               "output buffers held other values before each call, so an element left unwritten "
                               "shows this way)")
        if trial.dist != SPECIAL:
            self.strong += 1
            trivial = trivial_outputs(trial, refs, self.rule)
            if trivial:
                self.weak.append(f"{label}: {trivial[0]}")

    def _eager(self, trial: Trial) -> tuple[tuple, dict[int, torch.Tensor], dict[int, int]]:
        """Eager's outputs on the trial's reference inputs, the inputs it changed in place (index -> value
        after) and its outputs that alias an input (output -> input). Where eager may change inputs, it runs
        with their values saved and put back after, so every later reference sees the trial's inputs."""
        tensors = tensors_of(trial.ref_args, trial.ref_kwargs)
        saved = [t.clone() for t in tensors] if self.eager_inplace is not False else None
        if self.rule is None:
            out, ops = recorded_call(self.reference, trial.ref_args, trial.ref_kwargs)
            self.rule = rule_for(ops, self.precision)
        else:
            out = self.reference(*trial.ref_args, **trial.ref_kwargs)
        refs = _as_tuple(out)
        ptrs = {t.untyped_storage().data_ptr(): j for j, t in enumerate(tensors) if t.numel()}
        aliases = {i: ptrs[r.untyped_storage().data_ptr()] for i, r in enumerate(refs)
                   if isinstance(r, torch.Tensor) and r.numel() and r.untyped_storage().data_ptr() in ptrs}
        if saved is None:
            return refs, {}, aliases
        changed = [j for j, (b, t) in enumerate(zip(saved, tensors)) if not torch.equal(_bits(b), _bits(t))]
        if self.eager_inplace is None:
            self.eager_inplace = bool(changed)
        if changed:  # outputs that alias a changed input keep eager's values when the input is put back
            refs = tuple(r.clone() if i in aliases else r for i, r in enumerate(refs))
        after = {j: tensors[j].clone() for j in changed}
        for j in changed:
            tensors[j].copy_(saved[j])
        return refs, after, aliases

    def result(self) -> ValidationResult:
        """The verdict after every trial passed: a proof, or degenerate where a trivial output passed them all."""
        if self.strong and len(self.weak) == self.strong:
            return ValidationResult(False, "degenerate problem: on every trial a trivial output would pass "
                                    f"({self.weak[0]}), so no kernel can be proven correct", self.count,
                                    degenerate=True, precision=self.rule)
        worst = self.worst
        details: dict[str, Any] = {"weak_trials": self.weak}
        if self.rule is not None:
            details["precision"] = self.rule.describe()
        if self.eager_inplace:
            details["inplace"] = "eager changes its input in place; the candidate changed it the same way"
        return ValidationResult(True, f"matched eager on {self.count} trials", self.count, worst["max_abs_err"],
                                worst["norm_err"], worst["mismatch_fraction"], details, precision=self.rule)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exactly equal, NaN as NaN (its payload aside) and -0 as 0."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])


def _check_inputs(res: dict[str, Any], eager_after: dict[int, torch.Tensor], eager_aliases: dict[int, int]) -> None:
    """The candidate's inputs left as eager leaves them: each input eager changes in place changed exactly as
    eager changed it, every other input unchanged; an output may alias an input only where eager's does."""
    changed = set(res["inputs_changed"])
    for j in sorted(changed - set(eager_after)):
        raise Mismatch(f"input {j} was modified by the candidate")
    for j in sorted(set(eager_after) - changed):
        raise Mismatch(f"input {j} is changed in place by eager, but the candidate left it as it was")
    after = res.get("inputs_after", {})
    for j in sorted(changed):
        got = after.get(j)
        if got is None or not _same_values(got.to(eager_after[j].device), eager_after[j]):
            raise Mismatch(f"input {j} is changed in place by eager, and the candidate changed it otherwise")
    for i, j in res.get("input_aliases", []):
        if eager_aliases.get(i) != j:
            raise Mismatch(f"output {i} shares memory with input {j}" + (", as eager's does not" if i not in
                           eager_aliases else f", where eager's shares memory with input {eager_aliases[i]}"))


def judge(trials: Sequence[Trial], results: Sequence[dict[str, Any]], reference: Forward,
          reference64: Forward | None = None) -> ValidationResult:
    """Judge every trial's candidate result (see Judge); the first failure is the verdict."""
    judge_ = Judge(reference, reference64)
    for trial, res in zip(trials, results):
        failed = judge_.add(trial, res)
        if failed is not None:
            return failed
    return judge_.result()


def run_and_judge(batches: Iterable[list[Trial]], run: RunTrials, judge_: Judge) -> ValidationResult | str:
    """Run each batch of trials (RUN: the candidate's results, or why it could not run) and judge it
    before the next batch is made; the first failure ends the proof. A str is a failure to run."""
    t0 = time.perf_counter()
    for batch in batches:
        failed = _run_batch(batch, run, judge_)
        log.debug("metal_accel: trials %s made, run and judged in %.1f s", ", ".join(t.dist for t in batch),
                  time.perf_counter() - t0)
        t0 = time.perf_counter()
        del batch  # before the next batch is made
        if failed is not None:
            return failed
    return judge_.result()


def _run_batch(batch: list[Trial], run: RunTrials, judge_: Judge) -> ValidationResult | str | None:
    results = run(batch)
    if isinstance(results, str):
        return results
    for trial, res in zip(batch, results):
        failed = judge_.add(trial, res)
        if failed is not None:
            return failed
    return None


def default_rule() -> PrecisionRule:
    """The rule for outputs checked without the proof's recorded rule at hand: float32's tolerance, or
    torch.compile's own check where the settings ask for it."""
    return PrecisionRule("compile") if config.current().precision == "compile" else FLOAT32_DEFAULT


def spot_check(input_sets: Sequence[tuple[tuple, dict]], reference64: Forward | None = None,
               rule: PrecisionRule | None = None) -> Any:
    """A bench.Check for outputs taken while timed: each matches eager within tolerance or, where that
    fails and a float64 reference exists, by the rule validation used (its float64 outputs are computed
    once per input set), so an ill-conditioned output is held to the proof's standard, no stricter. RULE:
    the proof's precision rule (ValidationResult.precision); without one, float32's tolerance, or
    torch.compile's check where the settings ask for it."""
    rule = rule or default_rule()
    @functools.cache
    def refs64(which: int) -> tuple | None:
        args, kwargs = input_sets[which]
        return _reference64(reference64, Trial("timed", args, kwargs, args, kwargs))

    def check(k_out: Any, e_out: Any, label: str, which: int) -> None:
        ks, es = _as_tuple(k_out), _as_tuple(e_out)
        if len(ks) != len(es):
            raise Mismatch(f"{label}: {len(ks)} outputs, eager returns {len(es)}")
        for i, (k, e) in enumerate(zip(ks, es)):
            compare_or_float64(k, e, f"{label}, output {i}", lambda: refs64(which), i, rule)
    return check


def compare_or_float64(out: Any, ref: torch.Tensor, where: str, refs64: Callable[[], tuple | None],
                        i: int, rule: PrecisionRule = FLOAT32_DEFAULT) -> dict[str, float]:
    """compare_output by RULE, and where the plain check fails, again by the float64 rule (which only ever
    passes more): REFS64 (the float64 outputs, None where there are none) is run only then. A failure
    names the precision rule."""
    try:
        return compare_output(out, ref, where, rule=rule)
    except Mismatch as plain:
        exact = refs64()
        try:
            if not exact:
                raise
            return compare_output(out, ref, where, exact[i], rule=rule)
        except Mismatch as exc:
            raise Mismatch(f"{exc} [precision rule {rule.describe()}]") from plain


def to_float64(value: Any) -> Any:
    """VALUE with every floating tensor in it (containers walked: (cos, sin) too) as a float64 copy, the
    float64 reference's inputs; a copy even of float64 tensors, so a module that changes its input in place
    leaves the caller's as it was."""
    return _pytree.tree_map_only(torch.Tensor, lambda t: t.to(torch.float64, copy=True) if t.is_floating_point()
                                 else t, value)


def _reference64(reference64: Forward | None, trial: Trial) -> tuple | None:
    if reference64 is None:
        return None
    args, kwargs = to_float64((tuple(trial.ref_args), dict(trial.ref_kwargs)))
    try:
        return _as_tuple(reference64(*args, **kwargs))
    except Exception:  # the eager op has no float64 kernel: the same-dtype reference stands alone
        return None


def validate(reference: Forward, candidate: Forward, spec: InputSpec, *, device: torch.device | str,
             state: Iterable[torch.Tensor] = (), reference64: Forward | None = None,
             dists: Sequence[str] | None = None, seed: int | None = None) -> ValidationResult:
    """Validate a trusted, in-process candidate (isolated candidates go through worker.py)."""
    trials = make_trials(spec, device, seed, dists)
    state = list(state)
    results = [run_trial(candidate, t.args, t.kwargs, state, repeat=(i == 0)) for i, t in enumerate(trials)]
    return judge(trials, results, reference, reference64)
