"""Entries proven on an emulated device, re-keyed for the real device that shares its kernel language.

A Metal kernel proven correct by the MSL emulator (backend "mps-emu", CPU tensors) is the same
candidate for the real Metal backend ("mps", MPS tensors): same host code, same SOURCE, same launch
convention. `for_device` writes it as an "mps" entry (key, specs and candidate for "mps") that carries
only the emulator's verdict, under the emulator's environment, with no speed numbers. No Mac
environment has a verdict, so a Mac proves the kernel itself (correctness and speed, once) before
installing it, and remembers that verdict in its user cache (pipeline.py, autoload.py).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..core.candidate import Candidate
from ..core.errors import CacheError
from ..core.keys import entry_key
from ..core.specs import TensorSpec
from ..sandbox.kernel_source import LANGUAGE_OF_BACKEND
from .cache import CacheEntry, Verdict

EMULATED = {"mps-emu": ("mps", "mps")}  # emulated backend -> (real backend, its torch device type)


def _on(device: str) -> Callable[[TensorSpec], TensorSpec]:
    return lambda spec: replace(spec, device=device)


def for_device(entry: CacheEntry, backend: str, device: str) -> CacheEntry:
    """`entry` (accepted on an emulated backend) as an entry of `backend`, whose tensors live on `device`."""
    if entry.candidate is None or LANGUAGE_OF_BACKEND.get(entry.backend) != LANGUAGE_OF_BACKEND.get(backend):
        raise CacheError(f"entry {entry.key} of {entry.backend} has no kernel in the language of {backend}")
    spec = entry.input_spec.map_tensors(_on(device))  # tensors inside containers too
    out = entry.output_spec.map_tensors(_on(device)) if entry.output_spec is not None else None
    cand = Candidate(entry.candidate.code, entry.candidate.source, backend, entry.candidate.origin)
    verdicts = {}
    for env_id, v in entry.verdicts.items():
        if not (v.accepted and v.candidate_digest == entry.candidate.digest):
            continue
        details = {**v.details, "scope": "correctness only: proven on an emulated device, speed never measured",
                   "proven_as": {"backend": entry.backend, "key": entry.key, "candidate_digest": v.candidate_digest}}
        verdicts[env_id] = Verdict(v.env, True, v.reason, cand.digest, None, None, None, details, v.measured_at,
                                   fresh=False)  # a claim carried to another backend, never this process's proof
    if not verdicts:
        raise CacheError(f"entry {entry.key} has no accepted verdict to carry over")
    return CacheEntry(key=entry_key(entry.module_fingerprint, spec, backend), backend=backend,
                      module_class=entry.module_class, module_fingerprint=entry.module_fingerprint, input_spec=spec,
                      output_spec=out, candidate=cand, sandbox=dict(entry.sandbox), verdicts=verdicts,
                      class_source_sha=entry.class_source_sha)


def for_real_device(entry: CacheEntry) -> CacheEntry:
    """An emulated backend's entry as an entry of the device it emulates (mps-emu -> mps)."""
    if entry.backend not in EMULATED:
        raise CacheError(f"backend {entry.backend} is not an emulated device")
    backend, device = EMULATED[entry.backend]
    return for_device(entry, backend, device)
