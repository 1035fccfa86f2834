"""conv_bn_act (torchvision's Conv2dNormActivation): act(batch_norm(conv2d(x, w, b), running stats)).

BatchNorm in eval mode is an affine map per output channel, so it is folded into the convolution once per
module state (prepare(), computed in float64 and rounded once to the weight's dtype): w' = w * g / sqrt(v + eps),
b' = beta + (b - mean) * g / sqrt(v + eps). Each call is then one oneDNN convolution with bias (torch's
F.conv2d, as eager runs the convolution) and the activation applied in place over its output in one
vectorized pass (ReLU, ReLU6, Hardswish, SiLU with ma_vecmath.h; none: no pass at all), where eager runs the
convolution, a BatchNorm pass and an activation pass. That is float32. In bfloat16 a weight rounded after folding
errs beyond eager's own rounding where the sum cancels, so the convolution keeps the module's weights and the
BatchNorm (its per-channel map kept in float32 by prepare) and the activation run as one pass in place, each
rounded as eager rounds it. Other dtypes and layouts that are not dense run the same in torch.
"""

DTYPES = ("float32", "bfloat16")  # float16 runs the reference in torch: no CPU kernel for it

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <omp.h>
#include "ma_vecmath.h"
#include "ma_bf16.h"


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


// bfloat16: y = act(round(y * alpha[c] + beta[c])) in place, eager's BatchNorm (alpha, beta in float) and
// activation, each rounded as eager rounds it; c is the channel of each element: (i / inner) % C, where
// inner is H * W (NCHW) or 1 (channels last)
template <int ACT>
static void bn_act_bf16_t(uint16_t* y, const float* alpha, const float* beta, int64_t outer, int64_t C,
                          int64_t inner) {
  if (inner == 1) {
    #pragma omp parallel for schedule(static) if (outer * C > 65536)
    for (int64_t o = 0; o < outer; ++o) {
      uint16_t* row = y + o * C;
      #pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float t = bf16_to_f32(f32_to_bf16(bf16_to_f32(row[c]) * alpha[c] + beta[c]));
        row[c] = f32_to_bf16(ACT == 0 ? t : act_f(t, ACT));
      }
    }
    return;
  }
  #pragma omp parallel for schedule(static) if (outer * C * inner > 65536)
  for (int64_t p = 0; p < outer * C; ++p) {
    uint16_t* plane = y + p * inner;
    const float a = alpha[p % C], b = beta[p % C];
    #pragma omp simd
    for (int64_t i = 0; i < inner; ++i) {
      const float t = bf16_to_f32(f32_to_bf16(bf16_to_f32(plane[i]) * a + b));
      plane[i] = f32_to_bf16(ACT == 0 ? t : act_f(t, ACT));
    }
  }
}

extern "C" void conv_bn_act_bf16(uint16_t* y, const float* alpha, const float* beta, int64_t outer, int64_t C,
                                 int64_t inner, int act) {
  if (act == 1) bn_act_bf16_t<1>(y, alpha, beta, outer, C, inner);
  else if (act == 2) bn_act_bf16_t<2>(y, alpha, beta, outer, C, inner);
  else if (act == 3) bn_act_bf16_t<3>(y, alpha, beta, outer, C, inner);
  else if (act == 4) bn_act_bf16_t<4>(y, alpha, beta, outer, C, inner);
  else bn_act_bf16_t<0>(y, alpha, beta, outer, C, inner);
}

extern "C" void conv_act_f32(float* y, int64_t n, int act) {
  if (act == 1) act_f32_t<1>(y, n);
  else if (act == 2) act_f32_t<2>(y, n);
  else if (act == 3) act_f32_t<3>(y, n);
  else if (act == 4) act_f32_t<4>(y, n);
}
"""


def conv_bn_act_prepare(conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var, eps):
    """float32: (folded weight, folded bias, None, None). Other dtypes: (conv weight, conv bias, alpha, beta), BN's
    per-channel map in float32, since a weight rounded to bfloat16 after folding errs beyond eager's own rounding."""
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
    if y.numel() == 0 or code == 0 and alpha is None:
        return y
    flat = y
    inner = y.shape[2] * y.shape[3] if y.dim() == 4 else 0
    if y.dim() == 4 and not y.is_contiguous() and y.is_contiguous(memory_format=torch.channels_last):
        flat = y.permute(0, 2, 3, 1)  # the same memory, dense
        inner = 1
    if alpha is None and y.dtype == torch.float32 and flat.is_contiguous():
        lib.conv_act_f32(flat, y.numel(), code)
        return y
    if alpha is not None and y.dtype == torch.bfloat16 and flat.is_contiguous() and inner > 0:
        lib.conv_bn_act_bf16(flat, alpha, beta, y.numel() // (y.shape[1] * inner), y.shape[1], inner, code)
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
