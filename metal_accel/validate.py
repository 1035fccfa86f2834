"""Correctness: a candidate must match the eager module on fresh inputs, every trial."""
from __future__ import annotations

import secrets
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from .specs import InputSpec
from .testdata import DISTRIBUTIONS, make_inputs

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
EXACT = Tolerance(0.0, 0.0, 0.0)


@dataclass
class ValidationResult:
    ok: bool
    reason: str
    trials: int = 0
    max_abs_err: float = 0.0
    max_norm_err: float = 0.0
    mismatch_fraction: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


class Mismatch(Exception):
    """A check failed; the message says which output, how and by how much."""


def _as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8) if t.numel() else t.detach()


def tensors_of(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]


def compare_output(out: Any, ref: torch.Tensor, where: str) -> dict[str, float]:
    """Raise Mismatch unless `out` matches `ref` in type, shape, dtype, device, NaN/Inf and values."""
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
        raise Mismatch(f"{where}: Inf positions or signs differ")
    finite = torch.isfinite(r)
    o, r = o[finite], r[finite]
    if r.numel() == 0:
        return {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    tol = TOLERANCES.get(ref.dtype, TOLERANCES[torch.float32])
    err = (o - r).abs()
    scale = r.abs().mean().item()
    allowed = tol.atol * max(scale, 1e-30) + tol.rtol * r.abs()
    bad = err > allowed
    ref_norm = r.norm().item()
    norm_err = (o - r).norm().item() / ref_norm if ref_norm > 0 else (0.0 if err.max().item() == 0 else float("inf"))
    stats = {"max_abs_err": err.max().item(), "norm_err": norm_err, "mismatch_fraction": bad.float().mean().item()}
    if bad.any():
        idx = int(torch.argmax((err - allowed).flatten()))
        raise Mismatch(f"{where}: {int(bad.sum())} of {r.numel()} elements ({stats['mismatch_fraction']:.2%}) "
                       f"outside tolerance; worst at flat index {idx}: got {o.flatten()[idx].item():.6g}, "
                       f"eager {r.flatten()[idx].item():.6g} (max abs err {stats['max_abs_err']:.3g}, "
                       f"rtol {tol.rtol:g}, atol {tol.atol:g} x mean|eager| {scale:.3g})")
    if norm_err > tol.norm:
        raise Mismatch(f"{where}: relative error norm {norm_err:.3g} exceeds {tol.norm:g}")
    return stats


def _check_storage(outs: tuple, protected: Iterable[torch.Tensor]) -> None:
    ptrs = {t.untyped_storage().data_ptr() for t in protected if t.numel()}
    seen: set[int] = set()
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor) or not o.numel():
            continue
        p = o.untyped_storage().data_ptr()
        if p in ptrs:
            raise Mismatch(f"output {i} shares memory with an input or a parameter")
        if p in seen:
            raise Mismatch(f"output {i} shares memory with another output")
        seen.add(p)


def validate(reference: Forward, candidate: Forward, spec: InputSpec, *, device: torch.device | str,
             state: Iterable[torch.Tensor] = (), trials: Iterable[str] = DISTRIBUTIONS,
             seed: int | None = None) -> ValidationResult:
    """Run `candidate` and `reference` on fresh inputs per trial and compare every output.

    `candidate` should allocate through the sandbox's poisoned namespace so unwritten memory is NaN.
    `state` holds the module's parameters and buffers, which must come out of every call unchanged.
    """
    seed = secrets.randbits(62) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    state = list(state)
    state_before = [_bits(t).clone() for t in state]
    worst = {"max_abs_err": 0.0, "norm_err": 0.0, "mismatch_fraction": 0.0}
    done = 0
    for trial, dist in enumerate(trials):
        args, kwargs = make_inputs(spec, dist, gen, device)
        ref_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        ref_kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        inputs_before = [_bits(t).clone() for t in tensors_of(args, kwargs)]
        try:
            outs = _as_tuple(candidate(*args, **kwargs))
        except Exception as exc:
            return ValidationResult(False, f"trial {trial} ({dist} inputs): candidate raised "
                                    f"{type(exc).__name__}: {exc}", done,
                                    details={"traceback": traceback.format_exc(limit=4)})
        try:
            for i, (before, t) in enumerate(zip(inputs_before, tensors_of(args, kwargs))):
                if not torch.equal(before, _bits(t)):
                    raise Mismatch(f"input {i} was modified by the candidate")
            for i, (before, t) in enumerate(zip(state_before, state)):
                if not torch.equal(before, _bits(t)):
                    raise Mismatch(f"parameter/buffer {i} was modified by the candidate")
            _check_storage(outs, [*tensors_of(args, kwargs), *state])
            refs = _as_tuple(reference(*ref_args, **ref_kwargs))
            if len(outs) != len(refs):
                raise Mismatch(f"{len(outs)} outputs, eager returns {len(refs)}")
            for i, (o, r) in enumerate(zip(outs, refs)):
                stats = compare_output(o, r, f"output {i}")
                for k in worst:
                    worst[k] = max(worst[k], stats[k])
            if trial == 0:
                again = _as_tuple(candidate(*args, **kwargs))
                ref_again = _as_tuple(reference(*ref_args, **ref_kwargs))
                deterministic = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(refs, ref_again))
                if deterministic and not all(torch.equal(_bits(a), _bits(b)) for a, b in zip(outs, again)):
                    raise Mismatch("two calls on the same inputs gave different outputs (eager is deterministic)")
        except Mismatch as exc:
            return ValidationResult(False, f"trial {trial} ({dist} inputs): {exc}", done,
                                    worst["max_abs_err"], worst["norm_err"], worst["mismatch_fraction"])
        done += 1
    return ValidationResult(True, f"matched eager on {done} trials", done, worst["max_abs_err"],
                            worst["norm_err"], worst["mismatch_fraction"])
