"""Generate the CUDA candidates for the level-1 max and average pooling problems that torch.compile
won (L1_41 MaxPool1d, L1_42 MaxPool2d, L1_44 AvgPool1d).

    python benchmarks/candidates/gen_cuda_pools.py   # rewrites benchmarks/candidates/cuda/L1_{41,42,44}_*.py

MaxPool2d with stride 1 and dilation 1 over rows of a multiple of 4 floats (L1_42's case) has a kernel of
its own, maxpool2d_s1: a block walks down a strip of the plane keeping the row maxima of the window's
rows in registers (see its comment). Otherwise a block owns a tile of one plane's output: it stages
the input window of the tile (with the padding value: -inf for max, 0 for average) in shared memory
with coalesced loads, then each thread reduces its outputs' windows from shared memory. Input and output cross DRAM once. Max propagates NaN as
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

// Stride 1, dilation 1, W % 4 == 0: a block of NS threads owns a strip of 4 NS output columns and RH
// output rows of one plane and walks down it, so each input row crosses DRAM once (the K - 1 rows a
// block shares with the next one come again, from L2 mostly: the blocks of one plane run side by side;
// on an H100 16 input rows a block ran faster than 32 or 64, more blocks hiding more latency). A thread loads its 4 input columns as one
// float4 per row, UR rows in flight; the K - 1 columns its windows share with its neighbours come by
// warp shuffle (lanes 0 and 31 load the neighbouring float4 instead). The row maxima of the last K
// input rows stay in registers; each output row goes through shared memory so that a warp stores 128
// consecutive floats. Eager's scan is "the last NaN, else the first maximum" in row-major window order,
// an associative rule: row maxima left to right, then across rows top to bottom, give its result bit
// for bit (a -0.0/+0.0 tie included).
#define NS 128
#define UR 4
__device__ __forceinline__ float mx(float m, float v) { return (v > m || v != v) ? v : m; }
__device__ __forceinline__ float4 mx4(float4 m, float4 v) {
    return make_float4(mx(m.x, v.x), mx(m.y, v.y), mx(m.z, v.z), mx(m.w, v.w));
}
__device__ __forceinline__ float comp(float4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// maxima of the 4 windows of columns 4g - P + j .. 4g - P + j + K - 1 (j < 4); a: columns 4g .. 4g + 3,
// e: lane 0 the float4 left of a, lane 31 the one right of it
template <int K, int P>
__device__ __forceinline__ float4 row_max(float4 a, float4 e, int lane) {
    float c[12];  // c[4 + i]: column 4g + i
    c[4] = a.x; c[5] = a.y; c[6] = a.z; c[7] = a.w;
    #pragma unroll
    for (int i = 4 - P; i < 4; ++i) {
        const float t = __shfl_up_sync(0xffffffffu, comp(a, i), 1);
        c[i] = lane == 0 ? comp(e, i) : t;
    }
    #pragma unroll
    for (int i = 0; i < K - 1 - P; ++i) {
        const float t = __shfl_down_sync(0xffffffffu, comp(a, i), 1);
        c[8 + i] = lane == 31 ? comp(e, i) : t;
    }
    float r[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        float m = c[4 + j - P];
        #pragma unroll
        for (int i = 1; i < K; ++i) m = mx(m, c[4 + j - P + i]);
        r[j] = m;
    }
    return make_float4(r[0], r[1], r[2], r[3]);
}

template <int K, int P>
__device__ __forceinline__ void maxpool2d_s1_body(const float4* __restrict__ x, float* __restrict__ y,
        int H, int W4, int Hout, int Wout, int strips, int chunks, int RH, float4* tr) {
    const int lane = threadIdx.x & 31;
    int b = blockIdx.x;
    const int strip = b % strips;
    b /= strips;
    const int chunk = b % chunks;
    const long long plane = b / chunks;
    const int g = strip * NS + (int)threadIdx.x;
    const int hg = lane == 0 ? g - 1 : g + 1;
    const bool own = g < W4;
    const bool halo = (lane == 0 || lane == 31) && hg >= 0 && hg < W4;
    const float4* xp = x + plane * H * W4;
    float* yp = y + plane * Hout * Wout;
    const int oh0 = chunk * RH, oh1 = min(oh0 + RH, Hout);
    const int ir1 = oh1 - P + K - 1;  // input rows oh0 - P .. ir1 - 1 (outside 0 .. H - 1: -inf)
    const float4 neg = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    const int w0 = 4 * (g - lane);  // the warp's first output column
    float* trw = reinterpret_cast<float*>(tr + (threadIdx.x & ~31u));
    float4 h[K];
    #pragma unroll
    for (int k = 0; k < K; ++k) h[k] = neg;
    for (int ir0 = oh0 - P; ir0 < ir1; ir0 += UR) {
        float4 a[UR], e[UR];
        #pragma unroll
        for (int u = 0; u < UR; ++u) {
            const int ir = ir0 + u;
            const bool row = ir >= 0 && ir < H && ir < ir1;
            a[u] = row && own ? __ldg(xp + (long long)ir * W4 + g) : neg;
            e[u] = row && halo ? __ldg(xp + (long long)ir * W4 + hg) : neg;
        }
        #pragma unroll
        for (int u = 0; u < UR; ++u) {
            const int ir = ir0 + u;
            if (ir >= ir1) break;
            #pragma unroll
            for (int k = 0; k + 1 < K; ++k) h[k] = h[k + 1];
            h[K - 1] = row_max<K, P>(a[u], e[u], lane);
            const int oh = ir + P - K + 1;
            if (oh >= oh0) {
                float4 m = h[0];
                #pragma unroll
                for (int k = 1; k < K; ++k) m = mx4(m, h[k]);
                reinterpret_cast<float4*>(trw)[lane] = m;
                __syncwarp();
                float* yr = yp + (long long)oh * Wout + w0;
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int c = 32 * j + lane;
                    if (w0 + c < Wout) __stcs(yr + c, trw[c]);
                }
                __syncwarp();
            }
        }
    }
}

// K in 2..5, P <= K / 2 (the pair (K, P) picks the instance; host code checks both)
extern "C" __global__ void __launch_bounds__(NS) maxpool2d_s1(const float4* __restrict__ x, float* __restrict__ y,
        int H, int W4, int Hout, int Wout, int strips, int chunks, int RH, int k, int p) {
    __shared__ float4 tr[NS];  // a warp's output row on its way out
    switch (k * 4 + p) {
        case 8: maxpool2d_s1_body<2, 0>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 9: maxpool2d_s1_body<2, 1>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 12: maxpool2d_s1_body<3, 0>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 13: maxpool2d_s1_body<3, 1>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 16: maxpool2d_s1_body<4, 0>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 17: maxpool2d_s1_body<4, 1>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 18: maxpool2d_s1_body<4, 2>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 20: maxpool2d_s1_body<5, 0>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 21: maxpool2d_s1_body<5, 1>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
        case 22: maxpool2d_s1_body<5, 2>(x, y, H, W4, Hout, Wout, strips, chunks, RH, tr); break;
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
NS = 128  # threads of a stride-1 block: a strip of 4 NS output columns
ROWS_IN = 16  # input rows of a stride-1 block (a multiple of its UR): ROWS_IN - k + 1 output rows


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
    if planes and s == 1 and d == 1 and k >= 2 and k <= 5 and W % 4 == 0:
        strips = ((Wout + 3) // 4 + NS - 1) // NS  # Wout is W + 1 where 2 p == k
        rh = ROWS_IN - k + 1
        chunks = (Hout + rh - 1) // rh
        lib.maxpool2d_s1(xc, y, H, W // 4, Hout, Wout, strips, chunks, rh, k, p,
                         grid=(planes * chunks * strips,), block=(NS,))
    elif planes:
        tiles_h, tiles_w = (Hout + TH - 1) // TH, (Wout + TW - 1) // TW
        span_h = (TH - 1) * s + (k - 1) * d + 1
        floats = span_h * ((TW - 1) * s + (k - 1) * d + 1) + span_h * TW  # staged input, then row maxima
        lib.maxpool2d(xc, y, H, W, Hout, Wout, tiles_h, tiles_w, k, s, p, d,
                      grid=(planes * tiles_h * tiles_w,), block=(256,), shared_mem=floats * 4)
    return y
'''

STAGED = "with the tile's input window staged in shared memory; input and\noutput cross DRAM once"
FILES = {
    "L1_41_Max_Pooling_1D": ("MaxPool1d", STAGED, POOL1D, POOL1D_HOST + MAXPOOL1D_FORWARD),
    "L1_44_Average_Pooling_1D": ("AvgPool1d", STAGED, POOL1D, POOL1D_HOST + AVGPOOL1D_FORWARD),
    "L1_42_Max_Pooling_2D": ("MaxPool2d", "walking down strips of the plane (stride 1), else with tiles staged\n"
                             "in shared memory; input and output cross DRAM once", POOL2D, MAXPOOL2D_HOST),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (what, how, source, host) in FILES.items():
        doc = (f'"""{name[3:]}: {what} {how}. Integer pooling parameters only (a tuple fails and eager runs).\n'
               'Generated by benchmarks/candidates/gen_cuda_pools.py."""\n')
        (OUT / f"{name}.py").write_text(f'{doc}SOURCE = r"""{source}"""\nSHAPE_GENERIC = True\n{host}')
    print(f"wrote {len(FILES)} candidates to {OUT}")


if __name__ == "__main__":
    main()
