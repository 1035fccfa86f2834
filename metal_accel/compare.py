"""Output comparison: does a candidate's output match eager's, within tolerances per dtype?

Exact dtypes must be equal; floating outputs must agree in NaN and Inf positions and be close
elsewhere, judged against a float64 reference where there is one, so eager's own rounding error
is not mistaken for the truth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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


class Mismatch(Exception):
    """A check failed; the message says which output, how and by how much."""


EAGER_ERROR_QUANTILE = 0.99


def _upper_quantile(values: torch.Tensor, q: float) -> float:
    """The q-quantile of a flat float64 tensor (kthvalue: no size limit, unlike torch.quantile)."""
    flat = values.flatten()
    k = min(max(1, math.ceil(q * flat.numel())), flat.numel())
    return flat.kthvalue(k).values.item()


def _close(o: torch.Tensor, r: torch.Tensor, tol: Tolerance) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bad mask, abs error, allowed) of finite elements of o against r, both float64."""
    err = torch.sub(o, r).abs_()
    allowed = r.abs()
    scale = allowed.mean().item() if r.numel() else 0.0
    allowed.mul_(tol.rtol).add_(tol.atol * max(scale, 1e-30))
    return err > allowed, err, allowed


def compare_output(out: Any, ref: torch.Tensor, where: str, ref64: torch.Tensor | None = None) -> dict[str, float]:
    """Raise Mismatch unless `out` matches eager `ref` in type, shape, dtype, device, NaN/Inf and values.

    With a float64 reference, an element also passes when it is within tolerance of the exact value
    plus twice eager's own error there, or twice eager's 99th-percentile error over the output where
    that is larger (eager's rounding is not the truth, and a correct kernel rounds elsewhere), and
    the error norm may be up to twice eager's. That rule only ever passes more, so it is applied only
    where the plain check fails (the returned norm error is then the smaller of the two).
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
    o, r = out.detach(), ref.detach()
    nan_o, nan_r = torch.isnan(o), torch.isnan(r)
    if not torch.equal(nan_o, nan_r):
        raise Mismatch(f"{where}: NaN positions differ ({int(nan_o.sum())} NaN vs eager "
                       f"{int(nan_r.sum())}; an unwritten output element is NaN)")
    inf_o, inf_r = torch.isinf(o), torch.isinf(r)
    if not torch.equal(inf_o, inf_r) or not torch.equal(o[inf_o], r[inf_r]):
        raise Mismatch(f"{where}: Inf positions or signs differ ({int(inf_o.sum())} vs eager {int(inf_r.sum())})")
    finite: torch.Tensor | None = ~(nan_r | inf_r)
    del nan_o, nan_r, inf_o, inf_r
    if bool(finite.all()):  # the common case: no masked copies
        o, r, finite = o.double(), r.double(), None
    else:
        o, r = o[finite].double(), r[finite].double()
    if r.numel() == 0:
        return {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    tol = TOLERANCES.get(ref.dtype, TOLERANCES[torch.float32])
    bad, err, allowed = _close(o, r, tol)
    max_err = err.max().item()
    ref_norm = r.norm().item()
    norm_err = err.norm().item() / ref_norm if ref_norm > 0 else (0.0 if max_err == 0 else float("inf"))
    norm_limit = tol.norm
    x = None
    if ref64 is not None and (bool(bad.any()) or norm_err > norm_limit):
        x = ref64.detach().double()
        x = x if finite is None else x[finite]
        x = x if bool(torch.isfinite(x).all()) else None
    if x is not None:
        _, err64, allowed64 = _close(o, x, tol)
        # where eager itself is inaccurate (ill-conditioned inputs), being as far from the exact value
        # as twice eager's own error is as good as eager. Another correct order of operations rounds
        # differently element by element, so eager's error counts at its 99th percentile over the
        # output where that is larger than at the element itself; never looser than that.
        eager_err = torch.sub(r, x).abs_()
        floor = _upper_quantile(eager_err, EAGER_ERROR_QUANTILE)
        bad = bad & (err64 > allowed64.add_(eager_err.clamp_(min=floor).mul_(2)))
        del err64, allowed64
        x_norm = x.norm().item()
        if x_norm > 0:
            norm_limit = max(tol.norm, 2 * torch.sub(r, x).norm().item() / x_norm)
            norm_err = min(norm_err, torch.sub(o, x).norm().item() / x_norm)
    n_bad = int(bad.sum())
    stats = {"max_abs_err": max_err, "norm_err": norm_err, "mismatch_fraction": n_bad / bad.numel()}
    if n_bad:
        idx = int(torch.argmax(((err - allowed) * bad).flatten()))
        raise Mismatch(f"{where}: {n_bad} of {r.numel()} elements ({stats['mismatch_fraction']:.2%}) "
                       f"outside tolerance; worst at flat index {idx}: got {o.flatten()[idx].item():.6g}, "
                       f"eager {r.flatten()[idx].item():.6g} (max abs err {stats['max_abs_err']:.3g}, "
                       f"rtol {tol.rtol:g}, atol {tol.atol:g} x mean|eager| {r.abs().mean().item():.3g})")
    if norm_err > norm_limit:
        raise Mismatch(f"{where}: relative error norm {norm_err:.3g} exceeds {norm_limit:.3g}")
    return stats
