"""90_cumprod: torch.cumprod(x, dim) with eager CUDA's own association of the products, so overflow to
Inf, underflow to 0 and NaN land where eager's do (bit-identical results), in one read and one write.

Eager (PyTorch 2.11, aten/src/ATen/native/cuda/ScanUtils.cuh, scan_dim -> scan_innermost_dim ->
tensor_kernel_scan_innermost_dim_impl) scans a row in chunks of N = 2^(L+1) elements, L from
get_log_num_threads_x_inner_scan(rows, row_size) (uint32 arithmetic, clamped to 4..9; 7 for 512 x 32768),
chunks padded with 1.0: the chunk's first element is multiplied by the previous chunk's last output,
then a Sklansky scan runs levels m = 0..L, each element of the upper half of every group of 2^(m+1)
multiplied (own * other) by the last element of the group's lower half. Eager runs one chunk after
another with a __syncthreads per level, 16 rows a block.

Here (a warp per chunk, 4 chunks of a row at once, a block per row): each warp first runs the same
Sklansky levels skipping the group that holds the chunk's first element (the only group whose operands
depend on the carry), so A_i = eager's value of element i just before level msb(i). Eager then does
out[i] = A_i * C_msb(i), with C_k = out[2^k - 1] = A_(2^k-1) * C_(k-1) and C_0 = x_0 * carry: a chain of
L + 2 products per chunk (9 for N = 256), the only sequential work, done by one thread for the block's 4
chunks between two barriers. tests/test_cumprod_order.py emulates both orders on the CPU and checks
they are bit-identical. Other dims: eager's scan_outer_dim is a plain left fold per column (acc * x), done
the same way here. 1-D tensors (numel == size(dim)) go to CUB's inclusive_scan in eager, whose order is
not reproduced here: they get the chunked scan with rows = 1 (not bit-identical to eager there)."""
SOURCE = r"""
#define FULL 0xffffffffu
#define NW 4            // warps (chunks) per block
#define NT (NW * 32)

__host__ __device__ constexpr int ilog2(int e) { return e <= 1 ? 0 : 1 + ilog2(e / 2); }

// E consecutive elements of the row (chunk-local lane*E .. lane*E+E-1 at `first`), 1.0f past its end
template <int E, bool VEC>
__device__ __forceinline__ void load_e(const float* __restrict__ xr, unsigned int S, unsigned int first, float v[E]) {
    if (VEC) {  // S % 4 == 0 and E % 4 == 0: a float4 is all in or all out
        #pragma unroll
        for (int q = 0; q < E / 4; ++q) {
            const unsigned int i = first + 4 * q;
            float4 f = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            if (i < S) f = *reinterpret_cast<const float4*>(xr + i);
            v[4 * q] = f.x; v[4 * q + 1] = f.y; v[4 * q + 2] = f.z; v[4 * q + 3] = f.w;
        }
    } else {
        #pragma unroll
        for (int k = 0; k < E; ++k) v[k] = first + k < S ? xr[first + k] : 1.0f;
    }
}

template <int E, bool VEC>
__device__ __forceinline__ void store_e(float* __restrict__ yr, unsigned int S, unsigned int first, const float o[E]) {
    if (VEC) {
        #pragma unroll
        for (int q = 0; q < E / 4; ++q) {
            const unsigned int i = first + 4 * q;
            if (i < S) *reinterpret_cast<float4*>(yr + i) = make_float4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
        }
    } else {
        #pragma unroll
        for (int k = 0; k < E; ++k) if (first + k < S) yr[first + k] = o[k];
    }
}

// One block per row of S floats; eager's chunk is N = 32 * E elements (L = log2(N) - 1), a warp per chunk.
template <int E, bool VEC>
__device__ __forceinline__ void scan_rows(const float* __restrict__ x, float* __restrict__ y, unsigned int S) {
    constexpr int LE = ilog2(E);
    constexpr int L = LE + 4;
    constexpr int N = 32 * E;
    constexpr int K = L + 2;               // chain factors of a chunk: x_0 and A_(2^k - 1), k = 1..L+1
    __shared__ float sM[NW][K];
    __shared__ float sC[NW][K];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* xr = x + (size_t)blockIdx.x * S;
    float* yr = y + (size_t)blockIdx.x * S;
    const unsigned int nchunks = (S + N - 1) / N;
    float carry = 1.0f;                    // eager's block_total (thread 0 only)
    float nx[E];
    load_e<E, VEC>(xr, S, (unsigned int)warp * N + lane * E, nx);
    for (unsigned int c0 = 0; c0 < nchunks; c0 += NW) {
        const unsigned int base = (c0 + warp) * N + lane * E;
        float v[E];
        #pragma unroll
        for (int k = 0; k < E; ++k) v[k] = nx[k];
        if (c0 + NW < nchunks) load_e<E, VEC>(xr, S, base + NW * N, nx);
        // eager's Sklansky levels, except on the group holding the chunk's first element
        #pragma unroll
        for (int m = 0; m < LE; ++m) {     // groups inside a thread
            #pragma unroll
            for (int k = 0; k < E; ++k) {
                if ((k >> m) & 1) {
                    const int g = (k >> (m + 1)) << (m + 1);
                    if (lane != 0 || g != 0) v[k] = v[k] * v[g + (1 << m) - 1];
                }
            }
        }
        #pragma unroll
        for (int m = LE; m <= L; ++m) {    // groups of 2h lanes: the upper h lanes take the last of the lower h
            const int h = 1 << (m - LE);
            const int g = lane & ~(2 * h - 1);
            const float t = __shfl_sync(FULL, v[E - 1], g + h - 1);
            if ((lane & h) && g != 0) {
                #pragma unroll
                for (int k = 0; k < E; ++k) v[k] = v[k] * t;
            }
        }
        // the chain's factors: M_0 = x_0, M_k = A_(2^k - 1)
        if (lane == 0) {
            #pragma unroll
            for (int k = 0; k <= LE; ++k) sM[warp][k] = v[(1 << k) - 1];
        } else if (((lane + 1) & lane) == 0) {
            sM[warp][LE + 31 - __clz(lane + 1)] = v[E - 1];
        }
        __syncthreads();
        if (threadIdx.x == 0) {            // C_0 = x_0 * carry, C_k = A_(2^k - 1) * C_(k-1), carry = C_(L+1)
            #pragma unroll
            for (int w = 0; w < NW; ++w) { // chunks past the row's end compute garbage never used
                float c = sM[w][0] * carry;
                sC[w][0] = c;
                #pragma unroll
                for (int k = 1; k <= L; ++k) { c = sM[w][k] * c; sC[w][k] = c; }
                carry = sM[w][L + 1] * c;
            }
        }
        __syncthreads();
        if (c0 + warp < nchunks) {         // out_i = A_i * C_msb(i), out_0 = C_0
            float o[E];
            if (lane == 0) {
                o[0] = sC[warp][0];
                #pragma unroll
                for (int k = 1; k < E; ++k) o[k] = v[k] * sC[warp][31 - __clz(k)];
            } else {
                const float cm = sC[warp][LE + 31 - __clz(lane)];
                #pragma unroll
                for (int k = 0; k < E; ++k) o[k] = v[k] * cm;
            }
            store_e<E, VEC>(yr, S, base, o);
        }
    }
}

// E = N / 32 elements a thread; the v variants read float4s (S % 4 == 0)
extern "C" __global__ void __launch_bounds__(NT) cumprod_e1(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<1, false>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e2(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<2, false>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e4(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<4, false>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e8(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<8, false>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e16(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<16, false>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e32(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<32, false>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e4v(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<4, true>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e8v(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<8, true>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e16v(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<16, true>(x, y, S); }
extern "C" __global__ void __launch_bounds__(NT) cumprod_e32v(const float* __restrict__ x, float* __restrict__ y, unsigned int S) { scan_rows<32, true>(x, y, S); }

// eager's scan_outer_dim: a thread per (outer, inner) column, acc = acc * x down the scanned dim
extern "C" __global__ void __launch_bounds__(256) cumprod_outer(const float* __restrict__ x, float* __restrict__ y,
                                                                long long outer, long long S, long long inner) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer * inner) return;
    const long long o = t / inner, i = t - o * inner;
    const float* p = x + o * S * inner + i;
    float* q = y + o * S * inner + i;
    float acc = 1.0f;
    for (long long c = 0; c < S; ++c) {
        acc = acc * p[c * inner];
        q[c * inner] = acc;
    }
}
"""
SHAPE_GENERIC = True

NT = 128


def log_threads_x(rows, size):
    """get_log_num_threads_x_inner_scan(rows, size) of eager, in its uint32 arithmetic (rows, size >= 1)."""
    diff = (math.ceil(math.log2(size)) - math.ceil(math.log2(rows))) % (1 << 32)
    return min(max(4, ((9 + diff) % (1 << 32)) // 2), 9)


def scan_rows(x, y, rows, size):
    """Innermost-dim scan of `rows` contiguous rows of `size` floats, with eager's chunking."""
    e = (2 << log_threads_x(rows, size)) // 32
    vec = size % 4 == 0 and x.storage_offset() % 4 == 0
    args = (x, y, size)
    if e == 1:
        lib.cumprod_e1(*args, grid=(rows,), block=(NT,))
    elif e == 2:
        lib.cumprod_e2(*args, grid=(rows,), block=(NT,))
    elif e == 4 and vec:
        lib.cumprod_e4v(*args, grid=(rows,), block=(NT,))
    elif e == 4:
        lib.cumprod_e4(*args, grid=(rows,), block=(NT,))
    elif e == 8 and vec:
        lib.cumprod_e8v(*args, grid=(rows,), block=(NT,))
    elif e == 8:
        lib.cumprod_e8(*args, grid=(rows,), block=(NT,))
    elif e == 16 and vec:
        lib.cumprod_e16v(*args, grid=(rows,), block=(NT,))
    elif e == 16:
        lib.cumprod_e16(*args, grid=(rows,), block=(NT,))
    elif vec:
        lib.cumprod_e32v(*args, grid=(rows,), block=(NT,))
    else:
        lib.cumprod_e32(*args, grid=(rows,), block=(NT,))


def forward(module, x):
    assert x.dtype == torch.float32, "float32 only"
    if x.dim() == 0:
        return x.clone()
    d = module.dim % x.dim()
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n = xc.numel()
    if n == 0:
        return y
    size = xc.shape[d]
    if d == xc.dim() - 1 or n == size:
        scan_rows(xc, y, n // size, size)
    else:
        inner = 1
        for s in xc.shape[d + 1:]:
            inner *= s
        outer = n // (size * inner)
        lib.cumprod_outer(xc, y, outer, size, inner, grid=((outer * inner + 255) // 256,), block=(256,))
    return y
