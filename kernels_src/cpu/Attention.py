"""Causal multi-head self-attention with rotary embeddings, as one fused kernel.

Eager runs ~30 ops (projections, views, transposes, rotary arithmetic, matmul, scale,
masked_fill, softmax, matmul, transpose, contiguous, output projection). Here, in one OpenMP
region:
  1. x is packed into 32-row panels (x^T per panel) and the q/k/v projections run as one
     register-blocked GEMM (32 rows x 8 features per tile, weights in their [out, in] layout),
     writing q, k, v in the same panel layout;
  2. per (batch, head): rotary embedding from the module's cos/sin buffers, scores = q k^T * scale,
     the module's mask buffer (masked entries -> -inf), softmax, and p @ v;
  3. the output projection runs over the attention output's panels and scatters to rows.
Every product accumulates in order with one FMA per term, like the BLAS kernels eager uses at
these sizes, so the scores match eager closely even for large inputs (a peaked softmax amplifies
score differences).
"""

SOURCE = r"""
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <omp.h>
#include "ma_vecmath.h"

typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));
#define LD(p) (*(const v16*)(p))
#define ST(p, v) (*(v16*)(p) = (v))

static inline float* align64(float* p) { return (float*)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

// C^T tile of 32 rows x NR features: out[r][0..32) = sum_k P[k][0..32) * W[r][k]
template <int NR>
static inline void tile(const float* __restrict__ P, const float* __restrict__ W, int ldw, int K,
                        float* __restrict__ out) {
  v16 c0[NR], c1[NR];
  for (int r = 0; r < NR; ++r) { c0[r] = (v16){}; c1[r] = (v16){}; }
  for (int k = 0; k < K; ++k) {
    v16 a0 = LD(P + k * 32), a1 = LD(P + k * 32 + 16);
    for (int r = 0; r < NR; ++r) {
      float b = W[(size_t)r * ldw + k];
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

// Rotary embedding in place on one head's q and k ([D][Tp], t contiguous): with d < D/2,
// q[d] = q[d] cos[d] - q[d + D/2] sin[d], q[d + D/2] = q[d + D/2] cos[d + D/2] + q[d] sin[d + D/2].
// Each product is rounded before the sum, as in eager (q * cos + rotate_half(q) * sin): GCC would
// otherwise contract one product into an FMA, and with large inputs the softmax amplifies that
// last-bit difference. Clang contracts only within one expression, so separate statements do.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noinline, optimize("fp-contract=off")))
#endif
static void rope_head(float* q, float* k, const float* cosb, const float* sinb, int T, int Tp, int D) {
  const int half = D / 2;
  for (int d = 0; d < half; ++d) {
    float* q1 = q + (size_t)d * Tp; float* q2 = q + (size_t)(d + half) * Tp;
    float* k1 = k + (size_t)d * Tp; float* k2 = k + (size_t)(d + half) * Tp;
    #pragma omp simd
    for (int t = 0; t < T; ++t) {
      const float c1 = cosb[(size_t)t * D + d], s1 = sinb[(size_t)t * D + d];
      const float c2 = cosb[(size_t)t * D + d + half], s2 = sinb[(size_t)t * D + d + half];
      const float a1 = q1[t], a2 = q2[t], b1 = k1[t], b2 = k2[t];
      const float qa = a1 * c1;
      const float qb = -a2 * s1;
      const float qc = a2 * c2;
      const float qd = a1 * s2;
      const float ka = b1 * c1;
      const float kb = -b2 * s1;
      const float kc = b2 * c2;
      const float kd = b1 * s2;
      q1[t] = qa + qb; q2[t] = qc + qd;
      k1[t] = ka + kb; k2[t] = kc + kd;
    }
    for (int t = T; t < Tp; ++t) { q1[t] = 0.0f; q2[t] = 0.0f; }
  }
}


// scores for keys s0 .. s0+G-1 against every query t (G independent FMA chains per t-vector):
// S[s][t] = scale * sum_d k[d][s] q[d][t] (d in order, as eager's bmm), -inf where masked
template <int G>
static inline void score_rows(const float* q, const float* k, const float* keep, float* S, int D, int Tp,
                              int s0, float scale) {
  for (int t0 = 0; t0 < Tp; t0 += 16) {
    v16 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = (v16){};
    for (int d = 0; d < D; ++d) {
      const v16 qv = LD(q + (size_t)d * Tp + t0);
      const float* kr = k + (size_t)d * Tp + s0;
      for (int g = 0; g < G; ++g) acc[g] += qv * kr[g];
    }
    for (int g = 0; g < G; ++g) {
      const v16 kp = LD(keep + (size_t)(s0 + g) * Tp + t0);
      v16 sc = acc[g] * scale;
      sc = kp != 0.0f ? sc : -__builtin_inff();
      ST(S + (size_t)(s0 + g) * Tp + t0, sc);
    }
  }
}

// y[d][t] = sum_s v[d][s] P[s][t] (s in order, as eager's bmm) for d = d0 .. d0+G-1
template <int G>
static inline void pv_rows(const float* P, const float* v, float* y, int T, int Tp, int d0) {
  for (int t0 = 0; t0 < Tp; t0 += 16) {
    v16 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = (v16){};
    for (int s = 0; s < T; ++s) {
      const v16 pv = LD(P + (size_t)s * Tp + t0);
      for (int g = 0; g < G; ++g) acc[g] += pv * v[(size_t)(d0 + g) * Tp + s];
    }
    for (int g = 0; g < G; ++g) ST(y + (size_t)g * Tp + t0, acc[g]);
  }
}

// Rows [m0, m0 + n) of feature f of a panel-major matrix (F features) <-> a contiguous run.
static inline void panel_put(float* P, int F, int f, int m0, const float* v, int n) {
  while (n > 0) {
    const int i = m0 & 31, len = 32 - i < n ? 32 - i : n;
    memcpy(P + (size_t)(m0 >> 5) * 32 * F + (size_t)f * 32 + i, v, sizeof(float) * len);
    m0 += len; v += len; n -= len;
  }
}

extern "C" void attention_rope_causal(
    const float* x, const float* wq, const float* wk, const float* wv, const float* wo,
    const float* cosb, const float* sinb, const uint8_t* mask, float* out,
    int B, int T, int C, int H, int D, int mask_ld, float scale) {
  const int M = B * T;
  const int np = (M + 31) / 32;
  const int cb = (C + 7) / 8;
  const int kc = (C + 31) / 32;
  const int Tp = (T + 15) & ~15;
  const size_t pan = (size_t)np * 32 * C;
  const size_t heads = (size_t)B * H * D * Tp;     // q, k, v per (b, h): [D][Tp], t contiguous
  const size_t per_thread = (size_t)Tp * Tp + 8 * (size_t)Tp;
  const int maxt = omp_get_max_threads();
  float* const mem = (float*)malloc(sizeof(float) * (pan * 2 + heads * 3 + (size_t)Tp * Tp + per_thread * maxt + 16));
  if (mem == nullptr) return;  // outputs stay unwritten: the validation sees it
  float* X = align64(mem);
  float* Y = X + pan;
  float* Qh = Y + pan;
  float* Kh = Qh + heads;
  float* Vh = Kh + heads;
  float* keep = Vh + heads;                        // [s][t]: 1 where mask[t][s], else 0
  float* thread_buf = keep + (size_t)Tp * Tp;
  const long work = (long)M * C * C * 4 + (long)B * H * T * T * D * 2;
  #pragma omp parallel if (work > 150000)
  {
    float* tb = thread_buf + per_thread * omp_get_thread_num();
    // 1. pack x into panels; transpose the mask once
    #pragma omp single nowait
    for (int s = 0; s < Tp; ++s)
      for (int t = 0; t < Tp; ++t) keep[(size_t)s * Tp + t] = (s < T && t < T && mask[(size_t)t * mask_ld + s]) ? 1.0f : 0.0f;
    #pragma omp for collapse(2) schedule(static)
    for (int p = 0; p < np; ++p)
      for (int c = 0; c < kc; ++c) {
        const int k0 = c * 32, k1 = k0 + 32 < C ? k0 + 32 : C;
        const int m0 = p * 32, mr = M - m0 < 32 ? M - m0 : 32;
        float* dst = X + (size_t)p * 32 * C;
        for (int k = k0; k < k1; ++k) {
          #pragma omp simd
          for (int i = 0; i < 32; ++i) dst[k * 32 + i] = i < mr ? x[(size_t)(m0 + i) * C + k] : 0.0f;
        }
      }
    // 2. q, k, v projections, written per (batch, head) as [D][Tp]
    #pragma omp for collapse(2) schedule(static)
    for (int p = 0; p < np; ++p)
      for (int j = 0; j < 3 * cb; ++j) {
        alignas(64) float t[256];
        const int which = j / cb, blk = j % cb;
        const int n0 = blk * 8, nr = C - n0 < 8 ? C - n0 : 8;
        const float* W = which == 0 ? wq : which == 1 ? wk : wv;
        float* dst = which == 0 ? Qh : which == 1 ? Kh : Vh;
        tile_n(X + (size_t)p * 32 * C, W + (size_t)n0 * C, C, C, nr, t);
        const int m0 = p * 32, mr = M - m0 < 32 ? M - m0 : 32;
        for (int r = 0; r < nr; ++r) {
          const int f = n0 + r, h = f / D, d = f % D;
          for (int i = 0; i < mr;) {  // runs of rows within one sequence
            const int m = m0 + i, b = m / T, t0 = m % T;
            const int len = T - t0 < mr - i ? T - t0 : mr - i;
            memcpy(dst + (((size_t)b * H + h) * D + d) * Tp + t0, t + r * 32 + i, sizeof(float) * len);
            i += len;
          }
        }
      }
    // 3. attention per (batch, head), everything transposed: t runs along vectors
    #pragma omp for schedule(static)
    for (int bh = 0; bh < B * H; ++bh) {
      const int b = bh / H, h = bh % H;
      float* q = Qh + (size_t)bh * D * Tp;
      float* k = Kh + (size_t)bh * D * Tp;
      const float* v = Vh + (size_t)bh * D * Tp;
      float* S = tb;                    // [s][t] scores, then probabilities
      float* ybuf = S + (size_t)Tp * Tp; // [8][Tp]
      rope_head(q, k, cosb, sinb, T, Tp, D);
      // S[s][t] = scale * q[t] . k[s]; masked -> -inf
      int s0 = 0;
      for (; s0 + 8 <= T; s0 += 8) score_rows<8>(q, k, keep, S, D, Tp, s0, scale);
      for (; s0 < T; ++s0) score_rows<1>(q, k, keep, S, D, Tp, s0, scale);
      // softmax over s, for all t at once
      alignas(64) float mx[1024], sum[1024];
      for (int t0 = 0; t0 < Tp; t0 += 1024) {
        const int tn = Tp - t0 < 1024 ? Tp - t0 : 1024;
        for (int t = 0; t < tn; ++t) { mx[t] = -__builtin_inff(); sum[t] = 0.0f; }
        for (int s = 0; s < T; ++s) {
          const float* Sr = S + (size_t)s * Tp + t0;
          #pragma omp simd
          for (int t = 0; t < tn; ++t) mx[t] = Sr[t] > mx[t] ? Sr[t] : mx[t];
        }
        for (int s = 0; s < T; ++s) {
          float* Sr = S + (size_t)s * Tp + t0;
          #pragma omp simd
          for (int t = 0; t < tn; ++t) { const float e = ma_expf(Sr[t] - mx[t]); Sr[t] = e; sum[t] += e; }
        }
        #pragma omp simd
        for (int t = 0; t < tn; ++t) sum[t] = 1.0f / sum[t];
        for (int s = 0; s < T; ++s) {
          float* Sr = S + (size_t)s * Tp + t0;
          #pragma omp simd
          for (int t = 0; t < tn; ++t) Sr[t] = Sr[t] * sum[t];
        }
      }
      // y[d][t] = sum_s v[d][s] P[s][t] -> attention output panels (feature h*D + d)
      int d0 = 0;
      for (; d0 < D; d0 += 8) {
        const int g = D - d0 < 8 ? D - d0 : 8;
        if (g == 8) pv_rows<8>(S, v, ybuf, T, Tp, d0);
        else for (int j = 0; j < g; ++j) pv_rows<1>(S, v, ybuf + (size_t)j * Tp, T, Tp, d0 + j);
        for (int j = 0; j < g; ++j) panel_put(Y, C, h * D + d0 + j, b * T, ybuf + (size_t)j * Tp, T);
      }
    }
    // 4. output projection, scattered to rows
    #pragma omp for collapse(2) schedule(static)
    for (int p = 0; p < np; ++p)
      for (int b = 0; b < cb; ++b) {
        alignas(64) float t[256];
        const int n0 = b * 8, nr = C - n0 < 8 ? C - n0 : 8;
        tile_n(Y + (size_t)p * 32 * C, wo + (size_t)n0 * C, C, C, nr, t);
        const int m0 = p * 32, mr = M - m0 < 32 ? M - m0 : 32;
        for (int i = 0; i < mr; ++i) {
          float* o = out + (size_t)(m0 + i) * C + n0;
          for (int r = 0; r < nr; ++r) o[r] = t[r * 32 + i];
        }
      }
  }
  free(mem);
}
"""


def forward(module, x):
    x = x.contiguous()
    B, T, C = x.shape
    mask = module.mask
    assert T <= module.cos.shape[0] and T <= mask.shape[-2] and T <= mask.shape[-1]
    out = torch.empty_like(x)
    lib.attention_rope_causal(
        x, module.q_proj.weight.contiguous(), module.k_proj.weight.contiguous(),
        module.v_proj.weight.contiguous(), module.o_proj.weight.contiguous(),
        module.cos.contiguous(), module.sin.contiguous(), mask.contiguous(), out,
        B, T, C, module.n_heads, module.head_dim, mask.shape[-1], float(module.scale))
    return out
