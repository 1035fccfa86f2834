"""Which precision rule judges a candidate: as strict as eager under the user's own PyTorch settings, or what
torch.compile itself accepts.

Eager is allowed a reduced internal precision for some float32 ops by the user's flags: TF32 for cuDNN
convolutions (`torch.backends.cudnn.allow_tf32`, on by default), TF32 or bfloat16 for matmuls
(`torch.get_float32_matmul_precision()` "high" or "medium"), and oneDNN's own on the CPU
(`torch.backends.mkldnn.{conv,matmul}.fp32_precision`). Where eager ran such an op on float32 data, its
float32 outputs carry that precision's error, and which algorithm cuDNN picks (one with tensor cores or
not) depends on shape and memory layout, so eager's own error can be that large on another layout. The
"eager" rule then gives those outputs a tolerance in units u of that precision's roundoff (TF32: 2^-11,
bfloat16: 2^-8): 16u per element (relative, and against the output's mean magnitude) and 4u for the
relative error norm, never less than float32's. A product of two rounded factors is off by up to 2u and a
sum's error stays a few u of the output's scale, with tails: on an H100, eager's own TF32 convolution
(cuDNN, then GELU) was 0.63u off in norm and 9u at its worst element of 16M against float64. The "compile" rule is the accuracy check of
torch's own benchmark suite (`torch._dynamo.utils.same`): allclose at 1e-4 absolute and relative, else an
RMS error against the float64 reference at most twice eager's (three times for half dtypes or outputs
under 1000 elements) plus 1e-5.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


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
PRECISIONS = ("eager", "compile")
UNIT_ROUNDOFF = {"tf32": 2.0 ** -11, "bf16": 2.0 ** -8}  # internal precisions eager may be allowed
ELEMENT_UNITS, NORM_UNITS = 16, 4
COMPILE_TOL = 1e-4  # torch._dynamo.utils.same's default tol

CONV, MATMUL = "convolution", "matmul"
_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation", "einsum",
               "tensordot", "bilinear", "_trilinear", "scaled_dot_product_attention",
               "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
               "_scaled_dot_product_cudnn_attention", "_efficient_attention_forward", "_flash_attention_forward"}
_CONV_PREFIXES = ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose", "cudnn_convolution",
                  "mkldnn_convolution", "miopen_convolution", "_conv_depthwise", "conv_depthwise", "slow_conv",
                  "_slow_conv", "_nnpack_spatial_convolution", "_mps_convolution", "mps_convolution")


def op_family(name: str) -> str | None:
    """CONV or MATMUL for an aten op name (overload packet), else None."""
    if name in _MATMUL_OPS:
        return MATMUL
    return CONV if name.startswith(_CONV_PREFIXES) else None


def _fp32_precision(backend: Any) -> str | None:
    """A torch.backends object's `fp32_precision` ("ieee", "tf32", "bf16"; "none" inherits: None)."""
    value = getattr(backend, "fp32_precision", None)
    return None if value in (None, "none") else str(value)


def tf32_capable(device: torch.device) -> bool:
    """Whether this CUDA device has TF32 tensor cores (compute capability 8.0 and later)."""
    return torch.cuda.get_device_capability(device)[0] >= 8


def allowed_precision(family: str, device: torch.device) -> tuple[str, str] | None:
    """(internal precision, the flag that allows it) eager may use for a float32 op of FAMILY on DEVICE under
    the flags now; None when it must compute in float32."""
    if device.type == "cuda":
        if not tf32_capable(device):
            return None
        if family == CONV:
            if torch.backends.cudnn.enabled and torch.backends.cudnn.allow_tf32:
                return "tf32", "torch.backends.cudnn.allow_tf32"
            return None
        mode = torch.get_float32_matmul_precision()
        return {"high": ("tf32", "float32_matmul_precision 'high'"),
                "medium": ("bf16", "float32_matmul_precision 'medium'")}.get(mode)
    if device.type == "cpu" and torch.backends.mkldnn.is_available():
        sub = getattr(torch.backends.mkldnn, "conv" if family == CONV else "matmul", None)
        value = _fp32_precision(sub) or _fp32_precision(torch.backends.mkldnn)
        if value in UNIT_ROUNDOFF:
            return value, f"torch.backends.mkldnn.{'conv' if family == CONV else 'matmul'}.fp32_precision"
    return None


@dataclass(frozen=True)
class PrecisionRule:
    """How float outputs are judged. `reduced`: (device type, op family, internal precision, flag) for each
    float32 op family eager ran that its flags let compute in less than float32."""

    name: str = "eager"
    reduced: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def compile(self) -> bool:
        return self.name == "compile"

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        """The eager rule's tolerance for an output of DTYPE."""
        base = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
        if dtype != torch.float32 or not self.reduced:
            return base
        u = max(UNIT_ROUNDOFF[p] for _, _, p, _ in self.reduced)
        return Tolerance(max(base.rtol, ELEMENT_UNITS * u), max(base.atol, ELEMENT_UNITS * u),
                         max(base.norm, NORM_UNITS * u))

    def describe(self) -> str:
        if self.compile:
            return ("compile: torch.compile's own accuracy check (torch._dynamo.utils.same): allclose at "
                    f"{COMPILE_TOL:g}, else RMS error vs float64 at most 2x eager's + {COMPILE_TOL / 10:g}")
        if not self.reduced:
            return "eager: float32 outputs at float32's tolerance (no op eager ran may use less under its flags)"
        ops = "; ".join(f"{dev} {fam} may use {p.upper()} ({flag})" for dev, fam, p, flag in self.reduced)
        t = self.tolerance(torch.float32)
        return (f"eager: {ops}, so float32 outputs get rtol {t.rtol:g}, atol {t.atol:g}, "
                f"norm {t.norm:g}")


FLOAT32_DEFAULT = PrecisionRule()


class _OpRecorder(TorchDispatchMode):
    """Records (device, op family) of the float32 convolutions and matmuls a call runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[torch.device, str]] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        family = op_family(func.overloadpacket.__name__)
        if family is not None:
            first = next((a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)), None)
            if first is not None and first.dtype == torch.float32:
                self.seen.add((first.device, family))
        return func(*args, **(kwargs or {}))


def recorded_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, set[tuple[torch.device, str]]]:
    """FN(*ARGS, **KWARGS) and the float32 op families it ran, by device."""
    recorder = _OpRecorder()
    with recorder:
        out = fn(*args, **kwargs)
    return out, recorder.seen


def rule_for(ops: set[tuple[torch.device, str]], precision: str = "eager") -> PrecisionRule:
    """The rule for a module whose eager forward ran OPS, under the flags now; PRECISION "compile" takes
    torch.compile's own check instead."""
    if precision == "compile":
        return PrecisionRule("compile")
    reduced = []
    for device, family in sorted(ops, key=lambda o: (str(o[0]), o[1])):
        allowed = allowed_precision(family, device)
        if allowed is not None:
            reduced.append((device.type, family, *allowed))
    return PrecisionRule("eager", tuple(dict.fromkeys(reduced)))
