"""Generate the CPU candidates of the "convolution + elementwise epilogue" KernelBench problems.

    python benchmarks/candidates/gen_cpu_epilogues.py      # rewrites benchmarks/candidates/cpu/<name>.py

Each candidate runs its convolution channels-last through PyTorch (oneDNN works on NHWC directly; on
NCHW input it reorders to a blocked layout and back; a noisy side-by-side probe of the convs alone on
the 2-core AMD EPYC had channels-last at 0.3-0.7x the NCHW time, but through the pipeline, layout
conversions counted, most 2-D problems gained nothing: docs/benchmarks.md), and applies the whole
elementwise chain in one multi-threaded pass instead of eager's one pass per op. Where oneDNN returns
channels-last, that pass also writes the NCHW result (`epi_cl`, tile by tile), so no separate
conversion pass and no intermediate NCHW tensor; otherwise it runs over NCHW, vectorized (`epi`).
The chains are the CUDA generator's (gen_cuda_epilogues.SPECS: one statement of each problem's
formula, op by op in eager's order); the helpers below follow ATen's CPU formulas (NaN-propagating
clamp/min/relu, erf GELU, sigmoid as 1 / (1 + exp(-x))), with exp, tanh, erf and log1p from
ma_vecmath.h. GEMM problems are left out: their epilogue is under 5% of eager's time.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_cuda_epilogues import SPECS  # noqa: E402  (the per-problem formulas, shared with CUDA)

OUT = Path(__file__).resolve().parent / "cpu"

HELPERS = r"""
#include <cmath>
#include <cstdint>
#include "ma_vecmath.h"
static inline float ma_relu(float x) { return x <= 0.0f ? 0.0f : x; }
static inline float ma_clamp(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }
static inline float ma_minimum(float x, float c) { return x > c ? c : x; }
static inline float ma_leaky(float x, float s) { return x > 0.0f ? x : x * s; }
static inline float ma_gelu(float x) { return x * 0.5f * (1.0f + ma_erff(x * 0.70710678118654752440f)); }
static inline float ma_sigmoid(float x) { return 1.0f / (1.0f + ma_expf(-x)); }
static inline float ma_mish(float x) { return x * ma_tanhf(ma_log1pf(ma_expf(x))); }
static inline float ma_softplus(float x) { return x > 20.0f ? x : ma_log1pf(ma_expf(x)); }
static inline float ma_hardswish(float x) {
    float t = x + 3.0f;
    t = t < 0.0f ? 0.0f : t;
    t = t > 6.0f ? 6.0f : t;
    return x * t / 6.0f;
}
"""

KERNEL = r"""
static inline float epi_op(float v, int64_t c, float a{param_args}{scalar_args}) {{
{body}
}}

// y and out: P = N x C planes of L elements (NCHW); per-channel parameters indexed by p % C
extern "C" void epi(const float* __restrict y, const float* __restrict aux, float* __restrict out{param_args}{scalar_args},
                    int64_t P, int64_t L, int64_t C, int has_aux) {{
    #pragma omp parallel for schedule(static) if(P * L > 32768)
    for (int64_t p = 0; p < P; ++p) {{
        const int64_t c = p % C;
        const float* yp = y + p * L;
        const float* ap = aux + (has_aux ? p * L : 0);
        float* op = out + p * L;
        if (has_aux) {{
            #pragma omp simd
            for (int64_t l = 0; l < L; ++l) op[l] = epi_op(yp[l], c, ap[l]{param_pass}{scalar_pass});
        }} else {{
            #pragma omp simd
            for (int64_t l = 0; l < L; ++l) op[l] = epi_op(yp[l], c, 0.0f{param_pass}{scalar_pass});
        }}
    }}
}}

// y channels-last (N x L x C), out NCHW (N x C x L): the layout change and the chain in one pass, a tile
// of TILE positions at a time (the tile's C x TILE inputs stay in L1 while each channel's row is written)
extern "C" void epi_cl(const float* __restrict y, const float* __restrict aux, float* __restrict out{param_args}{scalar_args},
                       int64_t N, int64_t L, int64_t C, int has_aux) {{
    const int64_t TILE = 64, tiles = (L + TILE - 1) / TILE;
    #pragma omp parallel for schedule(static) if(N * L * C > 32768)
    for (int64_t t = 0; t < N * tiles; ++t) {{
        const int64_t n = t / tiles, l0 = (t % tiles) * TILE, l1 = l0 + TILE < L ? l0 + TILE : L;
        const float* yn = y + n * L * C;
        for (int64_t c = 0; c < C; ++c) {{
            float* op = out + (n * C + c) * L;
            const float* ap = aux + (has_aux ? (n * C + c) * L : 0);
            for (int64_t l = l0; l < l1; ++l)
                op[l] = epi_op(yn[l * C + c], c, has_aux ? ap[l] : 0.0f{param_pass}{scalar_pass});
        }}
    }}
}}
"""

HOST = '''
SHAPE_GENERIC = True


def forward(module, {inputs}):
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    w = module.{m}.weight.contiguous(memory_format=fmt)
    cb = module.{m}.bias if module.{m}.bias is not None else torch.zeros(module.{m}.out_channels, dtype=x.dtype)
    y = {conv}(x.contiguous(memory_format=fmt), w, None, {conv_args})
    out = torch.empty(y.shape, dtype=y.dtype)
    n, c, spatial = y.shape[0], y.shape[1], y.numel() // max(y.shape[0] * y.shape[1], 1)
    if y.is_contiguous(memory_format=fmt) and not y.is_contiguous():  # oneDNN kept channels-last
        yl = y.permute(0, 2, 3, 1) if y.dim() == 4 else y.permute(0, 2, 3, 4, 1)  # the same memory, NHWC
        lib.epi_cl(yl, {aux_cl}, out, cb{param_host}{scalar_host}, n, spatial, c, {has_aux})
    else:
        y = y.contiguous()
        lib.epi(y, {aux}, out, cb{param_host}{scalar_host}, n * c, spatial, c, {has_aux})
    return out
'''

CONV_ARGS = {
    "conv2d": ("F.conv2d", "module.{m}.stride, module.{m}.padding, module.{m}.dilation, module.{m}.groups"),
    "conv3d": ("F.conv3d", "module.{m}.stride, module.{m}.padding, module.{m}.dilation, module.{m}.groups"),
    "conv_transpose2d": ("F.conv_transpose2d", "module.{m}.stride, module.{m}.padding, module.{m}.output_padding, "
                                               "module.{m}.groups, module.{m}.dilation"),
    "conv_transpose3d": ("F.conv_transpose3d", "module.{m}.stride, module.{m}.padding, module.{m}.output_padding, "
                                               "module.{m}.groups, module.{m}.dilation"),
}


def render(name: str, spec: tuple) -> str:
    main, sub, params, scalars, body = spec
    params = [("cb", "cb")] + params  # the conv's own bias, added first, as eager's conv does before the chain
    body = "v = v + cb[c]; " + body.replace("tanhf(", "ma_tanhf(")
    kernel = KERNEL.format(
        param_args="".join(f", const float* __restrict {p}" for p, _ in params),
        scalar_args="".join(f", float {s}" for s, _ in scalars),
        param_pass="".join(f", {p}" for p, _ in params), scalar_pass="".join(f", {s}" for s, _ in scalars),
        body="    " + body.replace("; ", ";\n    "))
    aux_input = name == "ConvTranspose3d_Add_HardSwish"
    conv, conv_args = CONV_ARGS[main]
    host = HOST.format(inputs="x, add_input" if aux_input else "x", m=sub, conv=conv,
                       conv_args=conv_args.format(m=sub), aux="add_input.contiguous()" if aux_input else "y",
                       aux_cl="add_input.contiguous()" if aux_input else "yl",
                       param_host="".join(f", {h}" for p, h in params if p != "cb"),
                       scalar_host="".join(f", {h}" for _, h in scalars), has_aux=1 if aux_input else 0)
    doc = (f'"""{name}: {main} channels-last through PyTorch (oneDNN), then one fused epilogue pass.\n'
           'Generated by benchmarks/candidates/gen_cpu_epilogues.py."""\n')
    return doc + 'SOURCE = r"""' + HELPERS + kernel + '"""\n' + host


# left out: on "large" inputs (x 64) the channels-last 3-D conv's other summation order put 5 of 55,296
# outputs of tanh(mish(conv)) outside the proof's tolerance, beyond twice eager's own error there
LEFT_OUT = {"Conv3d_Mish_Tanh"}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    convs = {name: spec for name, spec in SPECS.items() if spec[0] in CONV_ARGS and name not in LEFT_OUT}
    for name, spec in convs.items():
        (OUT / f"{name}.py").write_text(render(name, spec))
    print(f"wrote {len(convs)} candidates to {OUT}")


if __name__ == "__main__":
    main()
