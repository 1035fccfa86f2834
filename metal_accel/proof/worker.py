"""Isolation: untrusted candidates run first in a confined worker process.

The worker starts with a scrubbed environment and a scratch directory of its own (removed on close),
confines itself (confine.py: Landlock, seccomp, limits) before it reads a request, and only loads
kernels the caller compiled: the build directory is read-only to it, the user cache out of reach. It
runs the proof's trials and the speed gate's workload (the soak) on the caller's inputs; a segfault,
abort, hang or runaway allocation there rejects the candidate with a reason, and the user's process
goes on. References stay in the caller. Replies are read with `torch.load(weights_only=True)`, so a
corrupted worker cannot make the caller unpickle code.

    python metal_accel/sandbox/confine.py -m metal_accel.proof.worker_main --backend B --device D --scratch DIR
        # the worker end: a hello frame naming its confinement, then length-prefixed frames on stdin/stdout
"""
from __future__ import annotations

import atexit
import hashlib
import io
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch.utils import _pytree

from ..core import config
from ..core.config import DEFAULT_TIMEOUT_S
from ..core.redact import redact
from ..sandbox import confine

START_TIMEOUT_S = 120.0  # importing torch on a busy machine; a worker not up by then is a failure
MEMORY_HEADROOM = 4 << 30  # address space a candidate may add over the worker's own (CPU device only)
REQUEST_COPIES = 4  # and this many times the request's size, for its inputs' copies and outputs
_HEADER = struct.Struct("<Q")


class WorkerFailure(Exception):
    """The worker crashed, hung or ran out of memory; the message is the reason."""


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def tensors_to(value: Any, device: torch.device | str) -> Any:
    """VALUE with every tensor in it moved to DEVICE (detached), inside tuples, lists, dicts and other pytree
    nodes too (position embeddings as (cos, sin)): what crosses the pipe goes on the CPU, the worker runs
    on its device."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    return _pytree.tree_map_only(torch.Tensor, lambda t: t.detach().to(device), value)


def output_digest(outs: tuple) -> str:
    """A digest of a call's outputs (dtype, shape, bytes), compared across the soak's calls."""
    h = hashlib.sha256()
    for o in outs:
        h.update(f"{o.dtype}{tuple(o.shape)}".encode())
        h.update(o.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


class RepeatDigests:
    """output_digest for calls that repeat on a few input sets (the soak's): a call whose outputs equal its set's
    first call's, bit for bit, gets that call's digest from a compare on the device, without the copy to the
    host and the hash (a GPU kernel's 500 soak calls of 8 MB each were 4 GB through the host)."""

    def __init__(self) -> None:
        self._first: dict[int, tuple[tuple[torch.Tensor, ...], str]] = {}

    def digest(self, input_set: int, outs: tuple) -> str:
        kept = self._first.get(input_set)
        if kept is not None and _bitwise_equal(kept[0], outs):
            return kept[1]
        d = output_digest(outs)
        if kept is None:
            self._first[input_set] = (tuple(o.detach().clone() for o in outs), d)
        return d


def _bitwise_equal(a: tuple, b: tuple) -> bool:
    """Equal dtypes, shapes and bytes (NaNs with the same bits are equal, -0.0 and 0.0 are not)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.dtype != y.dtype or x.shape != y.shape or x.device != y.device:
            return False
        if not torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8)):
            return False
    return True


def launch(backend: str, device: str, scratch: Path, module: str = "metal_accel.proof.worker_main") -> tuple[list[str], dict[str, str]]:
    """The worker's command line and its whole environment: scrubbed, HOME and TMPDIR in SCRATCH, the build
    directory named (read-only to it), the user cache pointed into SCRATCH, auto-instrumentation off."""
    env = {**confine.scrubbed_environment(scratch), "METAL_ACCEL_BUILD_DIR": str(config.build_dir()),
           "METAL_ACCEL_USER_CACHE": str(scratch / "user-cache"), "METAL_ACCEL_DISABLE": "1"}
    return [sys.executable, confine.__file__, "-m", module, "--backend", backend, "--device", device,
            "--scratch", str(scratch)], env


class Worker:
    """One confined worker process for one (backend, device, build directory), started on first use,
    restarted after it dies or when a request needs another."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._scratch: Path | None = None
        self._kind: tuple[str, str, str] | None = None
        self._lock = threading.Lock()
        self.layers: list[str] = []   # the running worker's confinement (confine.apply), as it reported it
        self.start_s = 0.0            # how long its start took, confinement included
        self.pid = 0

    def _start(self, backend: str, device: str, timeout: float) -> subprocess.Popen[bytes]:
        kind = (backend, device, str(config.build_dir()))  # the build directory is the only one it may read
        if self._proc is not None and (self._proc.poll() is not None or self._kind != kind):
            self.close()
        if self._proc is None:
            t0 = time.monotonic()
            # the worker may read the build directory only: it is granted when the worker confines itself, which
            # grants nothing for a path that does not exist yet (a worker started before the first build)
            config.build_dir().mkdir(parents=True, exist_ok=True)
            self._scratch = Path(tempfile.mkdtemp(prefix="metal_accel_worker_"))
            self._stderr = tempfile.TemporaryFile()
            cmd, env = launch(backend, device, self._scratch)
            self._proc = proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=self._stderr, env=env, cwd=self._scratch)
            self._kind = kind
            hello = self._reply(proc, max(timeout, START_TIMEOUT_S), "while starting")
            self.layers = [str(x) for x in hello.get("layers", [])]
            self.pid = proc.pid
            self.start_s = time.monotonic() - t0
        return self._proc

    def prestart(self, backend: str, device: str) -> threading.Thread | None:
        """Start the worker for (BACKEND, DEVICE) in the background, where none runs for them: its start (a Python
        process importing torch and opening the device, 6 s on an H200 host) then overlaps the work before the
        first request, which waits for it. A failed start is left for that request to meet and report."""
        if self._proc is not None and self._proc.poll() is None and self._kind is not None \
                and self._kind[:2] == (backend, device):
            return None

        def start() -> None:
            with self._lock:
                try:
                    self._start(backend, device, START_TIMEOUT_S)
                except (WorkerFailure, OSError):
                    self.close()
        thread = threading.Thread(target=start, name="metal_accel-worker-start", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def _stderr_tail(self, n: int = 1500) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return redact(self._stderr.read().decode(errors="replace")[-n:].strip())

    def _read(self, fd: int, n: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _reply(self, proc: subprocess.Popen[bytes], limit_s: float, when: str = "") -> dict[str, Any]:
        """The next frame from the worker within LIMIT_S; WorkerFailure saying how it died, hung or garbled it."""
        deadline = time.monotonic() + limit_s
        try:
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            size = _HEADER.unpack(self._read(fd, _HEADER.size, deadline))[0]
            data = self._read(fd, size, deadline)
        except TimeoutError:
            self.close()
            raise WorkerFailure(f"timed out{' ' + when if when else ''} after {limit_s:.0f} s "
                                "(a hang or an endless loop)") from None
        except (EOFError, BrokenPipeError):
            code = proc.wait()
            tail = self._stderr_tail()
            self.close()
            why = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
            raise WorkerFailure(f"crashed{' ' + when if when else ''} ({why})"
                                + (f": {tail.splitlines()[-1]}" if tail else "")) from None
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:
            self.close()
            raise WorkerFailure(f"sent an unreadable reply ({type(exc).__name__})") from None

    def request(self, req: dict[str, Any], timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        """Send one request; the reply dict, or WorkerFailure saying how the worker died. Where the worker
        could confine neither files nor syscalls, the reply refuses (unless METAL_ACCEL_UNCONFINED=1)."""
        with self._lock:
            proc = self._start(req["backend"], req["device"], timeout)
            if not confine.sufficient(self.layers) and not config.current().unconfined:
                missing = "; ".join(l for l in self.layers if "not applied" in l) or "no layer applied"
                return {"ok": False, "stage": "confine",
                        "error": f"refused to run untrusted native code: the worker could confine neither files nor "
                                 f"system calls on this machine ({missing}); set {confine.UNCONFINED_ENV}=1 to run "
                                 "it unconfined anyway"}
            payload = pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL)
            try:
                assert proc.stdin is not None
                proc.stdin.write(_HEADER.pack(len(payload)) + payload)
                proc.stdin.flush()
            except BrokenPipeError:
                pass  # it died: _reply says how
            reply = self._reply(proc, timeout)
            if reply.get("restart"):  # the worker's device context is broken: the next request gets a new one
                self.close()
            return reply


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


_worker: Worker | None = None


def shared_worker() -> Worker:
    global _worker
    if _worker is None:
        _worker = Worker()
        atexit.register(_worker.close)
    return _worker
