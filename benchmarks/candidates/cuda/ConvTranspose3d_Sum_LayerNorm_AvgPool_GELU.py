"""ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU: conv_transpose3d through cuDNN in channels-last-3d layout
(on an H100 at batch 8: 383 us against 596 us in NCDHW, the input's conversion 20 us); then + sum_weight,
LayerNorm over the last dimension (W = 64), 2x2x2 average pooling and GELU in one kernel reading that
layout: one block per pooled (n, d, h) reads its 2 x 2 planes of 64 (w) x 64 (c) values once, coalesced
along c, and writes only the pooled output, in the NCDHW layout eager returns. The sum and the LayerNorm
statistics are computed in double: eager rounds y + 1 to float, which on inputs of scale 1e-3 leaves rows of
nearly equal values whose spread the normalization magnifies, so a float32 kernel that rounds elsewhere fell
outside twice eager's error on a few of 33.5M elements."""
SOURCE = r"""
// y: (N, C=64, D, H, W=64) stored as (N, D, H, W, C); out: (N, 64, D/2, H/2, 32), contiguous.
// Thread t: channel c = t % 64, w-quarter q = t / 64 (input columns 16q .. 16q+15, output columns 8q .. 8q+7).
extern "C" __global__ void __launch_bounds__(256) sum_ln_pool_gelu_cl(const float* __restrict__ y,
        const float* __restrict__ sw, const float* __restrict__ g, const float* __restrict__ b,
        float* __restrict__ out, int D, int H, int Do, int Ho, float eps) {
    __shared__ double part[4][64];
    __shared__ float gs[64], bs[64];
    const int c = threadIdx.x & 63, q = threadIdx.x >> 6;
    const int oh = blockIdx.x % Ho;
    const int od = (blockIdx.x / Ho) % Do;
    const long long n = blockIdx.x / ((long long)Ho * Do);
    const double add = sw[0];
    if (threadIdx.x < 64) { gs[threadIdx.x] = g[threadIdx.x]; bs[threadIdx.x] = b[threadIdx.x]; }
    float acc[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
    for (int p = 0; p < 4; ++p) {
        const int d = 2 * od + (p >> 1), h = 2 * oh + (p & 1);
        const float* plane = y + ((n * D + d) * H + h) * 4096LL;
        double v[16];
        double s = 0.0;
        #pragma unroll
        for (int i = 0; i < 16; ++i) { v[i] = plane[(16 * q + i) * 64 + c] + add; s += v[i]; }
        part[q][c] = s;
        __syncthreads();
        const double mean = (part[0][c] + part[1][c] + part[2][c] + part[3][c]) / 64.0;
        __syncthreads();
        double ss = 0.0;
        #pragma unroll
        for (int i = 0; i < 16; ++i) { v[i] -= mean; ss += v[i] * v[i]; }
        part[q][c] = ss;
        __syncthreads();
        const float var = (float)((part[0][c] + part[1][c] + part[2][c] + part[3][c]) / 64.0);
        __syncthreads();
        const float rstd = rsqrtf(var + eps);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int w0 = 16 * q + 2 * i;
            acc[i] += (float)v[2 * i] * rstd * gs[w0] + bs[w0] + (float)v[2 * i + 1] * rstd * gs[w0 + 1] + bs[w0 + 1];
        }
    }
    float r[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float pv = acc[i] * 0.125f;
        r[i] = pv * 0.5f * (1.0f + erff(pv * 0.70710678118654752440f));
    }
    float4* o = reinterpret_cast<float4*>(out + (((n * 64 + c) * Do + od) * Ho + oh) * 32 + 8 * q);
    o[0] = make_float4(r[0], r[1], r[2], r[3]);
    o[1] = make_float4(r[4], r[5], r[6], r[7]);
}
"""


def forward(module, x):
    y = F.conv_transpose3d(x.contiguous(memory_format=torch.channels_last_3d),
                           module.conv_transpose.weight.contiguous(memory_format=torch.channels_last_3d),
                           module.conv_transpose.bias, module.conv_transpose.stride, module.conv_transpose.padding,
                           module.conv_transpose.output_padding, module.conv_transpose.groups,
                           module.conv_transpose.dilation)
    y = y.contiguous(memory_format=torch.channels_last_3d)  # a no-op where cuDNN kept the layout
    N, C, D, H, W = y.shape
    assert C == 64 and W == 64 and tuple(module.norm.normalized_shape) == (64,)
    assert tuple(module.avg_pool.kernel_size) == (2, 2, 2) and module.avg_pool.padding == 0
    assert D % 2 == 0 and H % 2 == 0
    Do, Ho = D // 2, H // 2
    out = torch.empty((N, C, Do, Ho, 32), dtype=y.dtype, device=y.device)
    ndhwc = y.permute(0, 2, 3, 4, 1)  # the layout's own order: a contiguous view
    lib.sum_ln_pool_gelu_cl(ndhwc, module.sum_weight, module.norm.weight, module.norm.bias, out, D, H, Do, Ho,
                            float(module.norm.eps), grid=(N * Do * Ho,), block=(256,))
    return out
