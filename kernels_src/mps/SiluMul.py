SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// The gated-MLP epilogue silu(gate) * up in one pass (eager: two kernels and an intermediate).
// silu as eager computes it: x / (1 + exp(-x)).
kernel void silu_mul(device const float* gate [[buffer(0)]], device const float* up [[buffer(1)]],
                     device float* out [[buffer(2)]], constant uint& n [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    if (i < n) {
        const float g = gate[i];
        out[i] = g / (1.0f + exp(-g)) * up[i];
    }
}
"""
SHAPE_GENERIC = True


def forward(module, gate, up):
    g = gate.contiguous()
    u = up.contiguous()
    out = torch.empty_like(g)
    n = g.numel()
    lib.silu_mul(g, u, out, n, threads=n, group_size=min(n, 256))
    return out
