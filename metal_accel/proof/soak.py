"""The speed gate's workload, run first in the confined worker (the soak).

Before a proven kernel is loaded in the user's process for timing, the worker makes the calls the speed
gate will make: its input sets (prove.timing_inputs), cycled as compare_speed cycles them, as many calls
as its warm-up and max_reps, under the worker's time limit. A crash or hang there is a rejection. Every
call's outputs are digested in the worker, and the outputs of secretly chosen calls (at least one on each
input set) come back and are checked here by the speed gate's own rule (validate.spot_check). A kernel
that misbehaves only after many calls, or only on the caller's own values, is rejected before the user's
process runs it.
"""
from __future__ import annotations

import inspect
import secrets
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree

from ..backends.base import Backend
from ..core.candidate import Candidate
from ..core.specs import output_tensors
from ..runtime.dispatch import eager_only
from .compare import Mismatch
from .speed import compare_speed
from .validate import spot_check
from .worker import WorkerFailure, output_digest, shared_worker, tensors_to

EXTRA_SAMPLES = 4             # sampled calls beyond one per input set
SAMPLE_BYTES = 256 << 20      # ...as long as their outputs stay under this
BUDGET_PER_BENCH_S = 6.0      # soak time per second of the gate's budget (the gate runs up to 3 rounds of pairs)

InputSets = Sequence[tuple[tuple, dict]]


def _gate_default(name: str) -> int:
    return int(inspect.signature(compare_speed).parameters[name].default)


def gate_calls() -> tuple[int, int]:
    """(most, fewest) kernel calls compare_speed makes with its defaults: warm-up plus max_reps, or min_reps."""
    warmup = _gate_default("warmup")
    return warmup + _gate_default("max_reps"), warmup + _gate_default("min_reps")


def _cpu(v: Any) -> Any:
    return tensors_to(v, "cpu")  # containers too (a structured call's tensors)


def distinct_sets(inputs: InputSets) -> tuple[list[tuple[list, dict]], list[int]]:
    """The input sets without repeats (the gate's copies of the example are equal), and for each set the
    index of its equal among them: one copy crosses the pipe, the worker makes the rest."""
    unique: list[tuple[list, dict]] = []
    order: list[int] = []
    for args, kwargs in inputs:
        for u, (ua, ukw) in enumerate(unique):
            if _same_set((list(args), kwargs), (ua, ukw)):
                order.append(u)
                break
        else:
            order.append(len(unique))
            unique.append(([_cpu(a) for a in args], {k: _cpu(v) for k, v in kwargs.items()}))
    return unique, order


def _same_set(a: Any, b: Any) -> bool:
    """Whether two input sets are equal: the same structure (containers such as (cos, sin) walked), equal
    tensors (shape, dtype, values) and equal other values."""
    leaves_a, tree_a = _pytree.tree_flatten(a)
    leaves_b, tree_b = _pytree.tree_flatten(b)
    if tree_a != tree_b:
        return False
    for x, y in zip(leaves_a, leaves_b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
                    and x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def sample_calls(n_sets: int, calls: int, output_bytes: int) -> list[int]:
    """Secretly chosen call indices: one on each input set (call i uses set i % n_sets), plus a few more
    while their outputs fit in SAMPLE_BYTES."""
    picks = {j + n_sets * secrets.randbelow(max(1, (calls - j + n_sets - 1) // n_sets)) for j in range(min(n_sets, calls))}
    extra = min(EXTRA_SAMPLES, max(0, SAMPLE_BYTES // max(output_bytes, 1) - len(picks)))
    while extra > 0 and len(picks) < calls:
        before = len(picks)
        picks.add(secrets.randbelow(calls))
        extra -= len(picks) - before
    return sorted(picks)


def soak(cand: Candidate, backend: Backend, device: torch.device, layout: Any, inputs: InputSets,
         reference64: Callable[..., Any] | None, original: Callable[..., Any], settings: Any,
         rule: Any = None) -> str:
    """Run the speed gate's workload in the worker; '' when it went well, else the rejection's sentence."""
    calls, min_calls = gate_calls()
    unique, order = distinct_sets(inputs)
    with torch.inference_mode(), eager_only():  # eager's outputs once per distinct input set
        firsts = [order.index(u) for u in range(len(unique))]
        eager_unique = [_as_tuple(original(*inputs[j][0], **inputs[j][1])) for j in firsts]
    eager_outs = [eager_unique[u] for u in order]
    out_bytes = sum(t.numel() * t.element_size() for t in eager_outs[0] if isinstance(t, torch.Tensor))
    sample = sample_calls(len(inputs), calls, out_bytes)
    req = {"kind": "soak", "poison": False,  # production's buffers, as the speed gate and every later call see
           "backend": backend.name, "device": str(device), "code": cand.code, "source": cand.source,
           "static": layout.static, "slots": layout.tensor_slots, "state": [_cpu(t) for t in layout.gather()],
           "sets": unique, "order": order, "calls": calls, "min_calls": min_calls, "sample": sample,
           "budget_s": BUDGET_PER_BENCH_S * settings.bench_budget_s}
    try:
        reply = shared_worker().request(req, settings.timeout_s)
    except WorkerFailure as exc:
        return f"soak (the speed gate's calls, run first in isolation): the isolated run {exc}"
    if not reply.get("ok"):
        return reply["error"] if reply.get("stage") == "confine" else \
            f"soak (the speed gate's calls, run first in isolation) failed in the worker: {reply.get('error')}"
    return judge_soak(reply, inputs, eager_outs, reference64, min_calls, rule)


def judge_soak(reply: dict[str, Any], inputs: InputSets, eager_outs: list[tuple], reference64: Callable[..., Any] | None,
               min_calls: int, rule: Any = None) -> str:
    """'' when the worker's soak reply shows a kernel that behaved on every call, else why not. RULE: the
    proof's precision rule (the spot checks hold outputs to it, no stricter)."""
    where = "soak (the speed gate's calls, run first in isolation)"
    if reply.get("error"):
        return f"{where}: {reply['error']}"
    digests, n = reply.get("digests", []), len(inputs)
    if len(digests) < min_calls:
        return f"{where}: only {len(digests)} calls were made, fewer than the gate's {min_calls}"
    if reply.get("inputs_changed"):
        return f"{where}: the kernel changed its inputs (input sets {reply['inputs_changed']})"
    if reply.get("state_changed"):
        return f"{where}: the kernel changed the module's parameters or buffers {reply['state_changed']}"
    first: dict[int, int] = {}
    for i, d in enumerate(digests):
        j = first.setdefault(i % n, i)
        if d != digests[j]:
            return (f"{where}: call {i} gave other outputs than call {j} on the same inputs (input set {i % n}): "
                    "a kernel must give the same result every time")
    check = spot_check(inputs, reference64, rule)
    seen = set()
    for s in reply.get("samples", []):
        i, j = int(s["call"]), int(s["set"])
        if j != i % n or not 0 <= i < len(digests):
            return f"{where}: the worker's reply is inconsistent (call {i}, input set {j})"
        if output_digest(tuple(s["outputs"])) != digests[i]:
            return f"{where}: the worker's reply is inconsistent (call {i}'s outputs do not match its digest)"
        outs = tuple(o.to(e.device) if isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor) else o
                     for o, e in zip(s["outputs"], eager_outs[j]))  # the worker sends them back on the CPU
        try:
            check(outs, eager_outs[j], f"soak call {i} (input set {j})", j)
        except Mismatch as exc:
            return f"{where}: wrong result: {exc}"
        seen.add(j)
    if seen != set(range(min(n, len(digests)))):
        return f"{where}: no checked outputs for input sets {sorted(set(range(n)) - seen)}"
    return ""


def _as_tuple(out: Any) -> tuple:
    return tuple(output_tensors(out))  # containers walked, None left out (validate._as_tuple)
