"""Generate the CUDA candidates for level-1 KernelBench problems that eager runs as several kernels.

    python benchmarks/candidates/gen_cuda_level1.py     # rewrites benchmarks/candidates/cuda/L1_<id>_<name>.py

Elementwise chains become one vectorized pass; means of elementwise losses become one read of the
inputs with a deterministic two-stage reduction (per-block partial sums in double, then one block
sums them in a fixed order). Files carry the L1_<id>_ prefix so they never match a submodule's class.
"""
from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent / "cuda"

ELEMENTWISE = r"""
__device__ __forceinline__ float op(float x) {{
    {body}
}}
extern "C" __global__ void __launch_bounds__(256) ew_v4(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {{
        float4 v = x[i];
        v.x = op(v.x); v.y = op(v.y); v.z = op(v.z); v.w = op(v.w);
        y[i] = v;
    }}
}}
extern "C" __global__ void __launch_bounds__(256) ew_v1(const float* __restrict__ x, float* __restrict__ y, long long n) {{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = op(x[i]);
}}
"""

ELEMENTWISE_HOST = '''

def forward(module, x):
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n = xc.numel()
    if n % 4 == 0 and xc.storage_offset() % 4 == 0:
        lib.ew_v4(xc, y, n // 4, grid=(min((n // 4 + 255) // 256, 132 * 16),), block=(256,))
    else:
        lib.ew_v1(xc, y, n, grid=(min((n + 255) // 256, 132 * 16),), block=(256,))
    return y
'''

# loss(a, b) summed over every element, then times `scale` (host expression)
REDUCE = r"""
#include <cmath>
__device__ __forceinline__ float term(float a, float b) {{
    {body}
}}
// stage 1: a fixed grid of blocks, each a grid-stride partial sum in double
extern "C" __global__ void __launch_bounds__(256) partial_sums(const float* __restrict__ a, const float* __restrict__ b,
                                                              double* __restrict__ part, long long n) {{
    __shared__ double sh[8];
    double s = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        s += (double)term(a[i], b[i]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {{ double t = 0.0; for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh[w]; part[blockIdx.x] = t; }}
}}
extern "C" __global__ void __launch_bounds__(256) partial_sums_v4(const float4* __restrict__ a, const float4* __restrict__ b,
                                                                 double* __restrict__ part, long long n4) {{
    __shared__ double sh[8];
    double s = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {{
        const float4 x = a[i], y = b[i];
        s += ((double)term(x.x, y.x) + (double)term(x.y, y.y)) + ((double)term(x.z, y.z) + (double)term(x.w, y.w));
    }}
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {{ double t = 0.0; for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh[w]; part[blockIdx.x] = t; }}
}}
// stage 2: one block sums the partials in a fixed order
extern "C" __global__ void __launch_bounds__(256) final_sum(const double* __restrict__ part, float* __restrict__ out,
                                                           int nparts, double scale) {{
    __shared__ double sh[256];
    double s = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {{ if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w]; __syncthreads(); }}
    if (threadIdx.x == 0) out[0] = (float)(sh[0] * scale);
}}
"""

REDUCE_HOST = '''
NPARTS = 1056


def forward(module, predictions, targets):
    a = predictions.contiguous()
    b = targets.contiguous()
    assert a.shape == b.shape
    n = a.numel()
    part = torch.empty(NPARTS, dtype=torch.float64, device=a.device)
    if n % 4 == 0 and a.storage_offset() % 4 == 0 and b.storage_offset() % 4 == 0:
        lib.partial_sums_v4(a, b, part, n // 4, grid=(NPARTS,), block=(256,))
    else:
        lib.partial_sums(a, b, part, n, grid=(NPARTS,), block=(256,))
    out = torch.empty((), dtype=a.dtype, device=a.device)
    lib.final_sum(part, out, NPARTS, {scale}, grid=(1,), block=(256,))
    return out
'''

ELEMENTWISE_SPECS = {
    "L1_25_Swish": "return x * (1.0f / (1.0f + expf(-x)));",
    "L1_30_Softsign": "return x / (1.0f + fabsf(x));",
    "L1_88_MinGPTNewGelu": "const float c = 0.7978845608028654f; "
                           "return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * (x * x * x))));",
}
REDUCE_SPECS = {
    "L1_94_MSELoss": ("const float d = a - b; return d * d;", "1.0 / n"),
    "L1_96_HuberLoss": ("const float z = fabsf(a - b); return z < 1.0f ? 0.5f * z * z : z - 0.5f;", "1.0 / n"),
    # kl_div(log(p), t, 'batchmean') = sum(xlogy(t, t) - t * log(p)) / p.shape[0]
    "L1_98_KLDivLoss": ("const float lp = logf(a); "
                        "const float xl = (b != b) ? b : (b == 0.0f ? 0.0f : b * logf(b)); return xl - b * lp;",
                        "1.0 / a.shape[0]"),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, body in ELEMENTWISE_SPECS.items():
        src = ELEMENTWISE.format(body=body.replace("; ", ";\n    "))
        (OUT / f"{name}.py").write_text(f'"""{name[3:]}: the elementwise chain in one vectorized pass.\n'
                                        'Generated by benchmarks/candidates/gen_cuda_level1.py."""\n'
                                        f'SOURCE = r"""{src}"""\nSHAPE_GENERIC = True\n{ELEMENTWISE_HOST}')
    for name, (body, scale) in REDUCE_SPECS.items():
        src = REDUCE.format(body=body.replace("; ", ";\n    "))
        (OUT / f"{name}.py").write_text(f'"""{name[3:]}: one read of both inputs, deterministic two-stage mean.\n'
                                        'Generated by benchmarks/candidates/gen_cuda_level1.py."""\n'
                                        f'SOURCE = r"""{src}"""\nSHAPE_GENERIC = True\n'
                                        + REDUCE_HOST.format(scale=scale))
    print(f"wrote {len(ELEMENTWISE_SPECS) + len(REDUCE_SPECS)} candidates to {OUT}")


if __name__ == "__main__":
    main()
