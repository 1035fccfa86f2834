"""A synthesis farm on Ray: problems synthesized on every device kind of a cluster, one bundle out.

A node says which device it has by a Ray custom resource naming the device kind (`metal-accel farm node`
prints it for the machine it runs on):

    metal_accel:mps:apple-m2      an Apple GPU, by chip generation (M1, M2, M3, M4)
    metal_accel:cuda:sm90         an NVIDIA GPU, by compute capability
    metal_accel:cpu:x86_64        a CPU, by architecture
    metal_accel:llm               (optional) the node that sends LLM requests: it holds the provider keys

`run_farm` starts, for every unit of every kind's resource in the cluster, one worker actor that holds
that unit (so it runs only where the device is, and no two workers share a device), and one LLM gateway
(farm_worker.py). Every problem is solved once per kind: its proofs and timing run on a node of that kind,
its LLM requests are tasks of the gateway. Each worker returns what it proved as a bundle; the bundles are
merged into one (store/merge.py: integrity checks, and the rule for one key proven with different kernels).

Budgets: the run's token and cost caps are divided evenly among the workers (each holds its share, so the
farm never spends more than the caps); the wall-time cap holds for each. `concurrency` bounds the requests
in flight of each worker; `problems` the problems each worker has in flight.
"""
from __future__ import annotations

import logging
import platform
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.errors import MetalAccelError
from ..core.scrub import scrub
from ..kernelbench.problems import Problem
from ..store.merge import MergeReport, merge_bundles
from .budget import Limits
from .settings import SynthSettings

log = logging.getLogger(__name__)
PREFIX = "metal_accel:"
LLM_RESOURCE = PREFIX + "llm"
INSTALL_HINT = "the farm needs Ray: pip install 'metal-accel[farm]'"


class FarmError(MetalAccelError):
    """The farm cannot run: Ray missing, no node of a kind asked for, nothing to do."""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-") or "unknown"


def device_kind(backend: str) -> str:
    """This machine's device kind for BACKEND: 'mps:apple-m2', 'cuda:sm90', 'cpu:x86_64'."""
    if backend == "mps":
        from ..backends.mps.backend import chip_name
        chip = chip_name()
        m = re.search(r"\bM(\d+)\b", chip)
        return f"mps:apple-m{m.group(1)}" if m else f"mps:{_slug(chip)}"
    if backend == "cuda":
        import torch
        major, minor = torch.cuda.get_device_capability()
        return f"cuda:sm{major}{minor}"
    return f"{backend}:{_slug(platform.machine())}"


def resource_of(kind: str) -> str:
    """The Ray resource naming a device kind ('mps:apple-m2' -> 'metal_accel:mps:apple-m2')."""
    return kind if kind.startswith(PREFIX) else PREFIX + kind


def backend_of(kind: str) -> str:
    """The backend a kind's proofs run on (its first part: 'cpu:sim-a' -> 'cpu')."""
    return kind[len(PREFIX):].split(":", 1)[0] if kind.startswith(PREFIX) else kind.split(":", 1)[0]


def node_resources(backends: Sequence[str], *, llm: bool = False) -> dict[str, int]:
    """The custom resources a node with BACKENDS advertises (`ray start --resources`): one unit per device kind,
    one per GPU for CUDA (each unit is a farm worker, placed on a GPU of its own: worker_options)."""
    out = {resource_of(device_kind(b)): _devices(b) for b in backends}
    if llm:
        out[LLM_RESOURCE] = 1
    return out


def _devices(backend: str) -> int:
    if backend != "cuda":
        return 1
    import torch
    return max(1, torch.cuda.device_count())


def worker_options(kind: str, cluster: Mapping[str, float], cuda_workers: int, problems_at_once: int) -> dict[str, Any]:
    """Ray options of one farm worker of KIND. A CUDA worker asks for a GPU of its own when the cluster has one
    for each of its CUDA_WORKERS (Ray then sets its CUDA_VISIBLE_DEVICES), so the workers of a multi-GPU node
    do not all prove and time on its first GPU; otherwise they share the node's device, one lane each."""
    opts: dict[str, Any] = {"num_cpus": 0, "resources": {resource_of(kind): 1},
                            "max_concurrency": max(1, problems_at_once)}
    if backend_of(kind) == "cuda" and cluster.get("GPU", 0) >= cuda_workers:
        opts["num_gpus"] = 1
    return opts


def cluster_kinds(resources: Mapping[str, float]) -> dict[str, int]:
    """Device kind -> workers it takes (the units its nodes advertise), from ray.cluster_resources()."""
    return {k[len(PREFIX):]: int(v) for k, v in sorted(resources.items())
            if k.startswith(PREFIX) and k != LLM_RESOURCE and int(v) >= 1}


def share(limits: Limits, parts: int) -> Limits:
    """Each of PARTS workers' share of the run's caps: tokens and cost divided, wall time as it is."""
    parts = max(1, parts)
    return Limits(tokens=None if limits.tokens is None else limits.tokens // parts,
                  cost_usd=None if limits.cost_usd is None else limits.cost_usd / parts, wall_s=limits.wall_s)


@dataclass
class FarmResult:
    kinds: dict[str, int]                                   # device kind -> workers
    results: list[dict[str, Any]] = field(default_factory=list)  # one per (problem, kind): FarmWorker.solve's
    spent: list[dict[str, Any]] = field(default_factory=list)    # each worker's run meter
    merge: MergeReport | None = None
    interrupted: bool = False
    wall_s: float = 0.0

    @property
    def requests(self) -> int:
        return sum(int(s.get("requests", 0)) for s in self.spent)

    @property
    def failed(self) -> int:
        return sum(int(s.get("failed", 0)) for s in self.spent)

    @property
    def cost_usd(self) -> float:
        return sum(float(s.get("cost_usd", 0.0)) for s in self.spent)

    def summary(self) -> str:
        tokens = sum(int(s.get("tokens_in", 0)) + int(s.get("tokens_out", 0)) for s in self.spent)
        kernels = sum(int(r.get("kernels", 0)) for r in self.results)
        failed = f" ({self.failed} failed)" if self.failed else ""
        return (f"{kernels} kernels for {len(self.results)} problem runs on {len(self.kinds)} device kinds; "
                f"{self.requests} requests{failed}, {tokens} tokens, ${self.cost_usd:.4f}, {self.wall_s:.0f} s")


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FarmError(INSTALL_HINT) from None
    return ray


def run_farm(problems: Sequence[Problem], models: Sequence[str], settings: SynthSettings, bundle: str | Path, *,
             address: str | None = None, kinds: Sequence[str] = (), worker_env: Mapping[str, dict[str, str]] = {},
             on_result: Callable[[dict[str, Any]], None] | None = None) -> FarmResult:
    """Solve every problem on every device kind of the Ray cluster at ADDRESS ('auto': the one this machine
    belongs to; None: a cluster of this machine alone, or the one ray.init() already joined) and merge what
    was proven into BUNDLE. KINDS: only these kinds (default: every kind the cluster advertises).
    WORKER_ENV: environment variables per kind for its workers (simulated nodes sharing one disk)."""
    ray = _ray()
    from .farm_worker import CONTROL, FarmWorker, LLMGateway

    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:  # no cluster there
            raise FarmError(f"cannot join the Ray cluster at {address or 'this machine'}: {scrub(exc)}") from None
    t0 = time.monotonic()
    actors: list[Any] = []
    try:
        found = cluster_kinds(ray.cluster_resources())
        wanted = [k[len(PREFIX):] if k.startswith(PREFIX) else k for k in kinds] or list(found)
        missing = [k for k in wanted if k not in found]
        if missing or not wanted:
            raise FarmError(f"no node of kind {', '.join(missing) or '(any)'} in the cluster (it has: "
                            f"{', '.join(found) or 'none'}); start nodes with the resources `metal-accel farm node` "
                            "prints")
        result = FarmResult({k: found[k] for k in wanted})
        s = settings.with_(run_limits=share(settings.run_limits, sum(result.kinds.values())))
        gateway = _start_gateway(ray, LLMGateway)
        actors.append(gateway)
        worker_cls = ray.remote(concurrency_groups={CONTROL: 2})(FarmWorker)
        workers: dict[str, list[Any]] = {}
        cluster = ray.cluster_resources()
        cuda_workers = sum(n for k, n in result.kinds.items() if backend_of(k) == "cuda")
        for k, n in result.kinds.items():
            workers[k] = [worker_cls.options(**worker_options(k, cluster, cuda_workers, s.problems)).remote(
                k, backend_of(k), list(models), s, gateway, dict(worker_env.get(k, {}))) for _ in range(n)]
            actors += workers[k]
        refs = {}
        for k, ws in workers.items():
            for i, pr in enumerate(problems):
                refs[ws[i % len(ws)].solve.remote(pr)] = (k, pr)
        try:
            _gather(ray, refs, result, on_result)
        except KeyboardInterrupt:  # stop asking; keep what was proven (each worker finishes its problem)
            result.interrupted = True
            for ws in workers.values():
                for w in ws:
                    w.interrupt.remote()
            try:
                _gather(ray, refs, result, on_result)
            except KeyboardInterrupt:
                pass
        every = [w for ws in workers.values() for w in ws]
        result.spent = ray.get([w.spent.remote() for w in every])
        blobs = ray.get([w.bundle.remote() for w in every])
        result.merge = _merge([b for b in blobs if b], bundle)
        result.wall_s = time.monotonic() - t0
        return result
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()


def _start_gateway(ray: Any, gateway_cls: type) -> Any:
    """The LLM gateway on a node advertising metal_accel:llm, else on this (the driver's) node."""
    opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000}
    if ray.cluster_resources().get(LLM_RESOURCE, 0) >= 1:
        opts["resources"] = {LLM_RESOURCE: 1}
    else:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                     soft=False)
    return ray.remote(gateway_cls).options(**opts).remote()


def _gather(ray: Any, refs: dict[Any, tuple[str, Problem]], result: FarmResult,
            on_result: Callable[[dict[str, Any]], None] | None) -> None:
    """Collect the problems' results as they finish (a timed wait, so that Ctrl-C reaches this thread)."""
    while refs:
        done, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
        for ref in done:
            kind, pr = refs.pop(ref)
            try:
                res = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the worker or its node died; the others go on
                res = {"problem": pr.name, "level": pr.level, "problem_id": pr.problem_id, "kind": kind,
                       "error": f"failed on the farm: {scrub(exc).strip().splitlines()[-1][:300]}"}
            result.results.append(res)
            if on_result is not None:
                on_result(res)


def _merge(blobs: list[bytes], dest: str | Path) -> MergeReport | None:
    """The workers' bundles merged into DEST; None when no worker proved anything."""
    if not blobs:
        return None
    with tempfile.TemporaryDirectory(prefix="metal_accel_farm_") as tmp:
        paths = []
        for i, blob in enumerate(blobs):
            p = Path(tmp) / f"worker{i}.tar.gz"
            p.write_bytes(blob)
            paths.append(p)
        return merge_bundles(paths, dest)
