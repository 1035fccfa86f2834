"""Conv2d_Subtract_Tanh_Subtract_AvgPool: the conv through PyTorch (oneDNN), then one OpenMP pass that applies
(v - s1) -> tanh -> (- s2) and the average pool, writing only the pooled output (NCHW, as eager's).

The pass reads each conv value once (pool windows with stride == kernel do not overlap) and sums a window in
eager's order (rows, then columns, from 0) before dividing by kh * kw, as eager's avg_pool2d. tanh is
ma_vecmath's ma_tanhf (a few ulp, vectorized). LAYOUT picks the conv's memory format: channels-last (the
pass vectorizes over channels and transposes a row of pooled values into NCHW) or NCHW (the pass vectorizes
along a row). NCHW is kept: at the bench's shape (batch 4) the two were within noise of each other (the conv
is ~90% of the time, the pass ~8 ms of ~80 ms), and channels-last oneDNN's conv rounds differently from
eager's NCHW one, which failed the proof's large-input trial (2 of 2M elements, where nearly all outputs are
saturated and eager's own error is tiny); NCHW's conv is eager's own, bit for bit. A NaN or Inf in a pooled window of the conv output sets a flag and the call runs eager's own
ops instead (conv2d NCHW, sub, tanh, sub, avg_pool2d), so NaN/Inf positions are eager's even where another
conv algorithm would overflow or make a NaN elsewhere. Deterministic: no reductions across threads.
"""
SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <vector>
#include <omp.h>
#include "ma_vecmath.h"

static inline float chain(float v, float s1, float s2) { return ma_tanhf(v - s1) - s2; }

// y: the conv output channels-last, (N, H, W, C) contiguous; out: (N, C, OH, OW) contiguous. Window (kh, kw),
// stride (sh, sw), no padding. bad[0] = 1 where a value read is NaN or Inf.
extern "C" void sub_tanh_pool_cl(const float* __restrict y, float* __restrict out, int32_t* __restrict bad,
                                 int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh,
                                 int64_t kw, int64_t sh, int64_t sw, float s1, float s2) {
    int32_t nonfinite = 0;
    const float div = (float)(kh * kw);
    #pragma omp parallel reduction(|: nonfinite) if(N * OH * OW * C > 16384)
    {
        std::vector<float> accv((size_t)(OW * C));
        float* __restrict acc = accv.data();
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < N * OH; ++t) {
            const int64_t n = t / OH, oh = t % OH;
            float z = 0.0f;  // v - v summed: NaN iff some v is NaN or Inf
            for (int64_t ow = 0; ow < OW; ++ow) {
                float* __restrict a = acc + ow * C;
                #pragma omp simd
                for (int64_t c = 0; c < C; ++c) a[c] = 0.0f;
                for (int64_t i = 0; i < kh; ++i)
                    for (int64_t j = 0; j < kw; ++j) {
                        const float* __restrict row = y + ((n * H + oh * sh + i) * W + ow * sw + j) * C;
                        #pragma omp simd reduction(+: z)
                        for (int64_t c = 0; c < C; ++c) {
                            const float v = row[c];
                            z += v - v;
                            a[c] += chain(v, s1, s2);
                        }
                    }
            }
            if (z != z) nonfinite = 1;
            float* __restrict o = out + n * C * OH * OW + oh * OW;
            for (int64_t c = 0; c < C; ++c)
                for (int64_t ow = 0; ow < OW; ++ow) o[c * OH * OW + ow] = acc[ow * C + c] / div;
        }
    }
    bad[0] = nonfinite;
}

// y: the conv output NCHW, (N * C, H, W) contiguous planes; out: (N * C, OH, OW).
extern "C" void sub_tanh_pool_nchw(const float* __restrict y, float* __restrict out, int32_t* __restrict bad,
                                   int64_t P, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh, int64_t kw,
                                   int64_t sh, int64_t sw, float s1, float s2) {
    int32_t nonfinite = 0;
    const float div = (float)(kh * kw);
    #pragma omp parallel reduction(|: nonfinite) if(P * OH * OW > 16384)
    {
        std::vector<float> tv((size_t)(kh * W + 16));
        float* __restrict tb = tv.data();
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < P; ++p) {
            float z = 0.0f;
            for (int64_t oh = 0; oh < OH; ++oh) {
                for (int64_t i = 0; i < kh; ++i) {
                    const float* __restrict row = y + (p * H + oh * sh + i) * W;
                    float* __restrict tr = tb + i * W;
                    #pragma omp simd reduction(+: z)
                    for (int64_t w = 0; w < W; ++w) {
                        const float v = row[w];
                        z += v - v;
                        tr[w] = chain(v, s1, s2);
                    }
                }
                float* __restrict o = out + (p * OH + oh) * OW;
                if (kh == 2 && kw == 2 && sw == 2) {
                    const float* __restrict t0 = tb;
                    const float* __restrict t1 = tb + W;
                    #pragma omp simd
                    for (int64_t ow = 0; ow < OW; ++ow)
                        o[ow] = (((0.0f + t0[2 * ow]) + t0[2 * ow + 1]) + t1[2 * ow] + t1[2 * ow + 1]) / div;
                } else {
                    for (int64_t ow = 0; ow < OW; ++ow) {
                        float s = 0.0f;
                        for (int64_t i = 0; i < kh; ++i)
                            for (int64_t j = 0; j < kw; ++j) s += tb[i * W + ow * sw + j];
                        o[ow] = s / div;
                    }
                }
            }
            if (z != z) nonfinite = 1;
        }
    }
    bad[0] = nonfinite;
}
"""

SHAPE_GENERIC = True
LAYOUT = "nchw"


def pair(v):
    # an int or a 2-tuple as (a, b), without isinstance (not in the sandbox): an empty tensor of that size
    e = torch.empty(v)
    return (e.shape[0], e.shape[0]) if e.dim() == 1 else (e.shape[0], e.shape[1])


def forward(module, x):
    k, s = pair(module.avgpool.kernel_size), pair(module.avgpool.stride)
    assert x.dim() == 4 and x.dtype == torch.float32 and module.conv.padding_mode == "zeros"
    assert module.avgpool.padding in (0, (0, 0)) and not module.avgpool.ceil_mode and module.avgpool.divisor_override is None
    assert s[0] >= k[0] and s[1] >= k[1]  # windows do not overlap (every value read once)
    s1, s2 = float(module.subtract1_value), float(module.subtract2_value)
    if LAYOUT == "cl":
        fmt = torch.channels_last
        y = F.conv2d(x.contiguous(memory_format=fmt), module.conv.weight.contiguous(memory_format=fmt), module.conv.bias,
                     module.conv.stride, module.conv.padding, module.conv.dilation, module.conv.groups)
    else:
        y = F.conv2d(x.contiguous(), module.conv.weight, module.conv.bias, module.conv.stride, module.conv.padding, module.conv.dilation, module.conv.groups)
    n, c, h, w = y.shape
    oh, ow = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    out = torch.empty((n, c, oh, ow), dtype=x.dtype)
    bad = torch.zeros((1,), dtype=torch.int32)
    if LAYOUT == "cl":
        t = y.permute(0, 2, 3, 1).contiguous()  # (N, H, W, C): no copy when the conv's output is channels-last
        lib.sub_tanh_pool_cl(t, out, bad, n, c, h, w, oh, ow, k[0], k[1], s[0], s[1], s1, s2)
    else:
        lib.sub_tanh_pool_nchw(y.contiguous(), out, bad, n * c, h, w, oh, ow, k[0], k[1], s[0], s[1], s1, s2)
    if bad.item():  # a NaN or Inf: eager's own ops, for eager's NaN/Inf positions
        y = F.conv2d(x, module.conv.weight, module.conv.bias, module.conv.stride, module.conv.padding, module.conv.dilation, module.conv.groups)
        y = torch.tanh(y - module.subtract1_value) - module.subtract2_value
        return F.avg_pool2d(y, module.avgpool.kernel_size, module.avgpool.stride, module.avgpool.padding, module.avgpool.ceil_mode, module.avgpool.count_include_pad,
                            module.avgpool.divisor_override)
    return out
