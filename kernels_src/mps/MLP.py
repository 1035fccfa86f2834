SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// SwiGLU MLP, down(silu(gate(x)) * up(x)): the three projections stay eager matmuls; the epilogue
// silu(g) * u is one kernel instead of two (and one intermediate fewer). silu as eager: x / (1 + exp(-x)).
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


def forward(module, x):
    g = F.linear(x, module.gate_proj.weight)
    u = F.linear(x, module.up_proj.weight)
    h = torch.empty_like(g)
    n = g.numel()
    lib.silu_mul(g, u, h, n, threads=n, group_size=min(n, 256))
    return F.linear(h, module.down_proj.weight)
