"""One call of a library wrapper module (attention, rotary) through the pipeline, for the routers that serve
functions HF models call rather than modules the library can replace: the call is proven like any module
call (the library's kernel file with its glue, proof on this device, speed gate, caches) and the accepted
kernel's op is handed back for the router to call."""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import nn

from ..backends import backend_for_device
from ..backends.base import Backend
from ..core import config
from ..core.provider import ProposedText, Provider, SynthesisRequest
from ..core.specs import InputSpec, OutputSpec
from ..pipeline import Pipeline
from ..proof.prove import ProofSettings
from ..report import ModuleReport
from ..runtime import dispatch
from ..runtime.capture import ModuleCall
from ..runtime.ops import KernelOp, _at_storage_start as at_storage_start
from .provider import kernel_file

log = logging.getLogger(__name__)


class WrapperProvider:
    """Proposes the backend's kernel file of FAMILY, with the glue GLUE(request) writes, for calls of a WRAPPER
    module whose first input's dtype the file serves."""

    name = "library"

    def __init__(self, family: str, wrapper: type[nn.Module], glue: Callable[[SynthesisRequest], str]) -> None:
        self.family, self.wrapper, self.glue = family, wrapper, glue

    def propose(self, request: SynthesisRequest) -> list[ProposedText]:
        kernel = kernel_file(request.backend, self.family)
        if kernel is None or not isinstance(request.module, self.wrapper):
            return []
        text, dtypes = kernel
        if dtypes is not None and request.input_spec.tensor_specs()[0].dtype not in dtypes:
            return []
        return [ProposedText(text + self.glue(request), f"library:{self.family}")]


def ships_for(backend: str, family: str) -> tuple[str, ...]:
    """The dtypes the kernel file of FAMILY for BACKEND serves (empty when none ships)."""
    kernel = kernel_file(backend, family)
    if kernel is None:
        return ()
    return kernel[1] or ("float32", "float16", "bfloat16")


def prove_module_call(wrapper: nn.Module, args: tuple[torch.Tensor, ...], provider: Provider, label: str,
                      backend: Backend | None = None) -> tuple[KernelOp | None, ModuleReport]:
    """The pipeline's decision for WRAPPER called on ARGS with PROVIDER's candidates (torch.compile not tried;
    one launch per call, no CUDA graph: what every other shape runs too), and the accepted kernel's op."""
    backend = backend or backend_for_device(args[0].device)
    # eval mode: a dispatcher runs no kernel for a module in training mode, and the speed gate times the call
    # through one (a wrapper left in nn.Module's default training mode timed eager against eager)
    wrapper = wrapper.to(args[0].device).eval()
    args = tuple(t.detach().clone() for t in args)
    with torch.no_grad(), dispatch.eager_only():
        out = wrapper(*args)
    call = ModuleCall(name=label, module=wrapper, spec=InputSpec.of(args, {}), output_spec=OutputSpec.of(out),
                      args=args, kwargs={}, calls=1)
    now = config.current()
    settings = ProofSettings(margin=now.margin, bench_budget_s=now.bench_budget_s, timeout_s=now.timeout_s,
                             graph_launch=False)
    rep = Pipeline(backend, [provider], settings=settings, try_compile=False).process(call)
    disp = dispatch.dispatcher_of(wrapper)
    op = disp.table.get(call.spec.signature()) if disp is not None and rep.status == "kernel" else None
    if not isinstance(op, KernelOp):
        log.info("metal_accel: %s stays with the model's own code: %s", label, rep.reason)
        return None, rep
    log.info("metal_accel: %s runs the library kernel: %s", label, rep.reason)
    return op, rep


def run_op(op: KernelOp, args: tuple[Any, ...]) -> Any:
    """Call a proven op the way the dispatcher does (no out= buffers). A router keys calls by shape, dtype and
    strides only, and no proof tries a view at a storage offset (q, k, v split from one fused projection): such
    a tensor is copied to one that starts its own storage, so the kernel sees only what its proof tried."""
    if any(isinstance(a, torch.Tensor) and a.storage_offset() for a in args):
        args = tuple(at_storage_start(a) if isinstance(a, torch.Tensor) else a for a in args)
    return op(args, {}, [])
