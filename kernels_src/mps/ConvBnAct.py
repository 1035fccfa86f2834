SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// Conv2d stays eager (MPSGraph convolution); BatchNorm with running statistics and SiLU are fused
// into one pass over its output, computed as eager does: alpha = w / sqrt(var + eps),
// beta = b - mean * alpha, t = y * alpha + beta, silu(t) = t / (1 + exp(-t)).
kernel void bn_silu(device const float* y [[buffer(0)]], device float* out [[buffer(1)]],
                    device const float* rm [[buffer(2)]], device const float* rv [[buffer(3)]],
                    device const float* w [[buffer(4)]], device const float* b [[buffer(5)]],
                    constant float& eps [[buffer(6)]], constant uint& L [[buffer(7)]],
                    constant uint& C [[buffer(8)]], uint2 pos [[thread_position_in_grid]]) {
    const uint l = pos.x, p = pos.y;  // position within the plane, plane (n * C + c)
    const uint c = p % C;
    const float alpha = 1.0f / sqrt(rv[c] + eps) * w[c];
    const float beta = b[c] - rm[c] * alpha;
    const ulong i = (ulong)p * L + l;
    const float t = y[i] * alpha + beta;
    out[i] = t / (1.0f + exp(-t));
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv2d(x, module.conv.weight, None, module.conv.stride, module.conv.padding,  # bias=False
                 module.conv.dilation, module.conv.groups).contiguous()
    out = torch.empty_like(y)
    C = y.shape[1]
    planes = y.shape[0] * C
    L = y.numel() // max(planes, 1)
    lib.bn_silu(y, out, module.bn.running_mean, module.bn.running_var, module.bn.weight, module.bn.bias,
                float(module.bn.eps), L, C, threads=(L, planes), group_size=(min(L, 256), 1))
    return out
