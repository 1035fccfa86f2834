"""A bundle's own files: its manifest (format, entries, the sha256 of every file), its lock (the
manifest's sha256, what an app pins), and unpacking a .tar.gz bundle safely. bundle.py makes and
verifies bundles; cache.py reads their entries."""
from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from ..core.errors import CacheError

MANIFEST = "manifest.json"


LOCK = "bundle.lock"


BUNDLE_FORMAT = "metal_accel-bundle"


BUNDLE_VERSION = 1


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=32)
def _manifest_cached(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if data.get("format") != BUNDLE_FORMAT or data.get("bundle_version") != BUNDLE_VERSION:
        raise CacheError(f"{path}: not a metal_accel bundle of a known version "
                         f"(format {data.get('format')!r}, version {data.get('bundle_version')!r})")
    return data


@functools.lru_cache(maxsize=32)
def _sha256_cached(path: str, mtime_ns: int, size: int) -> str:
    return sha256_file(Path(path))


def manifest_sha256(root: Path) -> str | None:
    """The sha256 of `root`'s manifest (what a pin names), or None when it has none."""
    path = root / MANIFEST
    if not path.is_file():
        return None
    st = path.stat()
    return _sha256_cached(str(path), st.st_mtime_ns, st.st_size)


def read_manifest(root: Path) -> dict[str, Any] | None:
    """The bundle manifest at `root`, or None when `root` is a plain cache directory."""
    path = root / MANIFEST
    if not path.is_file():
        return None
    st = path.stat()
    return _manifest_cached(str(path), st.st_mtime_ns, st.st_size)


def unpack(path: str | Path, into: Path) -> Path:
    """A bundle directory for `path`: itself, or the archive safely extracted under `into`."""
    path = Path(path)
    if path.is_dir():
        return path
    if not path.name.endswith((".tar.gz", ".tgz")) or not path.is_file():
        raise CacheError(f"{path} is neither a bundle directory nor a .tar.gz bundle")
    digest = sha256_file(path)[:16]
    out = into / digest
    if not (out / "bundle" / MANIFEST).is_file():
        tmp = Path(tempfile.mkdtemp(dir=into.parent if into.parent.exists() else None))
        with tarfile.open(path, "r:gz") as tar:
            tar.extractall(tmp, filter="data")  # refuses absolute paths, links out, devices
        if not (tmp / "bundle" / MANIFEST).is_file():
            shutil.rmtree(tmp)
            raise CacheError(f"{path} has no bundle/{MANIFEST}")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out / "bundle"
