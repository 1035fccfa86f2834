SOURCE = r"""
// Rotary embedding, "rotate half": out = x * cos + cat(-x2, x1) * sin, x (..., S, D), cos/sin (S, D).
//
// cos and sin are shared by all P = numel / (S * D) planes (batch x heads) of x. A thread owns one
// position (s, column) of cos/sin, loads it once into registers and walks planes of x with it, so cos
// and sin come from DRAM once in all (a row-major walk over x would stream the whole of cos/sin once
// per plane: 32 heads x 32 MB at S=31250, more than the 50 MB L2 keeps between two planes).
// Products rounded on their own (no FMA contraction), as eager's separate mul and add do: a contracted
// a*b+c keeps an overflowing product finite where eager gets Inf - Inf = NaN.

__device__ __forceinline__ float rope1(float a, float c, float b, float t) {  // a*c + b*t, each rounded
    return __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, t));
}

// Fast path: D % 8 == 0 and 16-byte aligned rows. Thread = (s, j) with j < q = D/8: it owns float4 j of
// the first half (x1) and float4 j of the second half (x2) of row s, so every byte of x is read once.
// Block b: chunk b / G of the S*q (s, j) items, plane group g = b % G (planes g, g+G, ...): the G blocks
// sharing one chunk of cos/sin run side by side and meet it in L2.
extern "C" __global__ void __launch_bounds__(256) rotary_v4(const float4* __restrict__ x, const float4* __restrict__ cs,
        const float4* __restrict__ sn, float4* __restrict__ out, int P, int S, int q, int G) {
    const int g = (int)(blockIdx.x % (unsigned)G);
    const int item = (int)(blockIdx.x / (unsigned)G) * 256 + (int)threadIdx.x;
    if (item >= S * q) return;
    const int s = item / q, j = item - s * q;
    const long long o1 = (long long)s * (2 * q) + j, o2 = o1 + q;  // float4 offsets of x1[j], x2[j] in row s
    const float4 c1 = __ldg(cs + o1), c2 = __ldg(cs + o2), t1 = __ldg(sn + o1), t2 = __ldg(sn + o2);
    const long long plane = (long long)S * (2 * q);                    // float4s per plane
    int p = g;
    // four planes per step: eight independent 16-byte loads in flight per thread
    for (; p + 3 * G < P; p += 4 * G) {
        float4 a[4], b[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long base = (long long)(p + u * G) * plane;
            a[u] = __ldcs(x + base + o1);
            b[u] = __ldcs(x + base + o2);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long base = (long long)(p + u * G) * plane;
            float4 r1, r2;
            r1.x = rope1(a[u].x, c1.x, -b[u].x, t1.x); r1.y = rope1(a[u].y, c1.y, -b[u].y, t1.y);
            r1.z = rope1(a[u].z, c1.z, -b[u].z, t1.z); r1.w = rope1(a[u].w, c1.w, -b[u].w, t1.w);
            r2.x = rope1(b[u].x, c2.x, a[u].x, t2.x); r2.y = rope1(b[u].y, c2.y, a[u].y, t2.y);
            r2.z = rope1(b[u].z, c2.z, a[u].z, t2.z); r2.w = rope1(b[u].w, c2.w, a[u].w, t2.w);
            __stcs(out + base + o1, r1);
            __stcs(out + base + o2, r2);
        }
    }
    for (; p < P; p += G) {
        const long long base = (long long)p * plane;
        const float4 a = __ldcs(x + base + o1), b = __ldcs(x + base + o2);
        float4 r1, r2;
        r1.x = rope1(a.x, c1.x, -b.x, t1.x); r1.y = rope1(a.y, c1.y, -b.y, t1.y);
        r1.z = rope1(a.z, c1.z, -b.z, t1.z); r1.w = rope1(a.w, c1.w, -b.w, t1.w);
        r2.x = rope1(b.x, c2.x, a.x, t2.x); r2.y = rope1(b.y, c2.y, a.y, t2.y);
        r2.z = rope1(b.z, c2.z, a.z, t2.z); r2.w = rope1(b.w, c2.w, a.w, t2.w);
        __stcs(out + base + o1, r1);
        __stcs(out + base + o2, r2);
    }
}

// Any D (odd too) and any alignment: one thread per element (s, k) of a row, walking the planes.
// chunk(2) splits D into x1 (the first a = ceil(D/2)) and x2 (the last b = floor(D/2));
// rotate_half[k] = -x2[k] = -x[k + a] for k < b, else x1[k - b] = x[k - b].
extern "C" __global__ void __launch_bounds__(256) rotary_any(const float* __restrict__ x, const float* __restrict__ cs,
        const float* __restrict__ sn, float* __restrict__ out, long long P, long long S, int D, int G) {
    const int g = (int)(blockIdx.x % (unsigned)G);
    const long long item = (long long)(blockIdx.x / (unsigned)G) * 256 + threadIdx.x;
    if (item >= S * D) return;
    const long long s = item / D;
    const int k = (int)(item - s * D);
    const int a = (D + 1) >> 1, b = D >> 1;
    const int kr = k < b ? k + a : k - b;
    const float c = cs[item], t = sn[item];
    const long long plane = S * D, off = s * D;
    for (long long p = g; p < P; p += G) {
        const float* xr = x + p * plane + off;
        const float r = k < b ? -xr[kr] : xr[kr];
        out[p * plane + off + k] = rope1(xr[k], c, r, t);
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x, cos, sin):
    xc = x.contiguous()
    out = torch.empty_like(xc)
    D = xc.shape[-1]
    S = xc.shape[-2]
    assert cos.shape == (S, D) and sin.shape == (S, D)
    cc = cos.contiguous()
    sc = sin.contiguous()
    n = xc.numel()
    if n == 0:
        return out
    P = n // (S * D)  # planes (batch x heads) sharing cos/sin
    waves = 132 * 8 * 4  # blocks for about four waves of 8 resident blocks on each of 132 SMs
    if D % 8 == 0 and xc.storage_offset() % 4 == 0 and cc.storage_offset() % 4 == 0 and \
            sc.storage_offset() % 4 == 0 and S * D < 2 ** 31 and P < 2 ** 31:
        q = D // 8
        chunks = (S * q + 255) // 256
        G = min(P, max(1, (waves + chunks - 1) // chunks))
        lib.rotary_v4(xc, cc, sc, out, P, S, q, G, grid=(chunks * G,), block=(256,))
    else:
        chunks = (S * D + 255) // 256
        G = min(P, max(1, (waves + chunks - 1) // chunks), 65535)
        lib.rotary_any(xc, cc, sc, out, P, S, D, G, grid=(chunks * G,), block=(256,))
    return out
