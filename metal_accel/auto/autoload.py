"""Find (and if needed prove) the cached kernel for one live module call, for auto-instrumentation."""
from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

from ..backends import backend_for_device
from ..candidates.compile import candidate_op, prove_candidate
from ..core.errors import MetalAccelError
from ..backends.base import Backend
from ..core import config
from ..core.candidate import Candidate, parse_candidate
from ..core.keys import class_path, class_source_sha, entry_key, generic_key, module_fingerprint
from ..core.provider import Evaluation, SynthesisRequest
from ..core.specs import InputSpec, OutputSpec, UnsupportedCall
from ..library.provider import LibraryProvider
from ..runtime.dispatch import eager_forward, eager_only
from ..proof.prove import ProofSettings, declared_shape_generic
from ..runtime.capture import ModuleCall
from ..runtime.model_state import StateGuard
from ..runtime.ops import KernelOp
from ..store import cache as cache_mod
from ..store.cache import CacheEntry

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
    stored = entry  # the entry as stored: its verdicts are sealed as they are there
    if entry is None:
        generic = generic_key(fingerprint, spec, backend.name)
        stored = cache_mod.lookup(backend.name, generic) if generic else None
        if stored is not None and stored.candidate is not None \
                and declared_shape_generic(stored.candidate.code) == "rows":
            with torch.inference_mode(), eager_only():  # the op is made for this call's own shapes, under its own key
                entry = dataclasses.replace(stored, key=key, input_spec=spec, verdicts=dict(stored.verdicts),
                                            output_spec=OutputSpec.of(eager_forward(module)(*args, **kwargs)))
        else:
            stored = None
    if entry is None and prove_here and config.current().library:
        return _library_kernel(module, args, kwargs, spec, fingerprint, key, backend)
    if entry is None or entry.candidate is None or entry.output_spec is None:
        return None
    env = backend.environment()
    verdict = (stored or entry).verdict_for(env)  # a shape-generic verdict is read from its own entry
    cand = entry.candidate
    if cand.is_builtin:  # torch.compile runs only where optimize() put it: compiling here would stall a call
        return None      # path the user never optimized, for seconds
    if verdict is not None:
        if not (verdict.accepted and verdict.candidate_digest == cand.digest):
            return None
        if not direct_launch_won(verdict.details):
            log.info("metal_accel: %s %s: cached kernel %s won only replayed as a CUDA graph; running eager (only "
                     "optimize(), which times the whole model, installs graph launches)", class_path(type(module)),
                     spec.describe(), key[:12])
            return None
        log.info("metal_accel: %s %s runs cached kernel %s", class_path(type(module)), spec.describe(), key[:12])
        return candidate_op(cand, key, module, spec, entry.output_spec, backend, None)  # type: ignore[return-value]
    if not prove_here:
        return None
    log.warning("metal_accel: proving cached kernel %s for %s %s on this device (once)", key[:12],
                class_path(type(module)), spec.describe())
    ev = _prove_here(module, args, kwargs, spec, entry.output_spec, key, cand, backend)
    entry.verdicts[env.id] = ev.verdict
    if not ev.verdict.accepted:
        entry.rejected.append({"digest": cand.digest, "origin": cand.origin, "reason": ev.verdict.reason})
    cache_mod.user_cache().put(entry)
    return ev.op if ev.verdict.accepted else None  # type: ignore[return-value]


def direct_launch_won(details: dict) -> bool:
    """Whether the kernel of an accepted verdict (its DETAILS) won the speed gate launched directly. A win that
    only its replay as a CUDA graph gave is a host launch time saved for one call timed alone; inside a running
    model the GPU's queue hides launches while each replay adds its own host time and copies (a BERT-large on
    an H100 in bf16 ran at 0.70x eager with its two residual LayerNorms replayed). Without optimize()'s
    end-to-end check, auto-instrumentation runs such a kernel neither way."""
    if details.get("launch") != "cuda-graph":
        return True
    return bool((details.get("direct_bench") or {}).get("accepted"))


def _prove_here(module: nn.Module, args: tuple, kwargs: dict, spec: InputSpec, output_spec: OutputSpec, key: str,
                cand: Candidate, backend: Backend) -> Evaluation:
    """CAND proven (correctness and speed) on this call now, the module's state guarded and put back. The direct
    launch only: no end-to-end check follows here to catch a graph replay's win that vanishes in the model."""
    call = ModuleCall(name=type(module).__name__, module=module, spec=spec, output_spec=output_spec,
                      args=args, kwargs=kwargs, calls=1)
    guard = StateGuard(module)
    guard.protect_all()
    try:
        return prove_candidate(call, key, cand, backend, ProofSettings(graph_launch=False))
    finally:
        for change in guard.restore():
            log.warning("metal_accel: %s: %s", class_path(type(module)), change)


def _library_kernel(module: nn.Module, args: tuple, kwargs: dict, spec: InputSpec, fingerprint: str, key: str,
                    backend: Backend) -> KernelOp | None:
    """The shipped library's kernel for a call no cache knows, when the module computes one of its families:
    proven here now (correctness and speed), stored in the user cache either way, like optimize() would."""
    request = SynthesisRequest(module, class_path(type(module)), type(module).__name__, fingerprint, spec,
                               OutputSpec((), True), backend.name, backend.language)
    proposals = LibraryProvider().propose(request)
    if not proposals:
        return None
    cand = parse_candidate(proposals[0].text, backend.name, proposals[0].origin)
    with torch.inference_mode(), eager_only():
        output_spec = OutputSpec.of(eager_forward(module)(*args, **kwargs))
    log.warning("metal_accel: proving the library's %s kernel for %s %s on this device (once)", cand.origin,
                class_path(type(module)), spec.describe())
    ev = _prove_here(module, args, kwargs, spec, output_spec, key, cand, backend)
    entry = CacheEntry(key=key, backend=backend.name, module_class=class_path(type(module)),
                       module_fingerprint=fingerprint, input_spec=spec, output_spec=output_spec,
                       candidate=cand if ev.verdict.accepted else None, sandbox={"ok": True} if ev.verdict.accepted else {},
                       rejected=[] if ev.verdict.accepted else
                       [{"digest": cand.digest, "origin": cand.origin, "reason": ev.verdict.reason}],
                       class_source_sha=class_source_sha(type(module)))
    entry.verdicts[backend.environment().id] = ev.verdict
    generic = generic_key(fingerprint, spec, backend.name)
    if ev.verdict.accepted and generic:  # every other shape of this input finds it there (the proof swept some)
        cache_mod.user_cache().put(dataclasses.replace(entry, key=generic,
                                                       verdicts={k: dataclasses.replace(v) for k, v in entry.verdicts.items()}))
    cache_mod.user_cache().put(entry)
    if ev.verdict.accepted:
        log.info("metal_accel: %s %s runs the library's %s kernel (%s)", class_path(type(module)),
                 spec.describe(), cand.origin, ev.verdict.reason)
    return ev.op if ev.verdict.accepted else None  # type: ignore[return-value]


__all__ = ["kernel_for_call"]
