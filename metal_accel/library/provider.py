"""The shipped kernel library as a candidate provider: kernels for what a module computes, whatever its class.

For a call whose module matches a family (match.py; the call's tensor arguments are the family's inputs), the
provider proposes the family's kernel file for the backend with a generated forward that binds the module's own
attributes; the pipeline then proves, times, caches and installs it like any candidate, on this device, before it
ever runs. Kernel files are read from
library/kernels/<backend>/<family>.py; a file may list the dtypes it serves (`DTYPES = ("float32", ...)`),
and only calls whose input has one of them are proposed.
"""
from __future__ import annotations

import functools
import logging

import torch

from ..core.candidate import declared_constant
from ..core.provider import ProposedText, SynthesisRequest
from ..core.specs import TensorSpec
from .match import Match, match_call
from . import sources

log = logging.getLogger(__name__)
ORIGIN = "library"
_told: set[tuple[str, str]] = set()  # (family, backend) pairs already logged as having no kernel
_LANGUAGE_DIR = {"cpu": "cpu", "cuda": "cuda", "mps": "mps", "mps-emu": "mps"}


@functools.cache
def kernel_file(backend: str, family: str) -> tuple[str, tuple[str, ...] | None] | None:
    """(text, dtypes served or None for all) of the family's kernel file for BACKEND, or None."""
    folder = _LANGUAGE_DIR.get(backend)
    path = sources.KERNELS / folder / f"{family}.py" if folder else None
    if path is None or not path.is_file():
        return None
    text = path.read_text()
    return text, _declared_dtypes(text)


def _declared_dtypes(text: str) -> tuple[str, ...] | None:
    dtypes = declared_constant(text, "DTYPES")
    return tuple(str(d) for d in dtypes) if isinstance(dtypes, (tuple, list)) else None


def example_input(spec: TensorSpec, like: torch.nn.Module) -> torch.Tensor:
    """An uninitialized tensor of the call's shape and dtype on the module's device (tracing reads no values)."""
    device = next((t.device for t in like.parameters()), None) or torch.device(spec.device)
    return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=device)


class LibraryProvider:
    """Proposes the shipped kernel of the call's family, bound to the module (see module docstring)."""

    name = ORIGIN

    def match(self, request: SynthesisRequest) -> Match | None:
        spec = request.input_spec
        if spec.kwargs or not spec.args or not all(isinstance(a, TensorSpec) for a in spec.args):
            return None
        inputs = tuple(example_input(a, request.module) for a in spec.args)  # type: ignore[arg-type]
        return match_call(request.module, inputs, {})

    def propose(self, request: SynthesisRequest) -> list[ProposedText]:
        found = self.match(request)
        if found is None:
            return []
        kernel = kernel_file(request.backend, found.family)
        if kernel is None:
            if (found.family, request.backend) not in _told:
                _told.add((found.family, request.backend))
                log.info("metal_accel: library: %s computes %s; no %s kernel for it ships", request.class_name,
                         found.family, request.backend)
            return []
        text, dtypes = kernel
        dtype = request.input_spec.args[0].dtype  # type: ignore[union-attr]
        if dtypes is not None and dtype not in dtypes:
            return []
        return [ProposedText(text + found.glue(), f"{ORIGIN}:{found.family}")]
