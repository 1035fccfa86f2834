"""attention_decode (HF sdpa_attention_forward for one query token over a KV cache, grouped-query heads):
out[b, 0, h] = softmax(scale * q[b, h] . k[b, h // G]^T + mask[b, h]) @ v[b, h // G], G = Hq / Hkv.

One task per (batch, kv head): the G query heads that share the kv head are done together, so each key and
value row is read from memory once for all of them (eager's GQA path expands or repacks first). Scores go to a
per-thread scratch row, then max, exp and sum, then the weighted sum of values, all in float; the result is
rounded once to the output dtype. Rows whose every score is -inf (fully masked) give 0, as torch's SDPA does;
a NaN anywhere in a row's scores makes the row NaN (the max and the sum carry it). Served: q_len 1, float32 or
bfloat16 q/k/v of one dtype, contiguous key/value [B, Hkv, L, D], mask None, bool, or additive of q's dtype,
shaped [1 or B, 1 or Hq, 1, L]. Anything else runs torch's SDPA (the same computation, unfused).
"""

DTYPES = ("float32", "bfloat16")  # float16 runs torch's SDPA: no CPU kernel for it

SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <omp.h>
#include "ma_bf16.h"


static inline float ld(float v) { return v; }
static inline float ld(uint16_t v) { return bf16_to_f32(v); }
static inline void st(float* p, float v) { *p = v; }
static inline void st(uint16_t* p, float v) { *p = f32_to_bf16(v); }

// exp(x) for x <= 0 (or NaN, kept NaN): Cephes' expf polynomial after x = n ln2 + r, 2^n from the exponent bits;
// within 2 ulp of expf, and vectorizable (std::exp is a call per score). x < -87 gives 0, -inf included.
static inline float exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = (int32_t)n + 127;
  const uint32_t bits = (uint32_t)(e < 1 ? 1 : e) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : y * scale;
}

#define JB 16  // keys per block of the score pass (one 16-float vector of scores per query head)
#define RB 4   // query heads per chunk (their accumulators live in registers together)

// One (batch, kv head): the G query heads sharing it. DC: the head size when known at compile time (0: D).
// mask_kind: 0 none, 1 bool (mb), 2 additive of T (mf); element [b, h, 0, j] at b * msb + h * msh + j.
// Scratch: s (G * L scores, then weights), qf (Gp * D scaled queries, Gp = G rounded up to RB; zero padded),
// kt (D * JB: a block of keys transposed, then one value row), sums (Gp).
template <typename T, int DC>
static void attend_one(const T* q, const T* kb, const T* vb, const uint8_t* mb, const T* mf, T* out, int64_t b,
                       int64_t g, int64_t Hq, int64_t G, int64_t L, int64_t Dr, float scale, int64_t msb,
                       int64_t msh, int mask_kind, float* s, float* qf, float* kt, float* sums) {
  const int64_t D = DC ? DC : Dr;
  const int64_t Gp = (G + RB - 1) / RB * RB;
  const float ninf = -__builtin_inff();
  for (int64_t r = 0; r < Gp; ++r)
    for (int64_t d = 0; d < D; ++d) qf[r * D + d] = r < G ? ld(q[(b * Hq + g * G + r) * D + d]) * scale : 0.0f;
  // scores: a block of JB keys transposed (d-major), then RB heads x JB keys accumulated in vectors
  for (int64_t j0 = 0; j0 < L; j0 += JB) {
    const int64_t jb = L - j0 < JB ? L - j0 : JB;
    for (int64_t jj = 0; jj < JB; ++jj) {
      const T* kj = kb + (j0 + (jj < jb ? jj : 0)) * D;
      for (int64_t d = 0; d < D; ++d) kt[d * JB + jj] = jj < jb ? ld(kj[d]) : 0.0f;
    }
    for (int64_t r0 = 0; r0 < G; r0 += RB) {
      float a[RB][JB] = {};
      for (int64_t d = 0; d < D; ++d) {
        const float* kd = kt + d * JB;
        for (int rr = 0; rr < RB; ++rr) {
          const float qd = qf[(r0 + rr) * D + d];
          #pragma omp simd
          for (int jj = 0; jj < JB; ++jj) a[rr][jj] += qd * kd[jj];
        }
      }
      for (int rr = 0; rr < RB && r0 + rr < G; ++rr)
        for (int64_t jj = 0; jj < jb; ++jj) s[(r0 + rr) * L + j0 + jj] = a[rr][jj];
    }
  }
  for (int64_t r = 0; r < Gp; ++r) {
    sums[r] = 0.0f;
    if (r >= G) continue;
    float* sr = s + r * L;
    const int64_t mo = b * msb + (g * G + r) * msh;
    if (mask_kind == 1) {
      #pragma omp simd
      for (int64_t j = 0; j < L; ++j) sr[j] += mb[mo + j] ? 0.0f : ninf;
    } else if (mask_kind == 2) {
      #pragma omp simd
      for (int64_t j = 0; j < L; ++j) sr[j] += ld(mf[mo + j]);
    }
    float m = ninf;
    bool nan = false;
    for (int64_t j = 0; j < L; ++j) {
      nan |= sr[j] != sr[j];
      m = sr[j] > m ? sr[j] : m;
    }
    if (nan) m = __builtin_nanf("");  // NaN scores: the whole row is NaN, as in SDPA
    if (m == ninf) {  // every position masked: SDPA gives zeros (weights 0, sum marked -inf)
      for (int64_t j = 0; j < L; ++j) sr[j] = 0.0f;
      sums[r] = ninf;
      continue;
    }
    float sum = 0.0f;
    #pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < L; ++j) {
      const float p = exp_nonpos(sr[j] - m);
      sr[j] = p;
      sum += p;
    }
    sums[r] = sum;
  }
  // weighted sum of values: RB heads at a time, each value row read once per chunk
  for (int64_t r0 = 0; r0 < G; r0 += RB) {
    float a[RB][DC ? DC : 1];
    float* acc = DC ? &a[0][0] : qf + r0 * D;  // unknown D: the (consumed) query rows hold the sums
    for (int64_t i = 0; i < RB * D; ++i) acc[i] = 0.0f;
    const int nr = G - r0 < RB ? (int)(G - r0) : RB;
    for (int64_t j = 0; j < L; ++j) {
      const T* vj = vb + j * D;
      #pragma omp simd
      for (int64_t d = 0; d < D; ++d) kt[d] = ld(vj[d]);
      for (int rr = 0; rr < RB; ++rr) {
        const float p = rr < nr ? s[(r0 + rr) * L + j] : 0.0f;
        float* ar = acc + rr * D;
        #pragma omp simd
        for (int64_t d = 0; d < D; ++d) ar[d] += p * kt[d];
      }
    }
    for (int rr = 0; rr < nr; ++rr) {
      T* o = out + (b * Hq + g * G + r0 + rr) * D;
      const float sum = sums[r0 + rr];
      const float inv = sum == ninf ? 0.0f : 1.0f / sum;
      for (int64_t d = 0; d < D; ++d) st(o + d, sum == ninf ? 0.0f : acc[rr * D + d] * inv);
    }
  }
}

template <typename T>
static void decode(const T* q, const T* k, const T* v, const uint8_t* mb, const T* mf, T* out, int64_t B,
                   int64_t Hq, int64_t Hkv, int64_t L, int64_t D, float scale, int64_t msb, int64_t msh,
                   int mask_kind) {
  const int64_t G = Hq / Hkv;
  #pragma omp parallel if (B * Hq * L * D > 65536)
  {
    const int64_t Gp = (G + RB - 1) / RB * RB;
    // scratch of this thread; plain malloc: std::vector pulled a thread-local object into the library with
    // GCC 13's headers (a TLS segment, which the binary check rejects)
    float* scratch = static_cast<float*>(std::malloc(sizeof(float) * (size_t)(G * L + Gp * D + D * JB + Gp)));
    float* s = scratch;
    float* qf = s + G * L;
    float* kt = qf + Gp * D;
    float* sums = kt + D * JB;
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < B * Hkv; ++t) {
      const int64_t b = t / Hkv, g = t % Hkv;
      const T* kb = k + t * L * D;
      const T* vb = v + t * L * D;
      if (D == 64)
        attend_one<T, 64>(q, kb, vb, mb, mf, out, b, g, Hq, G, L, D, scale, msb, msh, mask_kind, s,
                          qf, kt, sums);
      else if (D == 128)
        attend_one<T, 128>(q, kb, vb, mb, mf, out, b, g, Hq, G, L, D, scale, msb, msh, mask_kind, s,
                           qf, kt, sums);
      else
        attend_one<T, 0>(q, kb, vb, mb, mf, out, b, g, Hq, G, L, D, scale, msb, msh, mask_kind, s,
                         qf, kt, sums);
    }
    std::free(scratch);
  }
}

extern "C" void attn_decode_f32(const float* q, const float* k, const float* v, const uint8_t* mb, const float* mf,
                                float* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t D, float scale,
                                int64_t msb, int64_t msh, int mask_kind) {
  decode<float>(q, k, v, mb, mf, out, B, Hq, Hkv, L, D, scale, msb, msh, mask_kind);
}

extern "C" void attn_decode_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint8_t* mb,
                                 const uint16_t* mf, uint16_t* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t L,
                                 int64_t D, float scale, int64_t msb, int64_t msh, int mask_kind) {
  decode<uint16_t>(q, k, v, mb, mf, out, B, Hq, Hkv, L, D, scale, msb, msh, mask_kind);
}
"""


def attention_decode(query, key, value, attention_mask, scaling, groups):
    B, Hq, S, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    m = attention_mask
    served = (S == 1 and query.dtype in (torch.float32, torch.bfloat16) and key.dtype == query.dtype
              and value.dtype == query.dtype and key.dim() == 4 and tuple(value.shape) == (B, Hkv, L, D)
              and tuple(key.shape) == (B, Hkv, L, D) and Hkv * groups == Hq and L > 0 and D > 0
              and (m is None or (m.dim() == 4 and m.shape[0] in (1, B) and m.shape[1] in (1, Hq)
                                 and m.shape[2] == 1 and m.shape[3] == L
                                 and (m.dtype == torch.bool or m.dtype == query.dtype))))
    if not served:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=m, scale=scaling, enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous()
    q = query.contiguous()
    k = key.contiguous()
    v = value.contiguous()
    out = torch.empty((B, 1, Hq, D), dtype=query.dtype, device=query.device)
    kind, msb, msh = 0, 0, 0
    mb, mf = torch.empty((1,), dtype=torch.bool, device=q.device), q  # placeholders the kernel never reads
    if m is not None:
        m = m.contiguous()
        msh = L if m.shape[1] == Hq and Hq > 1 else 0
        msb = m.shape[1] * L if m.shape[0] == B and B > 1 else 0
        if m.dtype == torch.bool:
            kind, mb = 1, m
        else:
            kind, mf = 2, m
    scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(D)
    if query.dtype == torch.float32:
        lib.attn_decode_f32(q, k, v, mb, mf, out, B, Hq, Hkv, L, D, scale, msb, msh, kind)
    else:
        lib.attn_decode_bf16(q, k, v, mb, mf, out, B, Hq, Hkv, L, D, scale, msb, msh, kind)
    return out
