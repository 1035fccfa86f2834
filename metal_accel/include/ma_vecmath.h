/* ma_vecmath.h: vectorizable float32 math for metal_accel CPU kernels.
 *
 * Every function is `static inline`, branch-free (selects only) and free of libm calls, so GCC and
 * Clang vectorize loops that call them (`#pragma omp simd`, or plain -O3), without -ffast-math:
 * range reduction + minimax polynomial (Cephes) + exponent bits built with memcpy.
 *
 *   ma_expf      exp(x)                 max error ~1 ulp; exp(-inf)=0, exp(+inf)=inf, exp(nan)=nan;
 *                                       overflows to inf above ~88.72, subnormal results rounded
 *                                       once from the polynomial, 0 below ~-103.97.
 *   ma_sigmoidf  1 / (1 + exp(-x))      few ulp (also for tiny results, unlike the naive formula)
 *   ma_siluf     x / (1 + exp(-x))      few ulp; silu(-inf) = NaN as in torch
 *   ma_tanhf     tanh(x)                few ulp; saturates to +-1, tanh(+-0)=+-0
 *   ma_erff      erf(x)                 few ulp; saturates to +-1
 *   ma_geluf     0.5 x (1 + erf(x/sqrt2)) (torch's default gelu)
 *   ma_logf      log(x)                 ~1 ulp, subnormal x too; log(+-0) = -inf, log(x < 0) = NaN
 *   ma_log1pf    log(1 + x)             few ulp, also for tiny x (log1pf(x) = x below 2^-24)
 *   ma_expm1f    exp(x) - 1             few ulp, also for tiny x; expm1(-0) = -0
 *
 * Kernels are compiled with -O3 -fno-trapping-math -fno-math-errno -march=native -fopenmp -std=c++17
 * (without -fno-trapping-math GCC keeps the selects scalar on ISAs without masked vector ops, such as
 * AVX2); the header is also valid C99.
 * Cached verdicts of kernels are keyed by their own source, not by this header: keep the results
 * of existing functions stable (add new functions rather than changing old ones).
 */
#ifndef MA_VECMATH_H
#define MA_VECMATH_H

#include <stdint.h>
#include <string.h>

static inline float ma_bits_to_float(int32_t i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

static inline int32_t ma_float_to_bits(float f) {
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}

static inline float ma_absf(float x) { return ma_bits_to_float(ma_float_to_bits(x) & 0x7fffffff); }

/* x with the sign of s (x must be non-negative) */
static inline float ma_with_sign(float x, float s) {
    return ma_bits_to_float(ma_float_to_bits(x) | (ma_float_to_bits(s) & INT32_MIN));
}

/* exp(x) = ma_exp_split(x, &s) * s. x is clamped to [-150, 89] (NaN passes through: comparisons
 * with NaN are false), then x = n ln2 + r, |r| <= ln2/2, exp(r) by the Cephes polynomial, and 2^n
 * applied as two normal factors 2^(n - n/2) (returned) and 2^(n/2) (in *scale): the returned part
 * is normal, so callers may multiply by something else before the final scaling and keep full
 * precision on results that are normal although exp(x) itself is subnormal. */
static inline float ma_exp_split(float x, float* scale) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer (ties to even) */
    float xc = x < -150.0f ? -150.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    float t = xc * 1.44269504088896341f + magic;
    float n = t - magic;
    int32_t ni = ma_float_to_bits(t) - 0x4B400000; /* the integer n, read from t's mantissa */
    float r = xc - n * 0.693359375f;               /* Cody-Waite: ln2 = C1 + C2, n*C1 exact */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t n1 = ni >> 1; /* arithmetic shift: floor(n/2) */
    int32_t n2 = ni - n1; /* n in [-217, 128] -> n1, n2 in [-109, 64]: 2^n1, 2^n2 normal */
    /* (shifts in unsigned: for NaN input ni is arbitrary, and the result is NaN anyway) */
    *scale = ma_bits_to_float((int32_t)((uint32_t)(n1 + 127) << 23));
    return p * ma_bits_to_float((int32_t)((uint32_t)(n2 + 127) << 23));
}

/* exp(x): overflow gives inf, subnormal results are rounded once. */
static inline float ma_expf(float x) {
    float s;
    float m = ma_exp_split(x, &s);
    return m * s;
}

/* sigmoid(x) = 1 / (1 + exp(-x)), evaluated as e / (1 + e), e = exp(-|x|), for x < 0 so that tiny
 * results keep their relative accuracy (torch's formula flushes x < -88.7 to 0). */
static inline float ma_sigmoidf(float x) {
    float e = ma_expf(-ma_absf(x));
    float num = x >= 0.0f ? 1.0f : e; /* NaN: e is NaN */
    return num / (1.0f + e);
}

/* silu(x) = x sigmoid(x), same evaluation as ma_sigmoidf; for x < 0 the numerator x e is scaled
 * last (see ma_exp_split), so results stay accurate down to the subnormals. silu(-inf) is NaN,
 * as in torch (x / (1 + exp(-x)) = -inf / inf). */
static inline float ma_siluf(float x) {
    float s;
    float m = ma_exp_split(-ma_absf(x), &s);
    float e = m * s;
    float num = x >= 0.0f ? x : (x * m) * s;
    num = x < -150.0f ? x * e : num; /* exp clamped, e == 0: -0, or NaN at -inf */
    return num / (1.0f + e);
}

/* tanh(x): odd polynomial (Cephes) for |x| < 0.625, else 1 - 2 / (exp(2|x|) + 1); x's sign applied
 * last, so tanh(-0) = -0 and tanh(+-inf) = +-1 (exp overflows to inf, 2/inf = 0). */
static inline float ma_tanhf(float x) {
    float a = ma_absf(x);
    float z = a * a;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = a + a * (z * p);
    float big = 1.0f - 2.0f / (ma_expf(a + a) + 1.0f);
    return ma_with_sign(a < 0.625f ? small : big, x);
}

/* erf(x): for |x| < 0.875, x + x P(x^2); for |x| >= 0.875, 1 - exp(-h) with h = a + a Q(a) ~
 * -log(erfc(a)), a = min(|x|, 4) (erf(4) rounds to 1 in float). P, Q: weighted least-squares
 * (near-minimax) fits made for this header; relative error of the fits < 1e-8. */
static inline float ma_erff(float x) {
    float a = ma_absf(x);
    float s = x * x;
    float p = -6.2224211e-4f;
    p = p * s + 5.0358716e-3f;
    p = p * s - 2.6793955e-2f;
    p = p * s + 1.1282524e-1f;
    p = p * s - 3.7612557e-1f;
    p = p * s + 1.2837915e-1f;
    float small = x + x * p;
    float t = a > 4.0f ? 4.0f : a; /* NaN stays NaN */
    float q = 9.3648650e-6f;
    q = q * t - 3.0433357e-4f;
    q = q * t + 3.5682761e-3f;
    q = q * t - 2.3607226e-2f;
    q = q * t + 1.0605965e-1f;
    q = q * t + 6.3525689e-1f;
    q = q * t + 1.2862290e-1f;
    float h = t + t * q;
    float big = ma_with_sign(1.0f - ma_expf(-h), x);
    return a < 0.875f ? small : big;
}

static inline float ma_geluf(float x) { return 0.5f * x * (1.0f + ma_erff(x * 0.70710678118654752f)); }

/* log(x): x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(x) = e ln2 + log1p(m - 1), the last by the
 * Cephes polynomial; ln2 split in two (Cody-Waite) so e ln2 adds no rounding error. Subnormal x is
 * scaled by 2^23 first. */
static inline float ma_logf(float x) {
    int tiny = x < 1.17549435e-38f; /* subnormal, zero or negative: the selects below sort it out */
    float xs = tiny ? x * 8388608.0f : x;
    int32_t i = ma_float_to_bits(xs);
    float e = (float)(((i >> 23) & 0xff) - 126) - (tiny ? 23.0f : 0.0f);
    float m = ma_bits_to_float((i & 0x007fffff) | 0x3f000000); /* [0.5, 1) */
    int low = m < 0.707106781186547524f;
    e = low ? e - 1.0f : e;
    m = low ? m + m : m;
    float f = m - 1.0f;
    float z = f * f;
    float y = 7.0376836292e-2f;
    y = y * f - 1.1514610310e-1f;
    y = y * f + 1.1676998740e-1f;
    y = y * f - 1.2420140846e-1f;
    y = y * f + 1.4249322787e-1f;
    y = y * f - 1.6668057665e-1f;
    y = y * f + 2.0000714765e-1f;
    y = y * f - 2.4999993993e-1f;
    y = y * f + 3.3333331174e-1f;
    y = y * f * z;
    y = y + e * -2.12194440e-4f;
    y = y - 0.5f * z;
    float r = (f + y) + e * 0.693359375f;
    r = x > 3.40282347e38f ? x : r;                  /* +inf */
    r = x == 0.0f ? ma_bits_to_float((int32_t)0xff800000) : r; /* +-0 -> -inf */
    return x >= 0.0f ? r : ma_bits_to_float(0x7fc00000); /* x < 0 or NaN -> NaN */
}

/* log(1 + x) = log(u) - ((u - 1) - x) / u with u = 1 + x rounded: the second term is the first-order
 * correction for the rounding of u (exact where u == 1: then log1p(x) = x, sign of zero kept). */
static inline float ma_log1pf(float x) {
    float u = 1.0f + x;
    float lu = ma_logf(u);
    float r = lu - ((u - 1.0f) - x) / u;
    r = u == 1.0f ? x : r;
    r = u == 0.0f ? lu : r;                 /* x = -1: -inf */
    return x > 3.40282347e38f ? x : r;      /* +inf (the correction would be inf - inf) */
}

/* exp(x) - 1: for |x| < 1/2 the Taylor series to x^9 (truncation < 1e-9 relative), else
 * ma_expf(x) - 1 (no cancellation there: |exp(x) - 1| >= 0.39, so the subtraction adds at most
 * half an ulp of the result to exp's own error). */
static inline float ma_expm1f(float x) {
    float p = 2.75573192e-6f;
    p = p * x + 2.48015873e-5f;
    p = p * x + 1.98412698e-4f;
    p = p * x + 1.38888889e-3f;
    p = p * x + 8.33333333e-3f;
    p = p * x + 4.16666667e-2f;
    p = p * x + 1.66666667e-1f;
    p = p * x + 0.5f;
    float small = x + (x * x) * p;
    small = x == 0.0f ? x : small; /* keeps -0 */
    float big = ma_expf(x) - 1.0f;
    return ma_absf(x) < 0.5f ? small : big;
}

#endif /* MA_VECMATH_H */
