"""Kernel caches: one writable user cache and read-only shipped caches.

Layout: <root>/<backend>/<entry key>.json, one JSON document per (module, input spec, backend).

A verdict is proof here only when this user's library made it (its seal verifies: attest.py) or
the app pinned the bundle it came from; any other verdict is a claim, and the kernel is proven on
this device before it first runs, exactly as one proven on another device.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock

from ..core import config
from ..core.candidate import Candidate, check_builtin
from ..core.errors import CacheError, MetalAccelError
from ..core.redact import redact
from ..core.specs import InputSpec, OutputSpec
from ..core.verdict import Environment, Verdict
from ..sandbox.host_check import check_host_code
from ..sandbox.kernel_source import LANGUAGE_OF_BACKEND, check_kernel_source
from . import attest
from .clear import OWNED_DIRS, Cleared, clear_dir
from .index import (
    INDEX_NAME,
    INDEX_VERSION,
    atomic_write,
    index_record,
    read_index_file,
    update_index,
)
from .manifest import (
    LOCK,
    MANIFEST,
    manifest_sha256,
    read_manifest,
    sha256_file,
    unpack,
)

log = logging.getLogger(__name__)
FORMAT_VERSION = 1


def sealed_verdict(entry_doc: Any, env_id: str) -> bool:
    """Whether the verdict for ENV_ID in ENTRY_DOC (an entry file's JSON, parsed) carries this user's seal:
    for readers of plain JSON (hook.py). The entry is parsed, so its host code is checked too."""
    try:
        return CacheEntry.from_dict(entry_doc).proven(env_id)
    except (MetalAccelError, ValueError, KeyError, TypeError, AttributeError):
        return False


# Rejections that say something about this machine, not the kernel: never remembered as the kernel's.
_ENVIRONMENT_FAULTS = re.compile(
    r"compiled kernel library \S+ (is missing|has no readable build record|cannot be read|changed on disk"
    r"|is truncated or corrupt|could not be built)|cannot load compiled kernel library|no C\+\+ compiler found"
    r"|compilation timed out|compiling .{0,80} timed out|No space left on device|Read-only file system"
    r"|Too many open files|Permission denied|could not start the worker|worker could not start", re.I)


def environment_fault(reason: str) -> bool:
    """Whether a rejection REASON is this machine's fault (build infrastructure, disk, permissions)."""
    return bool(_ENVIRONMENT_FAULTS.search(reason))


# (candidate digest, kernel language) of cached code that passed the host-code and kernel-source checks in this
# process: the checks are functions of the code alone, and identical modules read the same entry many times
_CODE_PASSED: set[tuple[str, str]] = set()


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
    vouched: bool = False  # read from a bundle the app pinned by hash: its verdicts count as proof; not stored

    def verdict_for(self, env: Environment) -> Verdict | None:
        """The verdict for ENV if it is proof here: made by this user's library (sealed, or made by this
        process), or vouched for by a pinned bundle. A claim (any other verdict) gives None: prove it here."""
        verdict = self.verdicts.get(env.id)
        return verdict if verdict is not None and self.proven(env.id) else None

    def proven(self, env_id: str) -> bool:
        """Whether the verdict stored for ENV_ID is proof here rather than a claim."""
        v = self.verdicts.get(env_id)
        if v is None:
            return False
        return v.fresh or self.vouched or attest.verify(self.key, self._candidate_digest(), env_id, v.content(), v.seal,
                                                        self.subject())

    def _candidate_digest(self) -> str:
        return self.candidate.digest if self.candidate is not None else ""

    def subject(self) -> dict[str, Any]:
        """What of the entry besides its candidate decides how the kernel runs here (bound by every seal)."""
        return {"backend": self.backend, "module_class": self.module_class,
                "module_fingerprint": self.module_fingerprint, "class_source_sha": self.class_source_sha,
                "input_spec": self.input_spec.to_dict(with_hints=False),
                "output_spec": self.output_spec.to_dict() if self.output_spec else None}

    def seal_fresh(self) -> None:
        """Scrub and seal the verdicts this process made (never those read from a file): only they are proof."""
        for env_id, v in self.verdicts.items():
            if v.fresh:
                v.scrub()
                v.seal = attest.seal(self.key, self._candidate_digest(), env_id, v.content(), self.subject())

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
        check_location(d.get("backend"), d.get("key"))  # both name the entry's file: no path may come from a file
        cand = None
        if d.get("candidate"):
            c = d["candidate"]
            # the candidate checks that its source and kind follow from its code (CandidateFormatError)
            cand = Candidate(code=c["code"], source=c["source"], backend=c["backend"], origin=c.get("origin", ""),
                             kind=c.get("kind", "kernel"))
            if c.get("digest") and c["digest"] != cand.digest:
                raise CacheError("candidate digest does not match its code")
            if cand.is_builtin:
                check_builtin(cand)
            else:  # cached code is untrusted data: check it on every load (once per distinct code a process)
                language = LANGUAGE_OF_BACKEND.get(d["backend"], "")
                if (cand.digest, language) not in _CODE_PASSED:
                    check_host_code(cand.code)
                    check_kernel_source(cand.source, language)
                    _CODE_PASSED.add((cand.digest, language))
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
    """One cache directory. Writes (user cache only) are atomic and serialized by a file lock.

    `pin`: the sha256 of the bundle manifest the app pinned (load_cache(path, sha256=...)); the
    entries of a pinned bundle are vouched for, and its manifest is checked against the pin on every read.
    """

    def __init__(self, root: Path, *, writable: bool, name: str, pin: str | None = None) -> None:
        self.root = Path(root)
        self.writable = writable
        self.name = name
        self.pin = pin

    def path_for(self, backend: str, key: str) -> Path:
        check_location(backend, key)
        return self.root / backend / f"{key}.json"

    def _trusted(self, path: Path) -> bool:
        """In a bundle, only files whose sha256 the manifest lists may be read (and, pinned, only that manifest)."""
        try:
            manifest = read_manifest(self.root)
            if self.pin is not None and manifest_sha256(self.root) != self.pin:
                raise CacheError("its manifest no longer matches the pinned sha256")
        except (CacheError, ValueError, OSError) as exc:
            log.warning("metal_accel: ignoring bundle %s: %s", self.root, exc)
            return False
        if manifest is None:
            return self.pin is None
        rel = path.relative_to(self.root).as_posix()
        digest = manifest.get("files", {}).get(rel)
        if digest is None or not path.is_file() or sha256_file(path) != digest:
            if path.is_file():
                log.warning("metal_accel: skipping %s: not in the bundle manifest or its sha256 differs", path)
            return False
        return True

    def _read(self, path: Path) -> CacheEntry | None:
        entry = read_entry(path, self.name) if self._trusted(path) else None
        if entry is not None:
            entry.vouched = self.pin is not None
        return entry

    def get(self, backend: str, key: str) -> CacheEntry | None:
        path = self.path_for(backend, key)
        return self._read(path) if path.is_file() else None

    def put(self, entry: CacheEntry) -> Path:
        """Write `entry`, merged with what another process may have written meanwhile.

        Under the entry's lock: verdicts of the same candidate from other environments are kept,
        rejection records are united, and the index is updated. The verdicts this process made are
        scrubbed and sealed (only they become proof); rejections that are this machine's fault (a
        broken build, a full disk) are not remembered. Writes are atomic (rename).
        """
        if not self.writable:
            raise CacheError(f"cache {self.root} is read-only")
        path = self.path_for(entry.backend, entry.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry.verdicts = {k: v for k, v in entry.verdicts.items()
                          if not (v.fresh and not v.accepted and environment_fault(v.reason))}
        entry.rejected = [{**r, "reason": redact(str(r.get("reason", "")))} for r in entry.rejected
                          if not environment_fault(str(r.get("reason", "")))]
        with FileLock(str(path) + ".lock", timeout=60):
            merged = _merge(read_entry(path, self.name), entry)
            merged.seal_fresh()
            atomic_write(path, json.dumps(merged.to_dict(), indent=1, sort_keys=True))
        update_index(self.root, [merged])
        return path

    def entries(self, backend: str | None = None) -> Iterator[CacheEntry]:
        dirs = [self.root / backend] if backend else sorted(p for p in self.root.glob("*") if p.is_dir())
        for d in dirs:
            if d.name in OWNED_DIRS or d.name not in LANGUAGE_OF_BACKEND:  # entries live under backend names only
                continue
            for path in sorted(d.glob("*.json")):
                entry = self._read(path)
                if entry is not None:
                    yield entry

    def clear(self) -> Cleared:
        """Delete everything this (writable) cache owns: entries, index, locks, compiled artifacts,
        unpacked bundles, recordings. Files it did not make are left, and listed."""
        if not self.writable:
            raise CacheError(f"cache {self.root} is read-only")
        return clear_dir(self.root)


def _merge(old: CacheEntry | None, new: CacheEntry) -> CacheEntry:
    if old is None:
        return new
    seen = {r.get("digest") for r in new.rejected}
    new.rejected = new.rejected + [r for r in old.rejected if r.get("digest") not in seen]
    if old.candidate is not None and new.candidate is not None and old.candidate.digest == new.candidate.digest:
        # a claim (e.g. from an imported bundle) never replaces this user's own proof for the same environment
        own = {k: v for k, v in old.verdicts.items() if k in new.verdicts and old.proven(k) and not new.proven(k)}
        new.verdicts = {**old.verdicts, **new.verdicts, **own}
    elif new.candidate is None and old.candidate is not None and any(v.accepted for v in old.verdicts.values()):
        # a failed search here does not erase a kernel proven in another environment
        new.candidate, new.sandbox = old.candidate, old.sandbox
        new.verdicts = {**old.verdicts, **new.verdicts}
    return new


_loaded: dict[Path, str | None] = {}  # loaded cache directory -> the manifest sha256 the app pinned, if any


def load_cache(path: str | os.PathLike, sha256: str | None = None) -> Path:
    """Add a read-only kernel cache (a directory or a bundle, e.g. one shipped with an app).

    With `sha256` (the bundle's lock), a bundle whose manifest differs is refused, and the verdicts
    of one that matches count as proof: its kernels run here without being proven again. Without
    it, the cache's verdicts are claims: each kernel is proven on this device before its first use
    (and then remembered, sealed, in the user cache). Only paths the user names are ever loaded:
    CPU and CUDA kernels are native code. Returns the directory used.
    """
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
    pin = sha256.strip() if sha256 is not None else None
    if p not in _loaded or (pin is not None and _loaded[p] != pin):
        _loaded[p] = pin if pin is not None else _loaded.get(p)
    return p


def user_cache() -> CacheDir:
    return CacheDir(config.user_cache_dir(), writable=True, name="user")


def read_only_caches() -> list[CacheDir]:
    """Loaded caches, then METAL_ACCEL_CACHE_PATH, then the cache shipped with the package."""
    caches = [CacheDir(p, writable=False, name=f"loaded:{p}", pin=pin) for p, pin in _loaded.items()]
    caches += [CacheDir(p, writable=False, name=f"env:{p}") for p in config.extra_cache_paths()]
    caches.append(CacheDir(config.shipped_cache_dir(), writable=False, name="shipped"))
    return caches


def all_caches() -> list[CacheDir]:
    return [user_cache(), *read_only_caches()]


_KEY = re.compile(r"[0-9a-f]{32}")


def check_location(backend: Any, key: Any) -> None:
    """CacheError unless BACKEND is a backend's name and KEY an entry key (32 hex digits): they name an entry's
    file, and an entry read from a cache or a bundle is untrusted data ("../" in either would write elsewhere)."""
    if not isinstance(backend, str) or backend not in LANGUAGE_OF_BACKEND:
        raise CacheError(f"unknown backend {str(backend)[:40]!r} in a cache entry")
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise CacheError(f"malformed entry key {str(key)[:40]!r} (32 hexadecimal digits expected)")


def lookup(backend: str, key: str) -> CacheEntry | None:
    """The first entry for `key` in lookup order: the user cache, then the read-only caches."""
    for cache in all_caches():
        entry = cache.get(backend, key)
        if entry is not None:
            return entry
    return None


def read_index(root: Path) -> dict[str, dict[str, Any]]:
    """key -> record for every entry of the cache at `root`, from its index or by scanning."""
    data = read_index_file(root / INDEX_NAME)
    if data is not None:
        return {k: v for k, v in data["entries"].items() if (root / v["backend"] / f"{k}.json").is_file()}
    return {e.key: index_record(e) for e in CacheDir(root, writable=False, name="scan").entries()}


def write_index(root: Path) -> int:
    """Rebuild `<root>/index.json` from the entries on disk (for bundles and the shipped cache)."""
    entries = list(CacheDir(root, writable=False, name="scan").entries())
    data = {"format_version": INDEX_VERSION, "entries": {e.key: index_record(e) for e in entries}}
    atomic_write(root / INDEX_NAME, json.dumps(data, indent=1, sort_keys=True))
    return len(entries)
