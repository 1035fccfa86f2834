"""ConvTranspose2d_BatchNorm_Tanh_MaxPool_GroupNorm: the transposed conv through PyTorch (oneDNN), then one
OpenMP pass that does BatchNorm (eval: running stats) -> tanh -> max pool -> GroupNorm, writing only the output.

BatchNorm is eager's inference formula, v * alpha_c + beta_c with alpha_c = weight_c / sqrt(var_c + eps) and
beta_c = bias_c - mean_c * alpha_c. It and tanh are monotone, so the max of tanh(bn(v)) over a pool window is
tanh(bn(max v)) where alpha_c >= 0 and tanh(bn(min v)) where alpha_c < 0: the pass takes the window's max and
min of the conv values and applies BN and tanh (ma_vecmath's ma_tanhf, a few ulp) once per pooled value, a
quarter of the tanh work of eager. GroupNorm's per-(sample, group) mean and biased variance of the pooled
values are summed in double while they are made (the values are tanh's, in [-1, 1], so E[v^2] - E[v]^2 in
double loses nothing that matters), rstd = 1/sqrt(var + eps), and the group's block, still in cache, is
normalized as eager does (v * scale_c + shift_c, scale_c = gamma_c rstd, shift_c = beta_c - mean scale_c).
LAYOUT picks the conv's memory format: channels-last (one sample's pooled block kept in cache, vectorized over
channels, written transposed to NCHW) or NCHW (one (sample, group) block at a time, written in place).
NCHW is kept although channels-last was faster side by side at the bench's shape (batch 64: ~225 ms against
~280 ms, eager ~365 ms; oneDNN's channels-last conv_transpose2d is the faster conv, the pass is a small part):
channels-last's conv rounds differently from eager's NCHW one, and on the proof's large-input trial, where
most tanh values saturate and GroupNorm's rstd amplifies what is left, 2 of 2.4M elements fell outside the
tolerance in one of two bench runs. NCHW's conv is eager's own, bit for bit, so the kernel's differences from
eager are a few ulp of BN and tanh and GroupNorm's statistics (in double, closer to the exact values). A NaN or
Inf in a pool window of the conv output sets a flag and the call runs eager's own ops instead
(conv_transpose2d NCHW, batch_norm, tanh, max_pool2d, group_norm), so NaN/Inf positions are eager's.
Deterministic: each (sample, group) is summed by one thread in a fixed order.
"""
SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <vector>
#include <omp.h>
#include "ma_vecmath.h"

// eager's inference BatchNorm terms: alpha = weight / sqrt(var + eps), beta = bias - mean * alpha
static void bn_terms(const float* rm, const float* rv, const float* w, const float* b, float eps, float* alpha,
                     float* beta, int64_t C) {
    for (int64_t c = 0; c < C; ++c) {
        const float invstd = 1.0f / std::sqrt(rv[c] + eps);
        alpha[c] = invstd * w[c];
        beta[c] = b[c] - rm[c] * alpha[c];
    }
}

// scale and shift of one group from its sums (double): v * scale_c + shift_c is GroupNorm's output
static void gn_terms(double s, double ss, double cnt, double eps, const float* gamma, const float* gbeta,
                     int64_t c0, int64_t c1, float* scale, float* shift) {
    const double mean = s / cnt;
    double var = ss / cnt - mean * mean;
    var = var > 0.0 ? var : 0.0;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t c = c0; c < c1; ++c) {
        const double sc = (double)gamma[c] * rstd;
        scale[c] = (float)sc;
        shift[c] = (float)((double)gbeta[c] - mean * sc);
    }
}

// y: the conv output channels-last, (N, H, W, C) contiguous; out: (N, C, OH, OW) contiguous. Max pool window
// (kh, kw), stride (sh, sw), no padding; G groups. bad[0] = 1 where a value read is NaN or Inf.
extern "C" void bn_tanh_maxpool_gn_cl(const float* __restrict y, const float* __restrict rm, const float* __restrict rv,
                                      const float* __restrict bnw, const float* __restrict bnb, const float* __restrict gamma,
                                      const float* __restrict gbeta, float* __restrict out, int32_t* __restrict bad,
                                      int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh,
                                      int64_t kw, int64_t sh, int64_t sw, int64_t G, float bn_eps, double gn_eps) {
    std::vector<float> alpha((size_t)C), beta((size_t)C);
    bn_terms(rm, rv, bnw, bnb, bn_eps, alpha.data(), beta.data(), C);
    const float* __restrict al = alpha.data();
    const float* __restrict be = beta.data();
    const int64_t L = OH * OW, cpg = C / G;
    int32_t nonfinite = 0;
    #pragma omp parallel reduction(|: nonfinite) if(N * L * C > 16384)
    {
        std::vector<float> pbv((size_t)(L * C)), mxv((size_t)C), mnv((size_t)C), scv((size_t)C), shv((size_t)C);
        std::vector<double> sv((size_t)C), ssv((size_t)C);
        float* __restrict pb = pbv.data();
        float* __restrict mx = mxv.data();
        float* __restrict mn = mnv.data();
        double* __restrict s = sv.data();
        double* __restrict ss = ssv.data();
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            float z = 0.0f;  // v - v summed: NaN iff some v is NaN or Inf
            for (int64_t c = 0; c < C; ++c) { s[c] = 0.0; ss[c] = 0.0; }
            for (int64_t oh = 0; oh < OH; ++oh)
                for (int64_t ow = 0; ow < OW; ++ow) {
                    const float* __restrict r0 = y + ((n * H + oh * sh) * W + ow * sw) * C;
                    #pragma omp simd reduction(+: z)
                    for (int64_t c = 0; c < C; ++c) { mx[c] = r0[c]; mn[c] = r0[c]; z += r0[c] - r0[c]; }
                    for (int64_t i = 0; i < kh; ++i)
                        for (int64_t j = (i == 0); j < kw; ++j) {
                            const float* __restrict row = y + ((n * H + oh * sh + i) * W + ow * sw + j) * C;
                            #pragma omp simd reduction(+: z)
                            for (int64_t c = 0; c < C; ++c) {
                                const float v = row[c];
                                z += v - v;
                                mx[c] = v > mx[c] ? v : mx[c];
                                mn[c] = v < mn[c] ? v : mn[c];
                            }
                        }
                    float* __restrict p = pb + (oh * OW + ow) * C;
                    #pragma omp simd
                    for (int64_t c = 0; c < C; ++c) {
                        const float v = al[c] >= 0.0f ? mx[c] : mn[c];
                        const float t = ma_tanhf(v * al[c] + be[c]);
                        p[c] = t;
                        s[c] += (double)t;
                        ss[c] += (double)t * (double)t;
                    }
                }
            if (z != z) nonfinite = 1;
            float* __restrict sc = scv.data();
            float* __restrict sf = shv.data();
            for (int64_t g = 0; g < G; ++g) {
                double gs = 0.0, gss = 0.0;
                for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) { gs += s[c]; gss += ss[c]; }
                gn_terms(gs, gss, (double)(cpg * L), gn_eps, gamma, gbeta, g * cpg, (g + 1) * cpg, sc, sf);
            }
            float* __restrict o = out + n * C * L;
            for (int64_t c = 0; c < C; ++c) {
                const float a = sc[c], b = sf[c];
                #pragma omp simd
                for (int64_t l = 0; l < L; ++l) o[c * L + l] = pb[l * C + c] * a + b;
            }
        }
    }
    bad[0] = nonfinite;
}

// y: the conv output NCHW, (N, C, H, W) contiguous; out: (N, C, OH, OW) contiguous, each (sample, group) block
// pooled into out and then normalized there (in cache).
extern "C" void bn_tanh_maxpool_gn_nchw(const float* __restrict y, const float* __restrict rm, const float* __restrict rv,
                                        const float* __restrict bnw, const float* __restrict bnb,
                                        const float* __restrict gamma, const float* __restrict gbeta,
                                        float* __restrict out, int32_t* __restrict bad, int64_t N, int64_t C, int64_t H,
                                        int64_t W, int64_t OH, int64_t OW, int64_t kh, int64_t kw, int64_t sh,
                                        int64_t sw, int64_t G, float bn_eps, double gn_eps) {
    std::vector<float> alpha((size_t)C), beta((size_t)C);
    bn_terms(rm, rv, bnw, bnb, bn_eps, alpha.data(), beta.data(), C);
    const float* __restrict al = alpha.data();
    const float* __restrict be = beta.data();
    const int64_t L = OH * OW, cpg = C / G;
    int32_t nonfinite = 0;
    #pragma omp parallel reduction(|: nonfinite) if(N * L * C > 16384)
    {
        std::vector<float> mxv((size_t)OW), mnv((size_t)OW), scv((size_t)C), shv((size_t)C);
        float* __restrict mx = mxv.data();
        float* __restrict mn = mnv.data();
        float* __restrict sc = scv.data();
        float* __restrict sf = shv.data();
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < N * G; ++t) {
            const int64_t n = t / G, g = t % G;
            float z = 0.0f;
            double s = 0.0, ss = 0.0;
            for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
                const float a = al[c], b = be[c];
                const float* __restrict yp = y + (n * C + c) * H * W;
                float* __restrict op = out + (n * C + c) * L;
                for (int64_t oh = 0; oh < OH; ++oh) {
                    if (kh == 2 && kw == 2 && sw == 2) {
                        const float* __restrict r0 = yp + (oh * sh) * W;
                        const float* __restrict r1 = r0 + W;
                        #pragma omp simd reduction(+: z)
                        for (int64_t ow = 0; ow < OW; ++ow) {
                            const float v0 = r0[2 * ow], v1 = r0[2 * ow + 1], v2 = r1[2 * ow], v3 = r1[2 * ow + 1];
                            z += ((v0 - v0) + (v1 - v1)) + ((v2 - v2) + (v3 - v3));
                            const float m01 = v1 > v0 ? v1 : v0, m23 = v3 > v2 ? v3 : v2;
                            const float n01 = v1 < v0 ? v1 : v0, n23 = v3 < v2 ? v3 : v2;
                            mx[ow] = m23 > m01 ? m23 : m01;
                            mn[ow] = n23 < n01 ? n23 : n01;
                        }
                    } else {
                        for (int64_t ow = 0; ow < OW; ++ow) {
                            const float* __restrict w0 = yp + (oh * sh) * W + ow * sw;
                            float hi = w0[0], lo = w0[0];
                            for (int64_t i = 0; i < kh; ++i)
                                for (int64_t j = 0; j < kw; ++j) {
                                    const float v = w0[i * W + j];
                                    z += v - v;
                                    hi = v > hi ? v : hi;
                                    lo = v < lo ? v : lo;
                                }
                            mx[ow] = hi;
                            mn[ow] = lo;
                        }
                    }
                    float* __restrict o = op + oh * OW;
                    const float* __restrict src = a >= 0.0f ? mx : mn;
                    #pragma omp simd reduction(+: s, ss)
                    for (int64_t ow = 0; ow < OW; ++ow) {
                        const float th = ma_tanhf(src[ow] * a + b);
                        o[ow] = th;
                        s += (double)th;
                        ss += (double)th * (double)th;
                    }
                }
            }
            if (z != z) nonfinite = 1;
            gn_terms(s, ss, (double)(cpg * L), gn_eps, gamma, gbeta, g * cpg, (g + 1) * cpg, sc, sf);
            for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
                float* __restrict op = out + (n * C + c) * L;
                const float a = sc[c], b = sf[c];
                #pragma omp simd
                for (int64_t l = 0; l < L; ++l) op[l] = op[l] * a + b;
            }
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
    k, s = pair(module.max_pool.kernel_size), pair(module.max_pool.stride)
    assert x.dim() == 4 and x.dtype == torch.float32 and module.conv_transpose.padding_mode == "zeros"
    assert module.max_pool.padding in (0, (0, 0)) and module.max_pool.dilation in (1, (1, 1))
    assert not module.max_pool.ceil_mode and s[0] >= k[0] and s[1] >= k[1]  # windows do not overlap
    assert not module.batch_norm.training and module.batch_norm.running_mean is not None
    assert module.batch_norm.weight is not None and module.group_norm.weight is not None
    if LAYOUT == "cl":
        fmt = torch.channels_last
        y = F.conv_transpose2d(x.contiguous(memory_format=fmt), module.conv_transpose.weight.contiguous(memory_format=fmt),
                               module.conv_transpose.bias, module.conv_transpose.stride, module.conv_transpose.padding,
                               module.conv_transpose.output_padding, module.conv_transpose.groups,
                               module.conv_transpose.dilation)
    else:
        y = F.conv_transpose2d(x.contiguous(), module.conv_transpose.weight, module.conv_transpose.bias,
                               module.conv_transpose.stride, module.conv_transpose.padding,
                               module.conv_transpose.output_padding, module.conv_transpose.groups,
                               module.conv_transpose.dilation)
    n, c, h, w = y.shape
    oh, ow = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    out = torch.empty((n, c, oh, ow), dtype=x.dtype)
    bad = torch.zeros((1,), dtype=torch.int32)
    args = (module.batch_norm.running_mean.contiguous(), module.batch_norm.running_var.contiguous(),
            module.batch_norm.weight.contiguous(), module.batch_norm.bias.contiguous(),
            module.group_norm.weight.contiguous(), module.group_norm.bias.contiguous(), out, bad, n, c, h, w, oh, ow,
            k[0], k[1], s[0], s[1], module.group_norm.num_groups, float(module.batch_norm.eps),
            float(module.group_norm.eps))
    if LAYOUT == "cl":
        lib.bn_tanh_maxpool_gn_cl(y.permute(0, 2, 3, 1).contiguous(), *args)
    else:
        lib.bn_tanh_maxpool_gn_nchw(y.contiguous(), *args)
    if bad.item():  # a NaN or Inf: eager's own ops, for eager's NaN/Inf positions
        y = F.conv_transpose2d(x, module.conv_transpose.weight, module.conv_transpose.bias, module.conv_transpose.stride,
                               module.conv_transpose.padding, module.conv_transpose.output_padding,
                               module.conv_transpose.groups, module.conv_transpose.dilation)
        y = F.batch_norm(y, module.batch_norm.running_mean, module.batch_norm.running_var, module.batch_norm.weight,
                         module.batch_norm.bias, False, 0.0, module.batch_norm.eps)
        y = F.max_pool2d(torch.tanh(y), module.max_pool.kernel_size, module.max_pool.stride, module.max_pool.padding,
                         module.max_pool.dilation, module.max_pool.ceil_mode)
        return F.group_norm(y, module.group_norm.num_groups, module.group_norm.weight, module.group_norm.bias,
                            module.group_norm.eps)
    return out
