"""Reference modules for the common model blocks that ship with prebuilt kernels.

Each class is the plain PyTorch formulation a model would contain; the shipped cache holds
kernels for them (kernels_src/<backend>/<ClassName>.py, proven by scripts/build_shipped_cache.py)
at the shapes in SHIPPED_SHAPES. A model that uses these classes (or `import metal_accel` with
auto-instrumentation) gets the kernels on a matching call; everything else stays eager.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2, -1) + eps) * weight (Llama style)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LayerNorm(nn.Module):
    """F.layer_norm over the last dimension, with weight and bias."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class Softmax(nn.Module):
    """Softmax over the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class SiluMul(nn.Module):
    """The gated-MLP epilogue: silu(gate) * up."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


class BiasGelu(nn.Module):
    """gelu(x + bias), the epilogue of a linear layer followed by exact GELU."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + self.bias)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotary position embedding (GPT-NeoX / Llama "rotate half"): x * cos + rotate_half(x) * sin.

    x is (batch, heads, seq, head_dim); cos and sin are (seq, head_dim).
    """

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x * cos + rotate_half(x) * sin


class ConvBnAct(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d (running statistics) -> SiLU, the block of most CNNs."""

    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


def _randomize(m: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial 1-D weights, biases and statistics, so a kernel that ignores one cannot pass."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(m.named_parameters()) + list(m.named_buffers()):
            if not t.is_floating_point() or t.dim() != 1:
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith("weight"):
                t.copy_(1 + 0.3 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(0.3 * torch.randn(t.shape, generator=g))
    return m


# (name, module factory, example-input factory) at the shapes the shipped cache is built for
def shipped_blocks(device: str = "cuda") -> list[tuple[str, nn.Module, Callable[[], tuple]]]:
    t = 4096  # tokens
    out: list[tuple[str, nn.Module, Callable[[], tuple]]] = []
    for d in (4096,):
        out.append((f"RMSNorm {t}x{d}", _randomize(RMSNorm(d)), lambda d=d: (torch.randn(t, d),)))
        out.append((f"LayerNorm {t}x{d}", _randomize(LayerNorm(d)), lambda d=d: (torch.randn(t, d),)))
        out.append((f"BiasGelu {t}x{d}", _randomize(BiasGelu(d)), lambda d=d: (torch.randn(t, d),)))
    out.append(("Softmax 4096x4096", Softmax(), lambda: (torch.randn(4096, 4096),)))
    out.append(("SiluMul 4096x11008", SiluMul(), lambda: (torch.randn(4096, 11008), torch.randn(4096, 11008))))
    out.append(("Rotary 1x32x2048x128", Rotary(),
                lambda: (torch.randn(1, 32, 2048, 128), torch.randn(2048, 128), torch.randn(2048, 128))))
    out.append(("ConvBnAct 32x64x56x56", _randomize(ConvBnAct(64, 64)), lambda: (torch.randn(32, 64, 56, 56),)))
    return [(n, m.to(device).eval(), lambda f=f: tuple(a.to(device) for a in f())) for n, m, f in out]


# The Metal shapes: a 1.1B Llama-class model (dim 2048, MLP hidden 5632, 32 heads of 64) prefilling
# 512 tokens, and a ResNet-style conv block; small enough for the MSL emulator to prove in CI.
def metal_blocks(device: str = "cpu") -> list[tuple[str, nn.Module, Callable[[], tuple]]]:
    t, d, hidden = 512, 2048, 5632
    out: list[tuple[str, nn.Module, Callable[[], tuple]]] = [
        (f"RMSNorm {t}x{d}", _randomize(RMSNorm(d)), lambda: (torch.randn(t, d),)),
        (f"LayerNorm {t}x{d}", _randomize(LayerNorm(d)), lambda: (torch.randn(t, d),)),
        (f"BiasGelu {t}x{d}", _randomize(BiasGelu(d)), lambda: (torch.randn(t, d),)),
        ("Softmax 1024x1024", Softmax(), lambda: (torch.randn(1024, 1024),)),
        (f"SiluMul {t}x{hidden}", SiluMul(), lambda: (torch.randn(t, hidden), torch.randn(t, hidden))),
        (f"Rotary 1x32x{t}x64", Rotary(),
         lambda: (torch.randn(1, 32, t, 64), torch.randn(t, 64), torch.randn(t, 64))),
        ("ConvBnAct 8x64x56x56", _randomize(ConvBnAct(64, 64)), lambda: (torch.randn(8, 64, 56, 56),)),
    ]
    return [(n, m.to(device).eval(), lambda f=f: tuple(a.to(device) for a in f())) for n, m, f in out]
