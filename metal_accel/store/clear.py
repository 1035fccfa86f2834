"""`metal-accel cache clear`: remove everything a user cache owns, and say what."""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .index import INDEX_NAME


@dataclass
class Cleared:
    """What `clear_dir` removed, and what it left because it did not make it."""

    entries: int = 0
    artifacts: int = 0       # files under build/: compiled kernels, their sources, build records, locks
    bundles: int = 0         # bundles unpacked by load_cache
    recordings: int = 0      # METAL_ACCEL_RECORD files
    model_verdicts: int = 0  # end-to-end verdicts of whole models (model_verdicts.py)
    synthesis: int = 0       # LLM answers, prompts and run journals kept by synthesis (synth/memo.py)
    library_matches: int = 0  # classes found here to compute a kernel-library family (library/known.py)
    revoked: int = 0         # kernels a production spot check caught (runtime/spot_check.py)
    other: int = 0           # index, locks, temporary files
    left: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{self.entries} entries", f"{self.artifacts} build files (compiled kernels and their records)",
                 f"{self.bundles} unpacked bundles",
                 f"{self.recordings} recordings", f"{self.model_verdicts} model-level verdicts",
                 f"{self.synthesis} stored LLM answers, prompts and run journals",
                 f"{self.revoked} kernels switched off by a production check",
                 f"{self.library_matches} kernel-library class matches", f"{self.other} index, lock and temporary files"]
        out = "removed " + ", ".join(parts)
        if self.left:
            out += f"; left {len(self.left)} paths metal_accel did not make: " + ", ".join(self.left[:5])
        return out


# Top-level names a user cache owns besides its backend directories (build: compiled kernels).
OWNED_DIRS = {"build": "artifacts", "bundles": "bundles", "recorded": "recordings", "models": "model_verdicts",
              "synth": "synthesis", "library": "library_matches", "revoked": "revoked"}


def _files_in(path: Path) -> int:
    return sum(1 for p in path.rglob("*") if not p.is_dir()) if path.is_dir() else 0


def clear_dir(root: Path) -> Cleared:
    """Delete what metal_accel made in the user cache at ROOT: entry directories (entries, locks, temporary
    files), the index, build/ (compiled kernels), bundles/ (unpacked bundles), recorded/ and leftover unpack
    directories. Anything else is left in place and listed."""
    out = Cleared()
    if not root.is_dir():
        return out
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.is_symlink() and child.name in OWNED_DIRS:
            n = sum(1 for _ in child.iterdir()) if child.name == "bundles" else _files_in(child)
            setattr(out, OWNED_DIRS[child.name], getattr(out, OWNED_DIRS[child.name]) + n)
            shutil.rmtree(child, ignore_errors=True)
        elif child.is_dir() and not child.is_symlink() and (
                _is_backend_dir(child) or (child.name.startswith("tmp") and _leftover_unpack(child))):
            out.entries += sum(1 for _ in child.glob("*.json"))
            out.other += sum(1 for f in child.iterdir() if not f.name.endswith(".json"))
            shutil.rmtree(child, ignore_errors=True)
        elif child.is_file() and (child.name.startswith((INDEX_NAME, ".tmp-"))):
            child.unlink(missing_ok=True)
            out.other += 1
        else:
            out.left.append(str(child))
    return out


def _leftover_unpack(d: Path) -> bool:
    """A temporary directory bundle.unpack left behind (empty, or holding an extracted bundle/)."""
    return not any(d.iterdir()) or (d / "bundle").is_dir()


def _is_backend_dir(d: Path) -> bool:
    """A directory of entries: only <key>.json files, their locks and temporary files from atomic writes."""
    return all(f.is_file() and (f.suffix == ".json" or f.name.endswith(".json.lock") or f.name.startswith(".tmp-"))
               for f in d.iterdir())
