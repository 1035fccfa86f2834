"""Facts for a prompt: what a module computes (its op signature), inductor's code trimmed to what matters,
the eager time measured over many calls, how the proof judges a kernel, and the device's numbers."""
from __future__ import annotations

import collections
import hashlib
import os
import platform
import re
import statistics
import time
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..core.specs import InputSpec, TensorSpec
from ..proof.precision import TOLERANCES
from ..proof.testdata import DISTRIBUTIONS, ROW_KINDS, make_inputs
from ..runtime.dispatch import eager_only

_SKIP_OPS = {"aten.detach", "aten.alias", "aten.lift_fresh", "aten.empty", "aten.empty_like", "aten.t"}


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = str(func.overloadpacket)
        if name not in _SKIP_OPS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def op_multiset(module: nn.Module, spec: InputSpec, device: torch.device | str) -> dict[str, int]:
    """The aten ops one eager forward runs (name -> count); {} if it cannot run here."""
    try:
        args, kwargs = make_inputs(spec, "normal", torch.Generator().manual_seed(0), device)
        counter = _OpCounter()
        with torch.inference_mode(), eager_only(), counter:
            module(*args, **kwargs)
        return dict(sorted(counter.ops.items()))
    except Exception:  # a signature is a hint; no signature means no reference by structure
        return {}


def signature(ops: dict[str, int], spec: InputSpec) -> str:
    """A short hash of what a call computes: its sorted op multiset and its inputs' dtypes and ranks (not
    their sizes: a kernel for other shapes of the same computation is a good reference). '' without ops."""
    if not ops:
        return ""
    inputs = [f"{t.dtype}/{len(t.shape)}" if isinstance(t, TensorSpec) else type(t).__name__
              for t in spec.tensor_specs()]
    text = repr((sorted(ops.items()), inputs))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


_KERNEL_START = re.compile(r"^\w+ = async_compile\.\w+\(")
_CALL_START = re.compile(r"^(\s*)def call\(")
_NOISE = re.compile(r"^\s*(assert_size_stride|assert_alignment|del |args\.clear\(\))")


def trim_inductor(code: str) -> str:
    """Inductor's output cut to what a kernel author needs: each generated kernel and the function that
    allocates buffers and calls them in order (no imports, guards, benchmark harness, size asserts)."""
    lines = code.splitlines()
    keep: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _KERNEL_START.match(line):  # a kernel: up to the line that closes its source string
            j = i + 1
            while j < len(lines) and not re.match(r"^('''|\"\"\"|''', |\"\"\", )", lines[j]):
                j += 1
            keep.extend(lines[i:j + 1] + [""])
            i = j + 1
            continue
        m = _CALL_START.match(line)
        if m:
            indent = len(m.group(1))
            j = i + 1
            body = [line]
            while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
                if lines[j].strip() and not _NOISE.match(lines[j]):
                    body.append(lines[j])
                j += 1
            keep.extend(body + [""])
            i = j
            continue
        i += 1
    return "\n".join(keep).strip() if keep else code


def eager_time_us(module: nn.Module, spec: InputSpec, device: torch.device | str, *, budget_s: float = 0.25,
                  max_runs: int = 50) -> tuple[float, int] | None:
    """(median µs per eager call, runs) on fresh inputs, after a warm-up; None if it cannot run."""
    try:
        args, kwargs = make_inputs(spec, "normal", torch.Generator().manual_seed(1), device)
        dev = torch.device(device)
        sync = (torch.cuda.synchronize if dev.type == "cuda" else
                torch.mps.synchronize if dev.type == "mps" else (lambda: None))
        times: list[float] = []
        with torch.inference_mode(), eager_only():
            module(*args, **kwargs)
            sync()
            end = time.perf_counter() + budget_s
            while len(times) < max_runs and (len(times) < 5 or time.perf_counter() < end):
                t0 = time.perf_counter()
                module(*args, **kwargs)
                sync()
                times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6, len(times)
    except Exception:
        return None


def _dtype(d: Any) -> Any:
    return getattr(torch, d, None) if isinstance(d, str) else d


def proof_facts(module: nn.Module, spec: InputSpec, out_dtypes: list[Any]) -> str:
    """How the proof judges a kernel: the module's mode, the tolerances, the inputs it is fed."""
    mode = ("The module is in eval mode (`module.training` is False): dropout does nothing, batch norm uses "
            "its running statistics." if not module.training else
            "The module is in training mode (`module.training` is True).")
    tol = []
    for dt in dict.fromkeys(_dtype(d) for d in out_dtypes):
        t = TOLERANCES.get(dt)
        if t is not None:
            tol.append(f"{str(dt).removeprefix('torch.')}: |out - ref| <= {t.rtol:g}·|ref| + {t.atol:g}·mean|ref| "
                       f"per element and ||out - ref|| / ||ref|| <= {t.norm:g}")
    tols = ("Tolerances (against eager, per output dtype): " + "; ".join(tol) + ". Matmuls and convolutions "
            "get what eager's own reduced internal precision (TF32, oneDNN) allows.") if tol else \
        "Outputs must match eager exactly where they are not floating point."
    floats = any(isinstance(t, TensorSpec) and getattr(_dtype(t.dtype), "is_floating_point", False)
                 for t in spec.tensor_specs())
    inputs = (f"Test inputs: fresh random tensors of several distributions ({', '.join(DISTRIBUTIONS)})"
              + ("; a 'special' set with about 1 in 8 elements replaced by 0, -0, NaN, ±Inf, denormals, ±max/4, "
                 "±1e4 (NaN and Inf must propagate as eager's do)" if floats else "")
              + f"; 'structured' rows along the last dimension ({', '.join(ROW_KINDS)}, e.g. rows that start with "
              "zeros, constant rows, masks); and other shapes of the same rank where the call allows them. "
              "Output buffers start with arbitrary values.")
    return "\n".join([mode, tols, inputs])


def device_facts(device: torch.device | str) -> str:
    """Numbers a kernel author sizes work by, for the device the kernel runs on."""
    dev = torch.device(device)
    try:
        if dev.type == "cuda":
            p = torch.cuda.get_device_properties(dev)
            smem = getattr(p, "shared_memory_per_block_optin", 0) or getattr(p, "shared_memory_per_block", 0)
            l2 = getattr(p, "L2_cache_size", 0)
            return (f"{p.name}: compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                    f"{p.total_memory / 2**30:.0f} GiB, up to {smem // 1024} KiB shared memory per block (opt-in), "
                    f"{l2 / 2**20:.0f} MiB L2, warp size {getattr(p, 'warp_size', 32)}.")
        if dev.type == "mps":
            return _apple_gpu_facts()
    except Exception:
        return ""
    isa = _cpu_isa()
    return (f"{platform.machine()} CPU, {os.cpu_count() or 1} logical cores"
            + (f", vector ISA: {isa}" if isa else "") + ".")


def _cpu_isa() -> str:
    try:
        cap = torch.backends.cpu.get_cpu_capability()  # e.g. AVX2, AVX512, DEFAULT
    except Exception:
        cap = ""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read(1 << 16)
        have = set(re.search(r"^(flags|Features)\s*:\s*(.*)$", text, re.M).group(2).split())  # type: ignore[union-attr]
        flags = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "neon", "asimd", "sve")
                 if f in have]
    except Exception:
        pass
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        flags = flags or ["NEON"]
    return ", ".join(x for x in [str(cap) if cap and cap != "DEFAULT" else "", " ".join(flags)] if x)


def _apple_gpu_facts() -> str:
    """Apple GPUs: threadgroup memory and SIMD width are the same on every Apple family metal_accel runs on."""
    chip = ""
    try:
        import subprocess
        chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                              timeout=2).stdout.strip()
    except Exception:
        pass
    family = {"M1": "Apple7", "M2": "Apple8", "M3": "Apple9", "M4": "Apple9"}.get(
        next((m for m in ("M1", "M2", "M3", "M4") if m in chip), ""), "")
    return (f"{chip or 'Apple GPU'}" + (f" (GPU family {family})" if family else "")
            + ": 32 KiB threadgroup memory, SIMD-group width 32, up to 1024 threads per threadgroup, "
            "unified memory.")
