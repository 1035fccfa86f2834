SOURCE = r"""
// Conv2d through cuDNN (as eager), then BatchNorm (running statistics) and SiLU fused into one pass.
extern "C" __global__ void __launch_bounds__(256) bn_silu(const float* __restrict__ y, float* __restrict__ out,
        const float* __restrict__ rm, const float* __restrict__ rv, const float* __restrict__ w,
        const float* __restrict__ b, float eps, int P, int L, int C) {
    for (int p = blockIdx.y; p < P; p += gridDim.y) {
        const int c = p % C;
        const float mean = rm[c], den = sqrtf(rv[c] + eps), g = w[c], h = b[c];
        const long long base = (long long)p * L;
        for (int l = blockIdx.x * blockDim.x + threadIdx.x; l < L; l += gridDim.x * blockDim.x) {
            const float t = (y[base + l] - mean) / den * g + h;
            out[base + l] = t / (1.0f + expf(-t));
        }
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv2d(x, module.conv.weight, None, module.conv.stride, module.conv.padding,
                 module.conv.dilation, module.conv.groups)
    out = torch.empty_like(y)
    P = y.shape[0] * y.shape[1]
    L = y.numel() // max(P, 1)
    lib.bn_silu(y, out, module.bn.running_mean, module.bn.running_var, module.bn.weight, module.bn.bias,
                float(module.bn.eps), P, L, y.shape[1], grid=(min((L + 255) // 256, 64), min(P, 65535)), block=(256,))
    return out
