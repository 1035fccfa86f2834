"""Where the host time of one optimized call goes on CUDA (run on the GPU machine).

    python benchmarks/cuda_overhead.py [--rows 64] [--cols 8192] [--profile]

For SiluMul (the shipped candidate, kernels_src/cuda/SiluMul.py) at one shape it times, per call:
  host loop   N calls back to back, then one synchronize: the host cost per call when the host is
              the bottleneck (small kernels), which is what a decode loop sees;
  synced      synchronize, call, synchronize, timed by CUDA events (what `bench` measures);
for each layer of the path: a bare ctypes launch, `lib.kernel(...)`, the candidate's forward,
the custom op (KernelOp), the dispatcher (the optimized module) and the eager module.
--profile adds a cProfile of the optimized module's host loop.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def host_loop(fn, n: int) -> float:
    """Per-call host time (us) of n back-to-back calls, synchronized once at the end."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def synced(fn, n: int) -> float:
    """Median CUDA-event time (us) of one call between two synchronizations."""
    times = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs an NVIDIA GPU", file=sys.stderr)
        return 2
    import os
    os.environ.setdefault("METAL_ACCEL_USER_CACHE", tempfile.mkdtemp())
    from metal_accel.backends.cuda.backend import CudaBackend, _libcuda
    from metal_accel.backends.cuda.signature import ArgBinder
    from metal_accel.blocks import SiluMul
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.runtime.capture import capture
    from metal_accel.runtime.dispatch import dispatcher_of, install
    from metal_accel.runtime.ops import kernel_op
    from metal_accel.proof.prove import kernels_only
    from metal_accel.sandbox.host import load_forward

    gate = torch.randn(args.rows, args.cols, device="cuda")
    up = torch.randn(args.rows, args.cols, device="cuda")
    eager_mod = SiluMul().cuda()
    mod = SiluMul().cuda()
    # Installed by hand, as the pipeline does after a win: the path is profiled whether or not it wins.
    cand = parse_candidate((ROOT / "kernels_src/cuda/SiluMul.py").read_text(), "cuda")
    raw_lib = CudaBackend().compile(cand.source)
    call = capture(mod, (gate, up))[0]
    installed = kernel_op("overhead_probe", cand.digest, lambda: load_forward(cand.code, kernels_only(raw_lib)),
                          call.spec, call.output_spec, mod, "cuda")
    install(mod, call.spec.signature(), installed)
    torch.testing.assert_close(mod(gate, up), eager_mod(gate, up))
    disp = dispatcher_of(mod)
    op = next(iter(disp.table.values()))
    host = op._host
    state = disp.layout.gather()
    view = op._module_view(state)
    lib = host.__globals__["lib"]
    kern = lib.silu_mul_v4
    out = torch.empty_like(gate)
    n4 = gate.numel() // 4
    grid = (min((n4 + 255) // 256, 132 * 16),)
    cu_launch, _ = _libcuda()
    binder = ArgBinder("silu_mul_v4", raw_lib.signatures["silu_mul_v4"])
    fn_handle = raw_lib.loaded(0).handles["silu_mul_v4"]
    stream = torch.cuda.current_stream().cuda_stream
    addr, _keep = binder.pack(binder.values((gate, up, out, n4)))

    def bare() -> None:
        cu_launch(fn_handle, grid[0], 1, 1, 256, 1, 1, 0, stream, addr, None)

    layers = {
        "ctypes cuLaunchKernel (prepacked)": bare,
        "lib.silu_mul_v4(...)": lambda: kern(gate, up, out, n4, grid=grid, block=(256,)),
        "torch.empty_like": lambda: torch.empty_like(gate),
        "candidate forward(view, gate, up)": lambda: host(view, gate, up),
        "KernelOp._impl": lambda: op._impl([gate, up], state),
        "KernelOp.__call__": lambda: op((gate, up), {}, state),
        "torch custom op (dispatcher path)": lambda: op.op([gate, up], state),
        "optimized module": lambda: mod(gate, up),
        "eager module": lambda: eager_mod(gate, up),
        "F.silu(gate) * up (no module)": lambda: torch.nn.functional.silu(gate) * up,
    }
    results = {}
    print(f"\nSiluMul {args.rows}x{args.cols} float32 on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'layer':40s} {'host loop us':>12s} {'synced us':>10s}")
    with torch.inference_mode():
        for name, fn in layers.items():
            h = min(host_loop(fn, args.n) for _ in range(3))
            s = synced(fn, 200)
            results[name] = {"host_loop_us": round(h, 2), "synced_us": round(s, 2)}
            print(f"{name:40s} {h:12.2f} {s:10.2f}")
        if args.profile:
            for _ in range(args.n):  # the eager module's profile first, for comparison
                eager_mod(gate, up)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.n):
                mod(gate, up)
            prof.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            print(buf.getvalue())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
