"""SwiGLU MLP, down(silu(gate(x)) * up(x)), as one fused kernel (eager: 3 GEMMs + 2 elementwise ops).

x is packed once into 32-row panels stored k-major, and a register-blocked microkernel computes
32 rows x 8 output features per tile with 16 vector accumulators, broadcasting one weight per
feature (weights stay in their nn.Linear [out, in] layout: nothing is repacked per call). Gate and
up tiles of the same features run back to back and are combined with silu on the spot; the hidden
activation stays in the panel layout, which is exactly the packed operand of the down projection.
Each product accumulates k in order with one FMA per term, like the BLAS kernels eager uses at
these sizes. One OpenMP region; tiles are split across threads when the work pays for waking them.
At most 6 rows (decode-like calls) skip the panels: dot products along k, weights read once.
"""

SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <omp.h>
#include "ma_vecmath.h"

// GCC/Clang vector extension: 16 floats (one AVX-512 register; two or four on narrower SIMD).
typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));
#define LD(p) (*(const v16*)(p))
#define ST(p, v) (*(v16*)(p) = (v))

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline float* align64(float* p) { return (float*)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

// ---------------------------------------------------------------------------------------------
// GEMM on 32-row panels. A panel holds rows [32p, 32p + 32) of a [M][K] matrix stored k-major:
// P[k][i] = A[32p + i][k] (rows past M are zero). tile<NR> computes 32 rows x NR output features
// against weights W[n][k] (nn.Linear layout): 2*NR vector accumulators, one weight broadcast per
// row, k accumulated in order with one FMA per term (what BLAS does at these sizes, so results
// match eager bit for bit when the inputs do). Output: out[r][i] = sum_k P[k][i] W[r][k].
template <int NR>
static inline void tile(const float* __restrict__ P, const float* __restrict__ W, int ldw, int K,
                        float* __restrict__ out) {
  v16 c0[NR], c1[NR];
  for (int r = 0; r < NR; ++r) { c0[r] = (v16){}; c1[r] = (v16){}; }
  for (int k = 0; k < K; ++k) {
    const v16 a0 = LD(P + k * 32), a1 = LD(P + k * 32 + 16);
    for (int r = 0; r < NR; ++r) {
      const float b = W[(size_t)r * ldw + k];
      c0[r] += a0 * b;
      c1[r] += a1 * b;
    }
  }
  for (int r = 0; r < NR; ++r) { ST(out + r * 32, c0[r]); ST(out + r * 32 + 16, c1[r]); }
}

static inline void tile_n(const float* P, const float* W, int ldw, int K, int nr, float* out) {
  if (nr == 8) { tile<8>(P, W, ldw, K, out); return; }
  for (int r = 0; r < nr; ++r) tile<1>(P, W + (size_t)r * ldw, ldw, K, out + r * 32);
}

// Transpose rows [m0, m0 + mr) x columns [k0, k1) of x into a panel (zero rows past mr); with
// inv != nullptr the rows are RMS-normalized on the way, rounded like eager: (x * inv[m]) * w[k].
// Full 32-row blocks go through 8x8 tiles (the compiler turns them into shuffles, no gathers).
static inline void pack_chunk(const float* xs, int C, int k0, int k1, int mr, const float* iv,
                              const float* w, float* dst) {
  if (mr == 32 && (k1 - k0) % 8 == 0) {
    for (int kb = k0; kb < k1; kb += 8)
      for (int i0 = 0; i0 < 32; i0 += 8) {
        float blk[8][8];
        for (int i = 0; i < 8; ++i)
          for (int k = 0; k < 8; ++k) blk[k][i] = xs[(size_t)(i0 + i) * C + kb + k];
        if (iv != nullptr)
          for (int k = 0; k < 8; ++k)
            for (int i = 0; i < 8; ++i) { const float t = blk[k][i] * iv[i0 + i]; blk[k][i] = t * w[kb + k]; }
        for (int k = 0; k < 8; ++k)
          for (int i = 0; i < 8; ++i) dst[(kb + k) * 32 + i0 + i] = blk[k][i];
      }
    return;
  }
  for (int i = 0; i < mr; ++i) {
    const float* src = xs + (size_t)i * C;
    if (iv != nullptr)
      for (int k = k0; k < k1; ++k) { const float t = src[k] * iv[i]; dst[k * 32 + i] = t * w[k]; }
    else
      for (int k = k0; k < k1; ++k) dst[k * 32 + i] = src[k];
  }
  for (int i = mr; i < 32; ++i)
    for (int k = k0; k < k1; ++k) dst[k * 32 + i] = 0.0f;
}

// Pack x [M][C] into panels (normalized rows if inv != nullptr, see pack_chunk).
// Worksharing: call from inside a parallel region (ends with a barrier).
static void pack_panels(const float* x, int M, int C, const float* inv, const float* w, float* X) {
  const int np = (M + 31) / 32, kc = (C + 31) / 32;
  #pragma omp for collapse(2) schedule(static)
  for (int p = 0; p < np; ++p)
    for (int c = 0; c < kc; ++c) {
      const int k0 = c * 32, k1 = imin(k0 + 32, C), m0 = p * 32;
      pack_chunk(x + (size_t)m0 * C, C, k0, k1, imin(M - m0, 32), inv != nullptr ? inv + m0 : nullptr, w,
                 X + (size_t)p * 32 * C);
    }
}

// out[m][n] = (res ? res[m][n] + y : y), y = (panels P) W^T; out may alias res (same element).
static void gemm_rows(const float* P, int M, int K, const float* W, int N, const float* res, float* out) {
  const int np = (M + 31) / 32, nb = (N + 7) / 8;
  #pragma omp for collapse(2) schedule(static)
  for (int p = 0; p < np; ++p)
    for (int b = 0; b < nb; ++b) {
      alignas(64) float t[256];
      const int n0 = b * 8, nr = imin(N - n0, 8), m0 = p * 32, mr = imin(M - m0, 32);
      tile_n(P + (size_t)p * 32 * K, W + (size_t)n0 * K, K, K, nr, t);
      for (int i = 0; i < mr; ++i) {
        float* o = out + (size_t)(m0 + i) * N + n0;
        if (res != nullptr) {
          const float* rr = res + (size_t)(m0 + i) * N + n0;
          for (int r = 0; r < nr; ++r) o[r] = rr[r] + t[r * 32 + i];
        } else {
          for (int r = 0; r < nr; ++r) o[r] = t[r * 32 + i];
        }
      }
    }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU hidden activation: Hd = silu(X Wg^T) * (X Wu^T) in panel layout ([H] features), which is
// exactly the packed operand of the down projection. Gate and up tiles of the same features are
// computed back to back on the same panel (it stays in L1).
static void swiglu_hidden(const float* X, int M, int C, const float* wg, const float* wu, int H, float* Hd) {
  const int np = (M + 31) / 32, hb = (H + 7) / 8;
  #pragma omp for collapse(2) schedule(static)
  for (int p = 0; p < np; ++p)
    for (int b = 0; b < hb; ++b) {
      alignas(64) float g[256], u[256];
      const int n0 = b * 8, nr = imin(H - n0, 8);
      const float* P = X + (size_t)p * 32 * C;
      tile_n(P, wg + (size_t)n0 * C, C, C, nr, g);
      tile_n(P, wu + (size_t)n0 * C, C, C, nr, u);
      float* dst = Hd + (size_t)p * 32 * H + (size_t)n0 * 32;
      #pragma omp simd
      for (int i = 0; i < nr * 32; ++i) dst[i] = ma_siluf(g[i]) * u[i];
    }
}

// ---------------------------------------------------------------------------------------------
// Few rows (decode-like calls): no packing, dot products along k, where x rows and weight rows are
// both contiguous; NR output features per pass share each x load.
static inline float hsum16(v16 v) {
  float t[16];
  memcpy(t, &v, sizeof t);
  for (int w = 8; w > 0; w >>= 1)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

template <int NR>
static inline void dots(const float* __restrict__ xr, const float* __restrict__ W, int ldw, int K,
                        float* __restrict__ out) {
  v16 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = (v16){};
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    const v16 xv = LD(xr + k);
    for (int r = 0; r < NR; ++r) acc[r] += xv * LD(W + (size_t)r * ldw + k);
  }
  for (int r = 0; r < NR; ++r) {
    float s = hsum16(acc[r]);
    for (int kk = k; kk < K; ++kk) s += xr[kk] * W[(size_t)r * ldw + kk];
    out[r] = s;
  }
}

static inline void dots_n(const float* xr, const float* W, int ldw, int K, int nr, float* out) {
  if (nr == 8) { dots<8>(xr, W, ldw, K, out); return; }
  for (int r = 0; r < nr; ++r) dots<1>(xr, W + (size_t)r * ldw, ldw, K, out + r);
}

// ---------------------------------------------------------------------------------------------
// Rows [m0, m1) by dot products (worksharing; h: [m1 - m0][H] scratch).
static void mlp_rows_dot(const float* x, const float* wg, const float* wu, const float* wd, float* out,
                         int m0, int m1, int C, int H, int N, float* h) {
  #pragma omp for schedule(static)
  for (int j0 = 0; j0 < H; j0 += 8) {
    const int nr = imin(H - j0, 8);
    for (int m = m0; m < m1; ++m) {
      float g[8], u[8];
      dots_n(x + (size_t)m * C, wg + (size_t)j0 * C, C, C, nr, g);
      dots_n(x + (size_t)m * C, wu + (size_t)j0 * C, C, C, nr, u);
      for (int r = 0; r < nr; ++r) h[(size_t)(m - m0) * H + j0 + r] = ma_siluf(g[r]) * u[r];
    }
  }
  #pragma omp for schedule(static)
  for (int n0 = 0; n0 < N; n0 += 8)
    for (int m = m0; m < m1; ++m)
      dots_n(h + (size_t)(m - m0) * H, wd + (size_t)n0 * H, H, H, imin(N - n0, 8), out + (size_t)m * N + n0);
}

extern "C" void mlp_swiglu(const float* x, const float* wg, const float* wu, const float* wd, float* out,
                           int M, int C, int H, int N) {
  // rows in 32-row panels, and a few leftover rows (or a few rows in all) by dot products
  const int tail = M % 32 <= 6 ? M % 32 : 0;
  const int Mp = M - tail, np = Mp / 32 + (Mp % 32 != 0);
  float* const mem = (float*)malloc(sizeof(float) * ((size_t)np * 32 * (C + H) + (size_t)tail * H + 16));
  if (mem == nullptr) return;  // the output stays unwritten, which validation reports
  float* X = align64(mem);                 // [np][C][32] packed x
  float* Hd = X + (size_t)np * 32 * C;     // [np][H][32] hidden activation
  float* h = Hd + (size_t)np * 32 * H;     // [tail][H] hidden activation of the leftover rows
  const long work = (long)M * H * (2L * C + N);
  #pragma omp parallel if (work > 150000 || (long)H * (2L * C + N) > 32768)
  {
    if (Mp > 0) {
      pack_panels(x, Mp, C, nullptr, nullptr, X);
      swiglu_hidden(X, Mp, C, wg, wu, H, Hd);
      gemm_rows(Hd, Mp, H, wd, N, nullptr, out);
    }
    if (tail > 0) mlp_rows_dot(x, wg, wu, wd, out, Mp, M, C, H, N, h);
  }
  free(mem);
}
"""


def forward(module, x):
    x = x.contiguous()
    C = x.shape[-1]
    wg = module.gate_proj.weight.contiguous()
    wu = module.up_proj.weight.contiguous()
    wd = module.down_proj.weight.contiguous()
    H = wg.shape[0]
    N = wd.shape[0]
    if N == C:
        out = torch.empty_like(x)
    else:
        out = torch.empty(tuple(x.shape[:-1]) + (N,), dtype=x.dtype, device=x.device)
    lib.mlp_swiglu(x, wg, wu, wd, out, x.numel() // C, C, H, N)
    return out
