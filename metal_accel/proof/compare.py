"""Output comparison: does a candidate's output match eager's, within tolerances per dtype?

Exact dtypes must be equal; floating outputs must agree in NaN and Inf positions and be close
elsewhere, judged against a float64 reference where there is one, so eager's own rounding error
is not mistaken for the truth. Outputs are compared a chunk at a time, so the float64 temporaries
take a few chunks' memory, not many times the output's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch


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
                   first_failure: bool = False) -> dict[str, float]:
    """Raise Mismatch unless `out` matches eager `ref` in type, shape, dtype, device, NaN/Inf and values.

    With a float64 reference, an element also passes when it is within tolerance of the exact value
    plus twice eager's own error there, or twice eager's 99th-percentile error over the output where
    that is larger (eager's rounding is not the truth, and a correct kernel rounds elsewhere), and
    the error norm may be up to twice eager's. That rule only ever passes more, so it is applied only
    where the plain check fails (the returned norm error is then the smaller of the two). With
    `first_failure` and no float64 reference, it stops at the first chunk with an element out of
    tolerance, whose message then counts that chunk's only: enough to tell that a guess fails.
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
    scale, any_special = _check_special_values(o, r, where)
    tol = TOLERANCES.get(ref.dtype, TOLERANCES[torch.float32])
    plain = _Sums()
    for s, e in _spans(r):
        finite = torch.isfinite(r[s:e]) if any_special else None
        oc, rc = _finite64(o[s:e], finite), _finite64(r[s:e], finite)
        err, allowed = torch.sub(oc, rc).abs_(), _allowed(rc, tol, scale)
        plain.add(err, rc, err > allowed, allowed, s, finite)
        if first_failure and plain.bad and ref64 is None:
            break
    if plain.count == 0:
        return {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    norm_err = _ratio(plain.err_norm, plain.ref_norm, plain.max_err)
    n_bad, worst, norm_limit = plain.bad, plain.worst[1], tol.norm
    if ref64 is not None and (n_bad or norm_err > norm_limit):
        exact = _exact_rule(o, r, ref64.detach().reshape(-1), tol, scale, any_special)
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


def _check_special_values(o: torch.Tensor, r: torch.Tensor, where: str) -> tuple[float, bool]:
    """Raise unless NaN and Inf sit at the same places (Infs of the same sign); return the mean |eager|
    over its finite elements (the scale of atol) and whether it has any NaN or Inf."""
    total, count, special = 0.0, 0, False
    for s, e in _spans(r):
        oc, rc = o[s:e], r[s:e]
        nan_o, nan_r = torch.isnan(oc), torch.isnan(rc)
        if not torch.equal(nan_o, nan_r):
            raise Mismatch(f"{where}: NaN positions differ ({_count(torch.isnan, o)} NaN vs eager "
                           f"{_count(torch.isnan, r)}; an unwritten output element is NaN)")
        inf_o, inf_r = torch.isinf(oc), torch.isinf(rc)
        if not torch.equal(inf_o, inf_r) or not torch.equal(oc[inf_o], rc[inf_r]):
            raise Mismatch(f"{where}: Inf positions or signs differ ({_count(torch.isinf, o)} vs eager "
                           f"{_count(torch.isinf, r)})")
        finite = ~(nan_r | inf_r)
        if bool(finite.all()):
            total += rc.double().abs().sum().item()
            count += rc.numel()
        else:
            special = True
            total += rc[finite].double().abs().sum().item()
            count += int(finite.sum())
    return (total / count if count else 0.0), special


def _exact_rule(o: torch.Tensor, r: torch.Tensor, x: torch.Tensor, tol: Tolerance, scale: float,
                any_special: bool) -> tuple[int, int, float, float] | None:
    """(bad count, worst flat index, norm limit, norm error against X) by the float64 rule of compare_output,
    or None where the float64 reference X is not finite wherever eager is."""
    masks = [torch.isfinite(r[s:e]) if any_special else None for s, e in _spans(r)]
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
