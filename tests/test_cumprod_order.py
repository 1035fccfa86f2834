"""The CUDA cumprod candidate (benchmarks/candidates/cuda/L1_90_cumprod.py) multiplies in eager CUDA's order.

Float products are not associative: where a running product overflows to Inf or underflows to 0
depends on how the factors are grouped, and the proof wants eager's Inf/0/NaN positions. Two CPU
emulations in float32 (IEEE products, vectorized over rows):

- `eager_order` follows PyTorch 2.11's innermost-dim CUDA scan (aten/src/ATen/native/cuda/ScanUtils.cuh:
  scan_dim -> scan_innermost_dim -> tensor_kernel_scan_innermost_dim_impl, launch shape from
  get_log_num_threads_x_inner_scan): chunks of 2^(L+1) elements padded with 1, the chunk's first element
  times the previous chunk's last output, then Sklansky levels m = 0..L (the upper half of each group of
  2^(m+1) times the last element of its lower half).
- `kernel_order` follows the candidate's kernel index by index: E = N / 32 elements a lane, in-thread
  levels, then shuffle levels from the last element of a source lane, both skipping the group holding
  the chunk's first element; the chain C_0 = x_0 * carry, C_k = A_(2^k-1) * C_(k-1) run one chunk after
  another; out_i = A_i * C_msb(i).

They must agree bit for bit (NaN included) on random and special inputs, for every chunk size eager
picks (32..1024) and rows that are not a multiple of the chunk.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from metal_accel.core.candidate import parse_candidate

# slow: a CUDA benchmark candidate, emulated on the CPU
pytestmark = pytest.mark.slow

CANDIDATE = Path(__file__).resolve().parent.parent / "benchmarks" / "candidates" / "cuda" / "L1_90_cumprod.py"


def eager_log_threads_x(num_rows: int, row_size: int) -> int:
    """get_log_num_threads_x_inner_scan<uint32_t>: (9 + lx - ly) / 2 in uint32, clamped to [4, 9]."""
    lx = ly = 0
    while (1 << lx) < row_size:
        lx += 1
    while (1 << ly) < num_rows:
        ly += 1
    m = 0xFFFFFFFF
    return min(max(4, ((9 + ((lx - ly) & m)) & m) // 2), 9)


def _padded(x: torch.Tensor, n: int) -> torch.Tensor:
    rows, size = x.shape
    chunks = -(-size // n)
    out = torch.ones(rows, chunks * n, dtype=x.dtype)
    out[:, :size] = x
    return out


def eager_order(x: torch.Tensor) -> torch.Tensor:
    """Eager CUDA's cumprod of each row of a 2-D float32 tensor, product by product."""
    rows, size = x.shape
    L = eager_log_threads_x(rows, size)
    n = 2 << L
    xp = _padded(x, n)
    out = torch.empty_like(xp)
    total = torch.ones(rows, dtype=x.dtype)  # block_total, init = 1
    t = torch.arange(n // 2)                 # threadIdx.x, two elements a thread
    for c in range(xp.shape[1] // n):
        buf = xp[:, c * n:(c + 1) * n].clone()
        buf[:, 0] = buf[:, 0] * total        # row_buf[0] = binary_op(row_buf[0], block_total)
        for m in range(L + 1):
            s = 1 << m
            a = ((t >> m) << (m + 1)) | s
            ti, si = a + (t % s), a - 1
            buf[:, ti] = buf[:, ti] * buf[:, si]
        out[:, c * n:(c + 1) * n] = buf
        total = buf[:, n - 1]
    return out[:, :size]


def kernel_order(x: torch.Tensor) -> torch.Tensor:
    """The candidate kernel's products, indexed as the kernel indexes them (all chunks at once)."""
    rows, size = x.shape
    L = eager_log_threads_x(rows, size)
    n = 2 << L
    E = n // 32
    LE = E.bit_length() - 1
    assert L == LE + 4
    A = _padded(x, n).view(rows, -1, n).clone()   # (rows, chunks, lane * E + k)
    chunks = A.shape[1]
    i = torch.arange(n)
    lane, k = i // E, i % E
    for m in range(LE):                            # in-thread levels: v[k] *= v[g + 2^m - 1]
        g = (k >> (m + 1)) << (m + 1)
        sel = (((k >> m) & 1) == 1) & ((lane != 0) | (g != 0))
        dst, src = i[sel], (lane * E + g + (1 << m) - 1)[sel]
        A[..., dst] = A[..., dst] * A[..., src]
    for m in range(LE, L + 1):                     # shuffle levels: v[k] *= last element of lane g + h - 1
        h = 1 << (m - LE)
        g = lane & ~(2 * h - 1)
        src = (g + h - 1) * E + (E - 1)
        sel = ((lane & h) != 0) & (g != 0)
        A[..., i[sel]] = A[..., i[sel]] * A[..., src[sel]]
    M = [A[..., (1 << kk) - 1] for kk in range(LE + 1)]                    # lane 0
    M += [A[..., (ln + 1) * E - 1] for ln in (1, 3, 7, 15, 31)]           # lanes 2^j - 1, k = LE + j
    assert len(M) == L + 2
    C = torch.empty(rows, chunks, L + 1, dtype=x.dtype)
    carry = torch.ones(rows, dtype=x.dtype)
    for c in range(chunks):                        # thread 0's chain
        cur = M[0][:, c] * carry
        C[:, c, 0] = cur
        for kk in range(1, L + 1):
            cur = M[kk][:, c] * cur
            C[:, c, kk] = cur
        carry = M[L + 1][:, c] * cur
    msb = torch.zeros(n, dtype=torch.long)        # lane 0: msb(k); lane >= 1: LE + msb(lane)
    msb[1:] = torch.tensor([j.bit_length() - 1 for j in range(1, n)])
    out = A * C[..., msb]
    out[..., 0] = C[..., 0]
    return out.reshape(rows, -1)[:, :size]


def _inputs(rows: int, size: int, kind: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "near1":      # long products that keep all their bits: any regrouping shows
        return 1 + 0.05 * torch.randn(rows, size, generator=gen)
    if kind == "randn":
        return torch.randn(rows, size, generator=gen)
    if kind == "wide":       # products that overflow and underflow part way along
        return torch.exp(6 * torch.randn(rows, size, generator=gen)) * torch.sign(torch.randn(rows, size, generator=gen))
    x = torch.randn(rows, size, generator=gen) * 8
    specials = torch.tensor([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 1e-30, -1e-30,
                             1e-40, -1e-40, 3e38, -1.0, 1e4])
    where = torch.rand(rows, size, generator=gen) < 0.06
    x[where] = specials[torch.randint(0, len(specials), (int(where.sum()),), generator=gen)]
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


# (rows, size): chunk N = 2^(L+1) and E = N / 32 for each; sizes not multiples of the chunk
SHAPES = [
    (64, 40),     # L = 4: N = 32, E = 1
    (64, 100),    # L = 5: N = 64, E = 2
    (64, 300),    # L = 6: N = 128, E = 4
    (32, 1000),   # L = 7: N = 256, E = 8 (the benchmark's 512 x 32768 chunks)
    (4, 1000),    # L = 8: N = 512, E = 16
    (2, 2500),    # L = 9: N = 1024, E = 32
    (1100, 2),    # (9 + lx - ly) wraps in uint32: L = 9 for a 2-element row
]


def test_launch_shape():
    assert [eager_log_threads_x(r, s) for r, s in SHAPES] == [4, 5, 6, 7, 8, 9, 9]
    assert eager_log_threads_x(512, 32768) == 7 and eager_log_threads_x(256, 32768) == 8
    assert eager_log_threads_x(1025, 32768) == 6
    ns: dict = {"torch": torch, "math": math}
    exec(compile(parse_candidate(CANDIDATE.read_text(), "cuda", str(CANDIDATE)).code, str(CANDIDATE), "exec"), ns)
    for rows, size in SHAPES + [(512, 32768), (256, 32768), (1025, 32768), (1, 7), (3, 1), (100000, 2)]:
        assert ns["log_threads_x"](rows, size) == eager_log_threads_x(rows, size), (rows, size)


@pytest.mark.parametrize("kind", ["near1", "randn", "wide", "special"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_kernel_order_is_eager_order(shape, kind):
    x = _inputs(*shape, kind, seed=shape[0] * 7919 + shape[1])
    want, got = eager_order(x), kernel_order(x)
    assert _same_bits(want, got)
    if kind == "special":   # the case the proof is about: Inf, 0 and NaN in the outputs
        assert torch.isinf(want).any() and torch.isnan(want).any() and (want == 0).any()


def test_eager_order_is_a_cumprod():
    x = _inputs(32, 1000, "near1", seed=1)
    ref = torch.cumprod(x.double(), dim=1)
    torch.testing.assert_close(eager_order(x).double(), ref, rtol=1e-5, atol=0)


def test_order_matters():
    """A sequential left fold differs from eager's grouping in the last bits: the bit test has teeth."""
    x = _inputs(32, 1000, "near1", seed=2)
    seq = torch.empty_like(x)
    acc = torch.ones(32)
    for j in range(x.shape[1]):
        acc = acc * x[:, j]
        seq[:, j] = acc
    assert not _same_bits(seq, eager_order(x))
