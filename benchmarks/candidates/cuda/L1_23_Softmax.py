"""Softmax over very long rows: eager runs one block per row; here each row is split into chunks.
Stage 1: per chunk, its max and the sum of exp(x - chunk max). Stage 2: each chunk combines its row's
partials (every block the same way) and writes exp(x - max) / sum. 2 reads + 1 write on every SM.
Rows of 64K to 464K floats (sm_90): one read and one write, through clusters of 8 blocks that take
rows one after another (sm_cluster), each block's slice of a row held in shared memory, the next row
loaded while this one is written.

H100, rows of 393,216 floats, batch 256 (bandwidth runs 16-17, docs/cuda/h100_bandwidth_run1[67].json,
against a 3000-3007 GB/s copy): one cluster a row, loading then writing 337-339 us (79%); persistent
clusters, each row loaded only after the last one was written, 346 us (77%), and with the next row's
slice prefetched into L2 (cp.async.bulk.prefetch.L2) while writing 382 us (70%); persistent with the
next row loaded while this one is written: 352 us (76%) with 2 float4 loads a thread in flight,
334 us (80%) with 4, 321 us (84%) with 6, the kernel here."""
SOURCE = r"""
#include <cmath>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void __launch_bounds__(256) sm_partial(const float* __restrict__ x, float* __restrict__ part,
                                                            long long D, int chunk) {
    __shared__ float sh[8];
    __shared__ float mx;
    const long long row = blockIdx.y;
    const long long start = (long long)blockIdx.x * chunk, stop = min(start + chunk, D);
    const float* xr = x + row * D;
    float m = -INFINITY;
    for (long long i = start + threadIdx.x; i < stop; i += blockDim.x) m = fmaxf(m, xr[i]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) { float t = sh[0]; for (int w = 1; w < (int)(blockDim.x >> 5); ++w) t = fmaxf(t, sh[w]); mx = t; }
    __syncthreads();
    m = mx;
    float s = 0.0f;
    for (long long i = start + threadIdx.x; i < stop; i += blockDim.x) s += expf(xr[i] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh[w];
        part[(row * gridDim.x + blockIdx.x) * 2] = m;
        part[(row * gridDim.x + blockIdx.x) * 2 + 1] = t;
    }
}

extern "C" __global__ void __launch_bounds__(256) sm_apply(const float* __restrict__ x, const float* __restrict__ part,
        float* __restrict__ y, long long D, int chunk, int log_out) {
    __shared__ float stat[2];
    const long long row = blockIdx.y;
    if (threadIdx.x == 0) {
        float M = -INFINITY;
        for (int k = 0; k < (int)gridDim.x; ++k) M = fmaxf(M, part[(row * gridDim.x + k) * 2]);
        float S = 0.0f;
        for (int k = 0; k < (int)gridDim.x; ++k) S += part[(row * gridDim.x + k) * 2 + 1] * expf(part[(row * gridDim.x + k) * 2] - M);
        stat[0] = M;
        stat[1] = S;
    }
    __syncthreads();
    const float M = stat[0], S = stat[1], lS = logf(S);
    const long long start = (long long)blockIdx.x * chunk, stop = min(start + chunk, D);
    for (long long i = start + threadIdx.x; i < stop; i += blockDim.x) {
        const float v = x[row * D + i] - M;
        y[row * D + i] = log_out ? v - lS : expf(v) / S;
    }
}

// Long rows (sm_90): a cluster of 8 blocks owns one row; each block keeps its eighth in shared memory,
// the row's max and sum are combined over distributed shared memory. x is read from DRAM once.
// every thread gets the block's reduction (max if is_max, else sum) of v
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
    return v;
}

// a sum of exp(x - m) re-expressed as a sum of exp(x - M), M >= m; a NaN sum stays NaN
__device__ __forceinline__ float rescaled(float s, float m, float M) {
    return m == -INFINITY ? (s != s ? s : 0.0f) : s * expf(m - M);
}

#ifndef SM_UNROLL
#define SM_UNROLL 6  // float4 loads a thread has in flight
#endif

// the thread's running max m and sum s of exp(x - m), updated with v (NaN as eager: a NaN row)
__device__ __forceinline__ void online_update(float4 v, float& m, float& s) {
    const float vm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
    if (vm > m) { s *= expf(m - vm); m = vm; }
    if (m != -INFINITY) s += (expf(v.x - m) + expf(v.y - m)) + (expf(v.z - m) + expf(v.w - m));
    else if (v.x != v.x || v.y != v.y || v.z != v.z || v.w != v.w) s = NAN;
}

// Persistent: each cluster takes rows from *next_row until none is left (a cluster that starts late
// takes fewer, so the grid may exceed what the device holds at once). A row's output is written
// while the cluster's next row is loaded into the same shared memory, element by element (thread t
// owns elements t, t + blockDim.x, ...), so every SM reads and writes DRAM at once and the only gap
// a row is its reduction. block_max/block_sum/row_of are double-buffered by row parity, so one
// cluster barrier a row suffices.
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(1024)
sm_cluster(const float4* __restrict__ x, float4* __restrict__ y, int* __restrict__ next_row, int rows,
           long long D4, int slice4, int log_out) {
    extern __shared__ float4 buf[];
    __shared__ float scratch[32];
    __shared__ float block_max[2], block_sum[2];
    __shared__ int row_of[2];
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    const int B = (int)blockDim.x, t = (int)threadIdx.x;
    const long long start = (long long)rank * slice4;
    const int n = (int)max(0LL, min((long long)slice4, D4 - start));
    const float4 ninf = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    if (rank == 0 && t == 0) row_of[0] = atomicAdd(next_row, 1);
    cluster.sync();
    int row = *cluster.map_shared_rank(&row_of[0], 0);
    float m = -INFINITY, s = 0.0f;
    if (row < rows) {
        const float4* xr = x + row * D4 + start;
        for (int base = 0; base < n; base += SM_UNROLL * B) {
            float4 v[SM_UNROLL];
            #pragma unroll
            for (int k = 0; k < SM_UNROLL; ++k) {
                const int i = base + k * B + t;
                v[k] = i < n ? __ldcs(xr + i) : ninf;
            }
            #pragma unroll
            for (int k = 0; k < SM_UNROLL; ++k) {
                const int i = base + k * B + t;
                if (i < n) buf[i] = v[k];
                online_update(v[k], m, s);
            }
        }
    }
    for (int it = 0; row < rows; ++it) {
        const int slot = it & 1;
        if (rank == 0 && t == 0) row_of[slot ^ 1] = atomicAdd(next_row, 1);
        const float bm = block_reduce(m, true, scratch);
        s = rescaled(s, m, bm);
        s = block_reduce(s, false, scratch);
        if (t == 0) { block_max[slot] = bm; block_sum[slot] = s; }
        cluster.sync();
        float M = -INFINITY;
        for (unsigned r = 0; r < 8; ++r) M = fmaxf(M, *cluster.map_shared_rank(&block_max[slot], r));
        float S = 0.0f;
        for (unsigned r = 0; r < 8; ++r) {
            S += rescaled(*cluster.map_shared_rank(&block_sum[slot], r), *cluster.map_shared_rank(&block_max[slot], r), M);
        }
        const int next = *cluster.map_shared_rank(&row_of[slot ^ 1], 0);
        const bool more = next < rows;
        const float4* xn = x + (more ? next : row) * D4 + start;
        float4* yr = y + row * D4 + start;
        const float lS = logf(S), inv = 1.0f / S;
        m = -INFINITY;
        s = 0.0f;
        for (int base = 0; base < n; base += SM_UNROLL * B) {
            float4 v[SM_UNROLL];
            #pragma unroll
            for (int k = 0; k < SM_UNROLL; ++k) {
                const int i = base + k * B + t;
                v[k] = more && i < n ? __ldcs(xn + i) : ninf;
            }
            #pragma unroll
            for (int k = 0; k < SM_UNROLL; ++k) {
                const int i = base + k * B + t;
                if (i < n) {
                    const float4 u = buf[i];
                    float4 o;
                    if (log_out) {
                        o.x = (u.x - M) - lS; o.y = (u.y - M) - lS; o.z = (u.z - M) - lS; o.w = (u.w - M) - lS;
                    } else {
                        o.x = expf(u.x - M) * inv; o.y = expf(u.y - M) * inv; o.z = expf(u.z - M) * inv; o.w = expf(u.w - M) * inv;
                    }
                    __stcs(yr + i, o);
                    buf[i] = v[k];
                }
                online_update(v[k], m, s);
            }
        }
        row = next;
    }
    cluster.sync();  // no block may exit while another still reads its shared memory
}
"""
SHAPE_GENERIC = True
CHUNK = 16384
CLUSTER = 8
MAX_CLUSTERS = 16  # an H100 holds 16 clusters of 8 at one block an SM; more only start as others finish
SMEM_LIMIT = 232192  # 227 KiB opt-in shared memory per block on sm_90, less the kernel's static arrays


def forward(module, x):
    xc = x.contiguous()
    assert xc.dim() == 2
    rows, D = xc.shape[0], xc.shape[1]
    y = torch.empty_like(xc)
    slice4 = (D // 4 + CLUSTER - 1) // CLUSTER
    if D % 4 == 0 and D >= 65536 and slice4 * 16 <= SMEM_LIMIT:
        next_row = torch.zeros(1, dtype=torch.int32, device=xc.device)
        lib.sm_cluster(xc, y, next_row, rows, D // 4, slice4, 0, grid=(min(rows, MAX_CLUSTERS) * CLUSTER,), block=(1024,),
                       shared_mem=slice4 * 16)
        return y
    chunks = (D + CHUNK - 1) // CHUNK
    part = torch.empty(rows * chunks * 2, dtype=torch.float32, device=xc.device)
    lib.sm_partial(xc, part, D, CHUNK, grid=(chunks, rows), block=(256,))
    lib.sm_apply(xc, part, y, D, CHUNK, 0, grid=(chunks, rows), block=(256,))
    return y
