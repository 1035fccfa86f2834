"""TripletMarginLoss (p=2): one read of the three inputs, both distances of a row in one vectorized loop.

Eager computes ||a - p + eps|| and ||a - n + eps|| as separate ops with temporaries, then the hinge and
the mean. Here a thread takes whole rows; the sums of squares are float (as eager's, so overflow to
Inf happens where eager's does), the row losses are added in double per thread and the thread
partials in thread order, so a call is deterministic.
"""
SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <vector>
#include <omp.h>

extern "C" void triplet_margin(const float* __restrict a, const float* __restrict p, const float* __restrict n,
                               float* __restrict out, int64_t rows, int64_t dim, float margin, float eps) {
    std::vector<double> part(omp_get_max_threads(), 0.0);
    #pragma omp parallel if(rows * dim > 32768)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t chunk = (rows + nt - 1) / nt;
        const int64_t lo = t * chunk < rows ? t * chunk : rows, hi = lo + chunk < rows ? lo + chunk : rows;
        double s = 0.0;
        for (int64_t r = lo; r < hi; ++r) {
            const float* ar = a + r * dim;
            const float* pr = p + r * dim;
            const float* nr = n + r * dim;
            float sp = 0.0f, sn = 0.0f;
            #pragma omp simd reduction(+ : sp, sn)
            for (int64_t i = 0; i < dim; ++i) {
                const float dp = (ar[i] - pr[i]) + eps, dn = (ar[i] - nr[i]) + eps;
                sp += dp * dp;
                sn += dn * dn;
            }
            float l = (margin + std::sqrt(sp)) - std::sqrt(sn);
            l = l < 0.0f ? 0.0f : l;  // NaN stays NaN, as in clamp_min
            s += l;
        }
        part[t] = s;
    }
    double s = 0.0;
    for (double v : part) s += v;
    out[0] = (float)(s / (double)rows);
}
"""
SHAPE_GENERIC = True


def forward(module, anchor, positive, negative):
    assert module.loss_fn.p == 2 and not module.loss_fn.swap and module.loss_fn.reduction == "mean"
    assert anchor.dim() == 2 and anchor.shape == positive.shape and anchor.shape == negative.shape
    a = anchor.contiguous()
    out = torch.empty((), dtype=a.dtype)
    lib.triplet_margin(a, positive.contiguous(), negative.contiguous(), out, a.shape[0], a.shape[1],
                       float(module.loss_fn.margin), float(module.loss_fn.eps))
    return out
