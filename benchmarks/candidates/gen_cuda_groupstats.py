"""Generate the CUDA candidates whose epilogue normalizes over groups (GroupNorm, InstanceNorm, per-plane mean).

    python benchmarks/candidates/gen_cuda_groupstats.py     # rewrites benchmarks/candidates/cuda/<name>.py

The main op runs through PyTorch as eager does; then two kernels replace eager's chain:
`stats` reads the main op's output once and writes per-chunk partial sums of t and t^2 (in
double, fixed order: deterministic), where t = PRE(y, channel) is the elementwise part before
the normalization; `apply` combines a group's partials (every block the same way), recomputes t
and writes POST(t, channel, mean, rstd). A group is a contiguous run of `cpg` channel planes
(GroupNorm) or one plane (InstanceNorm, spatial mean). 2 reads + 1 write of the activation,
where eager makes 2 to 5 passes with a write each.
"""
from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent / "cuda"
CHUNK = 8192  # elements per stats/apply block

HELPERS = r"""
__device__ __forceinline__ float ma_gelu(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f)); }
__device__ __forceinline__ float ma_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float ma_hardswish(float x) { return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; }
"""

KERNELS = r"""
__device__ __forceinline__ float pre_op(float v, int c{pre_args}) {{
    {pre}
}}
__device__ __forceinline__ float post_op(float t, int c, float mean, float rstd{post_args}) {{
    {post}
}}

// y: groups of Lg = cpg * plane elements; grid (chunks, groups); partial[(g * chunks + k) * 2 + {{0,1}}]
extern "C" __global__ void __launch_bounds__(256) stats(const float* __restrict__ y, double* __restrict__ partial,
        int G, int Lg, int plane, int cpg, int C, int chunk{pre_decl}) {{
    __shared__ double sh[2][8];
    for (int g = blockIdx.y; g < G; g += gridDim.y) {{
        const long long base = (long long)g * Lg;
        const int c0 = (g * cpg) % C;
        const int start = blockIdx.x * chunk, stop = min(start + chunk, Lg);
        double s = 0.0, q = 0.0;
        for (int o = start + threadIdx.x; o < stop; o += blockDim.x) {{
            const float t = pre_op(y[base + o], c0 + o / plane{pre_pass});
            s += t; q += (double)t * t;
        }}
        for (int d = 16; d > 0; d >>= 1) {{ s += __shfl_xor_sync(0xffffffffu, s, d); q += __shfl_xor_sync(0xffffffffu, q, d); }}
        __syncthreads();
        if ((threadIdx.x & 31) == 0) {{ sh[0][threadIdx.x >> 5] = s; sh[1][threadIdx.x >> 5] = q; }}
        __syncthreads();
        if (threadIdx.x == 0) {{
            double ts = 0.0, tq = 0.0;
            for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {{ ts += sh[0][w]; tq += sh[1][w]; }}
            partial[((long long)g * gridDim.x + blockIdx.x) * 2] = ts;
            partial[((long long)g * gridDim.x + blockIdx.x) * 2 + 1] = tq;
        }}
    }}
}}

extern "C" __global__ void __launch_bounds__(256) apply(const float* __restrict__ y, const double* __restrict__ partial,
        float* __restrict__ out, int G, int Lg, int plane, int cpg, int C, int chunk, float eps{pre_decl}{post_decl}) {{
    __shared__ float stat[2];
    for (int g = blockIdx.y; g < G; g += gridDim.y) {{
        if (threadIdx.x == 0) {{
            double s = 0.0, q = 0.0;
            for (int k = 0; k < (int)gridDim.x; ++k) {{ s += partial[((long long)g * gridDim.x + k) * 2];
                                                       q += partial[((long long)g * gridDim.x + k) * 2 + 1]; }}
            const double mean = s / Lg;
            const float var = (float)(q / Lg - mean * mean);
            stat[0] = (float)mean;
            stat[1] = rsqrtf(fmaxf(var, 0.0f) + eps);
        }}
        __syncthreads();
        const float mean = stat[0], rstd = stat[1];
        const long long base = (long long)g * Lg;
        const int c0 = (g * cpg) % C;
        const int start = blockIdx.x * chunk, stop = min(start + chunk, Lg);
        for (int o = start + threadIdx.x; o < stop; o += blockDim.x) {{
            const int c = c0 + o / plane;
            out[base + o] = post_op(pre_op(y[base + o], c{pre_pass}), c, mean, rstd{post_pass});
        }}
        __syncthreads();
    }}
}}
"""

HOST = '''

def forward(module, x):
{main}
    N, C = y.shape[0], y.shape[1]
    plane = y.numel() // max(N * C, 1)
    cpg = {cpg}
    G = N * (C // cpg)
    Lg = cpg * plane
    chunks = (Lg + CHUNK - 1) // CHUNK
    partial = torch.empty(G * chunks * 2, dtype=torch.float64, device=y.device)
    out = torch.empty_like(y)
    grid = (chunks, min(G, 65535))
    lib.stats(y, partial, G, Lg, plane, cpg, C, CHUNK{pre_host}, grid=grid, block=(256,))
    lib.apply(y, partial, out, G, Lg, plane, cpg, C, CHUNK, {eps}{pre_host}{post_host}, grid=grid, block=(256,))
    return out
'''

MAIN = {
    "conv2d": "    y = F.conv2d(x, module.{m}.weight, module.{m}.bias, module.{m}.stride, module.{m}.padding, "
              "module.{m}.dilation, module.{m}.groups)",
    "conv_transpose2d": "    y = F.conv_transpose2d(x, module.{m}.weight, module.{m}.bias, module.{m}.stride, "
                        "module.{m}.padding, module.{m}.output_padding, module.{m}.groups, module.{m}.dilation)",
    "conv_transpose3d": "    y = F.conv_transpose3d(x, module.{m}.weight, module.{m}.bias, module.{m}.stride, "
                        "module.{m}.padding, module.{m}.output_padding, module.{m}.groups, module.{m}.dilation)",
}

# name: (main, submodule, cpg host expr, eps host expr, [pre params], pre body, [post params], post body)
SPECS = {
    "Conv2d_InstanceNorm_Divide": (
        "conv2d", "conv", "1", "float(module.instance_norm.eps)", [], "return v;",
        [("d", "float(module.divide_by)", "float")], "return (t - mean) * rstd / d;"),
    "Conv2d_Add_Scale_Sigmoid_GroupNorm": (
        "conv2d", "conv", "C // module.group_norm.num_groups", "float(module.group_norm.eps)",
        [("bias", "module.bias", "ptr"), ("scale", "module.scale", "ptr")],
        "v = v + bias[c]; v = v * scale[c]; return ma_sigmoid(v);",
        [("w", "module.group_norm.weight", "ptr"), ("b", "module.group_norm.bias", "ptr")],
        "return (t - mean) * rstd * w[c] + b[c];"),
    "ConvTranspose2d_GELU_GroupNorm": (
        "conv_transpose2d", "conv_transpose", "C // module.group_norm.num_groups", "float(module.group_norm.eps)", [],
        "return ma_gelu(v);",
        [("w", "module.group_norm.weight", "ptr"), ("b", "module.group_norm.bias", "ptr")],
        "return (t - mean) * rstd * w[c] + b[c];"),
    "ConvTranspose3d_Swish_GroupNorm_HardSwish": (
        "conv_transpose3d", "conv_transpose", "C // module.group_norm.num_groups", "float(module.group_norm.eps)", [],
        "return ma_sigmoid(v) * v;",
        [("w", "module.group_norm.weight", "ptr"), ("b", "module.group_norm.bias", "ptr")],
        "return ma_hardswish((t - mean) * rstd * w[c] + b[c]);"),
    # BN (running stats) then minus the spatial mean: a_c * (y - mean(y)) with a_c = w / sqrt(var + eps)
    "ConvTranspose3d_BatchNorm_Subtract": (
        "conv_transpose3d", "conv_transpose", "1", "0.0", [("rm", "module.batch_norm.running_mean", "ptr"),
                                                           ("rv", "module.batch_norm.running_var", "ptr"),
                                                           ("w", "module.batch_norm.weight", "ptr"),
                                                           ("b", "module.batch_norm.bias", "ptr"),
                                                           ("beps", "float(module.batch_norm.eps)", "float")],
        "return (v - rm[c]) / sqrtf(rv[c] + beps) * w[c] + b[c];", [], "return t - mean;"),
}


def _decl(params: list) -> str:
    return "".join(f", const float* __restrict__ {n}" if k == "ptr" else f", float {n}" for n, _, k in params)


def render(name: str, spec: tuple) -> str:
    main, sub, cpg, eps, pre_p, pre, post_p, post = spec
    kernel = KERNELS.format(pre_args=_decl(pre_p), post_args=_decl(post_p), pre=pre.replace("; ", ";\n    "),
                            post=post.replace("; ", ";\n    "), pre_decl=_decl(pre_p), post_decl=_decl(post_p),
                            pre_pass="".join(f", {n}" for n, _, _ in pre_p),
                            post_pass="".join(f", {n}" for n, _, _ in post_p))
    host = HOST.format(main=MAIN[main].format(m=sub), cpg=cpg, eps=eps,
                       pre_host="".join(f", {h}" for _, h, _ in pre_p), post_host="".join(f", {h}" for _, h, _ in post_p))
    doc = (f'"""{name}: {main} through PyTorch (as eager), then group statistics and the normalizing epilogue '
           f'in two kernels.\nGenerated by benchmarks/candidates/gen_cuda_groupstats.py."""\n')
    return (doc + 'SOURCE = r"""\n#include <cstdint>\n' + HELPERS + kernel + '"""\nSHAPE_GENERIC = True\n'
            f"CHUNK = {CHUNK}\n" + host)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, spec in SPECS.items():
        (OUT / f"{name}.py").write_text(render(name, spec))
    print(f"wrote {len(SPECS)} candidates to {OUT}")


if __name__ == "__main__":
    main()
