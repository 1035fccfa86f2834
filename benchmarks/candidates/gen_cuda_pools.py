"""Generate the CUDA candidates for the level-1 max and average pooling problems that torch.compile
won (L1_41 MaxPool1d, L1_42 MaxPool2d, L1_44 AvgPool1d).

    python benchmarks/candidates/gen_cuda_pools.py   # rewrites benchmarks/candidates/cuda/L1_{41,42,44}_*.py

A block owns a tile of one plane's output: it stages the input window of the tile (with the padding
value: -inf for max, 0 for average) in shared memory with coalesced loads, then each thread reduces
its outputs' windows from shared memory. Input and output cross DRAM once. Max propagates NaN as
eager does; the average sums its window in order and divides by the kernel size (count_include_pad,
no ceil_mode), as eager's kernel does. (A divisor_override is not visible to host code: the
proof, which compares with the module itself, rejects the candidate for such a module.)
"""
from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent / "cuda"

COMMON = r"""
#include <cmath>
#define NT 256
// m updated with v: EXACT keeps eager's rule (a NaN wins and stays); otherwise fmaxf (no NaN in sight)
template <bool EXACT>
__device__ __forceinline__ void take_max(float& m, float v) {
    if (EXACT) { if (v > m || v != v) m = v; }
    else m = fmaxf(m, v);
}

// max (or sum) of w[0], w[d], ..., w[(k-1) d]; K > 0: k == K, unrolled
template <int K, bool MAX, bool EXACT>
__device__ __forceinline__ float reduce_window(const float* w, int d, int k) {
    float r = MAX ? -INFINITY : 0.0f;
    if (K > 0) {
        #pragma unroll
        for (int j = 0; j < K; ++j) { if (MAX) take_max<EXACT>(r, w[j * d]); else r += w[j * d]; }
    } else {
        for (int j = 0; j < k; ++j) { if (MAX) take_max<EXACT>(r, w[j * d]); else r += w[j * d]; }
    }
    return r;
}
"""

POOL1D = COMMON + r"""
#define UNROLL 8
// rows of L floats -> rows of Lout; tiles of `tile` outputs; the block's input window staged in buf
template <int K>
__device__ __forceinline__ void pool1d_body(const float* __restrict__ x, float* __restrict__ y,
        long long L, long long Lout, int tiles, int tile, int k, int s, int p, int d, int is_max) {
    extern __shared__ float buf[];
    const long long row = blockIdx.x / tiles;
    const long long o0 = (long long)(blockIdx.x % tiles) * tile;
    const int nout = (int)min((long long)tile, Lout - o0);
    const long long in0 = o0 * s - p;
    const int span = (nout - 1) * s + (k - 1) * d + 1;
    const float pad = is_max ? -INFINITY : 0.0f;
    const float* xr = x + row * L;
    int nan = 0;
    // UNROLL loads in flight per thread before any is stored
    for (int base = 0; base < span; base += UNROLL * NT) {
        float v[UNROLL];
        #pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            const int i = base + j * NT + (int)threadIdx.x;
            const long long pos = in0 + i;
            v[j] = (i < span && pos >= 0 && pos < L) ? __ldcs(xr + pos) : pad;
        }
        #pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            const int i = base + j * NT + (int)threadIdx.x;
            if (i < span) buf[i] = v[j];
            nan |= v[j] != v[j];
        }
    }
    const bool exact = __syncthreads_or(nan);  // a NaN in the block's window: eager's rule, else fmaxf
    float* yr = y + row * Lout + o0;
    for (int o = threadIdx.x; o < nout; o += NT) {
        const float* w = buf + o * s;
        float r;
        if (!is_max) {
            r = reduce_window<K, false, false>(w, d, k);
            r = k == 8 ? r * 0.125f : r / (float)k;
        } else if (exact) {
            r = reduce_window<K, true, true>(w, d, k);
        } else {
            r = reduce_window<K, true, false>(w, d, k);
        }
        __stcs(yr + o, r);
    }
}

extern "C" __global__ void __launch_bounds__(NT) pool1d(const float* __restrict__ x, float* __restrict__ y,
        long long L, long long Lout, int tiles, int tile, int k, int s, int p, int d, int is_max) {
    switch (k) {
        case 2: pool1d_body<2>(x, y, L, Lout, tiles, tile, k, s, p, d, is_max); break;
        case 3: pool1d_body<3>(x, y, L, Lout, tiles, tile, k, s, p, d, is_max); break;
        case 4: pool1d_body<4>(x, y, L, Lout, tiles, tile, k, s, p, d, is_max); break;
        case 8: pool1d_body<8>(x, y, L, Lout, tiles, tile, k, s, p, d, is_max); break;
        default: pool1d_body<0>(x, y, L, Lout, tiles, tile, k, s, p, d, is_max);
    }
}
"""

POOL2D = COMMON + r"""
#define TH 32
#define TW 64
#define UNROLL 10
// planes of H x W floats -> Hout x Wout; a block owns a TH x TW output tile of one plane. The max is
// separable: the staged rows are reduced across the window's columns first (into hbuf), then the
// columns across its rows.
template <int K>
__device__ __forceinline__ void maxpool2d_body(const float* __restrict__ x, float* __restrict__ y,
        int H, int W, int Hout, int Wout, int tiles_h, int tiles_w, int k, int s, int p, int d) {
    extern __shared__ float buf[];
    const int per_plane = tiles_h * tiles_w;
    const long long plane = blockIdx.x / per_plane;
    const int t = blockIdx.x % per_plane;
    const int oh0 = (t / tiles_w) * TH, ow0 = (t % tiles_w) * TW;
    const int nh = min(TH, Hout - oh0), nw = min(TW, Wout - ow0);
    const int ih0 = oh0 * s - p, iw0 = ow0 * s - p;
    const int span_h = (nh - 1) * s + (k - 1) * d + 1, span_w = (nw - 1) * s + (k - 1) * d + 1;
    const int span = span_h * span_w;
    const float inv_w = 1.0f / (float)span_w;
    float* hbuf = buf + span;  // span_h x TW
    const float* xp = x + plane * H * W;
    int nan = 0;
    // UNROLL loads in flight per thread before any is stored
    for (int base = 0; base < span; base += UNROLL * NT) {
        float v[UNROLL];
        #pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            const int i = base + j * NT + (int)threadIdx.x;
            const int r = (int)(((float)i + 0.5f) * inv_w);  // i / span_w, exact for these small i
            const int ih = ih0 + r, iw = iw0 + i - r * span_w;
            v[j] = (i < span && ih >= 0 && ih < H && iw >= 0 && iw < W) ? __ldcs(xp + (long long)ih * W + iw) : -INFINITY;
        }
        #pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            const int i = base + j * NT + (int)threadIdx.x;
            if (i < span) buf[i] = v[j];
            nan |= v[j] != v[j];
        }
    }
    const bool exact = __syncthreads_or(nan);
    for (int i = threadIdx.x; i < span_h * TW; i += NT) {
        const int r = i / TW, c = i % TW;
        if (c < nw) {
            const float* w = buf + r * span_w + c * s;
            hbuf[i] = exact ? reduce_window<K, true, true>(w, d, k) : reduce_window<K, true, false>(w, d, k);
        }
    }
    __syncthreads();
    float* yp = y + plane * Hout * Wout;
    for (int i = threadIdx.x; i < TH * TW; i += NT) {
        const int r = i / TW, c = i % TW;
        if (r < nh && c < nw) {
            const float* w = hbuf + r * s * TW + c;
            const float m = exact ? reduce_window<K, true, true>(w, d * TW, k) : reduce_window<K, true, false>(w, d * TW, k);
            __stcs(yp + (long long)(oh0 + r) * Wout + ow0 + c, m);
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT) maxpool2d(const float* __restrict__ x, float* __restrict__ y,
        int H, int W, int Hout, int Wout, int tiles_h, int tiles_w, int k, int s, int p, int d) {
    switch (k) {
        case 2: maxpool2d_body<2>(x, y, H, W, Hout, Wout, tiles_h, tiles_w, k, s, p, d); break;
        case 3: maxpool2d_body<3>(x, y, H, W, Hout, Wout, tiles_h, tiles_w, k, s, p, d); break;
        case 4: maxpool2d_body<4>(x, y, H, W, Hout, Wout, tiles_h, tiles_w, k, s, p, d); break;
        default: maxpool2d_body<0>(x, y, H, W, Hout, Wout, tiles_h, tiles_w, k, s, p, d);
    }
}
"""

POOL1D_HOST = '''
STAGED = 2048  # input floats a block stages in one round of loads (256 threads x 8)


def pool1d(x, k, s, p, d, is_max):
    assert x.dtype == torch.float32 and x.dim() in (2, 3), "float32 (C, L) or (N, C, L) only"
    xc = x.contiguous()
    L = xc.shape[-1]
    Lout = (L + 2 * p - d * (k - 1) - 1) // s + 1
    assert Lout > 0 and 2 * p <= k, "output size or padding out of range"
    y = torch.empty(xc.shape[:-1] + (Lout,), dtype=xc.dtype, device=xc.device)
    rows = xc.numel() // L if L else 0
    if rows:
        tile = max(256, (STAGED - (k - 1) * d - 1) // s + 1)  # outputs whose window fits one round
        tiles = (Lout + tile - 1) // tile
        span = (tile - 1) * s + (k - 1) * d + 1
        lib.pool1d(xc, y, L, Lout, tiles, tile, k, s, p, d, int(is_max),
                   grid=(rows * tiles,), block=(256,), shared_mem=span * 4)
    return y
'''

MAXPOOL1D_FORWARD = '''

def forward(module, x):
    assert not module.maxpool.return_indices and not module.maxpool.ceil_mode, "plain max pooling only"
    k = int(module.maxpool.kernel_size)
    s = int(module.maxpool.stride) if module.maxpool.stride is not None else k
    return pool1d(x, k, s, int(module.maxpool.padding), int(module.maxpool.dilation), True)
'''

AVGPOOL1D_FORWARD = '''

def forward(module, x):
    assert module.avg_pool.count_include_pad and not module.avg_pool.ceil_mode, "count_include_pad, no ceil_mode only"
    return pool1d(x, module.avg_pool.kernel_size[0], module.avg_pool.stride[0], module.avg_pool.padding[0], 1, False)
'''

MAXPOOL2D_HOST = '''
TH = 32
TW = 64


def forward(module, x):
    assert not module.maxpool.return_indices and not module.maxpool.ceil_mode, "plain max pooling only"
    assert x.dtype == torch.float32 and x.dim() in (3, 4), "float32 (C, H, W) or (N, C, H, W) only"
    k, p, d = int(module.maxpool.kernel_size), int(module.maxpool.padding), int(module.maxpool.dilation)
    s = int(module.maxpool.stride) if module.maxpool.stride is not None else k
    xc = x.contiguous()
    H, W = xc.shape[-2], xc.shape[-1]
    Hout = (H + 2 * p - d * (k - 1) - 1) // s + 1
    Wout = (W + 2 * p - d * (k - 1) - 1) // s + 1
    assert Hout > 0 and Wout > 0 and 2 * p <= k, "output size or padding out of range"
    y = torch.empty(xc.shape[:-2] + (Hout, Wout), dtype=xc.dtype, device=xc.device)
    planes = xc.numel() // (H * W) if H * W else 0
    if planes:
        tiles_h, tiles_w = (Hout + TH - 1) // TH, (Wout + TW - 1) // TW
        span_h = (TH - 1) * s + (k - 1) * d + 1
        floats = span_h * ((TW - 1) * s + (k - 1) * d + 1) + span_h * TW  # staged input, then row maxima
        lib.maxpool2d(xc, y, H, W, Hout, Wout, tiles_h, tiles_w, k, s, p, d,
                      grid=(planes * tiles_h * tiles_w,), block=(256,), shared_mem=floats * 4)
    return y
'''

FILES = {
    "L1_41_Max_Pooling_1D": ("MaxPool1d", POOL1D, POOL1D_HOST + MAXPOOL1D_FORWARD),
    "L1_44_Average_Pooling_1D": ("AvgPool1d", POOL1D, POOL1D_HOST + AVGPOOL1D_FORWARD),
    "L1_42_Max_Pooling_2D": ("MaxPool2d", POOL2D, MAXPOOL2D_HOST),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (what, source, host) in FILES.items():
        doc = (f'"""{name[3:]}: {what} with the tile\'s input window staged in shared memory; input and\n'
               'output cross DRAM once. Integer pooling parameters only (a tuple fails and eager runs).\n'
               'Generated by benchmarks/candidates/gen_cuda_pools.py."""\n')
        (OUT / f"{name}.py").write_text(f'{doc}SOURCE = r"""{source}"""\nSHAPE_GENERIC = True\n{host}')
    print(f"wrote {len(FILES)} candidates to {OUT}")


if __name__ == "__main__":
    main()
