"""The profile of a proven candidate next to eager's, for the speed-round message (issue 30, deliver 2).

Where the device gives one: CUDA kernel times from torch.profiler (CUPTI) with the wall time per call, so
launch and host time show; the CPU op table of torch.profiler (the candidate's op is one op, eager's are
aten ops); Metal GPU times from command-buffer timestamps (GPUStartTime/GPUEndTime, through the
`metal_accel._mps_ext` extension; none with torch.mps.compile_shader). The MSL emulator runs Metal on the
CPU: its profile says so and gives no numbers. Profiling never fails a round: any error gives ''.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..core.specs import InputSpec
from ..proof.testdata import make_inputs
from ..runtime.dispatch import eager_only
from ..runtime.ops import KernelOp, ModuleLayout

log = logging.getLogger(__name__)
MAX_CHARS = 1200         # the whole profile text, cut beyond (at a line)
_CUT = "\n...(cut)"
MAX_NAME = 60            # a kernel or op name, cut beyond
_OP_PREFIX = "metal_accel::k_"  # the candidate's custom op (runtime/ops.py), as the profiler names it
EMULATOR_NOTE = ("No timing profile: the MSL emulator runs Metal kernels on the CPU, so its times say nothing "
                 "about a GPU (speed is measured on a Mac).")


@dataclass(frozen=True)
class Row:
    """One kernel (device) or op (CPU) of a profiled forward: time summed over the profiled calls."""

    name: str
    calls: int
    us: float


@dataclass(frozen=True)
class Side:
    """One forward profiled: wall time per call, busy time per call (device or CPU self time), its rows."""

    wall_us: float
    busy_us: float
    rows: list[Row]
    reps: int


def kernel_profile(module: nn.Module, spec: InputSpec, op: KernelOp, backend: str, *, reps: int = 3,
                   top: int = 4) -> str:
    """A few lines: the candidate's kernels (or ops) and eager's, with times per call; '' when the device
    gives no profile or profiling fails (logged at debug)."""
    if backend == "mps-emu":
        return EMULATOR_NOTE
    try:
        device = _device(spec, module)
        args, kwargs = make_inputs(spec, "normal", torch.Generator().manual_seed(0), device)
        state = ModuleLayout(module).gather()

        def mine() -> Any:
            return op(args, kwargs, state)

        def eager() -> Any:
            with eager_only():
                return module(*args, **kwargs)

        with torch.inference_mode():
            if device.type == "cuda":
                return render(f"Profile (torch.profiler, CUDA kernels, per call, {reps} calls each):", "GPU busy",
                              profile_cuda(mine, reps), profile_cuda(eager, reps), top, device_side=True)
            if device.type == "mps":
                return profile_mps_text(mine, eager, reps)
            return render(f"Profile (torch.profiler, CPU self time of ops, per call, {reps} calls each):",
                          "in ops", profile_cpu(mine, reps), profile_cpu(eager, reps), top, device_side=False)
    except Exception as exc:  # a profile is a hint; never fail a round over it
        log.debug("metal_accel: profiling the candidate of %s failed: %s", type(module).__name__, exc)
        return ""


def _device(spec: InputSpec, module: nn.Module) -> torch.device:
    for s in spec.tensor_specs():
        dev = getattr(s, "device", None)
        if dev is not None:
            return torch.device(dev)
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


def _wall_us(fn: Callable[[], Any], reps: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e6 / reps


def profile_cpu(fn: Callable[[], Any], reps: int) -> Side:
    """torch.profiler's CPU op table over `reps` calls (after one warm-up): self time per op."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    wall = _wall_us(fn, reps, lambda: None)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
    rows = [Row(ev.key, int(ev.count), float(ev.self_cpu_time_total)) for ev in prof.key_averages()
            if not ev.key.startswith("[") and float(ev.self_cpu_time_total) > 0]
    return Side(wall, sum(r.us for r in rows) / reps, rows, reps)


def profile_cuda(fn: Callable[[], Any], reps: int) -> Side:
    """torch.profiler with CUDA activity over `reps` calls (after one warm-up): the device kernels (and
    copies), their time; the wall time per call measured apart from the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    wall = _wall_us(fn, reps, torch.cuda.synchronize)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    busy, rows = device_rows(prof.key_averages(), reps, DeviceType.CUDA)
    return Side(wall, busy, rows, reps)


def device_rows(events: Any, reps: int, device_type: Any) -> tuple[float, list[Row]]:
    """The events that ran on the device (kernels, copies, memsets) and their busy time per call."""
    rows = [Row(ev.key, int(ev.count), float(getattr(ev, "self_device_time_total", 0.0) or 0.0))
            for ev in events if getattr(ev, "device_type", None) == device_type]
    rows = [r for r in rows if r.us > 0]
    return sum(r.us for r in rows) / reps, rows


def render(head: str, what: str, ours: Side, theirs: Side, top: int, *, device_side: bool) -> str:
    """The profile text: one line per side, then its top rows; bounded to MAX_CHARS."""
    lines = [head]
    for label, side in (("yours", ours), ("eager", theirs)):
        busy = f"{what} {side.busy_us:.1f} µs"
        if device_side and side.wall_us > 0:
            idle = max(0.0, 1 - side.busy_us / side.wall_us)
            busy += f" ({100 * idle:.0f}% of the wall time is launch/host time)"
        n = len(side.rows)
        lines.append(f"{label}: wall {side.wall_us:.1f} µs, {busy}, {n} {'kernel' if device_side else 'op'}"
                     f"{'s' if n != 1 else ''}:")
        total = sum(r.us for r in side.rows) or 1.0
        for r in sorted(side.rows, key=lambda r: -r.us)[:top]:
            name = r.name if len(r.name) <= MAX_NAME else r.name[:MAX_NAME - 3] + "..."
            if r.name.startswith(_OP_PREFIX):  # self time: the extern kernel and the host code's own work
                name = "your op (its kernel and host code)"
            lines.append(f"  {name}: {r.calls / side.reps:g} per call, {r.us / side.reps:.1f} µs "
                         f"({100 * r.us / total:.0f}%)")
    text = "\n".join(lines)
    if len(text) <= MAX_CHARS:
        return text
    return text[:text.rfind("\n", 0, MAX_CHARS - len(_CUT))] + _CUT  # whole lines only


# ---------------------------------------------------------------- Metal (MPS)

def mps_gpu_timer() -> Any:
    """The extension's command-buffer GPU timer ops (`gpu_time_mark`, `gpu_time_take`), else None (not
    built, or built before they existed, or the launcher is torch.mps.compile_shader)."""
    from ..backends.mps.backend import extension

    ext = extension()
    if ext is None or not hasattr(ext, "gpu_time_mark") or not hasattr(ext, "gpu_time_take"):
        return None
    return ext


def profile_mps(fn: Callable[[], Any], reps: int, timer: Any) -> Side:
    """GPU time of the command buffers that ran `fn` (GPUEndTime - GPUStartTime, summed per call):
    after each call the current command buffer gets a completion handler; read after synchronize."""
    sync = torch.mps.synchronize
    fn()
    wall = _wall_us(fn, reps, sync)
    sync()
    timer.gpu_time_take()  # reset
    for _ in range(reps):
        fn()
        timer.gpu_time_mark()
    sync()
    seconds, buffers = timer.gpu_time_take()
    return Side(wall, seconds * 1e6 / reps, [Row("command buffers", int(buffers), seconds * 1e6)], reps)


def profile_mps_text(mine: Callable[[], Any], eager: Callable[[], Any], reps: int) -> str:
    timer = mps_gpu_timer()
    if timer is None:
        return ("No GPU profile: GPU times come from command-buffer timestamps through the metal_accel._mps_ext "
                "extension, which is not in use here (torch.mps.compile_shader launches).")
    head = f"Profile (Metal command-buffer GPUStartTime/GPUEndTime, per call, {reps} calls each):"
    return render(head, "GPU busy", profile_mps(mine, reps, timer), profile_mps(eager, reps, timer), 1,
                  device_side=True)
