"""Kernel caches: one writable user cache and read-only shipped caches.

Layout: <root>/<backend>/<entry key>.json, one JSON document per (module, input spec, backend).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock

from . import config
from .backends.base import Environment
from .candidate import Candidate
from .errors import CacheError, MetalAccelError
from .sandbox_check import check_host_code
from .source_check import LANGUAGE_OF_BACKEND, check_kernel_source
from .cache_index import atomic_write, update_index
from .specs import InputSpec, OutputSpec

log = logging.getLogger(__name__)
FORMAT_VERSION = 1


@dataclass
class Verdict:
    """The outcome of proving one candidate in one environment, with the numbers behind it."""

    env: Environment
    accepted: bool
    reason: str
    candidate_digest: str = ""
    speedup: float | None = None
    eager_us: float | None = None
    kernel_us: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    measured_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {"env": self.env.to_dict(), "accepted": self.accepted, "reason": self.reason,
                "candidate_digest": self.candidate_digest, "speedup": self.speedup,
                "eager_us": self.eager_us, "kernel_us": self.kernel_us, "details": self.details,
                "measured_at": self.measured_at}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        return cls(env=Environment.from_dict(d["env"]), accepted=bool(d["accepted"]), reason=str(d["reason"]),
                   candidate_digest=d.get("candidate_digest", ""), speedup=d.get("speedup"),
                   eager_us=d.get("eager_us"), kernel_us=d.get("kernel_us"), details=d.get("details", {}),
                   measured_at=float(d.get("measured_at", 0.0)))


@dataclass
class CacheEntry:
    """Everything known about one (module, input spec, backend): the kernel and its verdicts."""

    key: str
    backend: str
    module_class: str
    module_fingerprint: str
    input_spec: InputSpec
    output_spec: OutputSpec | None
    candidate: Candidate | None
    sandbox: dict[str, Any] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)   # env id -> verdict
    rejected: list[dict[str, str]] = field(default_factory=list)  # {digest, origin, reason} of losers
    class_source_sha: str = ""  # sha256 of the module class's source (auto-instrumentation checks it)
    origin: str = "user"  # which cache it was read from; not stored

    def verdict_for(self, env: Environment) -> Verdict | None:
        return self.verdicts.get(env.id)

    def to_dict(self) -> dict[str, Any]:
        cand = None
        if self.candidate is not None:
            cand = {"code": self.candidate.code, "source": self.candidate.source,
                    "backend": self.candidate.backend, "origin": self.candidate.origin,
                    "digest": self.candidate.digest, "kind": self.candidate.kind}
        return {"format_version": FORMAT_VERSION, "key": self.key, "backend": self.backend,
                "module_class": self.module_class, "module_fingerprint": self.module_fingerprint,
                "input_spec": self.input_spec.to_dict(),
                "output_spec": self.output_spec.to_dict() if self.output_spec else None,
                "candidate": cand, "sandbox": self.sandbox,
                "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()}, "rejected": self.rejected,
                "class_source_sha": self.class_source_sha}

    @classmethod
    def from_dict(cls, d: dict[str, Any], origin: str = "user") -> "CacheEntry":
        if d.get("format_version") != FORMAT_VERSION:
            raise CacheError(f"unknown cache format version {d.get('format_version')!r}")
        cand = None
        if d.get("candidate"):
            c = d["candidate"]
            kind = c.get("kind", "kernel")
            if kind not in ("kernel", "inductor", "cuda-graph"):
                raise CacheError(f"unknown candidate kind {kind!r}")
            cand = Candidate(code=c["code"], source=c["source"], backend=c["backend"], origin=c.get("origin", ""),
                             kind=kind)
            if c.get("digest") and c["digest"] != cand.digest:
                raise CacheError("candidate digest does not match its code")
            if cand.is_builtin:
                from .builtin_compile import check_builtin
                check_builtin(cand)
            else:  # cached code is untrusted data: check it on every load
                check_host_code(cand.code)
                check_kernel_source(cand.source, LANGUAGE_OF_BACKEND.get(d["backend"], ""))
            if cand.backend != d["backend"]:
                raise CacheError("candidate backend differs from the entry's backend")
        out = d.get("output_spec")
        return cls(key=d["key"], backend=d["backend"], module_class=d["module_class"],
                   module_fingerprint=d["module_fingerprint"], input_spec=InputSpec.from_dict(d["input_spec"]),
                   output_spec=OutputSpec.from_dict(out) if out else None, candidate=cand,
                   sandbox=d.get("sandbox", {}),
                   verdicts={k: Verdict.from_dict(v) for k, v in d.get("verdicts", {}).items()},
                   rejected=list(d.get("rejected", [])), class_source_sha=d.get("class_source_sha", ""),
                   origin=origin)


def read_entry(path: Path, origin: str) -> CacheEntry | None:
    """Load one entry file; a corrupt, tampered or foreign entry is skipped with a warning."""
    try:
        entry = CacheEntry.from_dict(json.loads(path.read_text()), origin=origin)
    except FileNotFoundError:
        return None
    except (MetalAccelError, ValueError, KeyError, TypeError) as exc:
        log.warning("metal_accel: skipping cache entry %s: %s", path, exc)
        return None
    if entry.key != path.stem:
        log.warning("metal_accel: skipping cache entry %s: key does not match its file name", path)
        return None
    return entry


class CacheDir:
    """One cache directory. Writes (user cache only) are atomic and serialized by a file lock."""

    def __init__(self, root: Path, *, writable: bool, name: str) -> None:
        self.root = Path(root)
        self.writable = writable
        self.name = name

    def path_for(self, backend: str, key: str) -> Path:
        return self.root / backend / f"{key}.json"

    def _trusted(self, path: Path) -> bool:
        """In a bundle, only files whose sha256 the manifest lists may be read."""
        from .bundle import read_manifest, sha256_file
        try:
            manifest = read_manifest(self.root)
        except (CacheError, ValueError) as exc:
            log.warning("metal_accel: ignoring bundle %s: %s", self.root, exc)
            return False
        if manifest is None:
            return True
        rel = path.relative_to(self.root).as_posix()
        digest = manifest.get("files", {}).get(rel)
        if digest is None or not path.is_file() or sha256_file(path) != digest:
            if path.is_file():
                log.warning("metal_accel: skipping %s: not in the bundle manifest or its sha256 differs", path)
            return False
        return True

    def get(self, backend: str, key: str) -> CacheEntry | None:
        path = self.path_for(backend, key)
        if not path.is_file() or not self._trusted(path):
            return None
        return read_entry(path, self.name)

    def put(self, entry: CacheEntry) -> Path:
        """Write `entry`, merged with what another process may have written meanwhile.

        Under the entry's lock: verdicts of the same candidate from other environments are kept,
        rejection records are united, and the index is updated. Writes are atomic (rename).
        """
        if not self.writable:
            raise CacheError(f"cache {self.root} is read-only")
        path = self.path_for(entry.backend, entry.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock", timeout=60):
            merged = _merge(read_entry(path, self.name), entry)
            atomic_write(path, json.dumps(merged.to_dict(), indent=1, sort_keys=True))
        update_index(self.root, [merged])
        return path

    def entries(self, backend: str | None = None) -> Iterator[CacheEntry]:
        dirs = [self.root / backend] if backend else sorted(p for p in self.root.glob("*") if p.is_dir())
        for d in dirs:
            if d.name == "build":
                continue
            for path in sorted(d.glob("*.json")):
                entry = read_entry(path, self.name) if self._trusted(path) else None
                if entry is not None:
                    yield entry

    def clear(self) -> int:
        """Delete every entry (and compiled artifacts) of a writable cache; returns entries removed."""
        if not self.writable:
            raise CacheError(f"cache {self.root} is read-only")
        removed = 0
        for path in self.root.glob("*/*.json"):
            path.unlink(missing_ok=True)
            removed += 1
        for path in [*self.root.glob("*/*.lock"), self.root / "index.json"]:
            path.unlink(missing_ok=True)
        return removed


def _merge(old: CacheEntry | None, new: CacheEntry) -> CacheEntry:
    if old is None:
        return new
    seen = {r.get("digest") for r in new.rejected}
    new.rejected = new.rejected + [r for r in old.rejected if r.get("digest") not in seen]
    if old.candidate is not None and new.candidate is not None and old.candidate.digest == new.candidate.digest:
        new.verdicts = {**old.verdicts, **new.verdicts}
    elif new.candidate is None and old.candidate is not None and any(v.accepted for v in old.verdicts.values()):
        # a failed search here does not erase a kernel proven in another environment
        new.candidate, new.sandbox = old.candidate, old.sandbox
        new.verdicts = {**old.verdicts, **new.verdicts}
    return new


_loaded: list[Path] = []


def load_cache(path: str | os.PathLike, sha256: str | None = None) -> Path:
    """Add a read-only kernel cache (a directory or a bundle, e.g. one shipped with an app).

    With `sha256` (the bundle's lock), a bundle whose manifest differs is refused. Only paths the
    user names are ever loaded: CPU and CUDA kernels are native code. Returns the directory used.
    """
    from .bundle import LOCK, MANIFEST, read_manifest, sha256_file, unpack
    p = unpack(path, config.user_cache_dir() / "bundles")
    if not p.is_dir():
        raise CacheError(f"no cache directory at {p}")
    if sha256 is not None:
        manifest = p / MANIFEST
        if not manifest.is_file():
            raise CacheError(f"{path}: a sha256 was given but there is no {MANIFEST} to check it against")
        actual = sha256_file(manifest)
        if actual != sha256.strip():
            raise CacheError(f"{path}: manifest sha256 {actual[:16]}... does not match the pinned "
                             f"{sha256.strip()[:16]}... (see {LOCK}); refusing to load")
    read_manifest(p)  # an unknown bundle version is refused here, loudly
    if p not in _loaded:
        _loaded.append(p)
        try:
            from . import hook
            if hook.is_active():
                hook.activate()  # patch the classes the new cache names
        except Exception as exc:
            log.warning("metal_accel: could not extend auto-instrumentation to %s: %s", p, exc)
    return p


def user_cache() -> CacheDir:
    return CacheDir(config.user_cache_dir(), writable=True, name="user")


def read_only_caches() -> list[CacheDir]:
    """Loaded caches, then METAL_ACCEL_CACHE_PATH, then the cache shipped with the package."""
    caches = [CacheDir(p, writable=False, name=f"loaded:{p}") for p in _loaded]
    caches += [CacheDir(p, writable=False, name=f"env:{p}") for p in config.extra_cache_paths()]
    caches.append(CacheDir(config.shipped_cache_dir(), writable=False, name="shipped"))
    return caches


def all_caches() -> list[CacheDir]:
    return [user_cache(), *read_only_caches()]


def lookup(backend: str, key: str) -> CacheEntry | None:
    """The first entry for `key` in lookup order: the user cache, then the read-only caches."""
    for cache in all_caches():
        entry = cache.get(backend, key)
        if entry is not None:
            return entry
    return None
