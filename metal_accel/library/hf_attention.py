"""HF transformers' attention through the library's kernels: an attention implementation named "metal_accel".

Registered with transformers' AttentionInterface (and its AttentionMaskInterface, with sdpa's mask function, so
the masks a model builds are exactly the ones sdpa gets) only when transformers is importable; it is no
dependency. Each call goes to attention.AttentionRouter: a proven kernel for its signature, HF's own
sdpa_attention_forward for everything else (prefill, training, masks of other forms, any failure).

optimize() calls `attach(model, backend)` for a PreTrainedModel whose attention implementation is "sdpa" and
whose backend ships an attention kernel: the model's implementation is switched to ours (the previous one is
kept on the model) and the decode signature of each attention configuration is proven right away; `detach`
(called by restore()) puts the previous implementation back.
"""
from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch
from torch import nn

from ..backends.base import Backend
from ..core import config as settings
from .attention import AttentionRouter, ships_for, signature

log = logging.getLogger(__name__)
NAME = "metal_accel"
_routers: dict[str, AttentionRouter] = {}  # device type -> the router of the backend last attached for it
_registered = False


def available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def router_for(backend: Backend) -> AttentionRouter:
    """The router of BACKEND, made the one that serves its device type's calls."""
    router = _routers.get(backend.device_type)
    if router is None or router.backend is None or router.backend.name != backend.name:
        router = _routers[backend.device_type] = AttentionRouter(backend)
    return router


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The registered implementation: sdpa_attention_forward's signature and results."""
    router = _routers.get(query.device.type)
    if router is None:
        from .attention import sdpa_reference
        return sdpa_reference()(module, query, key, value, attention_mask, **kwargs)
    return router(module, query, key, value, attention_mask, **kwargs)



def register() -> bool:
    """Register "metal_accel" with transformers' attention and mask interfaces (once); False without transformers."""
    global _registered
    if _registered:
        return True
    if not available():
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    _registered = True
    return True


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """The model's attention modules: those with HF's attention attributes (scaling, head grouping, layer index)."""
    return [m for m in model.modules() if hasattr(m, "scaling") and hasattr(m, "num_key_value_groups")
            and hasattr(m, "layer_idx")]


def applies(model: nn.Module) -> bool:
    """MODEL is an HF model running sdpa attention that attach() would try to switch."""
    config = getattr(model, "config", None)
    return settings.current().library and config is not None and hasattr(model, "set_attn_implementation") \
        and getattr(config, "_attn_implementation", None) == "sdpa" and available()


def attach(model: nn.Module, backend: Backend, *, kv_length: int = 64) -> str:
    """Switch an HF model whose attention is "sdpa" to ours on BACKEND, and prove its decode signatures now;
    returns a line for the report ('' when the model is not such a model or no kernel ships)."""
    config = getattr(model, "config", None)
    if not settings.current().library or config is None or not hasattr(model, "set_attn_implementation") \
            or not available():
        return ""
    current = getattr(config, "_attn_implementation", None)
    if current == NAME:
        return ""
    if current != "sdpa":
        return f"attention: {current!r} kept (the library's attention kernels are proven against sdpa's computation)"
    served = ships_for(backend.name)
    param = next(model.parameters(), None)
    if not served or param is None:
        return ""
    dtype = str(param.dtype).replace("torch.", "")
    if dtype not in served:
        return f"attention: sdpa kept (no {backend.name} attention kernel for {dtype})"
    if not register():
        return ""
    try:
        model.set_attn_implementation(NAME)
    except Exception as exc:  # a model that cannot switch keeps its own
        return f"attention: sdpa kept ({type(exc).__name__}: {exc})"
    if getattr(model.config, "_attn_implementation", None) != NAME:
        return "attention: sdpa kept (the model does not take an attention implementation)"
    _name_routed(model.config, current)  # which also remembers what detach() puts back
    router = router_for(backend)
    router.proving = True
    proven = _prove_decode(model, router, param, kv_length)
    if not any(p.split(": ", 1)[1].startswith("kernel") for p in proven):  # nothing to route: the model as it was
        detach(model)
        return "attention: sdpa kept (" + ("; ".join(proven) if proven else "no attention module found") + ")"
    return f"attention: HF sdpa -> {NAME} (decode kernels where proven here, HF's sdpa otherwise): " + "; ".join(proven)


def _prove_decode(model: nn.Module, router: AttentionRouter, param: torch.Tensor, kv_length: int) -> list[str]:
    """Decide the decode signature (no mask, batch 1) of each distinct attention configuration now, so the first
    generate() step does not wait for a proof; other signatures are decided when first seen."""
    out = []
    seen: set[tuple] = set()
    for module in _attention_modules(model):
        cfg = getattr(module, "config", None)
        heads = getattr(cfg, "num_attention_heads", None)
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(module, "head_dim", None) or getattr(cfg, "head_dim", None)
        if not heads or not head_dim:
            continue
        q = torch.randn(1, heads, 1, head_dim, dtype=param.dtype, device=param.device)
        k = torch.randn(1, kv_heads, kv_length, head_dim, dtype=param.dtype, device=param.device)
        sig = signature(module, q, k, k, None, 0.0, float(module.scaling), {})
        if sig is None or sig in seen:
            continue
        seen.add(sig)
        with torch.no_grad():
            run = router.decide(module, q, k, torch.randn_like(k), None, sig)
        rep = router.reports[-1] if router.reports else None
        out.append(f"{heads}/{kv_heads} heads of {head_dim}, {str(param.dtype).replace('torch.', '')}: "
                   + ("kernel" if run is not None else "sdpa") + (f" ({rep.reason})" if rep is not None else ""))
    return out


class RoutedName(str):
    """The implementation name attach() sets, as configs hold it: pickled or deep-copied (torch.save(model),
    copy.deepcopy) it becomes the name it replaced, so a saved model loads and runs where metal_accel's attention
    is not registered (it raised KeyError there) and a copy runs the attention it had."""

    previous: str

    def __new__(cls, name: str, previous: str) -> "RoutedName":
        routed = super().__new__(cls, name)
        routed.previous = previous
        return routed

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return str, (self.previous,)


def _name_routed(config: Any, previous: str) -> None:
    """CONFIG's and its sub-configs' implementation names (set by set_attn_implementation) as RoutedName."""
    stack, seen = [config], set()
    while stack:
        c = stack.pop()
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        if getattr(c, "_attn_implementation_internal", None) == NAME:
            c._attn_implementation_internal = RoutedName(NAME, previous)
        stack += [getattr(c, key, None) for key in (getattr(c, "sub_configs", None) or {})]


def detach(model: nn.Module) -> None:
    """Put back the attention implementation attach() replaced (restore())."""
    name = getattr(getattr(model, "config", None), "_attn_implementation_internal", None)
    if not isinstance(name, RoutedName):
        return
    previous = name.previous
    try:
        model.set_attn_implementation(previous)
    except Exception as exc:  # the config attribute directly: what set_attn_implementation writes
        log.warning("metal_accel: attention implementation put back by hand: %s", exc)
        model.config._attn_implementation_internal = previous
