"""GELU with the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as HF NewGELUActivation and
GELUTanh and torch's GELU(approximate="tanh") compute it: one pass, four elements per thread as one vector load and
store (a scalar tail for the last n % 4), where eager's formula runs eight elementwise kernels with seven
intermediates. Computed in float and rounded once to the dtype, as F.gelu does; for float16/bfloat16 inputs of
the formula module (which eager rounds after every op) that is the more accurate of the two.
Served: float32, float16, bfloat16; other dtypes run the formula in torch."""
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

inline float gelu_tanh1(float x) {
    return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * (x * x * x))));
}

// y = gelu_tanh(x) over n elements: thread i < n / 4 takes elements 4i..4i+3 as one vector, thread n / 4 the
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


def gelu_tanh(x):
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))
    out = torch.empty_like(x)  # eager's layout: x's strides where x is dense
    n = x.numel()
    if n == 0:
        return out
    xc = x if x.is_contiguous() and x.storage_offset() % 4 == 0 else x.clone(memory_format=torch.contiguous_format)
    y = out if out.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    threads = n // 4 + (1 if n % 4 else 0)
    tg = min(256, threads)
    if x.dtype == torch.float32:
        lib.gelu_tanh_f32(xc, y, n, threads=threads, group_size=tg)
    elif x.dtype == torch.float16:
        lib.gelu_tanh_f16(xc, y, n, threads=threads, group_size=tg)
    else:
        lib.gelu_tanh_bf16(xc, y, n, threads=threads, group_size=tg)
    if y is not out:
        out.copy_(y)
    return out
