"""LayerNorm over a huge normalized shape (C, H, W): eager runs one block per row (a handful of
blocks for the whole GPU).

Rows of 2M floats or more (ln_persistent): one cooperative kernel, one block of 256 threads per
SM, DRAM traffic x + y per row. Block g owns the same slice of the N features in every row
(N/132 for the 132 SMs of an H100: 7,944 float4s, at most 32 a thread). The slice of the
current row lives in registers (32 float4s a thread, unrolled), the weight slice and the first
24 float4s a thread of the bias slice in shared memory (224 KB, loaded once), the rest of the bias
slice (8 float4s a thread) in registers too. Per row: each thread's sums of
x - K and (x - K)^2 in float (K = the row's first value; at most 128 values a thread), the block's
in double, go to a scratch buffer, the grid meets at a split barrier (arrive / wait), every block
adds all partials in the same order and writes y = (x - mean) * rstd * w + b for its slice, each
register refilled with the next row's value as soon as it is written. Between arrive and wait the
next row's first 12 float4s a thread are loaded, so DRAM stays busy across the one barrier a row,
and the rest of the next row's slice is prefetched into L2 by sm_90's bulk prefetch
(cp.async.bulk.prefetch.L2, the one kind of inline PTX kernels may hold), ahead of the refills.
x and y stream (evict-first). A slice longer than the registers (fewer SMs, e.g. 114 on an H100
PCIe, or longer rows) takes a two-read path in the same kernel.

Tried on the H100 and slower (2026-11-25): the next row copied into shared memory (cp.async) with
the bias read from L2 (486 us: L2 did not keep the bias), and x re-read from L2 in a second pass
(504 us: L2 did not keep the row); without its barrier (wrong output, timing only) the kernel of
then (bias rest read from L2 every row, 16 float4s loaded across the barrier) still took 260 us
against its 276 us.
Runs 22-24 (H100, batch 16, docs/cuda/h100_layernorm_variants_run2*.json): that kernel 276 us
(69% of the copy); the bias rest loaded with an L2 evict_last policy instead 276 us; the bias rest
in registers 251 us (8 float4s loaded across the barrier) and 249 us (12: the registers hold no
more, a few bytes spill). The next row's rest prefetched into L2 by sm_90's bulk prefetch
instruction (cp.async.bulk.prefetch.L2) ran 232 us (82%): the kernel here, since the source check
admits L2 prefetch PTX. Without inline PTX nothing came close: per-thread cp.async copies of one
16 bytes every 32, 64 or 128 bytes into scratch shared memory 250, 248, 251 us (249 without);
bulk copies of the rest into scratch shared memory 246-248 us (249 without in the same run, within
the run-to-run spread). With the PTX prefetch: prefetching two rows ahead 265 us, prefetching row
0 before the weights load 238 us against 232, 8 or 4 float4s across the barrier 245 and 281 us.
Bandwidth run 13 (those bulk copies): 247.3 us, 77% of a 3007 GB/s copy.

Shorter rows: partial sums (double) per chunk, then each chunk normalizes with its row's combined
statistics (2 reads + 1 write)."""
SOURCE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// Sums of d = x - K in double, K a value of the row (x[row][0]). Then M2 = Q - S^2 / n loses at most
// about 2^-53 * n relative: (K - mean)^2 <= M2 because K is one of the values. NaN and Inf reach the
// mean or the variance and make the whole row NaN, as in eager.
__device__ __forceinline__ void acc_add(double& s, double& q, const float4 v, double k) {
    const double d0 = (double)v.x - k, d1 = (double)v.y - k, d2 = (double)v.z - k, d3 = (double)v.w - k;
    s += (d0 + d1) + (d2 + d3);
    q = fma(d0, d0, fma(d1, d1, fma(d2, d2, fma(d3, d3, q))));
}

// The same in float, for one thread's at most 4 * NJ values of a row (the block adds the threads' sums in
// double): the double conversions were on the critical path between the barriers (287 -> 277 us on the H100).
__device__ __forceinline__ void acc_add(float& s, float& q, const float4 v, float k) {
    const float d0 = v.x - k, d1 = v.y - k, d2 = v.z - k, d3 = v.w - k;
    s += (d0 + d1) + (d2 + d3);
    q = fmaf(d0, d0, fmaf(d1, d1, fmaf(d2, d2, fmaf(d3, d3, q))));
}

// Every thread gets the block's sums, added in an order fixed by the thread layout (so every block
// that adds the same values gets the same bits). sh: blockDim.x / 32 + 1 entries.
__device__ __forceinline__ double2 block_sum(double s, double q, double2* sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_down_sync(0xffffffffu, s, o);
        q += __shfl_down_sync(0xffffffffu, q, o);
    }
    if (lane == 0) sh[w] = make_double2(s, q);
    __syncthreads();
    if (w == 0) {
        const double2 v = lane < (int)(blockDim.x >> 5) ? sh[lane] : make_double2(0.0, 0.0);
        s = v.x;
        q = v.y;
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_down_sync(0xffffffffu, s, o);
            q += __shfl_down_sync(0xffffffffu, q, o);
        }
        if (lane == 0) sh[blockDim.x >> 5] = make_double2(s, q);
    }
    __syncthreads();
    return sh[blockDim.x >> 5];
}

// mean and rstd of a row from the partials of its G blocks, added by every block in the same order.
__device__ __forceinline__ float2 row_stats(const double2* pr, int G, double inv_total, double k, float eps,
                                            double2* sh) {
    double ps = 0.0, pq = 0.0;
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        const double2 v = __ldcg(pr + g);
        ps += v.x;
        pq += v.y;
    }
    const double2 sum = block_sum(ps, pq, sh);
    const double dm = sum.x * inv_total;
    double var = (sum.y - sum.x * dm) * inv_total;
    if (var < 0.0) var = 0.0;  // rounding; a NaN stays NaN
    return make_float2((float)(k + dm), rsqrtf((float)var + eps));
}

__device__ __forceinline__ float4 affine(const float4 v, float mean, float rstd, const float4 g, const float4 h) {
    float4 o;
    o.x = (v.x - mean) * rstd * g.x + h.x;
    o.y = (v.y - mean) * rstd * g.y + h.y;
    o.z = (v.z - mean) * rstd * g.z + h.z;
    o.w = (v.w - mean) * rstd * g.w + h.w;
    return o;
}

#define LN_THREADS 256
#define NJ 32  // float4s of a row a thread holds in registers: 128 of the 255 registers a thread can have
#define NB 24  // float4s of the bias a thread holds in shared memory: (NJ + NB) * 16 B * 256 = 224 KB
#define NP 12  // float4s of the next row a thread loads before the barrier wait
#define PF_CHUNK 16384  // bytes of the next row's slice one thread has prefetched into L2

// The next row's float4s from .. n - 1 of a block's slice p come into L2 ahead of their loads: sm_90's
// bulk prefetch (the copy engine fetches, no thread waits), PF_CHUNK bytes for each of threads 0-63.
__device__ __forceinline__ void prefetch_slice(const float4* p, long long from, long long n, int t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const long long lo = from * 16 + (long long)t * PF_CHUNK;
    if (t < 64 && lo < n * 16) {
        const unsigned sz = (unsigned)min((long long)PF_CHUNK, n * 16 - lo);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"((const char*)p + lo), "r"(sz) : "memory");
    }
#endif
}

// Cooperative launch, one block per SM, blockDim.x == LN_THREADS, (NJ + NB) * LN_THREADS float4s of
// dynamic shared memory; part: 2 * maxg double2; blocks from maxg on own no slice.
extern "C" __global__ void __launch_bounds__(LN_THREADS, 1)
ln_persistent(const float4* __restrict__ x, const float4* __restrict__ w, const float4* __restrict__ b,
              float4* __restrict__ y, double2* __restrict__ part, int rows, long long N4, int maxg, float eps) {
    extern __shared__ float4 smem[];  // weight float4 j of thread t: smem[j * B + t]; bias: smem[(NJ + j) * B + t]
    __shared__ double2 sh[LN_THREADS / 32 + 1];
    constexpr int B = LN_THREADS;
    cg::grid_group grid = cg::this_grid();
    const int t = threadIdx.x;
    const int G = min((int)gridDim.x, maxg);
    const long long slice = ((N4 + G - 1) / G + 7) / 8 * 8;  // float4s per block; slices start 128-byte aligned
    const long long start = (long long)blockIdx.x * slice;
    const long long n = (int)blockIdx.x < G ? max(0LL, min(slice, N4 - start)) : 0LL;
    const int cnt = t < n ? (int)((n - 1 - t) / B + 1) : 0;  // this thread's float4s: j = 0 .. cnt - 1
    const float4* const wt = w + start + t;                  // float4 j of the slice: wt[j * B]
    const float4* const bt = b + start + t;
    const double inv_total = 1.0 / (4.0 * (double)N4);
    const bool owner = t == 0 && (int)blockIdx.x < G;

    if (slice > (long long)NJ * B) {  // same for every block: x read twice, w and b from L2 / DRAM
        for (int r = 0; r < rows; ++r) {
            const float4* const xr = x + (long long)r * N4 + start + t;
            float4* const yr = y + (long long)r * N4 + start + t;
            const double k = (double)__ldg((const float*)(x + (long long)r * N4));
            double s = 0.0, q = 0.0;
            for (long long i = t; i < n; i += B) acc_add(s, q, xr[i - t], k);
            const double2 sum = block_sum(s, q, sh);
            if (owner) __stcg(part + (r & 1) * maxg + blockIdx.x, sum);
            grid.sync();
            const float2 st = row_stats(part + (r & 1) * maxg, G, inv_total, k, eps, sh);
            for (long long i = t; i < n; i += B)
                __stcs(yr + (i - t), affine(__ldcs(xr + (i - t)), st.x, st.y, wt[i - t], bt[i - t]));
        }
        return;
    }

#pragma unroll 8
    for (int j = 0; j < cnt; ++j) {
        smem[j * B + t] = wt[j * B];
        if (j < NB) smem[(NJ + j) * B + t] = bt[j * B];
    }
    float4 br[NJ - NB];  // the rest of the bias slice
#pragma unroll
    for (int j = NB; j < NJ; ++j)
        if (j < cnt) br[j - NB] = bt[j * B];
    __syncthreads();  // keeps the compiler from holding the copy's loads and xv at once
    float4 xv[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
        if (j < cnt) xv[j] = __ldcs(x + start + t + j * B);
    float k = __ldg((const float*)x);  // the shift of row 0
    float s = 0.0f, q = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
        if (j < cnt) acc_add(s, q, xv[j], k);
    double2 sum = block_sum(s, q, sh);
    if (owner) __stcg(part + blockIdx.x, sum);
    cg::grid_group::arrival_token token = grid.barrier_arrive();

    for (int r = 0; r < rows; ++r) {
        const bool next = r + 1 < rows;
        const float4* const xn = x + (long long)(r + 1) * N4 + start + t;  // float4 j of the next row: xn[j * B]
        float4* const yr = y + (long long)r * N4 + start + t;
        // in flight across the barrier: the next row's shift and its first NP float4s
        float kn = 0.0f;
        float4 nx[NP];
        if (next) {
            prefetch_slice(x + (long long)(r + 1) * N4 + start, NP * B, n, t);
            kn = __ldg((const float*)(x + (long long)(r + 1) * N4));
#pragma unroll
            for (int u = 0; u < NP; ++u)
                if (u < cnt) nx[u] = __ldcs(xn + u * B);
        }
        grid.barrier_wait(static_cast<cg::grid_group::arrival_token&&>(token));
        const float2 st = row_stats(part + (r & 1) * maxg, G, inv_total, k, eps, sh);
        // write float4 j of this row, then its register takes float4 j of the next row (the first NP,
        // already loaded, count at once)
        s = 0.0;
        q = 0.0;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            if (j < cnt) {
                const float4 h = j < NB ? smem[(NJ + j) * B + t] : br[j < NB ? 0 : j - NB];
                __stcs(yr + j * B, affine(xv[j], st.x, st.y, smem[j * B + t], h));
                if (next) {
                    xv[j] = j < NP ? nx[j] : __ldcs(xn + j * B);
                    if (j < NP) acc_add(s, q, xv[j], kn);
                }
            }
        }
        if (!next) break;
        k = kn;
#pragma unroll
        for (int j = NP; j < NJ; ++j)
            if (j < cnt) acc_add(s, q, xv[j], k);
        sum = block_sum(s, q, sh);
        if (owner) __stcg(part + ((r + 1) & 1) * maxg + blockIdx.x, sum);
        token = grid.barrier_arrive();
    }
}

extern "C" __global__ void __launch_bounds__(256) ln_partial(const float4* __restrict__ x, double* __restrict__ part,
                                                            long long L4, int chunk4) {
    __shared__ double sh[2][8];
    const long long row = blockIdx.y;
    const long long start = (long long)blockIdx.x * chunk4, stop = min(start + chunk4, L4);
    double s = 0.0, q = 0.0;
    for (long long i = start + threadIdx.x; i < stop; i += blockDim.x) {
        const float4 v = x[row * L4 + i];
        s += (double)v.x + (double)v.y + (double)v.z + (double)v.w;
        q += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
    for (int o = 16; o > 0; o >>= 1) { s += __shfl_xor_sync(0xffffffffu, s, o); q += __shfl_xor_sync(0xffffffffu, q, o); }
    if ((threadIdx.x & 31) == 0) { sh[0][threadIdx.x >> 5] = s; sh[1][threadIdx.x >> 5] = q; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double ts = 0.0, tq = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) { ts += sh[0][w]; tq += sh[1][w]; }
        part[(row * gridDim.x + blockIdx.x) * 2] = ts;
        part[(row * gridDim.x + blockIdx.x) * 2 + 1] = tq;
    }
}

extern "C" __global__ void __launch_bounds__(256) ln_apply(const float4* __restrict__ x, const double* __restrict__ part,
        const float4* __restrict__ w, const float4* __restrict__ b, float4* __restrict__ y, long long L4, int chunk4,
        float eps) {
    __shared__ float stat[2];
    const long long row = blockIdx.y;
    if (threadIdx.x == 0) {
        double s = 0.0, q = 0.0;
        for (int k = 0; k < (int)gridDim.x; ++k) { s += part[(row * gridDim.x + k) * 2]; q += part[(row * gridDim.x + k) * 2 + 1]; }
        const double n = 4.0 * (double)L4;
        const double mean = s / n;
        stat[0] = (float)mean;
        stat[1] = rsqrtf(fmaxf((float)(q / n - mean * mean), 0.0f) + eps);
    }
    __syncthreads();
    const float m = stat[0], r = stat[1];
    const long long start = (long long)blockIdx.x * chunk4, stop = min(start + chunk4, L4);
    for (long long i = start + threadIdx.x; i < stop; i += blockDim.x) {
        const float4 v = x[row * L4 + i], g = w[i], h = b[i];
        float4 o;
        o.x = (v.x - m) * r * g.x + h.x; o.y = (v.y - m) * r * g.y + h.y;
        o.z = (v.z - m) * r * g.z + h.z; o.w = (v.w - m) * r * g.w + h.w;
        y[row * L4 + i] = o;
    }
}
"""
SHAPE_GENERIC = True
CHUNK4 = 4096
THREADS = 256  # LN_THREADS
SMEM = 229376  # (NJ + NB) * LN_THREADS float4s = (32 + 24) * 256 * 16 B: 224 KB of sm_90's 227 KB opt-in per block
MAXG = 1024  # blocks that own a slice (one per SM: more than any GPU has)
PERSISTENT_MIN = 2097152  # shorter rows: the barrier per row costs more than the second read saves


def forward(module, x):
    xc = x.contiguous()
    L = module.ln.weight.numel()
    rows = xc.numel() // L
    assert L % 4 == 0 and module.ln.bias is not None
    L4 = L // 4
    y = torch.empty_like(xc)
    if rows == 0:
        return y
    if L >= PERSISTENT_MIN:
        part = torch.empty(2 * MAXG * 2, dtype=torch.float64, device=xc.device)
        lib.ln_persistent(xc, module.ln.weight, module.ln.bias, y, part, rows, L4, MAXG, float(module.ln.eps),
                          block=(THREADS,), shared_mem=SMEM, cooperative=True)
        return y
    chunks = (L4 + CHUNK4 - 1) // CHUNK4
    part = torch.empty(rows * chunks * 2, dtype=torch.float64, device=xc.device)
    lib.ln_partial(xc, part, L4, CHUNK4, grid=(chunks, rows), block=(256,))
    lib.ln_apply(xc, part, module.ln.weight, module.ln.bias, y, L4, CHUNK4, float(module.ln.eps), grid=(chunks, rows),
                 block=(256,))
    return y
