"""Isolation: compile and first runs of untrusted candidates happen in a worker process.

A segfault, abort, hang or runaway allocation there rejects the candidate with a reason; the
user's process goes on. The worker only ever sees inputs; references stay in the caller.
Replies are read with `torch.load(weights_only=True)`, so a corrupted worker cannot make the
caller unpickle code.

    python -m metal_accel.worker      # the worker end: length-prefixed frames on stdin/stdout
"""
from __future__ import annotations

import atexit
import io
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, BinaryIO

import torch

DEFAULT_TIMEOUT_S = 120.0
MEMORY_HEADROOM = 4 << 30  # address space a candidate may add over the worker's own (CPU device only)
REQUEST_COPIES = 4  # and this many times the request's size, for its inputs' copies and outputs
_HEADER = struct.Struct("<Q")


class WorkerFailure(Exception):
    """The worker crashed, hung or ran out of memory; the message is the reason."""


# ---------------------------------------------------------------- worker end

def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _limit_memory(device: str, request_bytes: int) -> None:
    """Cap the address space for the next request: the worker's own, plus MEMORY_HEADROOM, plus room for
    the request's tensors several times over (the trial checks copies of its inputs, the outputs come
    back serialized), so a gigabyte input is no runaway allocation."""
    if device != "cpu" or not sys.platform.startswith("linux"):
        return  # GPU drivers reserve huge address ranges; an address-space cap would break them
    import resource
    with open("/proc/self/status") as f:
        vm_kb = int(next(line for line in f if line.startswith("VmSize:")).split()[1])
    limit = vm_kb * 1024 + MEMORY_HEADROOM + REQUEST_COPIES * request_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


def _poison_free_memory(device: torch.device) -> None:
    """Fill memory the allocator will hand out next with NaN, so stale results cannot pass."""
    if device.type == "cpu":
        return  # fresh CPU allocations come from the OS or malloc's free lists; outputs are NaN-filled anyway
    block = torch.full((64 << 20,), float("nan"), dtype=torch.float32, device=device)
    del block


def _handle(req: dict[str, Any]) -> dict[str, Any]:
    from .backends import get_backend
    from .errors import MetalAccelError
    from .ops import build_view
    from .prove import kernels_only
    from .sandbox import load_forward
    from .validate import run_trial

    os.environ["METAL_ACCEL_USER_CACHE"] = req["user_cache"]
    backend = get_backend(req["backend"])
    device = torch.device(req["device"])
    t0 = time.perf_counter()
    try:
        lib = backend.compile(req["source"])
        forward = load_forward(req["code"], kernels_only(lib), poison=True)
    except MetalAccelError as exc:
        return {"ok": False, "stage": "compile", "error": str(exc)}
    compile_s = time.perf_counter() - t0
    state = [t.to(device) for t in req["state"]]
    view = build_view(req["static"], req["slots"], state)
    results = []
    with torch.inference_mode():
        for i, trial in enumerate(req["trials"]):
            args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in trial["args"])
            kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in trial["kwargs"].items()}
            _poison_free_memory(device)
            res = run_trial(lambda *a, **k: forward(view, *a, **k), args, kwargs, state,
                            repeat=(i == 0), sync=backend.synchronize)
            if "outputs" in res:
                res["outputs"] = [o.cpu() for o in res["outputs"]]
            results.append(res)
    return {"ok": True, "results": results, "compile_s": compile_s, "run_s": time.perf_counter() - t0 - compile_s}


def serve() -> None:
    """The worker loop: read a request frame, answer it, until stdin closes."""
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a kernel prints goes to stderr, never into the reply stream
    proto_in = sys.stdin.buffer
    while True:
        head = _read_exact(proto_in, _HEADER.size)
        if head is None:
            return
        payload = _read_exact(proto_in, _HEADER.unpack(head)[0])
        if payload is None:
            return
        req = pickle.loads(payload)  # from the parent, which is trusted
        _limit_memory(req["device"], len(payload))
        try:
            reply = _handle(req)
        except MemoryError:
            reply = {"ok": False, "stage": "run", "error": "ran out of memory (allocation limit reached)"}
        except Exception as exc:  # anything else is still an answer, not a dead worker
            reply = {"ok": False, "stage": "run", "error": f"{type(exc).__name__}: {exc}"}
        broken = _device_broken(req["device"])
        if broken:
            reply["restart"] = broken
        buf = io.BytesIO()
        torch.save(reply, buf)
        data = buf.getvalue()
        proto_out.write(_HEADER.pack(len(data)) + data)
        proto_out.flush()
        if broken:
            return  # a sticky device error (e.g. CUDA illegal address) poisons this process for good


def _device_broken(device: str) -> str:
    """'' if the device still works; else why not (the caller then starts a fresh worker)."""
    if not device.startswith("cuda"):
        return ""
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device=device).add_(1).item()
        return ""
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


# ---------------------------------------------------------------- caller end

class Worker:
    """One worker process, started on first use and restarted after it dies."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._stderr = tempfile.TemporaryFile()
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self._proc = subprocess.Popen([sys.executable, "-m", "metal_accel.worker"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        return self._proc

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def _stderr_tail(self, n: int = 1500) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-n:].strip()

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

    def request(self, req: dict[str, Any], timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        """Send one request; the reply dict, or WorkerFailure saying how the worker died."""
        with self._lock:
            proc = self._start()
            payload = pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL)
            deadline = time.monotonic() + timeout
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(_HEADER.pack(len(payload)) + payload)
                proc.stdin.flush()
                fd = proc.stdout.fileno()
                size = _HEADER.unpack(self._read(fd, _HEADER.size, deadline))[0]
                data = self._read(fd, size, deadline)
            except TimeoutError:
                self.close()
                raise WorkerFailure(f"timed out after {timeout:.0f} s (a hang or an endless loop)") from None
            except (EOFError, BrokenPipeError):
                code = proc.wait()
                tail = self._stderr_tail()
                self._proc = None
                why = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
                raise WorkerFailure(f"crashed ({why})" + (f": {tail.splitlines()[-1]}" if tail else "")) from None
            try:
                reply = torch.load(io.BytesIO(data), weights_only=True)
            except Exception as exc:
                self.close()
                raise WorkerFailure(f"sent an unreadable reply ({type(exc).__name__})") from None
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


if __name__ == "__main__":
    serve()
