"""conv_bn_act (torchvision's Conv2dNormActivation): act(batch_norm(conv2d(x, w, b), running stats)).

BatchNorm in eval mode is an affine map per output channel, so it is folded into the convolution once per
module state (prepare(), computed in float32 on the device and rounded once to the weight's dtype: MPS has no
float64): w' = w * g / sqrt(v + eps), b' = beta + (b - mean) * g / sqrt(v + eps). Each call is then one MPS
convolution with bias (torch's F.conv2d, as eager runs the convolution) and the activation applied in place over
its output (four elements per thread as one vector, a scalar tail; none: no pass at all), where eager runs the
convolution, a BatchNorm kernel and an activation kernel. The activation is computed in float and rounded once.
Served: float32, float16, bfloat16; other dtypes and layouts that are not dense run the same in torch.
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
template [[host_name("conv_act_f16")]] [[kernel]] decltype(conv_act<half>) conv_act<half>;
template [[host_name("conv_act_bf16")]] [[kernel]] decltype(conv_act<bfloat>) conv_act<bfloat>;
"""


def conv_bn_act_prepare(conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var, eps):
    scale = bn_weight.float() * (running_var.float() + eps).rsqrt()
    shift = bn_bias.float() - running_mean.float() * scale
    if conv_bias is not None:
        shift = shift + conv_bias.float() * scale
    weight = (conv_weight.float() * scale.reshape(-1, 1, 1, 1)).to(conv_weight.dtype)
    return weight, shift.to(conv_weight.dtype)


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
    weight, bias = prepared
    y = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    code = act_code(act)
    n = y.numel()
    if code == 0 or n == 0:
        return y
    flat = y
    if y.dim() == 4 and not y.is_contiguous() and y.is_contiguous(memory_format=torch.channels_last):
        flat = y.permute(0, 2, 3, 1)  # the same memory, dense: the activation is elementwise
    if y.dtype in (torch.float32, torch.float16, torch.bfloat16) and flat.is_contiguous() \
            and flat.storage_offset() % 4 == 0:
        threads = n // 4 + (1 if n % 4 else 0)
        tg = min(256, threads)
        if y.dtype == torch.float32:
            lib.conv_act_f32(flat, n, code, threads=threads, group_size=tg)
        elif y.dtype == torch.float16:
            lib.conv_act_f16(flat, n, code, threads=threads, group_size=tg)
        else:
            lib.conv_act_bf16(flat, n, code, threads=threads, group_size=tg)
    elif code == 1:
        y = F.relu(y)
    elif code == 2:
        y = y.clamp(0.0, 6.0)  # hardtanh's own clamp
    elif code == 3:
        y = y * (y + 3.0).clamp(0.0, 6.0) / 6.0  # hardswish's formula, in its order
    else:
        y = F.silu(y)
    return y
