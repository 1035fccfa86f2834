"""Generate the CPU candidates for level-1 KernelBench problems (activations, softmax, losses).

    python benchmarks/candidates/gen_cpu_level1.py     # rewrites benchmarks/candidates/cpu/L1_<id>_<name>.py

Activations become one OpenMP + SIMD pass over the tensor through ma_vecmath.h (vectorized exp,
tanh, erf, log without libm calls); softmax and log-softmax read a row twice from cache and write it
once, split across threads when there are fewer rows than threads; elementwise losses are one read
of both inputs, summed in double per thread and the partial sums added in a fixed order, so a call
is deterministic. Eager's special-value rules are kept (NaN propagates, softplus's threshold, xlogy's
0 log 0 = 0), since the proof's special-values trial checks NaN and Inf positions exactly.
"""
from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent / "cpu"

OP = r"""
#include <cstdint>
#include "ma_vecmath.h"
static inline float op(float x, float p) {{
    {body}
}}
"""

ELEMENTWISE = OP + r"""extern "C" void ew(const float* __restrict x, float* __restrict y, int64_t n, float p) {{
    #pragma omp parallel for simd schedule(static) if(n > 32768)
    for (int64_t i = 0; i < n; ++i) y[i] = op(x[i], p);
}}
"""

# for ops whose positive branch is cheap (ELU, SELU): blocks without a non-positive element (or NaN)
# skip the exp, as eager's kernels do; on all-positive inputs that is 4x less work
ELEMENTWISE_POSITIVE = OP + r"""static inline float op_positive(float x, float p) {{
    {positive}
}}
extern "C" void ew(const float* __restrict x, float* __restrict y, int64_t n, float p) {{
    #pragma omp parallel for schedule(static) if(n > 32768)
    for (int64_t b = 0; b < n; b += 512) {{
        const int64_t e = b + 512 < n ? b + 512 : n;
        int slow = 0;
        #pragma omp simd reduction(| : slow)
        for (int64_t i = b; i < e; ++i) slow |= !(x[i] > 0.0f);
        if (slow) {{
            #pragma omp simd
            for (int64_t i = b; i < e; ++i) y[i] = op(x[i], p);
        }} else {{
            #pragma omp simd
            for (int64_t i = b; i < e; ++i) y[i] = op_positive(x[i], p);
        }}
    }}
}}
"""

ELEMENTWISE_HOST = '''

def forward(module, x):
    xc = x.contiguous()
    y = torch.empty_like(xc)
    lib.ew(xc, y, xc.numel(), {param})
    return y
'''

# problem: (body of op(x, p), host expression for p); POSITIVE: op for x > 0 where it is cheaper.
# ReLU, LeakyReLU, HardSigmoid, HardTanh and GELU had candidates of this form too; on the 2-core AMD
# EPYC at KernelBench's all-positive inputs (1.5 MB) they ran 0.64-0.81x eager (one memory pass, already
# vectorized by ATen, plus the host call's few microseconds), so they were dropped.
ELEMENTWISE_SPECS = {
    "L1_21_Sigmoid": ("return ma_sigmoidf(x);", "0.0"),
    "L1_22_Tanh": ("return ma_tanhf(x);", "0.0"),
    "L1_25_Swish": ("return x * ma_sigmoidf(x);", "0.0"),
    # torch.selu: scale * (x > 0 ? x : alpha * expm1(x))
    "L1_27_SELU_": ("return x > 0.0f ? x * 1.0507009873554804934f "
                    ": ma_expm1f(x) * (1.6732632423543772848f * 1.0507009873554804934f);", "0.0"),
    # F.softplus(beta=1, threshold=20): x above the threshold is returned as it is
    "L1_29_Softplus": ("return x > 20.0f ? x : ma_log1pf(ma_expf(x));", "0.0"),
    "L1_30_Softsign": ("return x / (1.0f + ma_absf(x));", "0.0"),
    "L1_31_ELU": ("return x > 0.0f ? x : ma_expm1f(x) * p;", "float(module.alpha)"),
    "L1_88_MinGPTNewGelu": ("float u = 0.7978845608028654f * (x + 0.044715f * (x * x * x)); "
                            "return 0.5f * x * (1.0f + ma_tanhf(u));", "0.0"),
}

POSITIVE = {
    "L1_27_SELU_": "return x * 1.0507009873554804934f;",
    "L1_31_ELU": "return x;",
}

SOFTMAX = r"""
#include <cmath>
#include <cstdint>
#include <vector>
#include <omp.h>
#include "ma_vecmath.h"

static inline float row_max(const float* x, int64_t n) {
    float m = -INFINITY;
    #pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}
// y = exp(x - m) (softmax) or nothing written (log-softmax); returns the sum of exp(x - m)
static inline float exp_sum(const float* x, float* y, int64_t n, float m, int log_out) {
    float s = 0.0f;
    if (log_out) {
        #pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; ++i) s += ma_expf(x[i] - m);
    } else {
        #pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; ++i) { float e = ma_expf(x[i] - m); y[i] = e; s += e; }
    }
    return s;
}
static inline void finish(const float* x, float* y, int64_t n, float m, float s, int log_out) {
    if (log_out) {
        const float ls = ma_logf(s);
        #pragma omp simd
        for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
    } else {
        const float r = 1.0f / s;
        #pragma omp simd
        for (int64_t i = 0; i < n; ++i) y[i] = y[i] * r;
    }
}

// softmax / log-softmax over the last dimension of a (rows, n) tensor. With at least as many rows
// as threads a thread takes whole rows; otherwise the threads split each row and combine their
// maxima and sums (in thread order, so the result does not depend on timing).
extern "C" void softmax_rows(const float* __restrict x, float* __restrict y, int64_t rows, int64_t n, int log_out) {
    std::vector<float> part_m(omp_get_max_threads()), part_s(omp_get_max_threads());
    #pragma omp parallel if(rows * n > 32768)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        if (rows >= nt) {
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; ++r) {
                const float* xr = x + r * n;
                float* yr = y + r * n;
                const float m = row_max(xr, n);
                finish(xr, yr, n, m, exp_sum(xr, yr, n, m, log_out), log_out);
            }
        } else {
            const int64_t chunk = (n + nt - 1) / nt;
            const int64_t lo = t * chunk < n ? t * chunk : n, hi = lo + chunk < n ? lo + chunk : n;
            for (int64_t r = 0; r < rows; ++r) {
                const float* xr = x + r * n;
                float* yr = y + r * n;
                part_m[t] = row_max(xr + lo, hi - lo);
                #pragma omp barrier
                float m = part_m[0];
                for (int k = 1; k < nt; ++k) m = (part_m[k] > m || part_m[k] != part_m[k]) ? part_m[k] : m;
                part_s[t] = exp_sum(xr + lo, yr + lo, hi - lo, m, log_out);
                #pragma omp barrier
                float s = 0.0f;
                for (int k = 0; k < nt; ++k) s += part_s[k];
                finish(xr + lo, yr + lo, hi - lo, m, s, log_out);
                #pragma omp barrier
            }
        }
    }
}
"""

SOFTMAX_HOST = '''

def forward(module, x):
    assert x.dim() == 2
    xc = x.contiguous()
    y = torch.empty_like(xc)
    lib.softmax_rows(xc, y, xc.shape[0], xc.shape[1], {log_out})
    return y
'''

SOFTMAX_SPECS = {"L1_23_Softmax": 0, "L1_24_LogSoftmax": 1}

# loss(a, b) = scale * sum over every element of term(a, b)
REDUCE = r"""
#include <cstdint>
#include <vector>
#include <omp.h>
#include "ma_vecmath.h"
static inline float term(float a, float b) {{
    {body}
}}
extern "C" void loss_sum(const float* __restrict a, const float* __restrict b, float* __restrict out, int64_t n,
                         double scale) {{
    std::vector<double> part(omp_get_max_threads(), 0.0);
    #pragma omp parallel if(n > 32768)
    {{
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t chunk = (n + nt - 1) / nt;
        const int64_t lo = t * chunk < n ? t * chunk : n, hi = lo + chunk < n ? lo + chunk : n;
        // float sums of 1024 terms (vectorized), accumulated in double
        double s = 0.0;
        for (int64_t i0 = lo; i0 < hi; i0 += 1024) {{
            const int64_t i1 = i0 + 1024 < hi ? i0 + 1024 : hi;
            float f = 0.0f;
            #pragma omp simd reduction(+ : f)
            for (int64_t i = i0; i < i1; ++i) f += term(a[i], b[i]);
            s += f;
        }}
        part[t] = s;
    }}
    double s = 0.0;
    for (double p : part) s += p;
    out[0] = (float)(s * scale);
}}
"""

REDUCE_HOST = '''

def forward(module, predictions, targets):
    a = predictions.contiguous()
    b = targets.contiguous()
    assert a.shape == b.shape
    out = torch.empty((), dtype=a.dtype)
    lib.loss_sum(a, b, out, a.numel(), {scale})
    return out
'''

# problem: (body of term(a, b), host expression for the scale)
REDUCE_SPECS = {
    "L1_94_MSELoss": ("const float d = a - b; return d * d;", "1.0 / a.numel()"),
    "L1_96_HuberLoss": ("const float z = ma_absf(a - b); return z < 1.0f ? 0.5f * z * z : z - 0.5f;",
                        "1.0 / a.numel()"),
    # kl_div(log(p), t, 'batchmean') = sum(xlogy(t, t) - t * log(p)) / p.shape[0]
    "L1_98_KLDivLoss": ("const float xl = b == 0.0f ? 0.0f : b * ma_logf(b); return xl - b * ma_logf(a);",
                        "1.0 / a.shape[0]"),
}


def _doc(name: str, what: str) -> str:
    return f'"""{name.split("_", 2)[2]}: {what}.\nGenerated by benchmarks/candidates/gen_cpu_level1.py."""\n'


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (body, param) in ELEMENTWISE_SPECS.items():
        template = ELEMENTWISE_POSITIVE if name in POSITIVE else ELEMENTWISE
        src = template.format(body=body.replace("; ", ";\n    "), positive=POSITIVE.get(name, ""))
        (OUT / f"{name}.py").write_text(_doc(name, "one vectorized, multi-threaded pass") + f'SOURCE = r"""{src}"""\n'
                                        "SHAPE_GENERIC = True\n" + ELEMENTWISE_HOST.format(param=param))
    for name, log_out in SOFTMAX_SPECS.items():
        (OUT / f"{name}.py").write_text(_doc(name, "two reads of each row from cache, one write")
                                        + f'SOURCE = r"""{SOFTMAX}"""\nSHAPE_GENERIC = True\n'
                                        + SOFTMAX_HOST.format(log_out=log_out))
    for name, (body, scale) in REDUCE_SPECS.items():
        src = REDUCE.format(body=body.replace("; ", ";\n    "))
        (OUT / f"{name}.py").write_text(_doc(name, "one read of both inputs, deterministic sum")
                                        + f'SOURCE = r"""{src}"""\nSHAPE_GENERIC = True\n'
                                        + REDUCE_HOST.format(scale=scale))
    count = len(ELEMENTWISE_SPECS) + len(SOFTMAX_SPECS) + len(REDUCE_SPECS)
    print(f"wrote {count} candidates to {OUT}")


if __name__ == "__main__":
    main()
