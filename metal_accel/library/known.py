"""Which module classes compute a library family: what `import metal_accel` patches for the library.

Two sources: classes.json shipped beside this file (the model zoo's classes, written by
scripts/library_classes.py) and <user cache>/library/classes.json, where every match found on this machine
(by optimize() or at a patched call) is added. Either is only a hint of where to look: a call runs a library
kernel only after its own trace matched the family and the kernel was proven on this device.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from filelock import FileLock

from ..core import config

log = logging.getLogger(__name__)
SHIPPED = Path(__file__).resolve().parent / "classes.json"


def _user_file() -> Path:
    return config.current().user_cache / "library" / "classes.json"


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def known_classes() -> dict[str, str]:
    """Class path -> family, shipped and learned here."""
    return {**_read(SHIPPED), **_read(_user_file())}


def learn(class_path: str, family: str) -> None:
    """Remember that CLASS_PATH computed FAMILY here (atomically; a failure only costs the hint)."""
    path = _user_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            known = _read(path)
            if known.get(class_path) == family:
                return
            known[class_path] = family
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(dict(sorted(known.items())), f, indent=1)
            os.replace(tmp, path)
    except OSError as exc:
        log.debug("metal_accel: library: could not record %s: %s", class_path, exc)
