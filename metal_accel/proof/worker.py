"""Isolation: untrusted candidates run first in a confined worker process.

The worker starts with a scrubbed environment and a scratch directory of its own (removed on close),
confines itself (confine.py: Landlock, seccomp, limits) before it reads a request, and only loads
kernels the caller compiled: the build directory is read-only to it, the user cache out of reach. It
runs the proof's trials and the speed gate's workload (the soak) on the caller's inputs; a segfault,
abort, hang or runaway allocation there rejects the candidate with a reason, and the user's process
goes on. References stay in the caller. Replies are read with `torch.load(weights_only=True)`, so a
corrupted worker cannot make the caller unpickle code.

    python metal_accel/confine.py -m metal_accel.proof.worker --backend B --device D --scratch DIR
        # the worker end: a hello frame naming its confinement, then length-prefixed frames on stdin/stdout
"""
from __future__ import annotations

import argparse
import atexit
import glob
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

from ..core import config
from ..sandbox import confine

try:
    from ..core.redact import redact
except ImportError:  # TODO(issue 25): metal_accel/redact.py (helper F) scrubs stderr tails; until then, as is
    def redact(text: str) -> str:
        return text

DEFAULT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0  # importing torch on a busy machine; a worker not up by then is a failure
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


def _scramble_free_memory(device: torch.device) -> None:
    """Fill memory the GPU allocator will hand out next with noise, so an earlier call's results left there
    cannot pass for this one's (noise, not NaN: production's plain buffers never hold NaN either)."""
    if device.type == "cpu":
        return  # fresh CPU allocations come from the OS or malloc's free lists; proof buffers get their own fills
    block = torch.randn((64 << 20,), dtype=torch.float32, device=device)
    del block


def prepare(backend_name: str, device: str) -> None:
    """What must happen before confinement: imports, whatever the backend's build needs a process for
    (`Backend.prepare`: the compiler's identity and the binary check's baseline build: artifact names and
    checks depend on them), and the device's initialization (drivers open their device files)."""
    from ..runtime import ops
    from . import prove, validate
    from ..sandbox import host as sandbox
    from ..backends import get_backend
    backend = get_backend(backend_name)
    if backend.device_type != "cpu":
        torch.zeros(1, device=device).add_(1).cpu()
        return
    prepare_backend = getattr(backend, "prepare", None)
    if callable(prepare_backend):
        prepare_backend()


def _device_paths(device: str) -> tuple[list[Path], list[Path]]:
    """(read-only, read-write) paths a GPU driver needs after confinement, beyond the defaults."""
    if device.startswith("cuda"):
        return [Path("/sys"), Path("/proc/driver/nvidia")], [Path(p) for p in glob.glob("/dev/nvidia*")]
    return [], []


def _load(req: dict[str, Any], backend: Any) -> Any:
    """The candidate's forward bound to the compiled kernels, loaded as production loads it."""
    from .prove import kernels_only
    from ..sandbox.host import load_forward
    lib = backend.compile(req["source"])  # built and checked by the caller: a load from the build directory
    return load_forward(req["code"], kernels_only(lib), poison=req.get("poison", True))


def _handle(req: dict[str, Any]) -> dict[str, Any]:
    from ..backends import get_backend
    from ..core.errors import MetalAccelError
    from ..runtime.ops import build_view
    from .trial_buffers import input_copies
    from .validate import run_trial

    backend = get_backend(req["backend"])
    device = torch.device(req["device"])
    t0 = time.perf_counter()
    try:
        forward = _load(req, backend)
    except MetalAccelError as exc:
        return {"ok": False, "stage": "compile", "error": str(exc)}
    compile_s = time.perf_counter() - t0
    state = [t.to(device) for t in req["state"]]
    if req.get("kind") != "soak":
        state = input_copies(state)  # fenced: a write past a parameter's end is caught like one past an input's
    view = build_view(req["static"], req["slots"], state)
    if req.get("kind") == "soak":
        return {"ok": True, "compile_s": compile_s, **_soak(req, lambda *a, **k: forward(view, *a, **k), state,
                                                            device, backend.synchronize)}
    results = []
    with torch.inference_mode():
        for i, trial in enumerate(req["trials"]):
            args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in trial["args"])
            kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in trial["kwargs"].items()}
            _scramble_free_memory(device)
            res = run_trial(lambda *a, **k: forward(view, *a, **k), args, kwargs, state,
                            repeat=(i == 0), sync=backend.synchronize)
            if "outputs" in res:
                res["outputs"] = [o.cpu() for o in res["outputs"]]
            results.append(res)
    return {"ok": True, "results": results, "compile_s": compile_s, "run_s": time.perf_counter() - t0 - compile_s}


def output_digest(outs: tuple) -> str:
    """A digest of a call's outputs (dtype, shape, bytes), compared across the soak's calls."""
    h = hashlib.sha256()
    for o in outs:
        h.update(f"{o.dtype}{tuple(o.shape)}".encode())
        h.update(o.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def _soak(req: dict[str, Any], forward: Any, state: list[torch.Tensor], device: torch.device,
          sync: Any) -> dict[str, Any]:
    """The speed gate's calls, untimed: input set `i % len(order)` for call i, as compare_speed cycles them,
    until `calls` calls or (past `min_calls`) `budget_s` seconds. Every call's outputs are digested; those
    of the calls in `sample` come back whole, and where the budget ended the soak first, those of each
    set's last call that no sample covered."""
    def to_dev(v: Any) -> Any:
        return v.to(device) if isinstance(v, torch.Tensor) else v

    def copy(v: Any) -> Any:
        return v.clone() if isinstance(v, torch.Tensor) else v
    pristine = [(tuple(map(to_dev, a)), {k: to_dev(v) for k, v in kw.items()}) for a, kw in req["sets"]]
    sets = [(tuple(map(copy, pristine[u][0])), {k: copy(v) for k, v in pristine[u][1].items()}) for u in req["order"]]
    state_before = [t.clone() for t in state]
    sample, n = set(req["sample"]), len(sets)
    digests: list[str] = []
    samples: list[dict[str, Any]] = []
    last: dict[int, tuple[int, tuple]] = {}
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(req["calls"]):
            if i >= req["min_calls"] and time.perf_counter() - t0 > req["budget_s"]:
                break
            args, kwargs = sets[i % n]
            outs = forward(*args, **kwargs)
            sync()
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            if not all(isinstance(o, torch.Tensor) for o in outs):
                return {"error": f"call {i} returned {', '.join(type(o).__name__ for o in outs)}, not tensors"}
            digests.append(output_digest(outs))
            if i in sample:
                samples.append({"call": i, "set": i % n, "outputs": [o.cpu() for o in outs]})
            else:
                last[i % n] = (i, outs)
    covered = {s["set"] for s in samples}
    for j, (i, outs) in sorted(last.items()):
        if j not in covered:
            samples.append({"call": i, "set": j, "outputs": [o.cpu() for o in outs]})
    changed = [j for j, (a, kw) in enumerate(sets) if not _same(
        (*a, *kw.values()), (*pristine[req["order"][j]][0], *pristine[req["order"][j]][1].values()))]
    return {"error": "", "calls": len(digests), "digests": digests, "samples": samples, "inputs_changed": changed,
            "state_changed": [i for i, (b, t) in enumerate(zip(state_before, state)) if not _same((b,), (t,))],
            "soak_s": time.perf_counter() - t0}


def _same(xs: tuple, ys: tuple) -> bool:
    return all(not isinstance(x, torch.Tensor) or (x.shape == y.shape and torch.equal(
        x.reshape(-1).view(torch.uint8) if x.numel() else x, y.reshape(-1).view(torch.uint8) if y.numel() else y))
        for x, y in zip(xs, ys))


def _hello(stream: BinaryIO, message: dict[str, Any]) -> None:
    buf = io.BytesIO()
    torch.save(message, buf)
    stream.write(_HEADER.pack(len(buf.getvalue())) + buf.getvalue())
    stream.flush()


def main(argv: list[str] | None = None) -> None:
    """The worker's start: prepare, confine (before any request is read), say how, then serve."""
    parser = argparse.ArgumentParser(prog="metal_accel.proof.worker")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--scratch", required=True, type=Path)
    opts = parser.parse_args(argv)
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a kernel prints goes to stderr, never into the reply stream
    prepare(opts.backend, opts.device)
    ro, rw = _device_paths(opts.device)
    netns = os.environ.pop("METAL_ACCEL_NETNS", "netns: not tried (not started through confine.py)")
    layers = [netns, *confine.apply(opts.scratch, read_only=[config.build_dir(), *ro], read_write=rw)]
    _hello(proto_out, {"layers": layers, "pid": os.getpid()})
    serve(proto_out)


def serve(proto_out: BinaryIO | None = None) -> None:
    """The worker loop: read a request frame, answer it, until stdin closes."""
    if proto_out is None:
        proto_out = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
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

def launch(backend: str, device: str, scratch: Path, module: str = "metal_accel.proof.worker") -> tuple[list[str], dict[str, str]]:
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
            if not confine.sufficient(self.layers) and not confine.unconfined_allowed():
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


if __name__ == "__main__":
    main()
