"""Attention over a KV cache as HF transformers' sdpa_attention_forward computes it, with the library's kernels.

Transformers' attention modules update a Cache object they are given, so the library cannot replace them;
below the cache update, though, each calls one attention function (AttentionInterface), which
hf_attention.py points here. The computation proven is `SdpaAttention`, a small module whose forward is HF's
own sdpa_attention_forward: a call's (query, key, value[, mask]) goes through the pipeline like any module
call (library kernel file + generated forward; proof on this device, speed gate, cache), with
SHAPE_GENERIC = "kv": proven on other batch sizes and kv lengths too and stored under keys.generic_key, so
one proof serves every decode step and batch. `AttentionRouter` sends each call to the proven kernel of its
signature (dtype, heads, head size, scaling, mask form, device) and to HF's function otherwise.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import torch
from torch import nn

from ..backends.base import Backend
from ..report import ModuleReport
from ..runtime import dispatch
from .provider import kernel_file
from . import routing
from .routing import WrapperProvider, prove_module_call, run_op

log = logging.getLogger(__name__)
FAMILY = "attention_decode"
# kwargs of an attention call that change what sdpa_attention_forward computes (or make it raise)
_UNSERVED_KWARGS = ("position_bias", "softcap", "output_attentions", "s_aux", "sinks", "sliding_window_size")

Run = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def sdpa_reference() -> Callable[..., tuple[torch.Tensor, Any]]:
    """transformers' own sdpa_attention_forward (imported only when an attention call needs it)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward


class SdpaAttention(nn.Module):
    """HF's sdpa_attention_forward for one attention module's configuration: what the kernels are proven against.
    Returns the attention output [B, q_len, Hq, D] (HF's first result)."""

    def __init__(self, scaling: float, num_key_value_groups: int) -> None:
        super().__init__()
        self.scaling = float(scaling)
        self.num_key_value_groups = int(num_key_value_groups)
        self.is_causal = True

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return sdpa_reference()(self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling)[0]


def glue(masked: bool) -> str:
    """The candidate's forward: the family's host function with the module's scaling and head grouping."""
    params, mask = ("query, key, value, attention_mask", "attention_mask") if masked else ("query, key, value", "None")
    return ("\n\nSHAPE_GENERIC = \"kv\"  # any batch and kv length: proven on several, one verdict for all\n"
            f"\n\ndef forward(module, {params}):\n"
            f"    return {FAMILY}(query, key, value, {mask}, module.scaling, module.num_key_value_groups)\n")


def AttentionProvider() -> WrapperProvider:  # noqa: N802 (a provider, made like a class)
    """Proposes the backend's attention kernel file for a call of SdpaAttention, where one ships."""
    return WrapperProvider(FAMILY, SdpaAttention, lambda request: glue(len(request.input_spec.args) == 4))


def ships_for(backend: str) -> tuple[str, ...]:
    """The dtypes the attention kernel of BACKEND serves (empty when none ships)."""
    return routing.ships_for(backend, FAMILY)


def signature(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              mask: torch.Tensor | None, dropout: float, scaling: float | None,
              kwargs: dict[str, Any]) -> tuple | None:
    """The route key of an attention call a kernel may serve (decode: one query position), or None when only HF's
    function may compute it: training, autograd, tracing, another mask form or any option the kernels lack."""
    if dispatch.bypass or type(query) is not torch.Tensor or query.dim() != 4 or query.shape[2] != 1:
        return None
    if dropout or scaling is None or any(kwargs.get(k) for k in _UNSERVED_KWARGS):
        return None
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return None
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None
    if type(key) is not torch.Tensor or type(value) is not torch.Tensor or key.dim() != 4 \
            or key.shape != value.shape or key.dtype != query.dtype or value.dtype != query.dtype:
        return None
    B, Hq, _, D = query.shape
    Hkv = key.shape[1]
    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    if key.shape[0] != B or key.shape[3] != D or Hkv * groups != Hq or key.shape[2] == 0:
        return None
    form: tuple = ()
    if mask is not None:
        if type(mask) is not torch.Tensor or mask.dim() != 4 or mask.shape[0] not in (1, B) \
                or mask.shape[1] not in (1, Hq) or mask.shape[2] != 1 or mask.shape[3] != key.shape[2] \
                or mask.dtype not in (torch.bool, query.dtype):
            return None
        form = (mask.dtype, mask.shape[0] == B, mask.shape[1], mask.is_contiguous())
    return (query.device, query.dtype, Hq, Hkv, D, groups, float(scaling), form,
            query.is_contiguous(), key.is_contiguous(), value.is_contiguous())


class AttentionRouter:
    """HF attention calls to proven kernels by signature; everything else to HF's own sdpa_attention_forward.

    `proving`: a signature seen for the first time is proven then (once per process; the cache keeps the
    verdict across processes). Without it, only signatures already decided are served."""

    def __init__(self, backend: Backend | None = None) -> None:
        self.backend = backend
        self.proving = False
        self.routes: dict[tuple, Run | None] = {}
        self.reports: list[ModuleReport] = []
        self.hits = 0
        self._lock = threading.Lock()

    def __call__(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        sig = signature(module, query, key, value, attention_mask, dropout, scaling, kwargs)
        run = self.routes.get(sig) if sig is not None else None
        if run is None and sig is not None and sig not in self.routes and self.proving:
            run = self.decide(module, query, key, value, attention_mask, sig)
        if run is not None:
            try:
                out = run(query, key, value, attention_mask)
                self.hits += 1
                return out, None
            except Exception as exc:  # switched off for good; HF's function answers from here on
                log.warning("metal_accel: attention kernel failed (%s: %s); HF's sdpa answers from now on",
                            type(exc).__name__, exc)
                self.routes[sig] = None
        return sdpa_reference()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                is_causal=is_causal, **kwargs)

    def decide(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor | None, sig: tuple | None = None) -> Run | None:
        """Prove (or find in the cache) the kernel for this call's signature; remember the answer."""
        groups = int(getattr(module, "num_key_value_groups", 1) or 1)
        scaling = float(getattr(module, "scaling", None) or query.shape[-1] ** -0.5) if sig is None else sig[6]
        with self._lock:
            if sig is not None and sig in self.routes:
                return self.routes[sig]
            try:
                run, rep = prove_call(SdpaAttention(scaling, groups), query, key, value, mask, self.backend)
            except Exception as exc:  # never a wrong answer: HF's function
                log.warning("metal_accel: attention not proven: %s: %s", type(exc).__name__, exc)
                run, rep = None, None
            if rep is not None:
                self.reports.append(rep)
            if sig is not None:
                self.routes[sig] = run
        return run


def prove_call(wrapper: SdpaAttention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor | None, backend: Backend | None = None) -> tuple[Run | None, ModuleReport]:
    """The pipeline's decision for WRAPPER called on these tensors (proof, speed gate, caches), and the kernel's
    runner when it was accepted."""
    shape = "x".join(map(str, query.shape))
    op, rep = prove_module_call(wrapper, (query, key, value, *(() if mask is None else (mask,))),
                                AttentionProvider(), f"attention[q {shape}, kv {key.shape[2]}]", backend)
    if op is None:
        return None, rep

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        return run_op(op, (q, k, v) if m is None else (q, k, v, m))
    return run, rep


def direct_forward(backend: Backend, masked: bool = False) -> Callable[..., torch.Tensor]:
    """The shipped kernel file's host forward for BACKEND with the generated glue, compiled here and NOT proven:
    forward(view, query, key, value[, mask]) with `view` a ModuleLayout view of an SdpaAttention. For benchmarks
    and tests; calls of models go through prove_call."""
    from ..core.candidate import declared_source
    from ..proof.prove import kernels_only
    from ..runtime.native_policy import runtime_library
    from ..sandbox.host import load_forward
    kernel = kernel_file(backend.name, FAMILY)
    if kernel is None:
        raise LookupError(f"no {backend.name} kernel for {FAMILY}")
    source = declared_source(kernel[0])
    assert source is not None
    return load_forward(kernel[0] + glue(masked), kernels_only(runtime_library(backend, source)), zeroed=False)

