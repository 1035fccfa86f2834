"""A small Llama-style decoder written with plain torch.nn: the library's demo model.

Small models at small batch are where eager PyTorch's per-op overhead dominates (on CPU and on
Apple GPUs), which is the regime metal_accel targets. Everything is float32 and initialised
deterministically from a seed, so kernels can be checked against eager bit-for-bit inputs.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# The default configuration: a realistic shape family (Llama: RMSNorm, RoPE, SwiGLU), kept small.
DEFAULT_CONFIG = dict(vocab=512, dim=128, n_layers=4, n_heads=4, hidden=384, max_seq=64)
DEFAULT_BATCH = 1
DEFAULT_SEQ = 32


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    """Multi-head causal self-attention with rotary position embeddings (Llama/nanoGPT style)."""

    def __init__(self, dim: int, n_heads: int, max_seq: int, rope_base: float = 10000.0) -> None:
        super().__init__()
        assert dim % n_heads == 0 and (dim // n_heads) % 2 == 0
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        inv_freq = 1.0 / (rope_base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # (max_seq, head_dim)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, max_seq, max_seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:T], self.sin[:T]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, H, T, head_dim)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.o_proj(y)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, dim: int, n_heads: int, hidden: int, max_seq: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = Attention(dim, n_heads, max_seq)
        self.norm2 = RMSNorm(dim)
        self.mlp = MLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class TinyLlama(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int, n_heads: int, hidden: int, max_seq: int) -> None:
        super().__init__()
        self.max_seq = max_seq
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, n_heads, hidden, max_seq) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def _init_weights(model: TinyLlama, seed: int) -> None:
    """Deterministic init (independent of the global RNG): N(0, 0.02), residual outputs scaled down,
    norm weights near 1 (not exactly 1, so a kernel that ignores them is caught)."""
    gen = torch.Generator().manual_seed(seed)
    n_layers = len(model.blocks)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            else:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                param.copy_(std * torch.randn(param.shape, generator=gen))


def build_demo_model(seed: int = 0, **overrides: int) -> TinyLlama:
    """The demo TinyLlama with the default config (overridable by keyword), in eval mode."""
    config = {**DEFAULT_CONFIG, **overrides}
    model = TinyLlama(**config)
    _init_weights(model, seed)
    return model.eval()


def demo_inputs(batch: int = DEFAULT_BATCH, seq: int = DEFAULT_SEQ, seed: int = 0,
                vocab: int = DEFAULT_CONFIG["vocab"]) -> tuple[torch.Tensor]:
    """Random token ids, shape (batch, seq), int64, deterministic from the seed."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, vocab, (batch, seq), generator=gen, dtype=torch.int64),)
