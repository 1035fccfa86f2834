"""Which native code may run inside the user's process: the decision, in one place.

A CPU kernel (C++, or an MSL kernel translated to C++ by the emulator) is machine code with the
process's full rights. No inspection of its text or of its binary bounds what it can do once it runs
here: without importing a single symbol it can walk the C library's tables from any pointer it is
handed, read the environment from the startup stack, flip the floating-point control register,
change the OpenMP runtime torch shares, or scribble on memory it was given. So:

- Untrusted native kernels (written by an LLM, read from the user cache, a bundle or a foreign cache)
  never run in the user's process. Each call runs in the kernel server (kernel_server.py): one
  sandboxed process per user process (confine.py), tensors shared through a memory arena, only the
  tensors the kernel may write (non-const pointer parameters) copied back. A crash or hang there is a
  failed call (the dispatcher falls back to eager), never a dead or stuck user process, and nothing
  the kernel does to its own process state (FP mode, threads, RNG, memory) reaches the caller's.
  The speed gate times exactly this path, so such a kernel is installed only if it wins including
  the server's per-call cost (benchmarks/dispatch_cost.py measures it).
- Trusted native kernels run in-process (ctypes), as before: the source of a kernel this package
  ships (byte-identical to one in config.shipped_cache_dir(), which is as trusted as the package's
  own Python code), or every kernel when the user opts in with METAL_ACCEL_TRUST_NATIVE=1.
- Device code (CUDA, Metal) always loads in-process: it cannot make system calls or touch host
  memory, so its safety does not rest on its text (it can still write out of bounds on the device;
  the proof's guard regions are what catch that).

Host code (restricted Python, sandbox.py) runs in the user's process in every case; only the
`lib.<kernel>(...)` calls cross to the server.
"""
from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from ..backends.base import Backend
from ..core import config
from ..library.sources import library_sources
from .kernel_server import RemoteLibrary

NATIVE_BACKENDS = frozenset({"cpu", "mps-emu"})  # kernels that are host machine code
IN_PROCESS = "in-process"
KERNEL_SERVER = "kernel server"

_placements: dict[str, str] = {}  # sha256 of a source -> where its kernels were last set to run


def trust_native() -> bool:
    """METAL_ACCEL_TRUST_NATIVE=1: the user trusts every native kernel enough to run it in-process."""
    return config.current().trust_native


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


@functools.cache
def _shipped_digests() -> tuple[frozenset[str], frozenset[str]]:
    """sha256 of every kernel source, and of every candidate's host code (its SOURCE literal included), in the
    shipped cache (all backends)."""
    sources, codes = set(), set()
    for path in config.shipped_cache_dir().glob("*/*.json"):
        try:
            cand = json.loads(path.read_text()).get("candidate") or {}
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(cand.get("source"), str) and cand["source"]:
            sources.add(_digest(cand["source"]))
        if isinstance(cand.get("code"), str):
            codes.add(_digest(cand["code"]))
    return frozenset(sources), frozenset(codes)


def shipped_source_digests() -> frozenset[str]:
    """sha256 of every kernel source in the shipped cache (all backends)."""
    return _shipped_digests()[0]


def shipped_code_digests() -> frozenset[str]:
    """sha256 of the host code of every shipped cache entry (its SOURCE literal included)."""
    return _shipped_digests()[1]


def runs_in_process(cand: Any, module: Any, spec: Any, backend: Backend, own: bool | None = None) -> bool:
    """Whether CAND's native kernels may run in the user's process for MODULE's call with SPEC: the user opted
    in, or its source and its host code are both the package's own (a shipped entry's code, or exactly what the
    kernel library proposes for this call: library/trusted.py). A trusted source is not enough: the host code
    chooses every pointer and size the kernel gets. OWN: is_package_candidate's answer, where the caller has it."""
    if backend.name not in NATIVE_BACKENDS or trust_native():
        return True
    if own is None:
        own = is_package_candidate(cand, module, spec, backend.name)
    return own and is_trusted(cand.source)


def is_package_candidate(cand: Any, module: Any, spec: Any, backend: str) -> bool:
    """Whether CAND's host code is the package's own for MODULE's call with SPEC: a shipped entry's code, or
    exactly what the kernel library proposes for the call. Such host code is reviewed, so its calls need no
    run-time guard against writing the module's tensors (backends/protected.py); any other candidate's do."""
    if _digest(cand.code) in shipped_code_digests():
        return True
    from ..library.trusted import is_library_candidate  # the library imports the runtime: late
    return is_library_candidate(cand, module, spec, backend)


def is_trusted(source: str) -> bool:
    """Whether native kernel SOURCE may run in the user's process: a shipped kernel (shipped cache or kernel
    library), or the user opted in."""
    digest = _digest(source)
    return trust_native() or digest in shipped_source_digests() or digest in library_sources()


def runtime_library(backend: Backend, source: str, *, trusted: bool | None = None) -> Any:
    """The library whose `lib.<kernel>(...)` production calls run: in-process for device code and
    trusted native code, else a RemoteLibrary served by the kernel server. TRUSTED None lets the
    policy decide (is_trusted); True or False is the caller's own knowledge (e.g. the entry's origin).
    Raises MetalAccelError (CompileError, KernelServerError) with a sentence."""
    if backend.name not in NATIVE_BACKENDS:
        return backend.compile(source)
    if trusted is None:
        trusted = is_trusted(source)
    if trusted:
        lib = backend.compile(source)
        _placements[_digest(source)] = IN_PROCESS
        return lib
    lib = RemoteLibrary(backend, source)
    _placements[_digest(source)] = KERNEL_SERVER
    return lib


def placement(source: str) -> str | None:
    """Where the kernels of SOURCE were last set to run in this process: IN_PROCESS, KERNEL_SERVER or None."""
    return _placements.get(_digest(source))


def op_variant(lib: Any) -> str:
    """What tells apart the custom ops of one kernel by where its calls run ('' in-process, 'srv' in the kernel
    server): an op made while the kernel was untrusted must not serve once it is trusted, nor the reverse."""
    return "srv" if isinstance(lib, RemoteLibrary) else ""
