"""Generate the CUDA candidates of the "main op + elementwise epilogue" KernelBench problems.

    python benchmarks/candidates/gen_cuda_epilogues.py      # rewrites benchmarks/candidates/cuda/<name>.py

Each candidate runs the main op (cuDNN/cuBLAS through F.conv*/F.linear) and then ONE fused epilogue
kernel instead of eager's chain of elementwise kernels. A convolution runs channels-last (NHWC), where
cuDNN's tensor-core kernels were 1.1-2.6x faster than the NCHW ones eager gets on 42 of the 45 level-2
convolutions on the H100 (docs/cuda/h100_conv_layout_run1.txt; the rule below leaves out the few
slower ones and those whose channels-last kernels lose eager's precision), and the epilogue transposes back to NCHW through shared memory as it writes. The epilogue
reproduces PyTorch's CUDA formulas op by op (same order, NaN-propagating clamp/min/relu, exact
erf GELU), so it also matches on NaN/Inf inputs. The tensor is seen as P planes of L elements:
per-channel parameters are indexed by plane (conv outputs) or by column (linear outputs).
"""
from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent / "cuda"

HELPERS = r"""
__device__ __forceinline__ float ma_isnan(float x) { return x != x; }
__device__ __forceinline__ float ma_relu(float x) { return ma_isnan(x) ? x : fmaxf(x, 0.0f); }
__device__ __forceinline__ float ma_clamp(float x, float lo, float hi) { return ma_isnan(x) ? x : fminf(fmaxf(x, lo), hi); }
__device__ __forceinline__ float ma_minimum(float x, float c) { return ma_isnan(x) ? x : fminf(x, c); }
__device__ __forceinline__ float ma_leaky(float x, float s) { return x > 0.0f ? x : x * s; }
__device__ __forceinline__ float ma_gelu(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f)); }
__device__ __forceinline__ float ma_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float ma_mish(float x) { return x * tanhf(log1pf(expf(x))); }
__device__ __forceinline__ float ma_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float ma_hardswish(float x) { return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; }
"""

KERNELS = r"""
// y viewed as P planes of L elements; per-channel parameters by PARAM_INDEX.
__device__ __forceinline__ float epi_op(float v, int c, float a{param_args}{scalar_args}) {{
{body}
}}

extern "C" __global__ void __launch_bounds__(256) epi_v4(const float* __restrict__ y, const float* __restrict__ aux,
        float* __restrict__ out{param_decl}{scalar_decl}, int P, int L, int C, int has_aux) {{
    const int L4 = L >> 2;
    for (int p = blockIdx.y; p < P; p += gridDim.y) {{
        const long long base = (long long)p * L;
        const float4* yv = reinterpret_cast<const float4*>(y + base);
        const float4* av = reinterpret_cast<const float4*>(aux + (has_aux ? base : 0));
        float4* ov = reinterpret_cast<float4*>(out + base);
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < L4; j += gridDim.x * blockDim.x) {{
            float4 v = yv[j];
            float4 a = has_aux ? av[j] : make_float4(0.f, 0.f, 0.f, 0.f);
            const int l = j << 2;
            v.x = epi_op(v.x, {cidx0}, a.x{param_pass}{scalar_pass});
            v.y = epi_op(v.y, {cidx1}, a.y{param_pass}{scalar_pass});
            v.z = epi_op(v.z, {cidx2}, a.z{param_pass}{scalar_pass});
            v.w = epi_op(v.w, {cidx3}, a.w{param_pass}{scalar_pass});
            ov[j] = v;
        }}
    }}
}}

// y channels-last, viewed as N x S x C (S spatial positions); out N x C x S. One 32 x 32 tile of
// (position, channel) per block, read along C and written along S.
extern "C" __global__ void __launch_bounds__(256) epi_cl(const float* __restrict__ y, const float* __restrict__ aux,
        float* __restrict__ out{param_decl}{scalar_decl}, int S, int C, int has_aux) {{
    __shared__ float tile[32][33];
    const long long nb = (long long)blockIdx.z * S * C;
    const int s0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {{
        const int sp = s0 + i, ch = c0 + threadIdx.x;  // not s, c: a scalar parameter may be named s
        if (sp < S && ch < C) tile[i][threadIdx.x] = y[nb + (long long)sp * C + ch];
    }}
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {{
        const int ch = c0 + i, sp = s0 + threadIdx.x;
        if (sp < S && ch < C) {{
            const long long o = nb + (long long)ch * S + sp;
            const float a = has_aux ? aux[o] : 0.0f;
            out[o] = epi_op(tile[threadIdx.x][i], ch, a{param_pass}{scalar_pass});
        }}
    }}
}}

extern "C" __global__ void __launch_bounds__(256) epi_v1(const float* __restrict__ y, const float* __restrict__ aux,
        float* __restrict__ out{param_decl}{scalar_decl}, int P, int L, int C, int has_aux) {{
    for (int p = blockIdx.y; p < P; p += gridDim.y) {{
        const long long base = (long long)p * L;
        for (int l = blockIdx.x * blockDim.x + threadIdx.x; l < L; l += gridDim.x * blockDim.x) {{
            const float a = has_aux ? aux[base + l] : 0.0f;
            out[base + l] = epi_op(y[base + l], {cidx}, a{param_pass}{scalar_pass});
        }}
    }}
}}
"""

HOST = '''

def forward(module, {inputs}):
{main}{channels_last}
    P = {planes}
    L = y.numel() // max(P, 1)
    out = torch.empty_like(y)
    aux = {aux}
    if L % 4 == 0:
        gx = min((L // 4 + 255) // 256, 64)
        lib.epi_v4(y, aux, out{param_host}{scalar_host}, P, L, {channels}, {has_aux}, grid=(gx, min(P, 65535)), block=(256,))
    else:
        gx = min((L + 255) // 256, 64)
        lib.epi_v1(y, aux, out{param_host}{scalar_host}, P, L, {channels}, {has_aux}, grid=(gx, min(P, 65535)), block=(256,))
    return out
'''

# conv mains: channels-last when it pays and keeps eager's precision (from 8 input channels in 3-D, 16 in 2-D:
# with 3 input channels cuDNN's NDHWC kernels round like TF32 where its NCDHW ones do not, and the proof
# rejected them on the H100), the NHWC epilogue when
# cuDNN returned channels-last (it may not, e.g. for one output channel); else the plain path on NCHW.
CHANNELS_LAST = '''
    n_out, c_out = y.shape[0], y.shape[1]
    s_out = y.numel() // max(n_out * c_out, 1)
    if nhwc and c_out > 1 and n_out <= 65535 and y.is_contiguous(memory_format=fmt):
        out = torch.empty(y.shape, device=y.device, dtype=y.dtype)
        yn = y.permute(0, 2, 3, 1) if y.dim() == 4 else y.permute(0, 2, 3, 4, 1)
        lib.epi_cl(yn, {aux}, out{param_host}{scalar_host}, s_out, c_out, {has_aux}, grid=((s_out + 31) // 32, (c_out + 31) // 32, n_out), block=(32, 8))
        return out
    y = y.contiguous()'''

LAYOUT = ("    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d\n"
          "    nhwc = x.shape[1] >= (8 if x.dim() == 5 else 16)\n"
          "    xin = x.contiguous(memory_format=fmt) if nhwc else x\n"
          "    w = module.{m}.weight.contiguous(memory_format=fmt) if nhwc else module.{m}.weight\n"
          "    cb = module.{m}.bias if module.{m}.bias is not None else torch.zeros(module.{m}.out_channels, "
          "device=x.device, dtype=x.dtype)\n")

MAIN = {
    "conv2d": LAYOUT + "    y = F.conv2d(xin, w, None, module.{m}.stride, module.{m}.padding, "
              "module.{m}.dilation, module.{m}.groups)",
    "conv3d": LAYOUT + "    y = F.conv3d(xin, w, None, module.{m}.stride, module.{m}.padding, "
              "module.{m}.dilation, module.{m}.groups)",
    "conv_transpose2d": LAYOUT + "    y = F.conv_transpose2d(xin, w, None, module.{m}.stride, "
                        "module.{m}.padding, module.{m}.output_padding, module.{m}.groups, module.{m}.dilation)",
    "conv_transpose3d": LAYOUT + "    y = F.conv_transpose3d(xin, w, None, module.{m}.stride, "
                        "module.{m}.padding, module.{m}.output_padding, module.{m}.groups, module.{m}.dilation)",
    "linear": "    y = F.linear(x, module.{m}.weight, module.{m}.bias)",
}

# name: (main op, main submodule, [(param, host expr)], [(scalar, host expr)], body using v, c, a, params, scalars)
SPECS = {
    "Conv2D_ReLU_BiasAdd": ("conv2d", "conv", [("bias", "module.bias")], [],
                            "return ma_relu(v) + bias[c];"),
    "ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide": (
        "conv_transpose2d", "conv_transpose", [("bias", "module.bias")], [("s", "float(module.scaling_factor)")],
        "v = v + bias[c]; v = ma_clamp(v, 0.0f, 1.0f); v = v * s; v = ma_clamp(v, 0.0f, 1.0f); return v / s;"),
    "Conv2d_Mish_Mish": ("conv2d", "conv", [], [], "return ma_mish(ma_mish(v));"),
    "ConvTranspose2d_Subtract_Tanh": ("conv_transpose2d", "conv_transpose", [("bias", "module.bias")], [],
                                      "return tanhf(v - bias[c]);"),
    "Conv3d_ReLU_LeakyReLU_GELU_Sigmoid_BiasAdd": (
        "conv3d", "conv", [("bias", "module.bias")], [],
        "v = ma_relu(v); v = ma_leaky(v, 0.01f); v = ma_gelu(v); v = ma_sigmoid(v); return v + bias[c];"),
    "ConvTranspose2d_Mish_Add_Hardtanh_Scaling": (
        "conv_transpose2d", "conv_transpose", [], [("add", "float(module.add_value)"), ("s", "float(module.scale)")],
        "v = ma_mish(v); v = v + add; v = ma_clamp(v, -1.0f, 1.0f); return v * s;"),
    "ConvTranspose3d_Sum_ResidualAdd_Multiply_ResidualAdd": (
        "conv_transpose3d", "conv_transpose", [("bias", "module.bias")], [],
        "const float o = v; float t = v + bias[c]; t = t + o; t = t * o; return t + o;"),
    "ConvTranspose3d_Add_HardSwish": ("conv_transpose3d", "conv_transpose", [], [],
                                      "const float t = v + a; return t * ma_hardswish(t);"),
    "Conv2d_Min_Add_Multiply": ("conv2d", "conv", [("bias", "module.bias")],
                                [("cv", "float(module.constant_value)"), ("s", "float(module.scaling_factor)")],
                                "v = ma_minimum(v, cv); v = v + bias[c]; return v * s;"),
    "Conv3d_Mish_Tanh": ("conv3d", "conv", [], [], "return tanhf(ma_mish(v));"),
    "Conv3d_Scaling_Tanh_Multiply_Sigmoid": (
        "conv3d", "conv", [("scale", "module.scaling_factor"), ("bias", "module.bias")], [],
        "v = v * scale[c]; v = tanhf(v); v = v * bias[c]; return ma_sigmoid(v);"),
    "Conv2d_Activation_BatchNorm": (
        "conv2d", "conv", [("rm", "module.bn.running_mean"), ("rv", "module.bn.running_var"),
                           ("w", "module.bn.weight"), ("b", "module.bn.bias")], [("eps", "float(module.bn.eps)")],
        "v = tanhf(ma_softplus(v)) * v; return (v - rm[c]) / sqrtf(rv[c] + eps) * w[c] + b[c];"),
    "Conv2d_Multiply_LeakyReLU_GELU": ("conv2d", "conv", [("m", "module.multiplier")], [],
                                       "v = v * m[c]; v = ma_leaky(v, 0.01f); return ma_gelu(v);"),
    "Conv2d_ReLU_HardSwish": ("conv2d", "conv", [], [],
                              "v = ma_relu(v); return v * ma_clamp((v + 3.0f) / 6.0f, 0.0f, 1.0f);"),
    # GEMM-bound: the fp32 GEMM is >95% of eager's time, so these are expected to be rejected as not faster
    "Gemm_Multiply_LeakyReLU": ("linear", "gemm", [], [("mul", "float(module.multiplier)"),
                                                      ("slope", "float(module.leaky_relu.negative_slope)")],
                                "v = v * mul; return ma_leaky(v, slope);"),
    "Matmul_Scaling_ResidualAdd": ("linear", "matmul", [], [("s", "float(module.scaling_factor)")],
                                   "const float o = v; v = v * s; return v + o;"),
}


def render(name: str, spec: tuple) -> str:
    main, sub, params, scalars, body = spec
    per_col = main == "linear"
    if not per_col:  # the conv's own bias, added first: as torch adds a cuDNN conv's bias, in a kernel of its own
        params, body = [("cb", "cb")] + params, "v = v + cb[c]; " + body
    cidx = "l" if per_col else "c"
    kernel = KERNELS.format(
        param_args="".join(f", const float* __restrict__ {p}" for p, _ in params),
        scalar_args="".join(f", float {s}" for s, _ in scalars),
        body="    " + body.replace("; ", ";\n    "),
        param_decl="".join(f", const float* __restrict__ {p}" for p, _ in params),
        scalar_decl="".join(f", float {s}" for s, _ in scalars),
        param_pass="".join(f", {p}" for p, _ in params), scalar_pass="".join(f", {s}" for s, _ in scalars),
        cidx=cidx, cidx0="l" if per_col else "c", cidx1="l + 1" if per_col else "c",
        cidx2="l + 2" if per_col else "c", cidx3="l + 3" if per_col else "c")
    if per_col:  # a linear output has no channels-last layout
        kernel = kernel[:kernel.index("// y channels-last")] + kernel[kernel.index('extern "C" __global__ void __launch_bounds__(256) epi_v1('):]
    kernel = kernel.replace("for (int p = blockIdx.y; p < P; p += gridDim.y) {\n",
                            "for (int p = blockIdx.y; p < P; p += gridDim.y) {\n        const int c = " +
                            ("0; (void)c;\n" if per_col else "p % C;\n"))
    aux_input = name == "ConvTranspose3d_Add_HardSwish"
    aux = "add_input.contiguous()" if aux_input else "y"
    aux_cl = "add_input.contiguous()" if aux_input else "yn"  # no aux: any contiguous tensor, never read
    param_host = "".join(f", {h}" for _, h in params)
    scalar_host = "".join(f", {h}" for _, h in scalars)
    host = HOST.format(
        inputs="x, add_input" if aux_input else "x",
        main=MAIN[main].format(m=sub),
        channels_last="" if per_col else CHANNELS_LAST.format(
            aux=aux_cl, param_host=param_host, scalar_host=scalar_host, has_aux=1 if aux_input else 0),
        planes="y.shape[0]" if per_col else "y.shape[0] * y.shape[1]",
        aux=aux, param_host=param_host, scalar_host=scalar_host,
        channels="y.shape[1]" if not per_col else "1", has_aux=1 if aux_input else 0)
    how = "cuBLAS, as eager" if per_col else "cuDNN, channels-last"
    doc = (f'"""{name}: {main} through PyTorch ({how}), then one fused epilogue kernel.\n'
           f'Generated by benchmarks/candidates/gen_cuda_epilogues.py."""\n')
    return doc + 'SOURCE = r"""\n#include <cstdint>\n' + HELPERS + KERNELS_HEAD + kernel + '"""' + HOST_HEAD + host


KERNELS_HEAD = ""
HOST_HEAD = "\nSHAPE_GENERIC = True\n"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, spec in SPECS.items():
        (OUT / f"{name}.py").write_text(render(name, spec))
    print(f"wrote {len(SPECS)} candidates to {OUT}")


if __name__ == "__main__":
    main()
