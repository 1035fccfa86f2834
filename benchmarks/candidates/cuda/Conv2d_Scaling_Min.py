"""Conv2d_Scaling_Min: conv2d through cuDNN, channels-last (its NHWC kernels beat the NCHW ones eager gets:
docs/cuda/h100_conv_layout_run1.txt); then one kernel reads the conv output once and writes min over
channels of (y * scale), a warp per pixel reading its channels contiguously. Eager writes the scaled tensor
(a full read and write of the conv output) before its min reduction reads it again and writes values and
int64 indices. NCHW kernels remain for a conv output cuDNN returns in NCHW."""
SOURCE = r"""
#include <cmath>
// torch.min(dim) propagates NaN: a NaN anywhere makes the result NaN
__device__ __forceinline__ float min_nan(float m, float v) { return (v < m || v != v) ? v : m; }

// y channels-last: P pixels x C4 float4 channels; one warp per pixel; out: P floats
extern "C" __global__ void __launch_bounds__(256) scale_min_nhwc(const float4* __restrict__ y, float* __restrict__ out,
        long long P, int C4, float s) {
    const int lane = threadIdx.x & 31;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long p = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; p < P; p += nwarps) {
        const float4* q = y + p * C4;
        float m = INFINITY;
        for (int c = lane; c < C4; c += 32) {
            const float4 v = q[c];
            m = min_nan(min_nan(min_nan(min_nan(m, v.x * s), v.y * s), v.z * s), v.w * s);
        }
        for (int o = 16; o > 0; o >>= 1) m = min_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) out[p] = m;
    }
}

// y: N x C x S, S % 4 == 0, seen as float4; out: N x S4 float4
extern "C" __global__ void __launch_bounds__(256) scale_min_v4(const float4* __restrict__ y, float4* __restrict__ out,
        int N, int C, int S4, float s) {
    const long long total = (long long)N * S4;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long n = i / S4;
        const float4* p = y + n * C * (long long)S4 + (i - n * S4);
        float4 m = p[0];
        m.x = m.x * s; m.y = m.y * s; m.z = m.z * s; m.w = m.w * s;
        for (int c = 1; c < C; ++c) {
            const float4 v = p[(long long)c * S4];
            m.x = min_nan(m.x, v.x * s); m.y = min_nan(m.y, v.y * s);
            m.z = min_nan(m.z, v.z * s); m.w = min_nan(m.w, v.w * s);
        }
        out[i] = m;
    }
}

extern "C" __global__ void __launch_bounds__(256) scale_min_v1(const float* __restrict__ y, float* __restrict__ out,
        int N, int C, int S, float s) {
    const long long total = (long long)N * S;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long n = i / S;
        const float* p = y + n * C * (long long)S + (i - n * S);
        float m = p[0] * s;
        for (int c = 1; c < C; ++c) m = min_nan(m, p[(long long)c * S] * s);
        out[i] = m;
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    fmt = torch.channels_last
    nhwc = x.shape[1] >= 16
    xin = x.contiguous(memory_format=fmt) if nhwc else x
    w = module.conv.weight.contiguous(memory_format=fmt) if nhwc else module.conv.weight
    y = F.conv2d(xin, w, module.conv.bias, module.conv.stride, module.conv.padding,
                 module.conv.dilation, module.conv.groups)
    N, C, H, W = y.shape
    S = H * W
    out = torch.empty((N, 1, H, W), dtype=y.dtype, device=y.device)
    s = float(module.scale_factor)
    if nhwc and C % 4 == 0 and C > 1 and y.is_contiguous(memory_format=fmt):
        warps = N * S
        lib.scale_min_nhwc(y.permute(0, 2, 3, 1), out, warps, C // 4, s,
                           grid=(max(1, min((warps + 7) // 8, 132 * 32)),), block=(256,))
        return out
    y = y.contiguous()
    if S % 4 == 0:
        total = N * (S // 4)
        lib.scale_min_v4(y, out, N, C, S // 4, s, grid=(max(1, min((total + 255) // 256, 132 * 16)),), block=(256,))
    else:
        total = N * S
        lib.scale_min_v1(y, out, N, C, S, s, grid=(max(1, min((total + 255) // 256, 132 * 16)),), block=(256,))
    return out
