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
