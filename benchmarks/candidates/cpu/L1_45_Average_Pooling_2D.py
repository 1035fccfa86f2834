"""Average_Pooling_2D: one pass over the input, each output summed in float in eager's order.
Written by hand (no generator).

Eager's CPU kernel sums a window in float, row by row and left to right, then divides by its size.
torch.compile sums in another order; on inputs near float's range that overflows elsewhere, so its
Inf and NaN positions differ from eager's and the proof rejects it (2-core AMD EPYC, torch 2.13,
docs/benchmarks.md). This kernel keeps eager's order per output, bit for bit, and gets its speed
from vectorizing across outputs instead: eight neighbouring outputs' windows are loaded row by row
and transposed in registers (AVX2), so lane l adds output l's elements in order. Input rows are
streamed start to end with a software prefetch; the sums of an output row stay in cache.
Without AVX2 (or for windows under 4 wide) each output is summed with scalar adds, same order.
"""
SOURCE = r"""
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>

// r[j] lane l <- r[l] lane j
static inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20); r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20); r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31); r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31); r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// v[c] lane l <- b[l * sw + off + c], c < 4: four window columns of eight outputs
static inline void columns4(const float* b, int64_t sw, int64_t off, __m256 v[4]) {
    __m256 r[4];
    for (int l = 0; l < 4; ++l)
        r[l] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(b + l * sw + off)),
                                    _mm_loadu_ps(b + (l + 4) * sw + off), 1);
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    v[0] = _mm256_shuffle_ps(t0, t2, 0x44); v[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    v[2] = _mm256_shuffle_ps(t1, t3, 0x44); v[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}

// adds one window row of eight outputs (b: the first one's row start) to acc, column by column (kw >= 4)
static inline __m256 add_window_row(__m256 acc, const float* b, int64_t kw, int64_t sw) {
    int64_t jc = 0;
    for (; jc + 8 <= kw; jc += 8) {
        __m256 r[8];
        for (int l = 0; l < 8; ++l) r[l] = _mm256_loadu_ps(b + l * sw + jc);
        transpose8(r);
        for (int j = 0; j < 8; ++j) acc = _mm256_add_ps(acc, r[j]);
    }
    for (; jc + 4 <= kw; jc += 4) {
        __m256 v[4];
        columns4(b, sw, jc, v);
        for (int j = 0; j < 4; ++j) acc = _mm256_add_ps(acc, v[j]);
    }
    if (jc < kw) {  // the last 1-3 columns: four loaded from kw - 4 (inside the window), the new ones added
        const int first = (int)(jc - (kw - 4));
        __m256 v[4];
        columns4(b, sw, kw - 4, v);
        #pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
            if (j >= first) acc = _mm256_add_ps(acc, v[j]);
    }
    return acc;
}
#endif

// x: P planes of H x W, y: P planes of OH x OW; no padding, floor mode (the host checks)
extern "C" void avg_pool(const float* __restrict x, float* __restrict y, int64_t P, int64_t H, int64_t W,
                         int64_t OH, int64_t OW, int64_t kh, int64_t kw, int64_t sh, int64_t sw) {
    const float size = (float)(kh * kw);
    #pragma omp parallel for schedule(static) if(P * OH * OW > 4096)
    for (int64_t t = 0; t < P * OH; ++t) {
        const int64_t p = t / OH, oh = t % OH;
        const float* xp = x + (p * H + oh * sh) * W;
        float* yp = y + t * OW;
        int64_t vec = 0;  // outputs [0, vec) summed eight at a time
#if defined(__AVX2__)
        vec = kw >= 4 ? OW / 8 * 8 : 0;
#endif
        for (int64_t ow = 0; ow < OW; ++ow) yp[ow] = 0.0f;
        for (int64_t i = 0; i < kh; ++i) {
            const float* row = xp + i * W;
#if defined(__AVX2__)
            for (int64_t ow = 0; ow < vec; ow += 8) {
                const float* b = row + ow * sw;
                for (int c = 0; c < 96; c += 16) _mm_prefetch((const char*)(b + 384 + c), _MM_HINT_T0);
                _mm256_storeu_ps(yp + ow, add_window_row(_mm256_loadu_ps(yp + ow), b, kw, sw));
            }
#endif
            for (int64_t ow = vec; ow < OW; ++ow)
                for (int64_t j = 0; j < kw; ++j) yp[ow] += row[ow * sw + j];
        }
        for (int64_t ow = 0; ow < OW; ++ow) yp[ow] = yp[ow] / size;
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    k = int(module.avg_pool.kernel_size)  # square windows and strides only: a tuple raises, and the proof rejects it
    st = int(module.avg_pool.stride if module.avg_pool.stride is not None else module.avg_pool.kernel_size)
    assert module.avg_pool.padding in (0, (0, 0)) and not module.avg_pool.ceil_mode and module.avg_pool.divisor_override is None
    x = x.contiguous()
    n, c, h, w = x.shape
    oh, ow = (h - k) // st + 1, (w - k) // st + 1
    y = torch.empty((n, c, oh, ow), dtype=x.dtype)
    lib.avg_pool(x, y, n * c, h, w, oh, ow, k, k, st, st)
    return y
