"""METAL_ACCEL_RECORD=1: remember the module calls that ran eager, so they can be synthesized offline.

Each (module fingerprint, input spec, keyword arguments included) without a kernel is counted with its eager time in
`<user cache>/recorded/`, next to a pickled copy of the module (once per fingerprint), which is
what `metal-accel synth --recorded` optimizes later. Recording costs two hooks per module call;
it is meant for a profiling run, not for production.
"""
from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from torch import nn

from ..api import explain, optimize
from ..core import config
from ..core.keys import class_path, module_fingerprint
from ..core.specs import InputSpec, UnsupportedCall, call_signature
from ..proof.testdata import make_inputs
from ..runtime.capture import llm_limit, replaceability
from ..runtime.dispatch import dispatcher_of
from ..store.index import atomic_write
from .hook import _AUTO_ATTR

log = logging.getLogger(__name__)
FLUSH_EVERY_S = 30.0


def recorded_dir() -> Path:
    return config.user_cache_dir() / "recorded"


@dataclass
class RecordedCall:
    class_path: str
    fingerprint: str
    input_spec: InputSpec
    calls: int
    total_s: float
    module_file: str  # "" when the module could not be pickled

    @property
    def mean_us(self) -> float:
        return self.total_s / max(self.calls, 1) * 1e6


class Recorder:
    def __init__(self) -> None:
        self._stack: list[float] = []
        self._counts: dict[tuple[str, str], list[Any]] = {}  # (fingerprint, spec key) -> [record, calls, s]
        self._fingerprints: dict[int, str | None] = {}
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._handles: list[Any] = []

    def start(self) -> None:
        reg = torch.nn.modules.module
        self._handles = [reg.register_module_forward_pre_hook(self._pre),
                         reg.register_module_forward_hook(self._post, with_kwargs=True)]
        atexit.register(self.flush)

    def stop(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.flush()

    def _pre(self, module: nn.Module, args: tuple) -> None:
        self._stack.append(time.perf_counter())

    def _post(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        elapsed = time.perf_counter() - self._stack.pop() if self._stack else 0.0
        if _has_kernel(module, args, kwargs):
            return
        fp = self._fingerprint(module)
        if fp is None:
            return
        try:
            spec = InputSpec.of(args, kwargs)  # keyword arguments too: the call is replayed as it was made
        except (UnsupportedCall, TypeError, ValueError):
            return
        with self._lock:
            slot = self._counts.setdefault((fp, spec.key), [(module, spec), 0, 0.0])
            slot[1] += 1
            slot[2] += elapsed
        if time.monotonic() - self._last_flush > FLUSH_EVERY_S:
            self.flush()

    def _fingerprint(self, module: nn.Module) -> str | None:
        mid = id(module)
        if mid not in self._fingerprints:
            try:
                unfit = replaceability(module) or llm_limit(module)  # recordings feed LLM synthesis
                self._fingerprints[mid] = None if unfit else module_fingerprint(module)
            except UnsupportedCall:
                self._fingerprints[mid] = None
        return self._fingerprints[mid]

    def flush(self) -> None:
        """Merge the counts into the user cache's recordings (locked, atomic)."""
        with self._lock:
            counts, self._counts = self._counts, {}
            self._last_flush = time.monotonic()
        if not counts:
            return
        root = recorded_dir()
        (root / "modules").mkdir(parents=True, exist_ok=True)
        for (fp, spec_key), ((module, spec), calls, total) in counts.items():
            path = root / f"{fp[:24]}-{spec_key[:16]}.json"
            module_file = root / "modules" / f"{fp[:24]}.pt"
            if not module_file.exists():
                try:
                    torch.save(module, module_file)
                except Exception as exc:  # lambdas, open files...: recorded without a module copy
                    log.info("metal_accel: cannot pickle %s for offline synthesis: %s", class_path(type(module)), exc)
            with FileLock(str(path) + ".lock", timeout=30):
                old = json.loads(path.read_text()) if path.exists() else {"calls": 0, "total_s": 0.0}
                data = {"class_path": class_path(type(module)), "fingerprint": fp, "input_spec": spec.to_dict(),
                        "calls": old["calls"] + calls, "total_s": old["total_s"] + total,
                        "module_file": module_file.name if module_file.exists() else ""}
                atomic_write(path, json.dumps(data, indent=1, sort_keys=True))


def _has_kernel(module: nn.Module, args: tuple, kwargs: dict[str, Any] | None = None) -> bool:
    disp = dispatcher_of(module) or module.__dict__.get(_AUTO_ATTR)
    if disp is None or not disp.table:
        return False
    try:
        return call_signature(args, kwargs or {}) in disp.table
    except TypeError:
        return False


def recorded_calls() -> list[RecordedCall]:
    """Everything recorded so far, hottest (total eager time) first."""
    out = []
    for path in recorded_dir().glob("*.json"):
        try:
            d = json.loads(path.read_text())
            out.append(RecordedCall(d["class_path"], d["fingerprint"], InputSpec.from_dict(d["input_spec"]),
                                    int(d["calls"]), float(d["total_s"]), d.get("module_file", "")))
        except (OSError, ValueError, KeyError) as exc:
            log.warning("metal_accel: skipping recording %s: %s", path, exc)
    return sorted(out, key=lambda r: -r.total_s)


def load_recorded_module(rec: RecordedCall) -> nn.Module:
    """The pickled module of a recording (written by this user's own process)."""
    if not rec.module_file:
        raise UnsupportedCall(f"{rec.class_path} was recorded without a module copy (it could not be pickled)")
    return torch.load(recorded_dir() / "modules" / rec.module_file, weights_only=False)


_recorder: Recorder | None = None


def start_recording() -> Recorder:
    global _recorder
    if _recorder is None:
        _recorder = Recorder()
        _recorder.start()
    return _recorder


def stop_recording() -> None:
    global _recorder
    if _recorder is not None:
        _recorder.stop()
        _recorder = None


def synthesize_recorded(providers: list[Any], *, top: int = 10, backend: str | None = None,
                        **optimize_kwargs: Any) -> list[tuple[RecordedCall, Any]]:
    """Optimize the `top` hottest recorded calls offline, on inputs drawn from their specs.

    The kernels that win land in the user cache, where `import metal_accel` finds them on the next
    run. Returns (recording, report or the reason it was skipped) pairs.
    """

    out: list[tuple[RecordedCall, Any]] = []
    for rec in recorded_calls()[:top]:
        try:
            module = load_recorded_module(rec)
        except Exception as exc:  # no pickled copy, or its class no longer imports
            out.append((rec, f"skipped: {type(exc).__name__}: {exc}"))
            continue
        tensors = rec.input_spec.tensor_specs()
        device = tensors[0].device if tensors else "cpu"
        try:
            args, kwargs = make_inputs(rec.input_spec, "normal", torch.Generator().manual_seed(0), device)
            with torch.no_grad():
                module.eval()(*args, **kwargs)  # a call that cannot be replayed is reported, never raised
        except Exception as exc:
            out.append((rec, f"skipped: cannot replay the recorded call: {type(exc).__name__}: {exc}"))
            continue
        optimize(module, args, kwargs, backend=backend, providers=providers, **optimize_kwargs)
        out.append((rec, explain(module)))
    return out
