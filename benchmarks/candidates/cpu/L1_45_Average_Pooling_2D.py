"""Average_Pooling_2D: one pass over the input, each output summed in float in eager's order.
Written by hand (no generator).

Eager's CPU kernel sums a window in float, row by row and left to right, then divides by its size.
torch.compile sums in another order; on inputs near float's range that overflows elsewhere, so its
Inf and NaN positions differ from eager's and the proof rejects it (2-core AMD EPYC, torch 2.13,
docs/benchmarks.md). This kernel keeps eager's order per output, bit for bit, and gets its speed
from the loop order instead: a block of outputs of one row is accumulated together, one window
column at a time, so every input row is read from cache and each output's additions stay in order.
"""
SOURCE = r"""
#include <cstdint>

// x: P planes of H x W, y: P planes of OH x OW; no padding, floor mode (the host checks)
extern "C" void avg_pool(const float* __restrict x, float* __restrict y, int64_t P, int64_t H, int64_t W,
                         int64_t OH, int64_t OW, int64_t kh, int64_t kw, int64_t sh, int64_t sw) {
    const float size = (float)(kh * kw);
    #pragma omp parallel for schedule(static) if(P * OH * OW > 4096)
    for (int64_t t = 0; t < P * OH; ++t) {
        const int64_t p = t / OH, oh = t % OH;
        const float* xp = x + (p * H + oh * sh) * W;
        float* yp = y + t * OW;
        for (int64_t ow = 0; ow < OW; ++ow) yp[ow] = 0.0f;
        for (int64_t i = 0; i < kh; ++i) {
            const float* row = xp + i * W;
            for (int64_t j = 0; j < kw; ++j) {
                const float* col = row + j;
                for (int64_t ow = 0; ow < OW; ++ow) yp[ow] += col[ow * sw];
            }
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
