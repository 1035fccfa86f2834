"""Channels-last against NCHW for the first convolution of KernelBench problems (the probe behind the
candidates' channels-last convs).

    python benchmarks/conv_layout.py --level 2 --ids 1 2 3 ...   (CUDA)

Per problem, its first Conv2d/Conv3d/ConvTranspose2d/3d on the input it receives in the model (batch fitted
to --max-tensor-mb as the bench fits it), median of 40 calls between synchronizations (CUDA events), in
microseconds: `model` the whole eager model; `nchw` the conv as eager runs it; `nhwc+conv_x` the conv with
channels-last weights on the input converted to channels-last in the call; `nhwc(w nchw)` the input
converted, the weights left NCHW. Output: docs/results/conv_layout/h100_conv_layout_run1.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from metal_accel.kernelbench.problems import load_problems  # noqa: E402
from metal_accel.kernelbench.problem import fit_batch  # noqa: E402

CONVS = (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def median_us(fn: Callable[[], Any], calls: int = 40) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=str(ROOT / ".kb" / "problems.jsonl"))
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--ids", type=int, nargs="+", required=True)
    ap.add_argument("--max-tensor-mb", type=float, default=64.0)
    args = ap.parse_args()
    for p in load_problems(Path(args.problems), levels=[args.level]):
        if p.problem_id not in args.ids:
            continue
        _, batch = fit_batch(p, args.max_tensor_mb)
        model, inputs = p.instantiate("cuda", 0)
        conv = next((m for m in model.modules() if isinstance(m, CONVS)), None)
        if conv is None:
            continue
        seen: dict[str, torch.Tensor] = {}
        hook = conv.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
        with torch.no_grad():
            model(*inputs)
        hook.remove()
        x = seen["x"]
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        extra = {"output_padding": conv.output_padding} if isinstance(conv, (nn.ConvTranspose2d, nn.ConvTranspose3d)) else {}
        cl = type(conv)(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, **extra).cuda()
        cl.load_state_dict(conv.state_dict())
        cl = cl.to(memory_format=fmt)
        with torch.no_grad():
            nchw = median_us(lambda: conv(x))
            nhwc = median_us(lambda: cl(x.contiguous(memory_format=fmt)))
            w_nchw = median_us(lambda: conv(x.contiguous(memory_format=fmt)))
            whole = median_us(lambda: model(*inputs))
            out_cl = cl(x.contiguous(memory_format=fmt)).is_contiguous(memory_format=fmt)
        print(f"L{args.level}_{p.problem_id} {type(conv).__name__} b={batch} x={tuple(x.shape)} model={whole:.0f} "
              f"nchw={nchw:.0f} nhwc+conv_x={nhwc:.0f} nhwc(w nchw)={w_nchw:.0f} ratio={nchw / nhwc:.2f} "
              f"out_cl={out_cl}", flush=True)


if __name__ == "__main__":
    main()
