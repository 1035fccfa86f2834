"""The candidate format: one Python block defining SOURCE (kernel code) and forward() (host code)."""
from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from . import pyast
from .errors import CacheError, CandidateFormatError

KINDS = ("kernel", "inductor", "cuda-graph")
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Candidate:
    """An untrusted kernel proposal for one module on one backend."""

    code: str          # the whole Python block: SOURCE = r\"\"\"...\"\"\" and def forward(module, ...)
    source: str        # the kernel source extracted from SOURCE
    backend: str       # backend whose language SOURCE is written in
    origin: str = ""   # where it came from, e.g. "dir:/path/RMSNorm.py" or "openai:gpt-5"
    kind: str = "kernel"  # "kernel": SOURCE + host code; "inductor": torch.compile of the module itself;
    #                       "cuda-graph": that compile replayed as a CUDA graph

    def __post_init__(self) -> None:
        # The digest hashes backend and code only, so nothing that decides behaviour may vary apart from them:
        # a kernel's SOURCE is the literal in its code, a built-in carries none (its code names its kind).
        if self.kind not in KINDS:
            raise CandidateFormatError(f"unknown candidate kind {self.kind!r}")
        if self.kind == "kernel":
            declared = declared_source(self.code)
            if declared != self.source:
                raise CandidateFormatError("the kernel source differs from the SOURCE literal of its code"
                                           if declared is not None else "its code defines no SOURCE literal")
        elif self.source:
            raise CandidateFormatError(f"a built-in {self.kind} candidate carries no kernel source")

    @property
    def digest(self) -> str:
        """sha256 of backend and code: with the checks above, of everything the candidate runs."""
        return hashlib.sha256(f"{self.backend}\0{self.code}".encode()).hexdigest()

    @property
    def is_builtin(self) -> bool:
        """A built-in candidate runs no code from the candidate: nothing to sandbox."""
        return self.kind != "kernel"


def extract_code(text: str) -> str:
    """The Python block of an answer: the fenced block that defines SOURCE, else the whole text."""
    blocks = _FENCE.findall(text)
    for block in blocks:
        if "SOURCE" in block and "def forward" in block:
            return block.strip("\n") + "\n"
    if blocks and not ("SOURCE" in text and "def forward" in text.split("```")[0]):
        raise CandidateFormatError("no fenced Python block defines both SOURCE and forward()")
    return text.strip("\n") + "\n"


def declared_constant(code: str, name: str) -> Any:
    """The literal value of CODE's top-level `NAME = ...` (the last such assignment, as Python would leave it);
    None when there is none, it is no literal, or CODE is not Python."""
    try:
        tree = pyast.parse(code)
    except (SyntaxError, ValueError):
        return None
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                found = ast.literal_eval(node.value)
            except ValueError:
                found = None
    return found


def declared_source(code: str) -> str | None:
    """The string of the top-level `SOURCE = "..."` of CODE; None when there is none or CODE is not Python."""
    found = declared_constant(code, "SOURCE")
    return found if isinstance(found, str) else None


def parse_candidate(text: str, backend: str, origin: str = "") -> Candidate:
    """Parse an LLM answer or a file into a Candidate; raise CandidateFormatError if malformed.

    Only the format is checked here; the sandbox check (metal_accel.sandbox.host) is separate.
    """
    code = extract_code(text)
    try:
        tree = pyast.parse(code)
    except SyntaxError as exc:
        raise CandidateFormatError(f"host code is not valid Python: line {exc.lineno}: {exc.msg}") from None
    source = None
    has_forward = False
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SOURCE" for t in node.targets):
            if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                raise CandidateFormatError(f"line {node.lineno}: SOURCE must be a plain string literal")
            source = node.value.value
        elif isinstance(node, ast.FunctionDef) and node.name == "forward":
            if not node.args.args or node.args.args[0].arg != "module":
                raise CandidateFormatError(f"line {node.lineno}: forward's first parameter must be `module`")
            has_forward = True
    if source is None:
        raise CandidateFormatError("no SOURCE = r\"\"\"...\"\"\" string literal at top level")
    if not has_forward:
        raise CandidateFormatError("no top-level `def forward(module, ...)`")
    return Candidate(code=code, source=source, backend=backend, origin=origin)


# Built-in candidates carry no code of their own: their code is one of these identities (and meanings).
COMPILE_CODE = "torch.compile(forward, fullgraph=True, dynamic=False)"  # the candidate's identity (and meaning)


GRAPH_CODE = "torch.cuda.graph(torch.compile(forward, fullgraph=True, dynamic=False))"
BUILTIN_CODES = {"inductor": COMPILE_CODE, "cuda-graph": GRAPH_CODE}


def check_builtin(cand: Candidate) -> None:
    """A cached built-in candidate must be exactly one we define (it carries no code)."""
    if BUILTIN_CODES.get(cand.kind) != cand.code or cand.source:
        raise CacheError("malformed built-in candidate")
