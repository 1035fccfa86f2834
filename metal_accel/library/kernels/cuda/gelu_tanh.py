"""GELU, tanh approximation, written out as GPT-2's NewGELUActivation computes it:
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). One pass (16-byte vector loads, four vectors a thread in
flight, a scalar tail) computes it in float and rounds once, where eager runs eight elementwise kernels with seven
temporaries of x's size (eight reads and writes of x's size per element instead of two). Served: float32, float16,
bfloat16 (computed in float: in half dtypes closer to the exact value than eager's rounding of every step); other
dtypes run the formula in torch. Output in x's layout where x is dense, as eager's."""
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

extern "C" __global__ void __launch_bounds__(256) act_f32(const float* x, float* y, long long n, int act) {
    act_apply<float, false>(x, x, y, n, act);
}
extern "C" __global__ void __launch_bounds__(256) act_f16(const __half* x, __half* y, long long n, int act) {
    act_apply<__half, false>(x, x, y, n, act);
}
extern "C" __global__ void __launch_bounds__(256) act_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, long long n, int act) {
    act_apply<__nv_bfloat16, false>(x, x, y, n, act);
}
"""


def _act(x, y, n, code):
    """y = act(x) over x's n contiguous elements (y may be x) on the GPU; CODE as act_f in SOURCE."""
    V = 4 if x.dtype == torch.float32 else 8
    grid = (((n + V - 1) // V + 511) // 512,)  # 256 threads x 2 vectors (UNROLL) a block
    if x.dtype == torch.float32:
        lib.act_f32(x, y, n, code, grid=grid, block=(256,))
    elif x.dtype == torch.float16:
        lib.act_f16(x, y, n, code, grid=grid, block=(256,))
    else:
        lib.act_bf16(x, y, n, code, grid=grid, block=(256,))


def gelu_tanh(x):
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))
    out = torch.empty_like(x)  # eager's layout: x's strides where x is dense
    n = x.numel()
    if n == 0:
        return out
    xc = x.contiguous()
    y = out if out.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _act(xc, y, n, 1)
    if y is not out:
        out.copy_(y)
    return out
