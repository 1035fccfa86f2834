"""The worker end of proof/worker.py: prepare, confine, then answer the caller's requests (trials, soaks).

    python metal_accel/sandbox/confine.py -m metal_accel.proof.worker_main --backend B --device D --scratch DIR
        # a hello frame naming its confinement, then length-prefixed frames on stdin/stdout
"""
from __future__ import annotations

import argparse
import glob
import io
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch.utils import _pytree

from ..backends import get_backend
from ..core import config
from ..core.errors import MetalAccelError
from ..core.specs import input_tensors, output_tensors
from ..runtime.ops import build_view
from ..sandbox import confine
from ..sandbox.host import load_forward
from .prove import kernels_only
from .trial_buffers import input_copies
from .validate import run_trial
from .worker import (
    _HEADER,
    MEMORY_HEADROOM,
    REQUEST_COPIES,
    RepeatDigests,
    _read_exact,
    tensors_to,
)


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
    checks depend on them), and the device's initialization (drivers open their device files). Everything the
    worker runs is imported with this module, while the package is still readable."""
    backend = get_backend(backend_name)
    if backend.device_type != "cpu":
        torch.zeros(1, device=device).add_(1).cpu()
        return
    backend.prepare()


def _device_paths(device: str) -> tuple[list[Path], list[Path]]:
    """(read-only, read-write) paths a GPU driver needs after confinement, beyond the defaults."""
    if device.startswith("cuda"):
        return [Path("/sys"), Path("/proc/driver/nvidia")], [Path(p) for p in glob.glob("/dev/nvidia*")]
    return [], []


def _load(req: dict[str, Any], backend: Any) -> Any:
    """The candidate's forward bound to the compiled kernels, loaded as production loads it."""
    lib = backend.compile(req["source"])  # built and checked by the caller: a load from the build directory
    return load_forward(req["code"], kernels_only(lib), poison=req.get("poison", True))


def _handle(req: dict[str, Any]) -> dict[str, Any]:

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
            args = tuple(tensors_to(a, device) for a in trial["args"])  # (cos, sin) and the like too
            kwargs = {k: tensors_to(v, device) for k, v in trial["kwargs"].items()}
            _scramble_free_memory(device)
            res = run_trial(lambda *a, **k: forward(view, *a, **k), args, kwargs, state,
                            repeat=(i == 0), sync=backend.synchronize)
            if "outputs" in res:
                res["outputs"] = [o.cpu() for o in res["outputs"]]
            if "inputs_after" in res:
                res["inputs_after"] = {j: t.cpu() for j, t in res["inputs_after"].items()}
            results.append(res)
    return {"ok": True, "results": results, "compile_s": compile_s, "run_s": time.perf_counter() - t0 - compile_s}


def _soak(req: dict[str, Any], forward: Any, state: list[torch.Tensor], device: torch.device,
          sync: Any) -> dict[str, Any]:
    """The speed gate's calls, untimed: input set `i % len(order)` for call i, as compare_speed cycles them,
    until `calls` calls or (past `min_calls`) `budget_s` seconds. Every call's outputs are digested; those
    of the calls in `sample` come back whole, and where the budget ended the soak first, those of each
    set's last call that no sample covered."""
    def to_dev(v: Any) -> Any:
        return tensors_to(v, device)

    def copy(v: Any) -> Any:
        return _pytree.tree_map_only(torch.Tensor, torch.clone, v)
    pristine = [(tuple(map(to_dev, a)), {k: to_dev(v) for k, v in kw.items()}) for a, kw in req["sets"]]
    sets = [(tuple(map(copy, pristine[u][0])), {k: copy(v) for k, v in pristine[u][1].items()}) for u in req["order"]]
    state_before = [t.clone() for t in state]
    sample, n = set(req["sample"]), len(sets)
    digests: list[str] = []
    samples: list[dict[str, Any]] = []
    last: dict[int, tuple[int, tuple]] = {}
    repeats = RepeatDigests()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(req["calls"]):
            if i >= req["min_calls"] and time.perf_counter() - t0 > req["budget_s"]:
                break
            args, kwargs = sets[i % n]
            outs = tuple(output_tensors(forward(*args, **kwargs)))  # containers walked, None left out, as eager's
            sync()
            if not all(isinstance(o, torch.Tensor) for o in outs):
                return {"error": f"call {i} returned {', '.join(type(o).__name__ for o in outs)}, not tensors"}
            digests.append(repeats.digest(i % n, outs))
            if i in sample:
                samples.append({"call": i, "set": i % n, "outputs": [o.cpu() for o in outs]})
            else:
                last[i % n] = (i, outs)
    covered = {s["set"] for s in samples}
    for j, (i, outs) in sorted(last.items()):
        if j not in covered:
            samples.append({"call": i, "set": j, "outputs": [o.cpu() for o in outs]})
    changed = [j for j, (a, kw) in enumerate(sets) if not _same(
        tuple(input_tensors(a, kw)), tuple(input_tensors(*pristine[req["order"][j]])))]
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


if __name__ == "__main__":
    main()
