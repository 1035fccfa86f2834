"""conv_bn_act (torchvision's Conv2dNormActivation): act(batch_norm(conv2d(x, w, b), running stats)).

BatchNorm in eval mode is an affine map per output channel, so it is folded into the convolution once per
module state (prepare(), computed in float64 and rounded once to the weight's dtype): w' = w * g / sqrt(v + eps),
b' = beta + (b - mean) * g / sqrt(v + eps). Each call is then one oneDNN convolution with bias (torch's
F.conv2d, as eager runs the convolution) and the activation applied in place over its output in one
vectorized pass (ReLU, ReLU6, Hardswish, SiLU with ma_vecmath.h; none: no pass at all), where eager runs the
convolution, a BatchNorm pass and an activation pass. float32 and bfloat16 (the activation computed in float
and rounded once, as eager's kernels); other dtypes and layouts that are not dense run the same in torch.
"""

DTYPES = ("float32", "bfloat16")  # float16 runs the reference in torch: no CPU kernel for it

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <omp.h>
#include "ma_vecmath.h"

static inline float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// round to nearest even, NaN kept NaN (as torch's conversion)
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return f != f ? (uint16_t)0x7fc0 : (uint16_t)r;
}

// act 1 relu, 2 relu6 (hardtanh 0..6), 3 hardswish x * min(max(x + 3, 0), 6) / 6, 4 silu; NaN stays NaN
static inline float act_f(float x, int act) {
  if (act == 1) return x > 0.0f || x != x ? x : 0.0f;
  if (act == 2) return x != x ? x : (x < 0.0f ? 0.0f : (x > 6.0f ? 6.0f : x));
  if (act == 3) {
    const float t = x + 3.0f;
    return x * (t != t ? t : (t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t))) / 6.0f;
  }
  return ma_siluf(x);
}

// in place over y[0, n): 4096-element chunks, split across threads when there are many
template <int ACT>
static void act_f32_t(float* y, int64_t n) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    #pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = act_f(y[i], ACT);
  }
}

template <int ACT>
static void act_bf16_t(uint16_t* y, int64_t n) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    #pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = f32_to_bf16(act_f(bf16_to_f32(y[i]), ACT));
  }
}

extern "C" void conv_act_f32(float* y, int64_t n, int act) {
  if (act == 1) act_f32_t<1>(y, n);
  else if (act == 2) act_f32_t<2>(y, n);
  else if (act == 3) act_f32_t<3>(y, n);
  else if (act == 4) act_f32_t<4>(y, n);
}

extern "C" void conv_act_bf16(uint16_t* y, int64_t n, int act) {
  if (act == 1) act_bf16_t<1>(y, n);
  else if (act == 2) act_bf16_t<2>(y, n);
  else if (act == 3) act_bf16_t<3>(y, n);
  else if (act == 4) act_bf16_t<4>(y, n);
}
"""


def conv_bn_act_prepare(conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var, eps):
    scale = bn_weight.double() * (running_var.double() + eps).rsqrt()
    shift = bn_bias.double() - running_mean.double() * scale
    if conv_bias is not None:
        shift = shift + conv_bias.double() * scale
    weight = (conv_weight.double() * scale.reshape(-1, 1, 1, 1)).to(conv_weight.dtype)
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
    if code == 0 or y.numel() == 0:
        return y
    flat = y
    if y.dim() == 4 and not y.is_contiguous() and y.is_contiguous(memory_format=torch.channels_last):
        flat = y.permute(0, 2, 3, 1)  # the same memory, dense: the activation is elementwise
    if y.dtype == torch.float32 and flat.is_contiguous():
        lib.conv_act_f32(flat, y.numel(), code)
    elif y.dtype == torch.bfloat16 and flat.is_contiguous():
        lib.conv_act_bf16(flat, y.numel(), code)
    elif code == 1:
        y = F.relu(y)
    elif code == 2:
        y = y.clamp(0.0, 6.0)  # hardtanh's own clamp
    elif code == 3:
        y = y * (y + 3.0).clamp(0.0, 6.0) / 6.0  # hardswish's formula, in its order
    else:
        y = F.silu(y)
    return y
