"""METAL_ACCEL_RECORD=1: remember the module calls that ran eager, so they can be synthesized offline.

Each (module fingerprint, input spec, keyword arguments included) without a kernel is counted with its eager time in
`<user cache>/recorded/`, next to a pickled skeleton of the module (once per fingerprint: its class,
configuration and tensor specs, its floating-point weights left out), which `metal-accel synth --recorded`
optimizes later with weights drawn at random (a kernel depends on the specs, not the values). Recording costs
two hooks per module call and a lookup of the call's signature; the spec of a (module, signature) is worked
out once. It is meant for a profiling run, not for production.
"""
from __future__ import annotations

import atexit
import copy
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
SMALL_BUFFER_BYTES = 1 << 16   # buffers up to this size are recorded with their values (index tables, masks)
_UNSEEN = object()


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
        self._specs: dict[tuple[int, tuple], tuple[str, InputSpec] | None] = {}
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
        if self._fingerprint(module) is None:  # a module that cannot be synthesized: nothing more per call
            return
        try:  # the spec is worked out once per (module, call signature): every other call only counts
            sig = (id(module), call_signature(args, kwargs))
        except TypeError:
            return
        known = self._specs.get(sig, _UNSEEN)
        if known is _UNSEEN:
            known = self._specs[sig] = self._spec_of(module, args, kwargs)
        if known is None:
            return
        fp, spec = known
        with self._lock:
            slot = self._counts.setdefault((fp, spec.key), [(module, spec), 0, 0.0])
            slot[1] += 1
            slot[2] += elapsed
        if time.monotonic() - self._last_flush > FLUSH_EVERY_S:
            self.flush()

    def _spec_of(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[str, InputSpec] | None:
        fp = self._fingerprint(module)
        if fp is None:
            return None
        try:
            return fp, InputSpec.of(args, kwargs)  # keyword arguments too: the call is replayed as it was made
        except (UnsupportedCall, TypeError, ValueError):
            return None

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
                    torch.save(skeleton(module), module_file)
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


def skeleton(module: nn.Module) -> nn.Module:
    """A copy of MODULE whose floating-point parameters and large buffers are on the meta device: its class,
    configuration and tensor specs (what its fingerprint and a kernel depend on) without its weights, so a
    recording of a model's layers takes kilobytes, not the model's size. Small buffers (tables, index
    ranges, whose values the forward may depend on) are kept."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for t in sub._parameters.values():
            if t is not None and t.is_floating_point():
                memo[id(t)] = nn.Parameter(torch.empty_like(t, device="meta"), requires_grad=t.requires_grad)
        for t in sub._buffers.values():
            if t is not None and t.is_floating_point() and t.numel() * t.element_size() > SMALL_BUFFER_BYTES:
                memo[id(t)] = torch.empty_like(t, device="meta")
    return copy.deepcopy(module, memo)


def load_recorded_module(rec: RecordedCall, device: str = "cpu") -> nn.Module:
    """The module of a recording (written by this user's own process), its weights drawn at random where the
    recording kept only their specs (skeleton): kernels are proven on it for its fingerprint and shapes."""
    if not rec.module_file:
        raise UnsupportedCall(f"{rec.class_path} was recorded without a module copy (it could not be pickled)")
    module = torch.load(recorded_dir() / "modules" / rec.module_file, weights_only=False)
    gen = torch.Generator().manual_seed(0)
    made: dict[int, torch.Tensor] = {}  # one new tensor per meta tensor: tied weights stay tied

    def draw(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            scale = 1.0 / max(1, t.shape[-1]) ** 0.5 if t.dim() > 1 else 1.0
            value = torch.randn(t.shape, generator=gen).mul_(scale).to(device=device, dtype=t.dtype)
            made[id(t)] = nn.Parameter(value, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else value
        return made[id(t)]
    for sub in module.modules():
        for store in (sub._parameters, sub._buffers):
            for name, t in list(store.items()):
                if t is not None and t.is_meta:
                    store[name] = draw(t)
    return module


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
        tensors = rec.input_spec.tensor_specs()
        device = tensors[0].device if tensors else "cpu"
        try:
            module = load_recorded_module(rec, device)
        except Exception as exc:  # no pickled copy, or its class no longer imports
            out.append((rec, f"skipped: {type(exc).__name__}: {exc}"))
            continue
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
