"""A provider that reads candidates from files, so kernels can be supplied without an LLM."""
from __future__ import annotations

from pathlib import Path

from ..core.provider import ProposedText, SynthesisRequest

_SUFFIXES = (".py", ".md", ".txt")


class DirectoryProvider:
    """Candidates for class `Name` on backend `b` are read from, in order:
    <root>/<b>/<Name>.py, <root>/<b>/<Name>/*, <root>/<Name>.py, <root>/<Name>/*
    (.py, .md or .txt; a .md answer may hold the block in a ```python fence).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"candidate directory {self.root} does not exist")
        self.name = f"dir:{self.root}"

    def files_for(self, class_name: str, backend: str) -> list[Path]:
        found: list[Path] = []
        for base in (self.root / backend, self.root):
            for suffix in _SUFFIXES:
                f = base / f"{class_name}{suffix}"
                if f.is_file():
                    found.append(f)
            folder = base / class_name
            if folder.is_dir():
                found += sorted(p for p in folder.iterdir() if p.suffix in _SUFFIXES and p.is_file())
        return found

    def propose(self, request: SynthesisRequest) -> list[ProposedText]:
        return [ProposedText(p.read_text(), f"dir:{p}") for p in self.files_for(request.class_name, request.backend)]


