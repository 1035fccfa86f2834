"""conv_bn_act (torchvision's Conv2dNormActivation): act(batch_norm(conv2d(x, w, b), running stats)).

BatchNorm in eval mode is an affine map per output channel. In float32 it is folded into the convolution once per
module state (prepare(), in float32 on the device: MPS has no float64): w' = w * g / sqrt(v + eps),
b' = beta + (b - mean) * g / sqrt(v + eps); each call is then one MPS convolution with bias (torch's F.conv2d) and
the activation in place over its output (four elements a thread as one vector, a scalar tail; none: no pass at
all), where eager runs the convolution, a BatchNorm kernel and an activation kernel. In float16 and bfloat16 a
weight rounded after folding errs beyond eager's own rounding where the sum cancels, so the convolution keeps
the module's weights and BatchNorm (its per-channel map kept in float32 by prepare) and the activation are one
in-place pass, each rounded as eager rounds it. Other dtypes and layouts that are not dense run the same in
torch.
"""
DTYPES = ("float32", "float16", "bfloat16")
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// act 1: relu; 2: relu6 (hardtanh 0..6); 3: hardswish x * min(max(x + 3, 0), 6) / 6; 4: silu x / (1 + exp(-x));
// NaN stays NaN. In float, the formulas of PyTorch's own kernels.
inline float act1(float x, uint act) {
    if (act == 1) return (x > 0.0f || isnan(x)) ? x : 0.0f;
    if (act == 2) return isnan(x) ? x : (x <= 0.0f ? 0.0f : (x >= 6.0f ? 6.0f : x));
    if (act == 3) {
        const float t = x + 3.0f;
        return x * (isnan(t) ? t : (t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t))) / 6.0f;
    }
    return x / (1.0f + exp(-x));
}

// y = act(y) in place over n elements: thread i < n / 4 takes elements 4i..4i+3 as one vector, thread n / 4 the
// n % 4 left over. The buffer starts 16-byte aligned (the host passes element offsets that are multiples of 4).
template <typename T>
kernel void conv_act(device T* y [[buffer(0)]], constant uint& n [[buffer(1)]], constant uint& act [[buffer(2)]],
                     uint i [[thread_position_in_grid]]) {
    const uint n4 = n / 4;
    if (i < n4) {
        const float4 v = float4(((device const vec<T, 4>*)y)[i]);
        ((device vec<T, 4>*)y)[i] = vec<T, 4>(float4(act1(v.x, act), act1(v.y, act), act1(v.z, act),
                                                     act1(v.w, act)));
    } else if (i == n4) {
        for (uint j = 4 * n4; j < n; ++j) y[j] = T(act1(float(y[j]), act));
    }
}

template [[host_name("conv_act_f32")]] [[kernel]] decltype(conv_act<float>) conv_act<float>;

// Half dtypes: y = T(act(T(y * alpha[c] + beta[c]))) in place, eager's BatchNorm (its per-channel map in float)
// and activation, each rounded as eager rounds it; one element a thread, of channel (i / inner) % C (inner:
// H * W for NCHW, 1 for channels last).
template <typename T>
kernel void conv_bn_act(device T* y [[buffer(0)]], device const float* alpha [[buffer(1)]],
                        device const float* beta [[buffer(2)]], constant uint& n [[buffer(3)]],
                        constant uint& C [[buffer(4)]], constant uint& inner [[buffer(5)]],
                        constant uint& act [[buffer(6)]], uint i [[thread_position_in_grid]]) {
    if (i >= n) return;
    const uint c = (i / inner) % C;
    const float t = float(T(float(y[i]) * alpha[c] + beta[c]));
    y[i] = T(act == 0 ? t : act1(t, act));
}

template [[host_name("conv_bn_act_f16")]] [[kernel]] decltype(conv_bn_act<half>) conv_bn_act<half>;
template [[host_name("conv_bn_act_bf16")]] [[kernel]] decltype(conv_bn_act<bfloat>) conv_bn_act<bfloat>;
"""


def conv_bn_act_prepare(conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var, eps):
    """float32: (folded weight, folded bias, None, None). Half dtypes: (conv weight, conv bias, alpha, beta), BN's
    per-channel map in float32, since a weight rounded to 16 bits after folding errs beyond eager's own rounding."""
    scale = bn_weight.float() * (running_var.float() + eps).rsqrt()
    shift = bn_bias.float() - running_mean.float() * scale
    if conv_weight.dtype != torch.float32:
        return conv_weight, conv_bias, scale, shift
    if conv_bias is not None:
        shift = shift + conv_bias.float() * scale
    return conv_weight * scale.reshape(-1, 1, 1, 1), shift, None, None


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
    if alpha is None and y.dtype == torch.float32 and flat.is_contiguous() and flat.storage_offset() % 4 == 0:
        threads = n // 4 + (1 if n % 4 else 0)
        lib.conv_act_f32(flat, n, code, threads=threads, group_size=min(256, threads))
        return y
    if alpha is not None and y.dtype in (torch.float16, torch.bfloat16) and flat.is_contiguous() and inner > 0:
        if y.dtype == torch.float16:
            lib.conv_bn_act_f16(flat, alpha, beta, n, y.shape[1], inner, code, threads=n, group_size=min(256, n))
        else:
            lib.conv_bn_act_bf16(flat, alpha, beta, n, y.shape[1], inner, code, threads=n, group_size=min(256, n))
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
