"""Find (and if needed prove) the cached kernel for one live module call, for auto-instrumentation."""
from __future__ import annotations

import logging

import torch
from torch import nn

from ..backends import backend_for_device
from ..candidates.compile import candidate_op, prove_candidate
from ..core.errors import MetalAccelError
from ..core.keys import class_path, entry_key, module_fingerprint
from ..core.specs import InputSpec, UnsupportedCall
from ..proof.prove import ProofSettings
from ..runtime.capture import ModuleCall
from ..runtime.model_state import StateGuard
from ..runtime.ops import KernelOp
from ..store import cache as cache_mod

log = logging.getLogger(__name__)


def kernel_for_call(module: nn.Module, args: tuple, kwargs: dict, *, prove_here: bool) -> KernelOp | None:
    """The op for this (module, call) if a cache holds a kernel proven in this environment (a cached
    torch.compile verdict is left to optimize(), which alone may compile).

    With `prove_here`, a kernel proven only elsewhere is proven now (correctness and speed) and
    the verdict, either way, is remembered in the user cache.
    """
    try:
        spec = InputSpec.of(args, kwargs)
        fingerprint = module_fingerprint(module)
    except UnsupportedCall:
        return None
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if not tensors:
        return None
    try:
        backend = backend_for_device(tensors[0].device)
    except MetalAccelError:
        return None
    key = entry_key(fingerprint, spec, backend.name)
    entry = cache_mod.lookup(backend.name, key)
    if entry is None or entry.candidate is None or entry.output_spec is None:
        return None
    env = backend.environment()
    verdict = entry.verdict_for(env)
    cand = entry.candidate
    if cand.is_builtin:  # torch.compile runs only where optimize() put it: compiling here would stall a call
        return None      # path the user never optimized, for seconds
    if verdict is not None:
        if not (verdict.accepted and verdict.candidate_digest == cand.digest):
            return None
        log.info("metal_accel: %s %s runs cached kernel %s", class_path(type(module)), spec.describe(), key[:12])
        return candidate_op(cand, key, module, spec, entry.output_spec, backend, verdict)  # type: ignore[return-value]
    if not prove_here:
        return None
    log.warning("metal_accel: proving cached kernel %s for %s %s on this device (once)", key[:12],
                class_path(type(module)), spec.describe())
    call = ModuleCall(name=type(module).__name__, module=module, spec=spec, output_spec=entry.output_spec,
                      args=args, kwargs=kwargs, calls=1)
    guard = StateGuard(module)
    guard.protect_all()
    try:
        ev = prove_candidate(call, key, cand, backend, ProofSettings())
    finally:
        for change in guard.restore():
            log.warning("metal_accel: %s: %s", class_path(type(module)), change)
    entry.verdicts[env.id] = ev.verdict
    if not ev.verdict.accepted:
        entry.rejected.append({"digest": cand.digest, "origin": cand.origin, "reason": ev.verdict.reason})
    cache_mod.user_cache().put(entry)
    return ev.op if ev.verdict.accepted else None  # type: ignore[return-value]


__all__ = ["kernel_for_call"]
