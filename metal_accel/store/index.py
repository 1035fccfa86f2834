"""The index of a cache directory: which module classes and input specs it has kernels for.

`<root>/index.json` lets `import metal_accel` learn which classes to patch without reading every
entry. The user cache keeps it current on every write; exported bundles and the shipped cache
carry one; a cache without one is scanned.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from filelock import FileLock

if TYPE_CHECKING:
    from .cache import CacheEntry

INDEX_NAME = "index.json"
INDEX_VERSION = 1


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and a rename: readers see old or new, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def index_record(entry: "CacheEntry") -> dict[str, Any]:
    return {"backend": entry.backend, "module_class": entry.module_class,
            "class_source_sha": entry.class_source_sha, "input_spec": entry.input_spec.to_dict(with_hints=False),
            "accepted_envs": sorted(k for k, v in entry.verdicts.items()
                                    if v.accepted and entry.candidate is not None
                                    and v.candidate_digest == entry.candidate.digest)}


def update_index(root: Path, entries: Iterable["CacheEntry"]) -> None:
    """Merge the records of `entries` into `<root>/index.json` (locked, atomic)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / INDEX_NAME
    with FileLock(str(path) + ".lock", timeout=60):
        data = read_index_file(path) or {"format_version": INDEX_VERSION, "entries": {}}
        for e in entries:
            data["entries"][e.key] = index_record(e)
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True))


def read_index_file(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format_version") != INDEX_VERSION:
        return None
    return data


