"""L3_8_ResNetBasicBlock: out = relu(bn2(conv2(relu(bn1(conv1(x))))) + bnd(convd(x))), BatchNorms in eval mode.

The three convolutions stay PyTorch's: F.conv2d with the module's own weights and exactly the arguments
nn.Conv2d passes (same input tensor, same contiguous NCHW layout, no bias), so cuDNN picks the same
algorithm with the same TF32 setting as eager and returns eager's bits. torch.compile failed the proof on
this problem because inductor's convolutions differ from eager's by up to about 1e-3 relative; here only
the elementwise work between the convolutions is replaced, by two fused passes:
  bn_relu:     y1  = relu(bn1(c1))             eager: batch_norm + relu, 2 passes over the 64-channel tensor
  bn_add_relu: out = relu(bn2(c2) + bnd(cd))   eager: 2 batch_norms + add + relu, 4 passes
(DRAM traffic between the convolutions about 5 tensor sizes instead of 13).

BatchNorm with running statistics as fmaf(w * (x - mean), rsqrtf(var + eps), b): on an H100 (torch 2.11,
cuDNN 9.19) that gave eager's eval batch-norm bits on all of 9.6M random values, where 1 / sqrtf or
((x - mean) * invstd) * w + b differed by 1-4 ulp in 17-58% of them (see L3_14_DenseNet121DenseBlock.py). relu keeps NaN (eager's clamp_min propagates it); Inf follows the same
arithmetic as eager's separate passes.

Grid: blockIdx.y walks the planes (n, c) (per-channel parameters read once per block), blockIdx.x the
chunks of a plane; a thread moves UNROLL float4s of a plane (its loads all in flight at once). A plane
length H*W not divisible by 4 takes the scalar kernels; anything else (other dtypes, channels-last or
empty tensors, planes of 2^30 elements or more) runs the same F.* calls as eager's modules.

The downsample's conv and BatchNorm are children "0" and "1" of an nn.Sequential, read as
module.downsample[0] / module.downsample[1]: this needs host code to index numbered children
(ModuleView.__getitem__ and the sandbox check admitting module.<name>[<int>].<attr> chains)."""
SOURCE = r"""
#define THREADS 256
#define UNROLL 4

__device__ __forceinline__ float relu_nan(float v) { return v != v ? v : fmaxf(v, 0.0f); }

// BatchNorm of one value with running statistics, in aten's order of operations.
__device__ __forceinline__ float bn_eval(float v, float mean, float invstd, float w, float b) {
    return fmaf(w * (v - mean), invstd, b);  // as eager's: gamma * (x - mean) * invstd + beta, one rounding less
}

struct BnParams {
    float mean, invstd, w, b;
};

__device__ __forceinline__ BnParams bn_params(const float* __restrict__ rm, const float* __restrict__ rv,
                                              const float* __restrict__ w, const float* __restrict__ b, int c,
                                              float eps) {
    BnParams p;
    p.mean = rm[c];
    p.invstd = rsqrtf(rv[c] + eps);
    p.w = w[c];
    p.b = b[c];
    return p;
}

__device__ __forceinline__ float bn1(float v, const BnParams& p) { return bn_eval(v, p.mean, p.invstd, p.w, p.b); }

__device__ __forceinline__ float4 bn_relu4(float4 v, const BnParams& p) {
    float4 o;
    o.x = relu_nan(bn1(v.x, p));
    o.y = relu_nan(bn1(v.y, p));
    o.z = relu_nan(bn1(v.z, p));
    o.w = relu_nan(bn1(v.w, p));
    return o;
}

// the sum rounded on its own, as eager's in-place add of the two BatchNorm outputs
__device__ __forceinline__ float bn_add_relu1(float a, float d, const BnParams& p, const BnParams& q) {
    return relu_nan(__fadd_rn(bn1(a, p), bn1(d, q)));
}

__device__ __forceinline__ float4 bn_add_relu4(float4 a, float4 d, const BnParams& p, const BnParams& q) {
    float4 o;
    o.x = bn_add_relu1(a.x, d.x, p, q);
    o.y = bn_add_relu1(a.y, d.y, p, q);
    o.z = bn_add_relu1(a.z, d.z, p, q);
    o.w = bn_add_relu1(a.w, d.w, p, q);
    return o;
}

// x, y: P planes of L4 float4s (NCHW contiguous, H*W % 4 == 0); plane p has channel p % C.
// grid.x * THREADS * UNROLL >= L4; grid.y <= P (planes walked with stride gridDim.y).
extern "C" __global__ void __launch_bounds__(THREADS) bn_relu_v4(const float* __restrict__ x, float* __restrict__ y,
        const float* __restrict__ rm, const float* __restrict__ rv, const float* __restrict__ w,
        const float* __restrict__ b, float eps, int P, int L4, int C) {
    const int j0 = blockIdx.x * (THREADS * UNROLL) + threadIdx.x;
    for (int p = blockIdx.y; p < P; p += gridDim.y) {
        const BnParams prm = bn_params(rm, rv, w, b, p % C, eps);
        const float4* xv = reinterpret_cast<const float4*>(x) + (long long)p * L4;
        float4* yv = reinterpret_cast<float4*>(y) + (long long)p * L4;
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * THREADS;
            if (j < L4) v[u] = xv[j];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * THREADS;
            if (j < L4) yv[j] = bn_relu4(v[u], prm);
        }
    }
}

// out = relu(bn2(a) + bnd(d)); a, d, out: P planes of L4 float4s.
extern "C" __global__ void __launch_bounds__(THREADS) bn_add_relu_v4(const float* __restrict__ a,
        const float* __restrict__ d, float* __restrict__ out,
        const float* __restrict__ rm2, const float* __restrict__ rv2, const float* __restrict__ w2,
        const float* __restrict__ b2, float eps2,
        const float* __restrict__ rmd, const float* __restrict__ rvd, const float* __restrict__ wd,
        const float* __restrict__ bd, float epsd, int P, int L4, int C) {
    const int j0 = blockIdx.x * (THREADS * UNROLL) + threadIdx.x;
    for (int p = blockIdx.y; p < P; p += gridDim.y) {
        const int c = p % C;
        const BnParams p2 = bn_params(rm2, rv2, w2, b2, c, eps2);
        const BnParams pd = bn_params(rmd, rvd, wd, bd, c, epsd);
        const long long base = (long long)p * L4;
        const float4* av = reinterpret_cast<const float4*>(a) + base;
        const float4* dv = reinterpret_cast<const float4*>(d) + base;
        float4* ov = reinterpret_cast<float4*>(out) + base;
        float4 va[UNROLL], vd[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * THREADS;
            if (j < L4) {
                va[u] = av[j];
                vd[u] = dv[j];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * THREADS;
            if (j < L4) ov[j] = bn_add_relu4(va[u], vd[u], p2, pd);
        }
    }
}

// Scalar versions for any plane length L: grid.x * THREADS * UNROLL >= L.
extern "C" __global__ void __launch_bounds__(THREADS) bn_relu_v1(const float* __restrict__ x, float* __restrict__ y,
        const float* __restrict__ rm, const float* __restrict__ rv, const float* __restrict__ w,
        const float* __restrict__ b, float eps, int P, int L, int C) {
    const int j0 = blockIdx.x * (THREADS * UNROLL) + threadIdx.x;
    for (int p = blockIdx.y; p < P; p += gridDim.y) {
        const BnParams prm = bn_params(rm, rv, w, b, p % C, eps);
        const long long base = (long long)p * L;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * THREADS;
            if (j < L) y[base + j] = relu_nan(bn1(x[base + j], prm));
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) bn_add_relu_v1(const float* __restrict__ a,
        const float* __restrict__ d, float* __restrict__ out,
        const float* __restrict__ rm2, const float* __restrict__ rv2, const float* __restrict__ w2,
        const float* __restrict__ b2, float eps2,
        const float* __restrict__ rmd, const float* __restrict__ rvd, const float* __restrict__ wd,
        const float* __restrict__ bd, float epsd, int P, int L, int C) {
    const int j0 = blockIdx.x * (THREADS * UNROLL) + threadIdx.x;
    for (int p = blockIdx.y; p < P; p += gridDim.y) {
        const int c = p % C;
        const BnParams p2 = bn_params(rm2, rv2, w2, b2, c, eps2);
        const BnParams pd = bn_params(rmd, rvd, wd, bd, c, epsd);
        const long long base = (long long)p * L;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * THREADS;
            if (j < L) out[base + j] = bn_add_relu1(a[base + j], d[base + j], p2, pd);
        }
    }
}
"""
SHAPE_GENERIC = True
THREADS = 256
UNROLL = 4
MAX_PLANE = 1073741824  # plane lengths up to 2^30 keep every int index of the kernels in range
MAX_GRID_Y = 65535


def fusable(t):
    """A float32 NCHW-contiguous 4-d tensor with elements, planes short enough for int indexing."""
    return t.dtype == torch.float32 and t.dim() == 4 and t.is_contiguous() and t.numel() > 0 \
        and t.shape[2] * t.shape[3] < MAX_PLANE


def launch_shape(t):
    """(P planes, plane length L, vectorized, grid) of an NCHW tensor for the kernels above."""
    P = t.shape[0] * t.shape[1]
    L = t.shape[2] * t.shape[3]
    vec = L % 4 == 0
    n = L // 4 if vec else L
    gx = (n + THREADS * UNROLL - 1) // (THREADS * UNROLL)
    return P, L, vec, (gx, min(P, MAX_GRID_Y))


def forward(module, x):
    # conv1 -> bn1 -> relu
    c1 = F.conv2d(x, module.conv1.weight, None, module.conv1.stride, module.conv1.padding, module.conv1.dilation,
                  module.conv1.groups)
    if fusable(c1):
        y1 = torch.empty_like(c1)
        P, L, vec, grid = launch_shape(c1)
        if vec:
            lib.bn_relu_v4(c1, y1, module.bn1.running_mean, module.bn1.running_var, module.bn1.weight,
                           module.bn1.bias, float(module.bn1.eps), P, L // 4, c1.shape[1], grid=grid, block=(THREADS,))
        else:
            lib.bn_relu_v1(c1, y1, module.bn1.running_mean, module.bn1.running_var, module.bn1.weight,
                           module.bn1.bias, float(module.bn1.eps), P, L, c1.shape[1], grid=grid, block=(THREADS,))
    else:
        y1 = F.relu(F.batch_norm(c1, module.bn1.running_mean, module.bn1.running_var, module.bn1.weight,
                                 module.bn1.bias, False, 0.0, module.bn1.eps))

    # conv2 and the downsample conv, then relu(bn2(c2) + bnd(cd))
    c2 = F.conv2d(y1, module.conv2.weight, None, module.conv2.stride, module.conv2.padding, module.conv2.dilation,
                  module.conv2.groups)
    cd = F.conv2d(x, module.downsample[0].weight, None, module.downsample[0].stride, module.downsample[0].padding,
                  module.downsample[0].dilation, module.downsample[0].groups)
    if fusable(c2) and fusable(cd) and c2.shape == cd.shape:
        out = torch.empty_like(c2)
        P, L, vec, grid = launch_shape(c2)
        if vec:
            lib.bn_add_relu_v4(c2, cd, out, module.bn2.running_mean, module.bn2.running_var, module.bn2.weight,
                               module.bn2.bias, float(module.bn2.eps), module.downsample[1].running_mean,
                               module.downsample[1].running_var, module.downsample[1].weight,
                               module.downsample[1].bias, float(module.downsample[1].eps), P, L // 4, c2.shape[1],
                               grid=grid, block=(THREADS,))
        else:
            lib.bn_add_relu_v1(c2, cd, out, module.bn2.running_mean, module.bn2.running_var, module.bn2.weight,
                               module.bn2.bias, float(module.bn2.eps), module.downsample[1].running_mean,
                               module.downsample[1].running_var, module.downsample[1].weight,
                               module.downsample[1].bias, float(module.downsample[1].eps), P, L, c2.shape[1],
                               grid=grid, block=(THREADS,))
        return out
    t = F.batch_norm(c2, module.bn2.running_mean, module.bn2.running_var, module.bn2.weight, module.bn2.bias, False,
                     0.0, module.bn2.eps)
    t.add_(F.batch_norm(cd, module.downsample[1].running_mean, module.downsample[1].running_var,
                        module.downsample[1].weight, module.downsample[1].bias, False, 0.0, module.downsample[1].eps))
    return F.relu(t)
