"""KernelBench-format problems: Python code defining `Model`, `get_inputs()` and `get_init_inputs()`.

A problem comes from a .py file, a directory of them (searched recursively), or a JSON-lines file
whose rows hold the code (`{"level", "problem_id", "name", "file", "code"}`, the format of
KernelBench's problem list). Loading a problem executes its code: it is the user's own file.
The code is registered with `linecache` under a stable module name, so `inspect.getsource` (and
so module fingerprints and prompts) work for code that never was a file.
"""
from __future__ import annotations

import hashlib
import json
import linecache
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from ..core.errors import MetalAccelError


class ProblemError(MetalAccelError):
    """A problem file is unreadable or does not define Model, get_inputs and get_init_inputs."""


@dataclass(frozen=True)
class Problem:
    name: str
    code: str
    origin: str                  # the file, or "<jsonl path>:<line>"
    level: int | None = None
    problem_id: int | None = None

    @property
    def module_name(self) -> str:
        """A stable module name: the same code is the same module (and the same cache keys)."""
        return "metal_accel_problem_" + hashlib.sha256(self.code.encode()).hexdigest()[:16]

    def load(self) -> types.ModuleType:
        """Execute the problem's code as a module (once per process) and return it."""
        name = self.module_name
        if name in sys.modules:
            return sys.modules[name]
        filename = self.origin if Path(self.origin).is_file() else f"<problem {self.origin}>"
        linecache.cache[filename] = (len(self.code), None, self.code.splitlines(True), filename)
        module = types.ModuleType(name)
        module.__file__ = filename
        sys.modules[name] = module
        try:
            exec(compile(self.code, filename, "exec"), module.__dict__)
        except Exception as exc:
            del sys.modules[name]
            raise ProblemError(f"{self.origin}: loading failed: {type(exc).__name__}: {exc}") from exc
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
        if missing:
            del sys.modules[name]
            raise ProblemError(f"{self.origin}: does not define {', '.join(missing)}")
        return module

    def instantiate(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[nn.Module, tuple]:
        """The problem's model (eval mode) and example inputs, on `device`."""
        module = self.load()
        torch.manual_seed(seed)
        model = module.Model(*module.get_init_inputs()).eval().to(device)
        inputs = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in module.get_inputs())
        return model, inputs


def _from_jsonl(path: Path) -> list[Problem]:
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row: dict[str, Any] = json.loads(line)
            code = row["code"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ProblemError(f"{path}:{i}: not a problem row ({exc})") from None
        name = row.get("name") or Path(row.get("file", f"problem_{i}")).stem
        out.append(Problem(str(name), code, f"{path}:{i}", row.get("level"), row.get("problem_id")))
    return out


def _from_file(path: Path) -> Problem:
    try:
        code = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(f"{path}: {exc}") from None
    return Problem(path.stem, code, str(path.resolve()))


def load_problems(path: str | Path, *, levels: Iterable[int] | None = None, ids: Iterable[int] | None = None,
                  names: Iterable[str] | None = None) -> list[Problem]:
    """Problems from a .py file, a directory of .py files, or a .jsonl file, optionally filtered by
    level, problem id, or a substring of the name."""
    p = Path(path)
    if p.is_dir():
        problems = [_from_file(f) for f in sorted(p.rglob("*.py"))]
    elif p.suffix in (".jsonl", ".json"):
        problems = _from_jsonl(p)
    elif p.is_file():
        problems = [_from_file(p)]
    else:
        raise ProblemError(f"no problem file or directory at {p}")
    levels, ids, names = set(levels or ()), set(ids or ()), list(names or ())
    return [pr for pr in problems
            if (not levels or pr.level in levels) and (not ids or pr.problem_id in ids)
            and (not names or any(n.lower() in pr.name.lower() for n in names))]
