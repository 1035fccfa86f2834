"""What a candidate provider is given and what it returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from torch import nn

from .candidate import Candidate
from .specs import InputSpec, OutputSpec

if TYPE_CHECKING:
    from ..proof.speed import BenchResult
    from ..runtime.ops import KernelOp
    from ..store.cache import Verdict


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
    compile_us: float | None = None   # torch.compile's time for this call, when it was measured
    compiled_code: str = ""           # what inductor generated: a working starting point to beat
    rejected: dict[str, str] = field(default_factory=dict)  # candidate digest -> why it was rejected (cached)
    eager_benchmarked: bool = False   # eager_us comes from a benchmark (else from one capture: measured again)


@dataclass(frozen=True)
class ProposedText:
    """Raw text of one proposal (parsed later, so a malformed one is a reported rejection)."""

    text: str
    origin: str


@dataclass
class Evaluation:
    """The proof of one candidate on this device: its verdict (reason = feedback) and, if accepted, its op."""

    candidate: Candidate
    verdict: "Verdict"
    op: "KernelOp | None" = None
    bench: "BenchResult | None" = None


Evaluate = Callable[[Candidate], Evaluation]


@runtime_checkable
class CandidateProvider(Protocol):
    """Proposes candidates up front: a directory of files, a fixed list."""

    name: str

    def propose(self, request: SynthesisRequest) -> list[ProposedText]: ...


@runtime_checkable
class InteractiveProvider(Protocol):
    """Iterates with feedback (an LLM with repair rounds): it calls `evaluate` on each candidate it
    writes and reads the verdict's reason; it returns every evaluation it made."""

    name: str

    def synthesize(self, request: SynthesisRequest, evaluate: Evaluate) -> list[Evaluation]: ...


Provider = Any  # CandidateProvider | InteractiveProvider
