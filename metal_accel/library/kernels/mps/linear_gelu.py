"""Dense then GELU, as BERT/ViT intermediates compute it: gelu(linear(x, weight, bias)), approximate "none" (erf)
or "tanh". The GEMM with its bias stays MPS's own (F.linear through torch); GELU is one in-place pass over its
output, four elements per thread as one vector (a scalar tail), computed in float and rounded once as F.gelu
does, so the activation costs one read and one write of the output and no allocation.
Served: float32, float16, bfloat16; other dtypes, or an output torch gives non-contiguous, run F.gelu."""
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// erfc(z) for the exact GELU (Metal has no erf): the Chebyshev fit of Numerical Recipes' erfcc, fractional
// error below 1.2e-7 everywhere, so the negative tail keeps its relative accuracy.
inline float erfc_fit(float z) {
    const float a = fabs(z);
    const float t = 1.0f / (1.0f + 0.5f * a);
    const float r = t * exp(-a * a - 1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
                    t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
                    t * (-0.82215223f + t * 0.17087277f)))))))));
    return z >= 0.0f ? r : 2.0f - r;
}

// approx 0: 0.5 x erfc(-x / sqrt(2)), +Inf at +Inf and NaN at -Inf as float64 gives; 1: 0.5 x (1 + tanh(sqrt(2/pi) (x +
// 0.044715 x^3))).
inline float gelu1(float x, uint approx) {
    if (approx != 0) return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * (x * x * x))));
    return isinf(x) ? (x > 0.0f ? x : NAN) : 0.5f * x * erfc_fit(-x * M_SQRT1_2_F);
}

// y = gelu(x) over n elements (y may be x: each element is read and written by one thread): thread i < n / 4
// takes elements 4i..4i+3 as one vector, thread n / 4 the n % 4 left over. Buffers start 16-byte aligned.
template <typename T>
kernel void gelu(device const T* x [[buffer(0)]], device T* y [[buffer(1)]], constant uint& n [[buffer(2)]],
                 constant uint& approx [[buffer(3)]], uint i [[thread_position_in_grid]]) {
    const uint n4 = n / 4;
    if (i < n4) {
        const float4 v = float4(((device const vec<T, 4>*)x)[i]);
        ((device vec<T, 4>*)y)[i] = vec<T, 4>(float4(gelu1(v.x, approx), gelu1(v.y, approx), gelu1(v.z, approx),
                                                     gelu1(v.w, approx)));
    } else if (i == n4) {
        for (uint j = 4 * n4; j < n; ++j) y[j] = T(gelu1(float(x[j]), approx));
    }
}

template [[host_name("gelu_f32")]] [[kernel]] decltype(gelu<float>) gelu<float>;
template [[host_name("gelu_f16")]] [[kernel]] decltype(gelu<half>) gelu<half>;
template [[host_name("gelu_bf16")]] [[kernel]] decltype(gelu<bfloat>) gelu<bfloat>;
"""
SHAPE_GENERIC = True


def linear_gelu(x, weight, bias, approximate):
    h = F.linear(x, weight, bias)
    n = h.numel()
    if h.dtype not in (torch.float32, torch.float16, torch.bfloat16) or approximate not in ("none", "tanh") \
            or not h.is_contiguous() or h.storage_offset() % 4 != 0:
        return F.gelu(h, approximate=approximate)
    if n > 0:
        code = 1 if approximate == "tanh" else 0
        threads = n // 4 + (1 if n % 4 else 0)
        tg = min(256, threads)
        if h.dtype == torch.float32:
            lib.gelu_f32(h, h, n, code, threads=threads, group_size=tg)
        elif h.dtype == torch.float16:
            lib.gelu_f16(h, h, n, code, threads=threads, group_size=tg)
        else:
            lib.gelu_bf16(h, h, n, code, threads=threads, group_size=tg)
    return h
