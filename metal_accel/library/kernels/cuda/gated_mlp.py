"""Gated MLP as HF Llama/Qwen2/Mistral (and T5's gated-gelu) compute it: down(act(gate(x)) * up(x)), no biases, act
silu, gelu_tanh, gelu_new (the same tanh formula written out), gelu (erf) or relu. The three GEMMs stay cuBLAS's
(F.linear through torch); the epilogue act(gate) * up is one pass over the intermediate activations, written in
place into gate's buffer (16-byte vector loads, two vectors a thread in flight, a scalar tail), where eager runs
two kernels and writes and re-reads an intermediate-sized temporary: three reads and writes of that size instead
of five, and no allocation. Rounding as eager: act computed in float and rounded to the dtype, then multiplied by
up in float and rounded again. Served: float32, float16, bfloat16; other dtypes run in torch."""
DTYPES = ("float32", "float16", "bfloat16")
SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// act 0: silu x / (1 + exp(-x)); 1: gelu tanh 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); 2: gelu
// x 0.5 (1 + erf(x / sqrt(2))); 3: relu (NaN stays NaN). In float, the formulas and operation order of
// PyTorch's CUDA kernels for F.silu, F.gelu and F.relu.
__device__ __forceinline__ float act_f(float x, int act) {
    if (act == 0) return x / (1.0f + expf(-x));
    if (act == 1) return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * (x * x * x))));
    if (act == 2) return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
    return (x > 0.0f || x != x) ? x : 0.0f;
}

// 16 bytes of T, loaded and stored as one access
template <typename T> struct alignas(16) Vec16 { T v[16 / sizeof(T)]; };
#define UNROLL 2  // vectors per thread, loaded before any is computed

// GATED: y = round(round(act(a)) * b), eager's act(gate) * up; else y = round(act(a)) (b unused). Over n
// contiguous elements; y may be a (each element is read, then written, by one thread). Threads of block i
// take vectors i * UNROLL * blockDim.x + k * blockDim.x + threadIdx.x, k < UNROLL, where all three
// pointers are 16-byte aligned; the elements past the last whole vector (all of them when a pointer is not
// aligned) go one per thread, grid-stride.
template <typename T, bool GATED>
__device__ __forceinline__ void act_apply(const T* a, const T* b, T* y, long long n, int act) {
    constexpr int V = 16 / sizeof(T);
    const unsigned long long bits = reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b) |
                                    reinterpret_cast<unsigned long long>(y);
    const long long nv = (bits & 15) == 0 ? n / V : 0;
    const long long first = (long long)blockIdx.x * UNROLL * blockDim.x + threadIdx.x;
    Vec16<T> va[UNROLL], vb[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
        const long long i = first + (long long)k * blockDim.x;
        if (i < nv) {
            va[k] = reinterpret_cast<const Vec16<T>*>(a)[i];
            if (GATED) vb[k] = reinterpret_cast<const Vec16<T>*>(b)[i];
        }
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
        const long long i = first + (long long)k * blockDim.x;
        if (i < nv) {
            Vec16<T> o;
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const T h = from_f<T>(act_f(to_f(va[k].v[e]), act));
                o.v[e] = GATED ? from_f<T>(to_f(h) * to_f(vb[k].v[e])) : h;
            }
            reinterpret_cast<Vec16<T>*>(y)[i] = o;
        }
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = nv * V + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T h = from_f<T>(act_f(to_f(a[i]), act));
        y[i] = GATED ? from_f<T>(to_f(h) * to_f(b[i])) : h;
    }
}

extern "C" __global__ void __launch_bounds__(256) act_mul_f32(const float* g, const float* u, float* h, long long n, int act) {
    act_apply<float, true>(g, u, h, n, act);
}
extern "C" __global__ void __launch_bounds__(256) act_mul_f16(const __half* g, const __half* u, __half* h, long long n,
                                                              int act) {
    act_apply<__half, true>(g, u, h, n, act);
}
extern "C" __global__ void __launch_bounds__(256) act_mul_bf16(const __nv_bfloat16* g, const __nv_bfloat16* u,
                                                               __nv_bfloat16* h, long long n, int act) {
    act_apply<__nv_bfloat16, true>(g, u, h, n, act);
}
"""
CODES = (("silu", 0), ("gelu_tanh", 1), ("gelu_new", 1), ("gelu", 2), ("relu", 3))  # act_f in SOURCE


def _code(act):
    for name, code in CODES:
        if name == act:
            return code
    return -1


def _act_torch(h, act):
    if act == "silu":
        return F.silu(h)
    if act == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if act == "gelu":
        return F.gelu(h)
    if act == "relu":
        return F.relu(h)
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3.0))))


def gated_mlp(x, gate_weight, up_weight, down_weight, act):
    g = F.linear(x, gate_weight)
    u = F.linear(x, up_weight)
    code = _code(act)
    if code < 0 or g.dtype not in (torch.float32, torch.float16, torch.bfloat16) or u.dtype != g.dtype or u.shape != g.shape:
        return F.linear(_act_torch(g, act) * u, down_weight)
    g = g.contiguous()
    u = u.contiguous()
    n = g.numel()
    if n > 0:
        V = 4 if g.dtype == torch.float32 else 8
        grid = (((n + V - 1) // V + 511) // 512,)  # 256 threads x 2 vectors (UNROLL) a block
        if g.dtype == torch.float32:
            lib.act_mul_f32(g, u, g, n, code, grid=grid, block=(256,))
        elif g.dtype == torch.float16:
            lib.act_mul_f16(g, u, g, n, code, grid=grid, block=(256,))
        else:
            lib.act_mul_bf16(g, u, g, n, code, grid=grid, block=(256,))
    return F.linear(g, down_weight)
