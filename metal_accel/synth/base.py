"""What a candidate provider is given and what it returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from torch import nn

from ..specs import InputSpec, OutputSpec


@dataclass
class SynthesisRequest:
    """One module call that has no proven kernel yet."""

    module: nn.Module
    module_class: str          # qualified class path
    class_name: str
    fingerprint: str
    input_spec: InputSpec
    output_spec: OutputSpec
    backend: str               # backend name, e.g. "cpu"
    language: str              # kernel language of that backend
    eager_us: float = 0.0
    feedback: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ProposedText:
    """Raw text of one proposal (parsed later, so a malformed one is a reported rejection)."""

    text: str
    origin: str


@runtime_checkable
class CandidateProvider(Protocol):
    """Anything that proposes candidates for a module: a directory of files, an LLM, ..."""

    name: str

    def propose(self, request: SynthesisRequest) -> list[ProposedText]: ...
