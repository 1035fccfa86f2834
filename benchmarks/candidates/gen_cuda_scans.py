"""Generate the CUDA candidates for the level-1 prefix sums (cumsum, reverse, exclusive, masked).

    python benchmarks/candidates/gen_cuda_scans.py   # rewrites benchmarks/candidates/cuda/L1_{89,91,92,93}_*.py

One kernel serves all four: a block of 512 threads owns a row and walks it in tiles of 2048 floats
(a float4 per thread, each tile's loads issued two tiles ahead of its scan); a tile is scanned
with warp shuffles and one shared-memory step, and its total carried into the next tile. The row is
read once and written once. Reverse scans walk the row from its end; the exclusive scan writes the
running sum before adding the element; the masked scan multiplies by the mask as eager does
(NaN * 0 stays NaN). L1_90 (cumprod) is not generated here: a product in another association order
overflows to Inf at other positions than eager's (the proof rejected inductor's for that), so its own
candidate, L1_90_cumprod.py, follows eager's order exactly.
"""
from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent / "cuda"

SOURCE = r"""
#define NT 512
#define NW (NT / 32)
#define FULL 0xffffffffu

// v's exclusive prefix over the block (thread order); `total` gets the block's sum. ws: NW floats,
// the caller alternates two buffers so a slow reader of the last tile never sees this tile's writes.
__device__ __forceinline__ float block_exclusive(float v, float* ws, float& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float s = v;
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(FULL, s, o);
        if (lane >= o) s += u;
    }
    float excl = __shfl_up_sync(FULL, s, 1);
    if (lane == 0) excl = 0.0f;
    if (lane == 31) ws[warp] = s;
    __syncthreads();
    if (warp == 0) {
        float w = lane < NW ? ws[lane] : 0.0f;
        #pragma unroll
        for (int o = 1; o < NW; o <<= 1) {
            const float u = __shfl_up_sync(FULL, w, o);
            if (lane >= o) w += u;
        }
        if (lane < NW) ws[lane] = w;
    }
    __syncthreads();
    total = ws[NW - 1];
    return warp ? ws[warp - 1] + excl : excl;
}

// logical elements 4q..4q+3 of the row (walked from the end when reversed), times the mask if any
template <bool VEC, bool MASK>
__device__ __forceinline__ void load4(const float* __restrict__ xr, const unsigned char* __restrict__ mr,
                                      long long D, long long q, int reverse, float v[4]) {
    if (VEC) {
        const long long D4 = D >> 2;
        const long long p = reverse ? D4 - 1 - q : q;
        float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        uchar4 m = make_uchar4(1, 1, 1, 1);
        if (q < D4) {
            f = reinterpret_cast<const float4*>(xr)[p];
            if (MASK) m = reinterpret_cast<const uchar4*>(mr)[p];
        }
        if (MASK) { f.x *= (float)m.x; f.y *= (float)m.y; f.z *= (float)m.z; f.w *= (float)m.w; }
        if (reverse) { v[0] = f.w; v[1] = f.z; v[2] = f.y; v[3] = f.x; }
        else { v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w; }
    } else {
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            const long long i = 4 * q + k;
            const long long p = reverse ? D - 1 - i : i;
            v[k] = i < D ? xr[p] * (MASK ? (float)mr[p] : 1.0f) : 0.0f;
        }
    }
}

template <bool VEC>
__device__ __forceinline__ void store4(float* __restrict__ yr, long long D, long long q, int reverse, const float o[4]) {
    if (VEC) {
        const long long D4 = D >> 2;
        if (q >= D4) return;
        const float4 f = reverse ? make_float4(o[3], o[2], o[1], o[0]) : make_float4(o[0], o[1], o[2], o[3]);
        reinterpret_cast<float4*>(yr)[reverse ? D4 - 1 - q : q] = f;
    } else {
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            const long long i = 4 * q + k;
            if (i < D) yr[reverse ? D - 1 - i : i] = o[k];
        }
    }
}

// scans one tile (a float4 per thread at logical quad q), writes it and advances the carry
template <bool VEC>
__device__ __forceinline__ void scan_tile(const float v[4], float* __restrict__ yr, long long D, long long q,
                                          int reverse, int exclusive, float* ws, float& carry) {
    float total;
    const float pre = block_exclusive(((v[0] + v[1]) + v[2]) + v[3], ws, total);
    float r = carry + pre;
    float o[4];
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (exclusive) { o[k] = r; r += v[k]; }
        else { r += v[k]; o[k] = r; }
    }
    store4<VEC>(yr, D, q, reverse, o);
    carry += total;
}

// two tiles per iteration, each tile's loads issued two tiles ahead of its scan
template <bool VEC, bool MASK>
__device__ __forceinline__ void scan_row(const float* __restrict__ x, const unsigned char* __restrict__ mask,
                                         float* __restrict__ y, long long D, int reverse, int exclusive) {
    __shared__ float ws[2][NW];
    const long long row = blockIdx.x;
    const float* xr = x + row * D;
    const unsigned char* mr = MASK ? mask + row * D : nullptr;
    float* yr = y + row * D;
    const long long quads = (D + 3) >> 2;
    const long long tid = threadIdx.x;
    float a[4], b[4];
    load4<VEC, MASK>(xr, mr, D, tid, reverse, a);
    load4<VEC, MASK>(xr, mr, D, NT + tid, reverse, b);
    float carry = 0.0f;
    for (long long base = 0; base < quads; base += 2 * NT) {
        const float v[4] = {a[0], a[1], a[2], a[3]};
        if (base + 2 * NT < quads) load4<VEC, MASK>(xr, mr, D, base + 2 * NT + tid, reverse, a);
        scan_tile<VEC>(v, yr, D, base + tid, reverse, exclusive, ws[0], carry);
        if (base + NT < quads) {
            const float w[4] = {b[0], b[1], b[2], b[3]};
            if (base + 3 * NT < quads) load4<VEC, MASK>(xr, mr, D, base + 3 * NT + tid, reverse, b);
            scan_tile<VEC>(w, yr, D, base + NT + tid, reverse, exclusive, ws[1], carry);
        }
    }
}

// one block of NT threads per row of D floats (rows contiguous)
extern "C" __global__ void __launch_bounds__(NT) scan_v4(const float* __restrict__ x, float* __restrict__ y,
                                                         long long D, int reverse, int exclusive) {
    scan_row<true, false>(x, nullptr, y, D, reverse, exclusive);
}
extern "C" __global__ void __launch_bounds__(NT) scan_v1(const float* __restrict__ x, float* __restrict__ y,
                                                         long long D, int reverse, int exclusive) {
    scan_row<false, false>(x, nullptr, y, D, reverse, exclusive);
}
extern "C" __global__ void __launch_bounds__(NT) masked_scan_v4(const float* __restrict__ x, const unsigned char* __restrict__ mask,
                                                                float* __restrict__ y, long long D, int reverse, int exclusive) {
    scan_row<true, true>(x, mask, y, D, reverse, exclusive);
}
extern "C" __global__ void __launch_bounds__(NT) masked_scan_v1(const float* __restrict__ x, const unsigned char* __restrict__ mask,
                                                                float* __restrict__ y, long long D, int reverse, int exclusive) {
    scan_row<false, true>(x, mask, y, D, reverse, exclusive);
}
"""

HOST = '''
NT = 512


def scan(x, mask, dim, reverse, exclusive):
    """The prefix sum of x (times mask, when given) along dim; float32 only."""
    assert x.dtype == torch.float32, "float32 only"
    if x.dim() == 0:
        return scan(x.reshape(1), None if mask is None else mask.reshape(1), 0, reverse, exclusive).reshape(())
    d = dim % x.dim()
    last = d == x.dim() - 1
    xt = (x if last else x.transpose(d, -1)).contiguous()
    mt = None if mask is None else (mask if last else mask.transpose(d, -1)).contiguous()
    y = torch.empty_like(xt)
    D = xt.shape[-1]
    rows = xt.numel() // D if D else 0
    if rows:
        vec = D % 4 == 0 and xt.storage_offset() % 4 == 0 and (mt is None or mt.storage_offset() % 4 == 0)
        flags = (D, int(reverse), int(exclusive))
        if mt is None and vec:
            lib.scan_v4(xt, y, *flags, grid=(rows,), block=(NT,))
        elif mt is None:
            lib.scan_v1(xt, y, *flags, grid=(rows,), block=(NT,))
        elif vec:
            lib.masked_scan_v4(xt, mt, y, *flags, grid=(rows,), block=(NT,))
        else:
            lib.masked_scan_v1(xt, mt, y, *flags, grid=(rows,), block=(NT,))
    return y if last else y.transpose(d, -1).contiguous()
'''

FORWARDS = {
    "L1_89_cumsum": ("torch.cumsum(x, dim)", '''

def forward(module, x):
    return scan(x, None, module.dim, False, False)
'''),
    "L1_91_cumsum_reverse": ("torch.cumsum(x.flip(dim), dim).flip(dim)", '''

def forward(module, x):
    return scan(x, None, module.dim, True, False)
'''),
    "L1_92_cumsum_exclusive": ("the sums before each element, 0 first", '''

def forward(module, x):
    return scan(x, None, module.dim, False, True)
'''),
    "L1_93_masked_cumsum": ("torch.cumsum(x * mask, dim)", '''

def forward(module, x, mask):
    if mask.shape == x.shape and mask.dtype == torch.bool:
        return scan(x, mask, module.dim, False, False)
    return scan(x * mask, None, module.dim, False, False)
'''),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (what, forward) in FORWARDS.items():
        doc = (f'"""{name[3:]}: {what} in one read and one write of the row (a block per row, tiles of 2048\n'
               'floats scanned with warp shuffles, the running total carried between tiles).\n'
               'Generated by benchmarks/candidates/gen_cuda_scans.py."""\n')
        (OUT / f"{name}.py").write_text(f'{doc}SOURCE = r"""{SOURCE}"""\nSHAPE_GENERIC = True\n{HOST}{forward}')
    print(f"wrote {len(FORWARDS)} candidates to {OUT}")


if __name__ == "__main__":
    main()
