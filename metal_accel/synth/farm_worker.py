"""The Ray actors of a farm (farm.py starts them): the LLM gateway, and one worker per device of a kind.

- `LLMGateway` (an async actor, on a node advertising `metal_accel:llm`, else the driver's node): sends every
  LLM request of the run, each one an actor task, through the same SDK clients as a local run (retries,
  deadlines, key scrubbing). Only its node needs the provider keys.
- `FarmWorker` (a threaded actor holding one unit of its kind's resource, so only on nodes with that device):
  synthesizes problems with a SynthesisLoop whose chat clients hand each request to the gateway; proofs and
  timing run here, on the device, taking turns on its lane (lanes.py) as in a local run, while the problems'
  requests wait. `bundle()` gives back what it proved, as a bundle (.tar.gz bytes).

Imported only when a farm runs (it imports ray).
"""
from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import ray

from ..api import explain, optimize, restore
from ..backends import get_backend
from ..core.errors import CacheError, MetalAccelError
from ..core.scrub import scrub
from ..kernelbench.problems import Problem
from ..store import cache as cache_mod
from ..store.bundle import export_bundle
from .clients import Completion, Message, RequestFailed, SDKChatClient, make_client
from .lanes import lane_for
from .loop import SynthesisLoop
from .models import ModelSpec, ProviderConfigError
from .settings import SynthSettings

log = logging.getLogger(__name__)
CONTROL = "control"  # the concurrency group of a worker's calls that must not wait for problems to finish


class LLMGateway:
    """Sends LLM requests for the farm's workers: one SDK client per model, created on first use."""

    def __init__(self) -> None:
        self._clients: dict[ModelSpec, Any] = {}

    async def complete(self, spec: ModelSpec, settings: SynthSettings, system: str, messages: list[Message],
                       remaining_s: float | None) -> tuple:
        """('ok', Completion) or ('failed', message, fatal, billable): a RequestFailed does not cross Ray whole."""
        try:
            client = self._clients.get(spec)
            if client is None:
                client = self._clients[spec] = make_client(spec, settings)
            deadline = None if remaining_s is None else time.monotonic() + remaining_s
            return ("ok", await client.complete(system, messages, deadline=deadline))
        except RequestFailed as exc:
            return ("failed", str(exc), exc.fatal, exc.billable)
        except ProviderConfigError as exc:  # no SDK or no credentials on the gateway's node
            return ("failed", f"on the farm's LLM node: {exc}", True, False)


class GatewayClient:
    """A ChatClient (session.py) whose requests are tasks of the farm's LLM gateway."""

    def __init__(self, gateway: Any, spec: ModelSpec, settings: SynthSettings) -> None:
        self.spec = spec
        self.settings = settings
        self._gateway = gateway

    def request_args(self, system: str, messages: list[Message]) -> dict[str, Any]:
        """The SDK call's arguments, as the gateway's client will send them (they key the answer cache)."""
        return SDKChatClient.request_args(self, system, messages)  # type: ignore[arg-type]

    async def complete(self, system: str, messages: list[Message], *, deadline: float | None = None) -> Completion:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ref = self._gateway.complete.remote(self.spec, self.settings, system, messages, remaining)
        try:
            out = await asyncio.wrap_future(ref.future())
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except ray.exceptions.RayError as exc:  # the gateway died or its node left: the work may have been done
            raise RequestFailed(f"the farm's LLM gateway failed: {scrub(exc).splitlines()[0]}", billable=True) from None
        if out[0] == "ok":
            return out[1]
        raise RequestFailed(out[1], fatal=out[2], billable=out[3])

    async def close(self) -> None:
        pass


class FarmWorker:
    """One device of one kind: problems synthesized and proven here, what was proven kept for the bundle."""

    def __init__(self, kind: str, backend: str, models: list[str], settings: SynthSettings, gateway: Any,
                 env: dict[str, str] | None = None) -> None:
        os.environ.update(env or {})  # e.g. a cache of its own for a simulated node sharing a disk
        self.kind = kind
        self.backend = get_backend(backend)
        self.loop = SynthesisLoop(models, settings, client_factory=lambda m, s: GatewayClient(gateway, m, s))
        self.keys: set[str] = set()
        self._lock = threading.Lock()

    def solve(self, problem: Problem) -> dict[str, Any]:
        """Optimize one problem's Model here (LLM synthesis through the gateway); its report and synthesis records."""
        out: dict[str, Any] = {"problem": problem.name, "level": problem.level, "problem_id": problem.problem_id,
                               "kind": self.kind, "error": ""}
        if self.loop.interrupted:
            out["error"] = "not started: the farm was interrupted"
            return out
        lane = lane_for(self.backend.name)
        t0 = time.monotonic()
        with lane.hold():
            try:
                model, inputs = problem.instantiate(self.backend.device_type)
            except MetalAccelError as exc:
                out["error"] = str(exc)
                return out
            with self.loop.collect() as records:
                try:
                    optimize(model, inputs, backend=self.backend.name, providers=[self.loop])
                    report = explain(model)
                finally:
                    restore(model)
        with self._lock:
            self.keys.update(m.key for m in report.modules if m.key and m.status != "eager")
        out.update(device=report.device, wall_s=time.monotonic() - t0, report=report.to_dict(),
                   table=report.table(), kernels=len(report.kernels),
                   synthesis=[r.to_dict() for r in records], summaries=[r.summary() for r in records],
                   finished=not self.loop.interrupted and not self.loop.run_meter.exceeded(),
                   stopped=self.loop.run_meter.exceeded())
        return out

    @ray.method(concurrency_group=CONTROL)
    def interrupt(self) -> None:
        """Stop synthesis as Ctrl-C would: what was proven is kept, nothing more is asked."""
        self.loop.interrupt()

    @ray.method(concurrency_group=CONTROL)
    def spent(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.loop.run_meter.to_dict()}

    @ray.method(concurrency_group=CONTROL)
    def bundle(self) -> bytes | None:
        """The accepted entries of the problems solved here, as a bundle (.tar.gz bytes); None if there are none."""
        with self._lock:
            keys = sorted(self.keys)
        if not keys:
            return None
        with tempfile.TemporaryDirectory(prefix="metal_accel_farm_") as tmp:
            path = Path(tmp) / "bundle.tar.gz"
            try:
                export_bundle(path, [cache_mod.user_cache()], keys=keys)
            except CacheError:  # nothing accepted in this user cache (e.g. the kernels came from a loaded bundle)
                return None
            return path.read_bytes()
