"""conv_bn_act (torchvision's Conv2dNormActivation): act(batch_norm(conv2d(x, w, b), running stats)).

BatchNorm in eval mode is an affine map per output channel. In float32 it is folded into the convolution once per
module state (prepare(), computed in float64 and rounded once): w' = w * g / sqrt(v + eps), b' = beta + (b - mean)
* g / sqrt(v + eps); each call is then one cuDNN convolution with bias (torch's F.conv2d, under the user's own
TF32 flags, as eager's) and the activation in place over its output in one pass (16-byte vector loads, two
vectors a thread in flight, a scalar tail; none: no pass at all), where eager runs the convolution, a BatchNorm
kernel and an activation kernel. In float16 and bfloat16 a weight rounded after folding errs beyond eager's own
rounding where the sum cancels, so the convolution keeps the module's weights and BatchNorm (its per-channel map
kept in float32 by prepare) and the activation are one in-place pass, each rounded as eager rounds it. Other
dtypes and layouts that are not dense run the same in torch."""
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

// act 1: relu; 2: relu6 (hardtanh 0..6); 3: hardswish x * min(max(x + 3, 0), 6) / 6; 4: silu x / (1 + exp(-x));
// NaN stays NaN. In float, the formulas and operation order of PyTorch's CUDA kernels for F.relu,
// F.hardtanh, F.hardswish and F.silu.
__device__ __forceinline__ float act_f(float x, int act) {
    if (act == 1) return (x > 0.0f || x != x) ? x : 0.0f;
    if (act == 2) return x <= 0.0f ? 0.0f : (x >= 6.0f ? 6.0f : x);
    if (act == 3) return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f;
    return x / (1.0f + expf(-x));
}

// 16 bytes of T, loaded and stored as one access
template <typename T> struct alignas(16) Vec16 { T v[16 / sizeof(T)]; };
#define UNROLL 2  // vectors per thread, loaded before any is computed

// float32: y = act(a) over n contiguous elements; y may be a (each element is read, then written, by one thread).
// Threads of block i take vectors i * UNROLL * blockDim.x + k * blockDim.x + threadIdx.x, k < UNROLL, where both
// pointers are 16-byte aligned; the elements past the last whole vector (all of them when a pointer is not
// aligned) go one per thread, grid-stride.
__device__ __forceinline__ void act_apply(const float* a, float* y, long long n, int act) {
    constexpr int V = 4;
    const unsigned long long bits = reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(y);
    const long long nv = (bits & 15) == 0 ? n / V : 0;
    const long long first = (long long)blockIdx.x * UNROLL * blockDim.x + threadIdx.x;
    Vec16<float> va[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
        const long long i = first + (long long)k * blockDim.x;
        if (i < nv) va[k] = reinterpret_cast<const Vec16<float>*>(a)[i];
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
        const long long i = first + (long long)k * blockDim.x;
        if (i < nv) {
            Vec16<float> o;
#pragma unroll
            for (int e = 0; e < V; ++e) o.v[e] = act_f(va[k].v[e], act);
            reinterpret_cast<Vec16<float>*>(y)[i] = o;
        }
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = nv * V + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = act_f(a[i], act);
}

// Half dtypes: y = round(act(round(y * alpha[c] + beta[c]))) in place, eager's BatchNorm (its per-channel map in
// float) and activation, each rounded as eager rounds it; the channel of element i is (i / inner) % C (inner:
// H * W for NCHW, 1 for channels last). V consecutive elements a thread as one 16-byte access where y is aligned,
// one element a thread (grid-stride) for the rest.
template <typename T>
__device__ __forceinline__ T bn_act1(T v, const float* alpha, const float* beta, long long i, int C, long long inner,
                                      int act) {
    const int c = (int)((i / inner) % C);
    const float t = to_f(from_f<T>(to_f(v) * alpha[c] + beta[c]));
    return from_f<T>(act == 0 ? t : act_f(t, act));
}

template <typename T>
__device__ __forceinline__ void bn_act_apply(T* y, const float* alpha, const float* beta, long long n, int C,
                                             long long inner, int act) {
    constexpr int V = 16 / sizeof(T);
    const long long nv = (reinterpret_cast<unsigned long long>(y) & 15) == 0 ? n / V : 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < nv; k += stride) {
        Vec16<T> v = reinterpret_cast<Vec16<T>*>(y)[k];
#pragma unroll
        for (int e = 0; e < V; ++e) v.v[e] = bn_act1(v.v[e], alpha, beta, k * V + e, C, inner, act);
        reinterpret_cast<Vec16<T>*>(y)[k] = v;
    }
    for (long long i = nv * V + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = bn_act1(y[i], alpha, beta, i, C, inner, act);
}

extern "C" __global__ void __launch_bounds__(256) conv_bn_act_f16(__half* y, const float* alpha, const float* beta,
                                                                  long long n, int C, long long inner, int act) {
    bn_act_apply<__half>(y, alpha, beta, n, C, inner, act);
}
extern "C" __global__ void __launch_bounds__(256) conv_bn_act_bf16(__nv_bfloat16* y, const float* alpha,
                                                                   const float* beta, long long n, int C,
                                                                   long long inner, int act) {
    bn_act_apply<__nv_bfloat16>(y, alpha, beta, n, C, inner, act);
}

extern "C" __global__ void __launch_bounds__(256) conv_act_f32(const float* x, float* y, long long n, int act) {
    act_apply(x, y, n, act);
}
"""


def conv_bn_act_prepare(conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var, eps):
    """float32: (folded weight, folded bias, None, None). Half dtypes: (conv weight, conv bias, alpha, beta), BN's
    per-channel map in float32, since a weight rounded to 16 bits after folding errs beyond eager's own rounding."""
    scale = bn_weight.double() * (running_var.double() + eps).rsqrt()
    shift = bn_bias.double() - running_mean.double() * scale
    if conv_weight.dtype != torch.float32:
        return conv_weight, conv_bias, scale.float(), shift.float()
    if conv_bias is not None:
        shift = shift + conv_bias.double() * scale
    weight = (conv_weight.double() * scale.reshape(-1, 1, 1, 1)).to(conv_weight.dtype)
    return weight, shift.to(conv_weight.dtype), None, None


def act_code(act):
    if act == "relu" or act == "relu_":
        return 1
    if act == "relu6" or act == "relu6_":
        return 2
    if act == "hardswish" or act == "hardswish_":
        return 3
    if act == "silu" or act == "silu_":
        return 4
    return 0


def conv_bn_act(x, prepared, stride, padding, dilation, groups, act, momentum):
    weight, bias, alpha, beta = prepared
    y = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    code = act_code(act)
    n = y.numel()
    if n == 0 or code == 0 and alpha is None:
        return y
    flat = y
    inner = y.shape[2] * y.shape[3] if y.dim() == 4 else 0
    if y.dim() == 4 and not y.is_contiguous() and y.is_contiguous(memory_format=torch.channels_last):
        flat = y.permute(0, 2, 3, 1)  # the same memory, dense
        inner = 1
    if alpha is None and y.dtype == torch.float32 and flat.is_contiguous():
        lib.conv_act_f32(flat, flat, n, code, grid=((n // 4 + 511) // 512 + 1,), block=(256,))
        return y
    if alpha is not None and y.dtype in (torch.float16, torch.bfloat16) and flat.is_contiguous() and inner > 0:
        grid = (min((n // 8 + 255) // 256 + 1, 65535),)
        if y.dtype == torch.float16:
            lib.conv_bn_act_f16(flat, alpha, beta, n, y.shape[1], inner, code, grid=grid, block=(256,))
        else:
            lib.conv_bn_act_bf16(flat, alpha, beta, n, y.shape[1], inner, code, grid=grid, block=(256,))
        return y
    if alpha is not None:  # eager's BatchNorm, rounded to y's dtype
        y = (y.float() * alpha.reshape(-1, 1, 1) + beta.reshape(-1, 1, 1)).to(y.dtype)
    if code == 0:
        return y
    if code == 1:
        y = F.relu(y)
    elif code == 2:
        y = y.clamp(0.0, 6.0)  # hardtanh's own clamp
    elif code == 3:
        y = y * (y + 3.0).clamp(0.0, 6.0) / 6.0  # hardswish's formula, in its order
    else:
        y = F.silu(y)
    return y
