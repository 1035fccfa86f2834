"""Gated MLP as HF Llama/Qwen2/Mistral compute it: down(act(gate(x)) * up(x)), no biases, act silu, gelu_tanh or
gelu (erf). The three GEMMs stay MPS's own matmuls (through torch); the epilogue act(gate) * up is one kernel
(vector loads of four elements, a scalar tail) instead of eager's two, which saves one write and one read of the
intermediate-sized activation. Rounding as eager: the activation is computed in float and rounded to the dtype,
then multiplied by up and rounded again. Served: float32, float16, bfloat16; other dtypes run in torch."""
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

// act 0: silu x / (1 + exp(-x)); 1: gelu tanh 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
// 2: gelu 0.5 x erfc(-x / sqrt(2)), +Inf at +Inf and NaN at -Inf as float64 gives.
inline float activate(float x, uint act) {
    if (act == 0) return x / (1.0f + exp(-x));
    if (act == 1) return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    return isinf(x) ? (x > 0.0f ? x : NAN) : 0.5f * x * erfc_fit(-x * M_SQRT1_2_F);
}

template <typename T>
inline T gate_up(T g, T u, uint act) {
    return T(float(T(activate(float(g), act))) * float(u));
}

// h = act(g) * u over n elements: thread i < n / 4 takes elements 4i..4i+3 as one vector, thread n / 4 the
// n % 4 left over. Buffers start 16-byte aligned (fresh matmul outputs).
template <typename T>
kernel void act_mul(device const T* g [[buffer(0)]], device const T* u [[buffer(1)]], device T* h [[buffer(2)]],
                    constant uint& n [[buffer(3)]], constant uint& act [[buffer(4)]],
                    uint i [[thread_position_in_grid]]) {
    const uint n4 = n / 4;
    if (i < n4) {
        const vec<T, 4> a = ((device const vec<T, 4>*)g)[i];
        const vec<T, 4> b = ((device const vec<T, 4>*)u)[i];
        ((device vec<T, 4>*)h)[i] = vec<T, 4>(gate_up(a.x, b.x, act), gate_up(a.y, b.y, act),
                                              gate_up(a.z, b.z, act), gate_up(a.w, b.w, act));
    } else if (i == n4) {
        for (uint j = 4 * n4; j < n; ++j) h[j] = gate_up(g[j], u[j], act);
    }
}

template [[host_name("act_mul_f32")]] [[kernel]] decltype(act_mul<float>) act_mul<float>;
template [[host_name("act_mul_f16")]] [[kernel]] decltype(act_mul<half>) act_mul<half>;
template [[host_name("act_mul_bf16")]] [[kernel]] decltype(act_mul<bfloat>) act_mul<bfloat>;
"""
SHAPE_GENERIC = True


def gated_mlp(x, gate_weight, up_weight, down_weight, act):
    g = F.linear(x, gate_weight)
    u = F.linear(x, up_weight)
    code = 0 if act == "silu" else 1 if act in ("gelu_tanh", "gelu_new") else 2 if act == "gelu" else -1
    if code < 0 or g.dtype not in (torch.float32, torch.float16, torch.bfloat16) or u.dtype != g.dtype \
            or u.shape != g.shape:
        a = F.silu(g) if act == "silu" else F.relu(g) if act == "relu" else \
            F.gelu(g, approximate="tanh" if act in ("gelu_tanh", "gelu_new") else "none")
        return F.linear(a * u, down_weight)
    if not (g.is_contiguous() and u.is_contiguous() and g.storage_offset() % 4 == 0
            and u.storage_offset() % 4 == 0):
        g = g.clone(memory_format=torch.contiguous_format)
        u = u.clone(memory_format=torch.contiguous_format)
    h = torch.empty_like(g)
    n = g.numel()
    if n > 0:
        threads = n // 4 + (1 if n % 4 else 0)
        tg = min(256, threads)
        if g.dtype == torch.float32:
            lib.act_mul_f32(g, u, h, n, code, threads=threads, group_size=tg)
        elif g.dtype == torch.float16:
            lib.act_mul_f16(g, u, h, n, code, threads=threads, group_size=tg)
        else:
            lib.act_mul_bf16(g, u, h, n, code, threads=threads, group_size=tg)
    return F.linear(h, down_weight)
