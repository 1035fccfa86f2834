"""Seals on verdicts: which verdicts this user's own library made, as opposed to claims read from a file.

A verdict in a cache file is text anyone can write. A verdict counts as proof here only when it
carries a seal (HMAC-SHA256) made with this user's secret key at the moment this library wrote it
after proving the kernel itself. The key lives in the user's config directory, never in a cache
directory, so a copied, shared or shipped cache carries no key and its verdicts stay claims.

    <config dir>/verdict.key   32 random bytes, mode 0600, created once (atomically)

The seal binds the entry key, the entry's candidate digest, what else of the entry decides behaviour
(its specs, module class and fingerprint: `subject`), the environment id the verdict is stored under
and the verdict's whole content (launch settings included): moving a sealed verdict to another entry,
candidate or environment, or editing any of these fields, breaks it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

from ..core import config

log = logging.getLogger(__name__)
KEY_NAME = "verdict.key"
KEY_BYTES = 32
SEAL_VERSION = 1

_keys: dict[str, bytes | None] = {}   # key file path -> key (None: no usable key there)
_lock = threading.Lock()


def config_dir() -> Path:
    """METAL_ACCEL_CONFIG_DIR, else the platform's user config directory for metal_accel."""
    return config.current().config_dir


def key_path() -> Path:
    return config_dir() / KEY_NAME


def _read_key(path: Path) -> bytes | None:
    """The key at PATH if it is a private file of ours holding exactly KEY_BYTES bytes, else None."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if os.name == "posix" and (st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or st.st_uid != os.getuid()):
            log.warning("metal_accel: ignoring the verdict key %s: it is readable or writable by other users "
                        "(expected mode 0600, owned by you); every cached kernel is proven again before it runs",
                        path)
            return None
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        log.warning("metal_accel: ignoring the verdict key %s: it is not %d bytes; delete it to make a new one",
                    path, KEY_BYTES)
        return None
    return data


def _create_key(path: Path) -> None:
    """Write a fresh key to PATH unless one exists: the first process to link its file wins."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".key-")  # mkstemp creates it 0600
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made the key first: use theirs
        except OSError:  # no hard links on this file system
            if not path.exists():
                os.replace(tmp, path)
    finally:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)


def user_key() -> bytes | None:
    """This user's verdict key, created on first use; None (with one warning) when it cannot be had."""
    path = key_path()
    with _lock:
        if str(path) in _keys:
            return _keys[str(path)]
        key = None
        try:
            if not path.exists():
                _create_key(path)
            key = _read_key(path)
        except OSError as exc:
            log.warning("metal_accel: no verdict key at %s (%s); cached kernels are proven again in every "
                        "process before they run", path, exc.strerror or exc)
        _keys[str(path)] = key
        return key


def _message(entry_key: str, candidate_digest: str, env_id: str, content: dict[str, Any],
             subject: dict[str, Any] | None) -> bytes:
    doc = {"v": SEAL_VERSION, "entry": entry_key, "candidate": candidate_digest, "env": env_id, "verdict": content,
           "subject": subject or {}}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def seal(entry_key: str, candidate_digest: str, env_id: str, content: dict[str, Any],
         subject: dict[str, Any] | None = None) -> str:
    """The seal of one verdict's CONTENT (its to_dict without the seal), or '' when there is no key."""
    key = user_key()
    if key is None:
        return ""
    message = _message(entry_key, candidate_digest, env_id, content, subject)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def verify(entry_key: str, candidate_digest: str, env_id: str, content: dict[str, Any], mark: str,
           subject: dict[str, Any] | None = None) -> bool:
    """Whether MARK is this user's seal of exactly this verdict, entry (and SUBJECT), candidate and environment."""
    if not mark:
        return False
    expected = seal(entry_key, candidate_digest, env_id, content, subject)
    return bool(expected) and hmac.compare_digest(expected, mark)


def existing_key() -> bytes | None:
    """This user's key if it exists already (never created here): a confined worker, whose config directory is its
    scratch, has none and leaves seals unchecked; the caller checked them before it sent the work."""
    path = key_path()
    with _lock:
        if str(path) in _keys:
            return _keys[str(path)]
    try:
        return _read_key(path) if path.exists() else None
    except OSError:
        return None


def _artifact_message(name: str, sha256: str) -> bytes:
    return json.dumps({"v": SEAL_VERSION, "artifact": name, "sha256": sha256}, sort_keys=True).encode()


def seal_artifact(name: str, sha256: str) -> str:
    """This user's seal of a compiled artifact named NAME with these bytes ('' without a key): its build record
    beside it can then only be rewritten to match another file by someone holding the key."""
    key = user_key()
    return hmac.new(key, _artifact_message(name, sha256), hashlib.sha256).hexdigest() if key else ""


def artifact_sealed(name: str, sha256: str, mark: str) -> bool:
    """Whether MARK is this user's seal of the artifact NAME with these bytes; True where no key exists here (a
    confined process, which loads only what its caller checked)."""
    key = existing_key()
    if key is None:
        return True
    expected = hmac.new(key, _artifact_message(name, sha256), hashlib.sha256).hexdigest()
    return bool(mark) and hmac.compare_digest(expected, mark)


__all__ = ["artifact_sealed", "config_dir", "existing_key", "key_path", "seal", "seal_artifact", "user_key",
           "verify"]
