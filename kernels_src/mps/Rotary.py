SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// Rotary embedding, "rotate half": out = x * cos + cat(-x2, x1) * sin, x (B, H, S, D), cos/sin (S, D).
// One thread per pair (j, j + D/2): both halves are read once and written once.
kernel void rotary(device const float* x [[buffer(0)]], device const float* cs [[buffer(1)]],
                   device const float* sn [[buffer(2)]], device float* out [[buffer(3)]],
                   constant uint& S [[buffer(4)]], constant uint& D [[buffer(5)]],
                   uint i [[thread_position_in_grid]]) {
    const uint h = D / 2;
    const ulong r = i / h;
    const uint j = i - uint(r) * h;
    const ulong s = (r % S) * D;
    const ulong base = r * D;
    const float x1 = x[base + j], x2 = x[base + j + h];
    out[base + j] = x1 * cs[s + j] + (-x2) * sn[s + j];
    out[base + j + h] = x2 * cs[s + j + h] + x1 * sn[s + j + h];
}
"""
SHAPE_GENERIC = True


def forward(module, x, cos, sin):
    xc = x.contiguous()
    out = torch.empty_like(xc)
    D = xc.shape[-1]
    S = xc.shape[-2]
    assert D % 2 == 0 and cos.shape == (S, D) and sin.shape == (S, D)
    pairs = xc.numel() // 2
    lib.rotary(xc, cos.contiguous(), sin.contiguous(), out, S, D, threads=pairs, group_size=min(pairs, 256))
    return out
