"""TripletMarginLoss (p=2, mean): the three inputs read once.

A block per row sums (a - p + eps)^2 and (a - n + eps)^2 (per thread in float, across threads in
double, in a fixed order), takes the two distances and the row's hinge max(margin + d_ap - d_an, 0)
(NaN kept, as clamp_min keeps it); one block then averages the rows in a fixed order."""
SOURCE = r"""
#include <cmath>
#define NT 256
#define UNROLL 4

__device__ __forceinline__ void add_sq(float& s, float x, float y, float eps) {
    const float d = (x - y) + eps;
    s += d * d;
}

// the block's sum of v (double), in a fixed order; valid in thread 0
__device__ __forceinline__ double block_sum(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < NT / 32; ++w) t += sh[w];
    __syncthreads();
    return t;
}

extern "C" __global__ void __launch_bounds__(NT) triplet_rows(const float* __restrict__ a, const float* __restrict__ p,
        const float* __restrict__ n, float* __restrict__ loss, long long D, float margin, float eps, int vec) {
    __shared__ double sh[NT / 32];
    const long long row = blockIdx.x;
    const float* ar = a + row * D;
    const float* pr = p + row * D;
    const float* nr = n + row * D;
    float sp = 0.0f, sn = 0.0f;
    if (vec) {
        const long long D4 = D >> 2;
        const float4* a4 = reinterpret_cast<const float4*>(ar);
        const float4* p4 = reinterpret_cast<const float4*>(pr);
        const float4* n4 = reinterpret_cast<const float4*>(nr);
        for (long long base = 0; base < D4; base += UNROLL * NT) {
            float4 va[UNROLL], vp[UNROLL], vn[UNROLL];
            #pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const long long i = base + k * NT + threadIdx.x;
                if (i < D4) { va[k] = __ldcs(a4 + i); vp[k] = __ldcs(p4 + i); vn[k] = __ldcs(n4 + i); }
            }
            #pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                if (base + k * NT + threadIdx.x < D4) {
                    add_sq(sp, va[k].x, vp[k].x, eps); add_sq(sp, va[k].y, vp[k].y, eps);
                    add_sq(sp, va[k].z, vp[k].z, eps); add_sq(sp, va[k].w, vp[k].w, eps);
                    add_sq(sn, va[k].x, vn[k].x, eps); add_sq(sn, va[k].y, vn[k].y, eps);
                    add_sq(sn, va[k].z, vn[k].z, eps); add_sq(sn, va[k].w, vn[k].w, eps);
                }
            }
        }
    } else {
        for (long long i = threadIdx.x; i < D; i += NT) {
            const float x = ar[i];
            add_sq(sp, x, pr[i], eps);
            add_sq(sn, x, nr[i], eps);
        }
    }
    const double P = block_sum((double)sp, sh);
    const double N = block_sum((double)sn, sh);
    if (threadIdx.x == 0) {
        const float h = (margin + (float)sqrt(P)) - (float)sqrt(N);
        loss[row] = h != h ? h : fmaxf(h, 0.0f);
    }
}

// one block: the mean of `rows` losses, summed in double in a fixed order
extern "C" __global__ void __launch_bounds__(NT) mean_rows(const float* __restrict__ loss, float* __restrict__ out,
                                                          long long rows) {
    __shared__ double sh[NT / 32];
    double s = 0.0;
    for (long long i = threadIdx.x; i < rows; i += NT) s += (double)loss[i];
    const double t = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = (float)(t / (double)rows);
}
"""
SHAPE_GENERIC = True
NT = 256


def forward(module, anchor, positive, negative):
    assert module.loss_fn.p == 2 and not module.loss_fn.swap and module.loss_fn.reduction == "mean", \
        "p=2, no swap, mean reduction only"
    assert anchor.dtype == torch.float32 and anchor.dim() == 2, "float32 (batch, features) only"
    assert anchor.shape == positive.shape and anchor.shape == negative.shape, "no broadcasting"
    a = anchor.contiguous()
    p = positive.contiguous()
    n = negative.contiguous()
    rows, D = a.shape[0], a.shape[1]
    assert rows > 0, "empty batch"
    loss = torch.empty(rows, dtype=a.dtype, device=a.device)
    vec = D % 4 == 0 and a.storage_offset() % 4 == 0 and p.storage_offset() % 4 == 0 and n.storage_offset() % 4 == 0
    lib.triplet_rows(a, p, n, loss, D, float(module.loss_fn.margin), float(module.loss_fn.eps), int(vec),
                     grid=(rows,), block=(NT,))
    out = torch.empty((), dtype=a.dtype, device=a.device)
    lib.mean_rows(loss, out, rows, grid=(1,), block=(NT,))
    return out
