"""Whether a candidate is the library's own for one call: what the package itself would propose there.

The library's kernel files are reviewed in this repository, and so is the glue its matcher writes (a forward
calling the file's host function with the call's inputs and the module's own attributes). Such a candidate's
claims are the package's: its SHAPE_GENERIC is taken at its word, and its native kernels may run in the user's
process. That is decided by generating the library's proposals for the call again and comparing the code,
never from an origin a cache entry or bundle states, and never from the kernel source alone: host code chooses
every pointer and size the kernel gets, so a reviewed kernel driven by other host code is not reviewed code.
"""
from __future__ import annotations

import logging

from torch import nn

from ..core.candidate import Candidate, parse_candidate
from ..core.errors import MetalAccelError
from ..core.keys import class_path
from ..core.provider import SynthesisRequest
from ..core.specs import InputSpec, OutputSpec

log = logging.getLogger(__name__)


def library_codes(module: nn.Module, spec: InputSpec, backend: str) -> list[str]:
    """The host code of every candidate the library proposes for MODULE called with SPEC on BACKEND."""
    from .attention import AttentionProvider
    from .provider import LibraryProvider
    from .rotary import RotaryProvider
    request = SynthesisRequest(module, class_path(type(module)), type(module).__name__, "", spec,
                               OutputSpec((), True), backend, "")
    codes = []
    for provider in (LibraryProvider(), AttentionProvider(), RotaryProvider()):
        try:
            proposals = provider.propose(request)
        except Exception as exc:  # a module the matcher cannot trace: nothing of the library's applies
            log.debug("metal_accel: library: no proposal from %s for %s: %s", provider.name, request.class_name, exc)
            continue
        for proposal in proposals:
            try:
                codes.append(parse_candidate(proposal.text, backend, proposal.origin).code)
            except MetalAccelError:
                continue
    return codes


def is_library_candidate(cand: Candidate, module: nn.Module, spec: InputSpec | None, backend: str) -> bool:
    """CAND is exactly what the library proposes for MODULE called with SPEC on BACKEND (module docstring)."""
    if cand.kind != "kernel" or spec is None:
        return False
    return cand.code in library_codes(module, spec, backend)
