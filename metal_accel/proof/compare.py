"""Output comparison: does a candidate's output match eager's, within tolerances per dtype?

Exact dtypes must be equal; floating outputs must agree in NaN and Inf positions and be close
elsewhere, judged against a float64 reference where there is one, so eager's own rounding error
is not mistaken for the truth; a NaN or Inf where eager has another value passes only where the float64
reference agrees with the candidate (eager's own float32 arithmetic overflowed there). Which tolerances
apply follows the precision rule (precision.py): eager's under the user's flags, or torch.compile's own
check. Outputs are compared a chunk at a time, so the float64 temporaries
take a few chunks' memory, not many times the output's.
"""
from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from .precision import (
    COMPILE_TOL,
    FLOAT32_DEFAULT,
    TOLERANCES,
    PrecisionRule,
    Tolerance,
)

__all__ = ["TOLERANCES", "Mismatch", "Tolerance", "compare_output"]


EAGER_ERROR_QUANTILE = 0.99
# elements compared at a time: on the CPU, per thread, so each thread's float64 temporaries stay in its
# cache; on a GPU, enough for few launches
CHUNK_NUMEL = {"cpu": 1 << 15, "other": 1 << 22}


class Mismatch(Exception):
    """A check failed; the message says which output, how and by how much."""


def _spans(t: torch.Tensor) -> Iterator[tuple[int, int]]:
    """(start, end) of each chunk of flat T."""
    n = t.numel()
    step = CHUNK_NUMEL["cpu"] * max(1, torch.get_num_threads()) if t.device.type == "cpu" else CHUNK_NUMEL["other"]
    return ((s, min(s + step, n)) for s in range(0, n, step))


def _count(pred: Any, *flat: torch.Tensor) -> int:
    """How many elements PRED holds for, over flat tensors of one size, counted a chunk at a time."""
    return sum(int(pred(*(t[s:e] for t in flat)).sum()) for s, e in _spans(flat[0]))


def _finite64(t: torch.Tensor, finite: torch.Tensor | None) -> torch.Tensor:
    return t.double() if finite is None else t[finite].double()


def _upper_quantile(values: torch.Tensor, q: float) -> float:
    """The q-quantile of a flat float64 tensor, which this may reorder (on the CPU it is selected in place,
    no copy; kthvalue elsewhere: no size limit, unlike torch.quantile)."""
    k = min(max(1, math.ceil(q * values.numel())), values.numel())
    if values.device.type == "cpu":
        flat = values.numpy()
        flat.partition(k - 1)
        return float(flat[k - 1])
    return values.kthvalue(k).values.item()


def _allowed(r: torch.Tensor, tol: Tolerance, scale: float) -> torch.Tensor:
    return r.abs().mul_(tol.rtol).add_(tol.atol * max(scale, 1e-30))


class _Sums:
    """Running totals over the chunks of one comparison (norms combined with hypot: no overflow)."""

    def __init__(self) -> None:
        self.count = self.bad = 0
        self.max_err = self.err_norm = self.ref_norm = 0.0
        self.worst = (-math.inf, -1)  # (err - allowed, flat index) of the worst bad element

    def add(self, err: torch.Tensor, ref: torch.Tensor, bad: torch.Tensor, allowed: torch.Tensor, start: int,
            finite: torch.Tensor | None) -> None:
        """One chunk, from flat index START; FINITE: which of its elements these are (None: all)."""
        if not err.numel():
            return
        self.count += err.numel()
        self.max_err = max(self.max_err, err.max().item())
        self.err_norm = math.hypot(self.err_norm, err.norm().item())
        self.ref_norm = math.hypot(self.ref_norm, ref.norm().item())
        n_bad = int(bad.sum())
        if n_bad:
            self.bad += n_bad
            excess = torch.where(bad, err - allowed, -math.inf)
            i = int(torch.argmax(excess))
            if excess[i].item() > self.worst[0]:
                at = start + (i if finite is None else int(finite.nonzero()[i]))
                self.worst = (excess[i].item(), at)


def compare_output(out: Any, ref: torch.Tensor, where: str, ref64: torch.Tensor | None = None,
                   first_failure: bool = False, rule: PrecisionRule = FLOAT32_DEFAULT) -> dict[str, float]:
    """Raise Mismatch unless `out` matches eager `ref` in type, shape, dtype, device, NaN/Inf and values.

    Tolerances are RULE's (precision.py): eager's for the output's dtype under the user's flags, or, for
    the "compile" rule, torch.compile's own accuracy check (_compile_rule). With a float64 reference, an
    element also passes when it is within tolerance of the exact value plus twice eager's own error there,
    or twice eager's 99th-percentile error over the output where that is larger (eager's rounding is not
    the truth, and a correct kernel rounds elsewhere), and the error norm may be up to twice eager's; a NaN
    or Inf where eager has something else passes where the float64 reference has the candidate's value.
    That rule only ever passes more, so it is applied only where the plain check fails (the returned norm
    error is then the smaller of the two). With `first_failure` and no float64 reference, it stops at the
    first chunk with an element out of tolerance, whose message then counts that chunk's only: enough to
    tell that a guess fails.
    """
    if not isinstance(out, torch.Tensor):
        raise Mismatch(f"{where}: expected a tensor, got {type(out).__name__}")
    if out.shape != ref.shape:
        raise Mismatch(f"{where}: shape {tuple(out.shape)} != eager {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        raise Mismatch(f"{where}: dtype {out.dtype} != eager {ref.dtype}")
    if out.device != ref.device:
        raise Mismatch(f"{where}: device {out.device} != eager {ref.device}")
    o, r = out.detach().reshape(-1), ref.detach().reshape(-1)  # views, unless a layout is not contiguous
    if not ref.is_floating_point():
        if not torch.equal(o, r):
            raise Mismatch(f"{where}: {_count(torch.ne, o, r)} of {ref.numel()} elements differ "
                           f"(exact dtype {ref.dtype})")
        return {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    x = None if ref64 is None else ref64.detach().reshape(-1)
    tol = rule.tolerance(ref.dtype)
    scale, any_special = _check_special_values(o, r, where, x, tol)
    if rule.compile:
        return _compile_rule(o, r, x, where, any_special, first_failure)
    plain = _Sums()
    for s, e in _spans(r):
        finite = _both_finite(o, r, s, e) if any_special else None
        oc, rc = _finite64(o[s:e], finite), _finite64(r[s:e], finite)
        err, allowed = torch.sub(oc, rc).abs_(), _allowed(rc, tol, scale)
        plain.add(err, rc, err > allowed, allowed, s, finite)
        if first_failure and plain.bad and x is None:
            break
    if plain.count == 0:
        return {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    norm_err = _ratio(plain.err_norm, plain.ref_norm, plain.max_err)
    n_bad, worst, norm_limit = plain.bad, plain.worst[1], tol.norm
    if x is not None and (n_bad or norm_err > norm_limit):
        exact = _exact_rule(o, r, x, tol, scale, any_special)
        if exact is not None:
            n_bad, worst, norm_limit, norm64 = exact
            norm_err = min(norm_err, norm64)
    stats = {"max_abs_err": plain.max_err, "norm_err": norm_err, "mismatch_fraction": n_bad / plain.count}
    if n_bad:
        raise Mismatch(f"{where}: {n_bad} of {plain.count} elements ({stats['mismatch_fraction']:.2%}) "
                       f"outside tolerance; worst at flat index {worst}: got {o[worst].item():.6g}, "
                       f"eager {r[worst].item():.6g} (max abs err {stats['max_abs_err']:.3g}, "
                       f"rtol {tol.rtol:g}, atol {tol.atol:g} x mean|eager| {scale:.3g})")
    if norm_err > norm_limit:
        raise Mismatch(f"{where}: relative error norm {norm_err:.3g} exceeds {norm_limit:.3g}")
    return stats


def _ratio(num: float, den: float, max_err: float) -> float:
    return num / den if den > 0 else (0.0 if max_err == 0 else float("inf"))


def _both_finite(o: torch.Tensor, r: torch.Tensor, s: int, e: int) -> torch.Tensor:
    """Which elements of chunk [S, E) are finite in both (they differ only where a special value was disputed
    and the float64 reference sided with the candidate)."""
    return torch.isfinite(r[s:e]) & torch.isfinite(o[s:e])


def _check_special_values(o: torch.Tensor, r: torch.Tensor, where: str, x: torch.Tensor | None,
                          tol: Tolerance) -> tuple[float, bool]:
    """Raise unless NaN and Inf sit at the same places (Infs of the same sign), or, with the float64
    reference X, differ only where X has the candidate's value (_sides_with): eager's float32 arithmetic broke
    down there (an intermediate overflowed, or another summation order met Inf - Inf), the candidate's did not.
    Return the mean |eager| over elements finite in both (the scale of atol) and whether any are not."""
    total, count, special = 0.0, 0, False
    x_scale: float | None = None
    for s, e in _spans(r):
        oc, rc = o[s:e], r[s:e]
        nan_o, nan_r = torch.isnan(oc), torch.isnan(rc)
        inf_o, inf_r = torch.isinf(oc), torch.isinf(rc)
        disputed = (nan_o != nan_r) | (inf_o != inf_r) | (inf_o & inf_r & (oc != rc))
        if bool(disputed.any()):
            what = "NaN positions" if not torch.equal(nan_o, nan_r) else "Inf positions or signs"
            counts = (f"{_count(torch.isnan, o)} NaN vs eager {_count(torch.isnan, r)}; an unwritten output "
                      "element is NaN" if what == "NaN positions"
                      else f"{_count(torch.isinf, o)} vs eager {_count(torch.isinf, r)}")
            if x is None:
                raise Mismatch(f"{where}: {what} differ ({counts})")
            if x_scale is None:
                x_scale = _finite_mean_abs(x)
            exact = _sides_with(oc[disputed], x[s:e][disputed], tol, x_scale)
            if not bool(exact.all()):
                raise Mismatch(f"{where}: {what} differ ({counts}), and the float64 reference does not side "
                               f"with the candidate at {int((~exact).sum())} of {int(disputed.sum())} of them")
        finite = ~(nan_r | inf_r | nan_o | inf_o)
        if bool(finite.all()):
            total += rc.double().abs().sum().item()
            count += rc.numel()
        else:
            special = True
            total += rc[finite].double().abs().sum().item()
            count += int(finite.sum())
    return (total / count if count else 0.0), special


def _sides_with(o: torch.Tensor, x: torch.Tensor, tol: Tolerance, x_scale: float) -> torch.Tensor:
    """Where candidate values O have the float64 reference X's value: both NaN, the Inf that X rounds to
    in O's dtype (an exact value beyond the dtype's range overflows), or finite and within tolerance of X
    with atol scaled by X_SCALE, as finite elements are judged (_exact_rule): a dot product whose large
    terms cancel is as exact as its float32 sum can be, not to the last ulp of the exact value."""
    od, rounded = o.double(), x.to(o.dtype).double()
    return (torch.isnan(od) & torch.isnan(x)) | (torch.isinf(od) & (od == rounded)) | (
        torch.isfinite(od) & torch.isfinite(x) & ((od - x).abs() <= _allowed(x, tol, x_scale)))


def _finite_mean_abs(x: torch.Tensor) -> float:
    """Mean |X| over X's finite elements (0 when none), a chunk at a time."""
    total, count = 0.0, 0
    for s, e in _spans(x):
        finite = torch.isfinite(x[s:e])
        total += x[s:e][finite].abs().sum().item()
        count += int(finite.sum())
    return total / count if count else 0.0


def _compile_rule(o: torch.Tensor, r: torch.Tensor, x: torch.Tensor | None, where: str, any_special: bool,
                  first_failure: bool) -> dict[str, float]:
    """torch.compile's own accuracy check (torch._dynamo.utils.same) over the elements finite in both:
    allclose at COMPILE_TOL absolute and relative, else, with the float64 reference X, an RMS error against
    X at most twice eager's (three times for half dtypes or under 1000 elements) plus COMPILE_TOL / 10.
    Special values were judged by the eager rule (torch's check stops judging once both outputs hold a NaN)."""
    count = bad = 0
    max_err = out_sq = ref_sq = x_sq = 0.0
    for s, e in _spans(r):
        finite = _both_finite(o, r, s, e) if any_special else None
        oc, rc = _finite64(o[s:e], finite), _finite64(r[s:e], finite)
        err = torch.sub(oc, rc).abs_()
        count += err.numel()
        if err.numel():
            max_err = max(max_err, err.max().item())
            bad += int((err > rc.abs().mul_(COMPILE_TOL).add_(COMPILE_TOL)).sum())
        if bad and first_failure and x is None:
            break
        if x is not None:
            xc = _finite64(x[s:e], finite)
            out_sq += torch.sub(oc, xc).square_().sum().item()
            ref_sq += torch.sub(rc, xc).square_().sum().item()
            x_sq += xc.square().sum().item()
    stats = {"max_abs_err": max_err, "norm_err": 0.0, "mismatch_fraction": bad / count if count else 0.0}
    if not bad:
        return stats
    if x is None or not math.isfinite(out_sq + ref_sq):
        raise Mismatch(f"{where}: {bad} of {count} elements ({stats['mismatch_fraction']:.2%}) outside allclose "
                       f"at {COMPILE_TOL:g} (max abs err {max_err:.3g}) and no finite float64 reference to "
                       "judge the RMS error by (precision rule 'compile')")
    out_rmse, ref_rmse = math.sqrt(out_sq / count), math.sqrt(ref_sq / count)
    stats["norm_err"] = math.sqrt(out_sq / x_sq) if x_sq > 0 else (0.0 if out_sq == 0 else math.inf)
    multiplier = 3.0 if r.dtype in (torch.float16, torch.bfloat16) or r.numel() < 1000 else 2.0
    if out_rmse > multiplier * ref_rmse + COMPILE_TOL / 10:
        raise Mismatch(f"{where}: RMS error vs float64 {out_rmse:.3g} exceeds {multiplier:g} x eager's "
                       f"{ref_rmse:.3g} + {COMPILE_TOL / 10:g} (precision rule 'compile'; {bad} of {count} "
                       f"elements outside allclose at {COMPILE_TOL:g})")
    return stats


def _exact_rule(o: torch.Tensor, r: torch.Tensor, x: torch.Tensor, tol: Tolerance, scale: float,
                any_special: bool) -> tuple[int, int, float, float] | None:
    """(bad count, worst flat index, norm limit, norm error against X) by the float64 rule of compare_output,
    or None where the float64 reference X is not finite wherever eager is."""
    masks = [_both_finite(o, r, s, e) if any_special else None for s, e in _spans(r)]
    n_finite = sum(int(m.sum()) for m in masks) if any_special else r.numel()
    eager_err = torch.empty(n_finite, dtype=torch.float64, device=r.device)
    at, x_abs, x_norm, eager_norm, out_norm = 0, 0.0, 0.0, 0.0, 0.0
    for (s, e), finite in zip(_spans(r), masks):
        xc = _finite64(x[s:e], finite)
        if not bool(torch.isfinite(xc).all()):
            return None
        rc, oc = _finite64(r[s:e], finite), _finite64(o[s:e], finite)
        chunk = eager_err[at:at + xc.numel()]
        torch.sub(rc, xc, out=chunk).abs_()
        at += xc.numel()
        x_abs += xc.abs().sum().item()
        x_norm = math.hypot(x_norm, xc.norm().item())
        eager_norm = math.hypot(eager_norm, chunk.norm().item())
        out_norm = math.hypot(out_norm, torch.sub(oc, xc).norm().item())
    if not n_finite:
        return None
    floor = _upper_quantile(eager_err, EAGER_ERROR_QUANTILE)  # reorders eager_err
    del eager_err
    x_scale = x_abs / n_finite  # the exact value's own mean magnitude scales atol against it
    sums = _Sums()
    for (s, e), finite in zip(_spans(r), masks):
        # where eager itself is inaccurate (ill-conditioned inputs), being as far from the exact value
        # as twice eager's own error is as good as eager. Another correct order of operations rounds
        # differently element by element, so eager's error counts at its 99th percentile over the
        # output where that is larger than at the element itself; never looser than that.
        oc, rc, xc = _finite64(o[s:e], finite), _finite64(r[s:e], finite), _finite64(x[s:e], finite)
        err, allowed = torch.sub(oc, rc).abs_(), _allowed(rc, tol, scale)
        slack = torch.sub(rc, xc).abs_().clamp_(min=floor).mul_(2)
        bad = (err > allowed) & (torch.sub(oc, xc).abs_() > _allowed(xc, tol, x_scale).add_(slack))
        sums.add(err, rc, bad, allowed, s, finite)
    norm_limit = max(tol.norm, 2 * eager_norm / x_norm) if x_norm > 0 else tol.norm
    return sums.bad, sums.worst[1], norm_limit, (out_norm / x_norm if x_norm > 0 else math.inf)
