"""Correctness: a candidate must match the eager module on fresh inputs, every trial.

The candidate side (`run_trial`) is what runs where the candidate is: in the isolated worker for
new or foreign candidates. The judging side (`judge`) runs in the caller's process, against
references the candidate never sees.
"""
from __future__ import annotations

import math
import secrets
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from .specs import InputSpec
from .testdata import DISTRIBUTIONS, SPECIAL, make_inputs

Forward = Callable[..., Any]


@dataclass(frozen=True)
class Tolerance:
    rtol: float   # per element, relative to |reference|
    atol: float   # per element, relative to the reference's mean magnitude
    norm: float   # ||out - ref|| / ||ref||


TOLERANCES = {
    torch.float64: Tolerance(1e-7, 1e-9, 1e-9),
    torch.float32: Tolerance(1e-4, 1e-5, 1e-5),
    torch.float16: Tolerance(1e-2, 1e-3, 2e-3),
    torch.bfloat16: Tolerance(3e-2, 8e-3, 1e-2),
}


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


@dataclass
class Trial:
    """One set of fresh inputs; `ref_args`/`ref_kwargs` are the caller's private copies."""

    dist: str
    args: tuple
    kwargs: dict[str, Any]
    ref_args: tuple = ()
    ref_kwargs: dict[str, Any] = field(default_factory=dict)


class Mismatch(Exception):
    """A check failed; the message says which output, how and by how much."""


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def make_trials(spec: InputSpec, device: torch.device | str, seed: int | None = None,
                dists: Sequence[str] = (*DISTRIBUTIONS, SPECIAL)) -> list[Trial]:
    """Fresh inputs per distribution, from a secret seed unless one is given."""
    gen = torch.Generator().manual_seed(secrets.randbits(62) if seed is None else seed)
    trials = []
    for dist in dists:
        args, kwargs = make_inputs(spec, dist, gen, device)
        trials.append(Trial(dist, args, kwargs, tuple(_clone(a) for a in args),
                            {k: _clone(v) for k, v in kwargs.items()}))
    return trials


def _as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.detach()  # 0-dim too


def tensors_of(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]


def run_trial(candidate: Forward, args: tuple, kwargs: dict, state: Sequence[torch.Tensor], *,
              repeat: bool = False, sync: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Call the candidate once (twice with `repeat`) and report what it did, in plain data.

    Checked here, next to the candidate: inputs and state bit-identical after the call, outputs
    are fresh tensors that alias nothing, and a repeated call gives bit-identical outputs.
    """
    inputs = tensors_of(args, kwargs)
    before = [_bits(t).clone() for t in inputs]
    state_before = [_bits(t).clone() for t in state]
    try:
        outs = _as_tuple(candidate(*args, **kwargs))
        sync()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}
    result: dict[str, Any] = {"error": ""}
    bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
    if bad:
        return {"error": f"forward returned {', '.join(bad)} where tensors were expected"}
    result["inputs_changed"] = [i for i, (b, t) in enumerate(zip(before, inputs)) if not torch.equal(b, _bits(t))]
    result["state_changed"] = [i for i, (b, t) in enumerate(zip(state_before, state)) if not torch.equal(b, _bits(t))]
    protected = {t.untyped_storage().data_ptr() for t in (*inputs, *state) if t.numel()}
    seen: set[int] = set()
    result["alias"] = ""
    for i, o in enumerate(outs):
        p = o.untyped_storage().data_ptr() if o.numel() else None
        if p is not None and p in protected:
            result["alias"] = f"output {i} shares memory with an input or a parameter"
        elif p is not None and p in seen:
            result["alias"] = f"output {i} shares memory with another output"
        if p is not None:
            seen.add(p)
    result["repeat_equal"] = True
    if repeat:
        try:
            again = _as_tuple(candidate(*args, **kwargs))
            sync()
            result["repeat_equal"] = len(again) == len(outs) and all(
                isinstance(a, torch.Tensor) and a.shape == o.shape and a.dtype == o.dtype
                and torch.equal(_bits(a), _bits(o)) for a, o in zip(again, outs))
        except Exception as exc:
            return {"error": f"second call raised {type(exc).__name__}: {exc}"}
    result["devices"] = [str(o.device) for o in outs]
    result["strides"] = [list(o.stride()) for o in outs]
    result["outputs"] = [o.detach() for o in outs]
    return result


EAGER_ERROR_QUANTILE = 0.99


def _upper_quantile(values: torch.Tensor, q: float) -> float:
    """The q-quantile of a flat float64 tensor (kthvalue: no size limit, unlike torch.quantile)."""
    flat = values.flatten()
    k = min(max(1, math.ceil(q * flat.numel())), flat.numel())
    return flat.kthvalue(k).values.item()


def _close(o: torch.Tensor, r: torch.Tensor, tol: Tolerance) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(bad mask, abs error, allowed) of finite elements of o against r, both float64."""
    err = (o - r).abs()
    scale = r.abs().mean().item() if r.numel() else 0.0
    allowed = tol.atol * max(scale, 1e-30) + tol.rtol * r.abs()
    return err > allowed, err, allowed


def compare_output(out: Any, ref: torch.Tensor, where: str, ref64: torch.Tensor | None = None) -> dict[str, float]:
    """Raise Mismatch unless `out` matches eager `ref` in type, shape, dtype, device, NaN/Inf and values.

    With a float64 reference, an element also passes when it is within tolerance of the exact value
    plus twice eager's own error there, or twice eager's 99th-percentile error over the output where
    that is larger (eager's rounding is not the truth, and a correct kernel rounds elsewhere), and
    the error norm may be up to twice eager's.
    """
    if not isinstance(out, torch.Tensor):
        raise Mismatch(f"{where}: expected a tensor, got {type(out).__name__}")
    if out.shape != ref.shape:
        raise Mismatch(f"{where}: shape {tuple(out.shape)} != eager {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        raise Mismatch(f"{where}: dtype {out.dtype} != eager {ref.dtype}")
    if out.device != ref.device:
        raise Mismatch(f"{where}: device {out.device} != eager {ref.device}")
    if not ref.is_floating_point():
        if not torch.equal(out, ref):
            n = int((out != ref).sum())
            raise Mismatch(f"{where}: {n} of {ref.numel()} elements differ (exact dtype {ref.dtype})")
        return {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    o, r = out.detach().double(), ref.detach().double()
    if not torch.equal(torch.isnan(o), torch.isnan(r)):
        raise Mismatch(f"{where}: NaN positions differ ({int(torch.isnan(o).sum())} NaN vs eager "
                       f"{int(torch.isnan(r).sum())}; an unwritten output element is NaN)")
    inf_o, inf_r = torch.isinf(o), torch.isinf(r)
    if not torch.equal(inf_o, inf_r) or not torch.equal(o[inf_o], r[inf_r]):
        raise Mismatch(f"{where}: Inf positions or signs differ ({int(inf_o.sum())} vs eager {int(inf_r.sum())})")
    finite = torch.isfinite(r)
    o, r = o[finite], r[finite]
    if r.numel() == 0:
        return {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    tol = TOLERANCES.get(ref.dtype, TOLERANCES[torch.float32])
    bad, err, allowed = _close(o, r, tol)
    norm_limit = tol.norm
    x = None
    if ref64 is not None and torch.isfinite(ref64[finite]).all():
        x = ref64.detach().double()[finite]
        _, err64, allowed64 = _close(o, x, tol)
        # where eager itself is inaccurate (ill-conditioned inputs), being as far from the exact value
        # as twice eager's own error is as good as eager. Another correct order of operations rounds
        # differently element by element, so eager's error counts at its 99th percentile over the
        # output where that is larger than at the element itself; never looser than that.
        eager_err = (r - x).abs()
        floor = _upper_quantile(eager_err, EAGER_ERROR_QUANTILE)
        bad = bad & (err64 > allowed64 + 2 * eager_err.clamp(min=floor))
        x_norm = x.norm().item()
        if x_norm > 0:
            norm_limit = max(tol.norm, 2 * (r - x).norm().item() / x_norm)
    ref_norm = r.norm().item()
    norm_err = (o - r).norm().item() / ref_norm if ref_norm > 0 else (0.0 if err.max().item() == 0 else float("inf"))
    if x is not None and x.norm().item() > 0:
        norm_err = min(norm_err, (o - x).norm().item() / x.norm().item())
    stats = {"max_abs_err": err.max().item(), "norm_err": norm_err, "mismatch_fraction": bad.float().mean().item()}
    if bad.any():
        idx = int(torch.argmax(((err - allowed) * bad).flatten()))
        raise Mismatch(f"{where}: {int(bad.sum())} of {r.numel()} elements ({stats['mismatch_fraction']:.2%}) "
                       f"outside tolerance; worst at flat index {idx}: got {o.flatten()[idx].item():.6g}, "
                       f"eager {r.flatten()[idx].item():.6g} (max abs err {stats['max_abs_err']:.3g}, "
                       f"rtol {tol.rtol:g}, atol {tol.atol:g} x mean|eager| {r.abs().mean().item():.3g})")
    if norm_err > norm_limit:
        raise Mismatch(f"{where}: relative error norm {norm_err:.3g} exceeds {norm_limit:.3g}")
    return stats


def _passes(out: torch.Tensor, ref: torch.Tensor) -> bool:
    try:
        compare_output(out, ref, "trivial")
        return True
    except Mismatch:
        return False


def trivial_outputs(trial: Trial, refs: tuple) -> list[str]:
    """Names of trivial answers (zeros, ones, an input copy) that would pass this trial."""
    passing = []
    for i, r in enumerate(refs):
        if not isinstance(r, torch.Tensor):
            continue
        guesses = {"zeros": torch.zeros_like(r), "ones": torch.ones_like(r)}
        for j, t in enumerate(tensors_of(trial.ref_args, trial.ref_kwargs)):
            if t.shape == r.shape and t.dtype == r.dtype:
                guesses[f"a copy of input {j}"] = t.clone()
        passing += [f"output {i} = {name}" for name, g in guesses.items() if _passes(g, r)]
    return passing


def judge(trials: Sequence[Trial], results: Sequence[dict[str, Any]], reference: Forward,
          reference64: Forward | None = None) -> ValidationResult:
    """Compare each trial's candidate result with eager (and float64) references computed here."""
    worst = {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    weak: list[str] = []
    for n, (trial, res) in enumerate(zip(trials, results)):
        label = f"trial {n} ({trial.dist} inputs)"
        if res.get("error"):
            return ValidationResult(False, f"{label}: candidate raised {res['error']}", n,
                                    details={"traceback": res.get("traceback", "")})
        try:
            if res["inputs_changed"]:
                raise Mismatch(f"input {res['inputs_changed'][0]} was modified by the candidate")
            if res["state_changed"]:
                raise Mismatch(f"parameter/buffer {res['state_changed'][0]} was modified by the candidate")
            if res["alias"]:
                raise Mismatch(res["alias"])
            refs = _as_tuple(reference(*trial.ref_args, **trial.ref_kwargs))
            refs64 = _reference64(reference64, trial)
            outs = res["outputs"]
            if len(outs) != len(refs):
                raise Mismatch(f"{len(outs)} outputs, eager returns {len(refs)}")
            for i, (o, r) in enumerate(zip(outs, refs)):
                o = o.to(r.device) if res["devices"][i] == str(r.device) else o
                stats = compare_output(o, r, f"output {i}", refs64[i] if refs64 else None)
                if r.dim() and [s for s, d in zip(res["strides"][i], r.shape) if d > 1] != \
                        [s for s, d in zip(r.stride(), r.shape) if d > 1]:
                    raise Mismatch(f"output {i}: strides {tuple(res['strides'][i])} != eager {r.stride()}")
                for k in worst:
                    worst[k] = max(worst[k], stats[k])
            if not res["repeat_equal"]:
                ref_again = _as_tuple(reference(*trial.ref_args, **trial.ref_kwargs))
                if all(torch.equal(_bits(a), _bits(b)) for a, b in zip(refs, ref_again)):
                    raise Mismatch("two calls on the same inputs gave different outputs (eager is deterministic)")
            if trial.dist != SPECIAL:
                trivial = trivial_outputs(trial, refs)
                if trivial:
                    weak.append(f"{label}: {trivial[0]}")
        except Mismatch as exc:
            return ValidationResult(False, f"{label}: {exc}", n, worst["max_abs_err"], worst["norm_err"],
                                    worst["mismatch_fraction"])
    strong = [t for t in trials if t.dist != SPECIAL]
    if strong and len(weak) == len(strong):
        return ValidationResult(False, "degenerate problem: on every trial a trivial output would pass "
                                f"({weak[0]}), so no kernel can be proven correct", len(trials), degenerate=True)
    return ValidationResult(True, f"matched eager on {len(trials)} trials", len(trials), worst["max_abs_err"],
                            worst["norm_err"], worst["mismatch_fraction"], {"weak_trials": weak})


def spot_check(input_sets: Sequence[tuple[tuple, dict]], reference64: Forward | None = None) -> Any:
    """A bench.Check for outputs taken while timed: each matches eager within tolerance or, where that
    fails and a float64 reference exists, by the rule validation used (its float64 outputs are computed
    once per input set), so an ill-conditioned output is held to the proof's standard, no stricter."""
    refs: dict[int, tuple | None] = {}

    def check(k_out: Any, e_out: Any, label: str, which: int) -> None:
        ks, es = _as_tuple(k_out), _as_tuple(e_out)
        if len(ks) != len(es):
            raise Mismatch(f"{label}: {len(ks)} outputs, eager returns {len(es)}")
        for i, (k, e) in enumerate(zip(ks, es)):
            try:
                compare_output(k, e, f"{label}, output {i}")
            except Mismatch:
                if reference64 is None:
                    raise
                if which not in refs:
                    args, kwargs = input_sets[which]
                    refs[which] = _reference64(reference64, Trial("timed", args, kwargs, args, kwargs))
                if refs[which] is None:
                    raise
                compare_output(k, e, f"{label}, output {i}", refs[which][i])
    return check


def _reference64(reference64: Forward | None, trial: Trial) -> tuple | None:
    if reference64 is None:
        return None
    up = lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
    try:
        return _as_tuple(reference64(*[up(a) for a in trial.ref_args],
                                     **{k: up(v) for k, v in trial.ref_kwargs.items()}))
    except Exception:  # the eager op has no float64 kernel: the same-dtype reference stands alone
        return None


def validate(reference: Forward, candidate: Forward, spec: InputSpec, *, device: torch.device | str,
             state: Iterable[torch.Tensor] = (), reference64: Forward | None = None,
             dists: Sequence[str] | None = None, seed: int | None = None) -> ValidationResult:
    """Validate a trusted, in-process candidate (isolated candidates go through worker.py)."""
    trials = make_trials(spec, device, seed, dists) if dists is not None else make_trials(spec, device, seed)
    state = list(state)
    results = [run_trial(candidate, t.args, t.kwargs, state, repeat=(i == 0)) for i, t in enumerate(trials)]
    return judge(trials, results, reference, reference64)
