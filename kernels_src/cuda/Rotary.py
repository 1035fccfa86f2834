SOURCE = r"""
// Rotary embedding, "rotate half": out = x * cos + cat(-x2, x1) * sin, x (B, H, S, D), cos/sin (S, D).
// One thread per pair (j, j + D/2): both halves are read once and written once.
extern "C" __global__ void __launch_bounds__(256) rotary(const float* __restrict__ x, const float* __restrict__ cs,
        const float* __restrict__ sn, float* __restrict__ out, long long rows, int S, int D) {
    const int h = D >> 1;
    const long long total = rows * h;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / h;
        const int j = (int)(i - r * h);
        const int s = (int)(r % S);
        const float* xr = x + r * D;
        const float x1 = xr[j], x2 = xr[j + h];
        const float* c = cs + (long long)s * D;
        const float* t = sn + (long long)s * D;
        // products rounded on their own (no FMA contraction), as eager's separate mul and add do: a
        // contracted a*b+c keeps an overflowing product finite where eager gets Inf - Inf = NaN
        out[r * D + j] = __fadd_rn(__fmul_rn(x1, c[j]), __fmul_rn(-x2, t[j]));
        out[r * D + j + h] = __fadd_rn(__fmul_rn(x2, c[j + h]), __fmul_rn(x1, t[j + h]));
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x, cos, sin):
    xc = x.contiguous()
    out = torch.empty_like(xc)
    D = xc.shape[-1]
    S = xc.shape[-2]
    rows = xc.numel() // D
    assert cos.shape == (S, D) and sin.shape == (S, D)
    total = rows * (D // 2)
    lib.rotary(xc, cos.contiguous(), sin.contiguous(), out, rows, S, D, grid=(min((total + 255) // 256, 132 * 32),),
               block=(256,))
    return out
