"""HF GPT2MLP (Conv1D weights, [in, out]): addmm(proj_bias, gelu_tanh(addmm(fc_bias, x, fc_weight)), proj_weight).
Both GEMMs with their bias stay MPS's own addmm (through torch), rounded exactly as eager's; the activation between
them is one in-place pass over the hidden activations (four elements per thread as one vector, a scalar tail),
where eager's gelu_new formula runs eight elementwise kernels with seven intermediates of that size. The
activation is computed in float and rounded once to the dtype. Served: float32, float16, bfloat16 (all three
tensors of x's dtype); other dtypes run in torch."""
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

inline float gelu_tanh1(float x) {
    return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * (x * x * x))));
}

// y = gelu_tanh(x) over n elements (y may be x: each element is read and written by one thread): thread i < n / 4 takes elements 4i..4i+3 as one vector, thread n / 4 the
// n % 4 left over. Buffers start 16-byte aligned (the host passes element offsets that are multiples of 4).
template <typename T>
kernel void gelu_tanh(device const T* x [[buffer(0)]], device T* y [[buffer(1)]], constant uint& n [[buffer(2)]],
                      uint i [[thread_position_in_grid]]) {
    const uint n4 = n / 4;
    if (i < n4) {
        const float4 v = float4(((device const vec<T, 4>*)x)[i]);
        ((device vec<T, 4>*)y)[i] = vec<T, 4>(float4(gelu_tanh1(v.x), gelu_tanh1(v.y), gelu_tanh1(v.z),
                                                     gelu_tanh1(v.w)));
    } else if (i == n4) {
        for (uint j = 4 * n4; j < n; ++j) y[j] = T(gelu_tanh1(float(x[j])));
    }
}

template [[host_name("gelu_tanh_f32")]] [[kernel]] decltype(gelu_tanh<float>) gelu_tanh<float>;
template [[host_name("gelu_tanh_f16")]] [[kernel]] decltype(gelu_tanh<half>) gelu_tanh<half>;
template [[host_name("gelu_tanh_bf16")]] [[kernel]] decltype(gelu_tanh<bfloat>) gelu_tanh<bfloat>;
"""
SHAPE_GENERIC = True


def gpt2_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias):
    h = torch.addmm(fc_bias, x.reshape(-1, x.shape[-1]), fc_weight)
    n = h.numel()
    if h.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not h.is_contiguous() \
            or h.storage_offset() % 4 != 0:
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3.0))))
    elif n > 0:
        threads = n // 4 + (1 if n % 4 else 0)
        tg = min(256, threads)
        if h.dtype == torch.float32:
            lib.gelu_tanh_f32(h, h, n, threads=threads, group_size=tg)
        elif h.dtype == torch.float16:
            lib.gelu_tanh_f16(h, h, n, threads=threads, group_size=tg)
        else:
            lib.gelu_tanh_bf16(h, h, n, threads=threads, group_size=tg)
    out = torch.addmm(proj_bias, h, proj_weight)
    return out.reshape(*x.shape[:-1], out.shape[-1])
