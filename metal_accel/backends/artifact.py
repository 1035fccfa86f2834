"""Compiled kernel libraries on disk: checked when built, checked again before the first load.

Building writes `<artifact>.check.json` (the artifact's sha256, the binary check's verdict, and this user's
seal of the sha256: store/attest.py) before the artifact itself appears. Before a process first loads an artifact, its sha256 is recomputed and
compared with that record and the binary check runs again (about 10 ms), so neither a swapped or
truncated file nor an edited record (nor both rewritten to match: the seal) is loaded. A mismatch deletes the artifact and rebuilds it once;
a second failure is a CompileError that says so.
"""
from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import filelock

from ..core.errors import CompileError
from ..store import attest
from ..sandbox.binary_allow import Policy
from ..sandbox.binary_check import (
    DEFAULT_BASELINE,
    Baseline,
    BinaryCheckError,
    Verdict,
    check_shared_object,
    measure_baseline,
    sha256_of,
)
from .native_build import compile_shared

LOCK_TIMEOUT_S = 600
EMPTY_UNIT = 'extern "C" void ma_empty_kernel() {}\n'


def record_path(artifact: Path) -> Path:
    """Where the build record of ARTIFACT lives."""
    return artifact.with_name(artifact.name + ".check.json")


@functools.cache
def baseline(cxx: str, flags: tuple[str, ...], include_dir: str, unit: str = EMPTY_UNIT,
             headers: frozenset[str] = frozenset()) -> Baseline:
    """The toolchain's own load-time entries and writable data for FLAGS, measured once per process by
    compiling UNIT, a translation unit with no kernel code of its own: an empty one, or for the emulator a
    trivial translated kernel, which brings the emulator's runtime (HEADERS: what UNIT may include; kept in
    memory only: a record on disk could be edited)."""
    with tempfile.TemporaryDirectory(prefix="ma-baseline-") as d:
        work = Path(d)
        (work / "kernel.cpp").write_text(unit)
        so = compile_shared(cxx, flags, work, "kernel.cpp", 120, Path(include_dir), headers,
                            "compiling the empty baseline unit")
        return measure_baseline(so)


def check_and_place(built: Path, artifact: Path, policy: Policy, base: Baseline) -> Verdict:
    """Binary-check BUILT (raises BinaryCheckError), write ARTIFACT's record, then move BUILT to ARTIFACT."""
    verdict = check_shared_object(built, policy, base)
    rec = {"sha256": verdict.sha256, "backend": policy.backend, "binary_check": verdict.summary,
           "seal": attest.seal_artifact(artifact.name, verdict.sha256)}
    fd, tmp = tempfile.mkstemp(dir=artifact.parent, prefix=artifact.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, record_path(artifact))
    os.replace(built, artifact)
    return verdict


def _problem(artifact: Path, policy: Policy, base: Baseline, recheck: bool = True) -> str | None:
    """Why ARTIFACT may not be loaded as it is (None when it may). A failed binary check raises; RECHECK False
    (just built and checked by this process) compares the sha256 only."""
    if not artifact.exists():
        return "is missing"
    try:
        rec = json.loads(record_path(artifact).read_text())
        recorded = rec["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return "has no readable build record"
    try:
        actual = sha256_of(artifact)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if actual != recorded:
        return "changed on disk after it was built (its sha256 differs from the build record)"
    if not attest.artifact_sealed(artifact.name, recorded, str(rec.get("seal", ""))):
        return "has a build record this user's library did not write (no valid seal)"
    if not recheck:
        return None
    try:
        check_shared_object(artifact, policy, base)
    except BinaryCheckError as e:
        if "not a readable ELF" in str(e):
            return "is truncated or corrupt"
        raise
    return None


def discard(artifact: Path) -> None:
    """Delete ARTIFACT and its build record."""
    for p in (artifact, record_path(artifact)):
        p.unlink(missing_ok=True)


def ensure_artifact(artifact: Path, build: Callable[[], None] | None, policy: Policy, base: Baseline | None) -> bool:
    """Make sure ARTIFACT exists, matches its build record and passes the binary check; BUILD() (which must
    call check_and_place) makes it when missing, and remakes it once when it fails. True when built now.
    BASE None: no compiler here to measure the baseline; GCC's own (DEFAULT_BASELINE) is assumed."""
    base = base or DEFAULT_BASELINE
    built_now = False
    problem = None
    for attempt in range(2):
        if artifact.exists() and _problem(artifact, policy, base) is None:
            return built_now
        artifact.parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(artifact.with_suffix(".lock")), timeout=LOCK_TIMEOUT_S):
            problem = _problem(artifact, policy, base)
            if problem is None:
                return built_now
            if attempt and problem != "is missing":
                break
            discard(artifact)
            if build is None:
                break
            build()
            built_now = True
            problem = _problem(artifact, policy, base, recheck=False)
            if problem is None:
                return True
    raise CompileError(f"the compiled kernel library {artifact.name} {problem or 'could not be built'}"
                       f"{' and rebuilding it did not help' if built_now else ''}; it is not loaded")
