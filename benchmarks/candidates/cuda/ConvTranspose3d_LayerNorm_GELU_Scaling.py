"""ConvTranspose3d_LayerNorm_GELU_Scaling: conv_transpose3d through cuDNN (as eager); LayerNorm over
the last dimension, GELU and scaling fused: one warp per row, the row in registers (1 read, 1 write).
Mean and variance in double (as robust as eager's Welford for huge finite values)."""
SOURCE = r"""
#define MAXV 8
extern "C" __global__ void __launch_bounds__(256) ln_gelu_scale(const float* __restrict__ y, const float* __restrict__ w,
        const float* __restrict__ b, float* __restrict__ out, long long rows, int D, float eps, float s) {
    const int lane = threadIdx.x & 31;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = warp; r < rows; r += nwarps) {
        const float* src = y + r * D;
        float v[MAXV];
        double sum = 0.0;
#pragma unroll
        for (int k = 0; k < MAXV; ++k) { const int j = lane + 32 * k; v[k] = j < D ? src[j] : 0.0f; if (j < D) sum += v[k]; }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const double mean = sum / D;
        double q = 0.0;
#pragma unroll
        for (int k = 0; k < MAXV; ++k) { const int j = lane + 32 * k; if (j < D) { const double d = v[k] - mean; q += d * d; } }
        for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
        const float rstd = rsqrtf((float)(q / D) + eps);
        const float m = (float)mean;
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
            const int j = lane + 32 * k;
            if (j < D) {
                const float t = (v[k] - m) * rstd * w[j] + b[j];
                out[r * D + j] = t * 0.5f * (1.0f + erff(t * 0.70710678118654752440f)) * s;
            }
        }
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv_transpose3d(x, module.conv_transpose.weight, module.conv_transpose.bias, module.conv_transpose.stride,
                           module.conv_transpose.padding, module.conv_transpose.output_padding,
                           module.conv_transpose.groups, module.conv_transpose.dilation)
    D = y.shape[-1]
    assert tuple(module.layer_norm.normalized_shape) == (D,) and D <= 256
    rows = y.numel() // D
    out = torch.empty_like(y)
    lib.ln_gelu_scale(y, module.layer_norm.weight, module.layer_norm.bias, out, rows, D, float(module.layer_norm.eps),
                      float(module.scaling_factor), grid=(min((rows + 7) // 8, 132 * 64),), block=(256,))
    return out
