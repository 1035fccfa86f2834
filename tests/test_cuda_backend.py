"""The CUDA backend: pure-Python parts everywhere (CI has no GPU), launches on a GPU (marked `cuda`)."""
from __future__ import annotations

import ctypes

import pytest
import torch

from metal_accel.backends.cuda import backend as cb
from metal_accel.backends.cuda import nvrtc as cuda_nvrtc
from metal_accel.backends.cuda.signature import ArgBinder, cooperative_dims, launch_dims, parse_cuda_kernels
from metal_accel.proof.speed import TimingRejected, compare_speed
from metal_accel.core.errors import BackendUnavailableError, CompileError, KernelLaunchError

SAXPY = r"""
#include <cstdint>
extern "C" __global__ void saxpy(const float* __restrict__ x, float* y, float a, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


# ---------------------------------------------------------------- signatures

def test_parse_kernels_skips_helpers_and_reads_types():
    src = r"""
    #include <cuda_fp16.h>
    __device__ float helper(float x) { return x; }
    template <typename T> __global__ void not_extern(T* p) {}
    extern "C" {
    __device__ inline float h2(float x) { return x; }
    __global__ void __launch_bounds__(256, 2) k1(const float4* __restrict__ a, __half* b, const __nv_bfloat16* c,
                                                 long long n, unsigned int m, float s, bool flag) {}
    }
    extern "C" __global__ void k2(int* out, const unsigned char* mask, size_t n, double d) { }
    extern "C" __global__ void k3(void) { }
    """
    ks = parse_cuda_kernels(src)
    assert list(ks) == ["k1", "k2", "k3"]
    assert [str(p) for p in ks["k1"]] == ["const float4* a", "__half* b", "const __nv_bfloat16* c", "long long n",
                                          "unsigned int m", "float s", "bool flag"]
    assert [p.is_pointer for p in ks["k2"]] == [True, True, False, False]
    assert ks["k3"] == []


@pytest.mark.parametrize("src, msg", [
    ('extern "C" __global__ int bad(float* a) {}', "must return void"),
    ('extern "C" __global__ void bad(float& a) {}', "references"),
    ('extern "C" __global__ void bad(float** a) {}', "unsupported type"),
    ('extern "C" __global__ void bad(MyStruct s) {}', "unsupported type"),
])
def test_parse_rejects(src, msg):
    with pytest.raises(CompileError, match=msg):
        parse_cuda_kernels(src)


# ---------------------------------------------------------------- launch dimensions

def test_launch_dims_threads_convention():
    assert launch_dims("k", threads=1000, group_size=256) == ((4, 1, 1), (256, 1, 1))
    assert launch_dims("k", threads=100) == ((1, 1, 1), (100, 1, 1))
    assert launch_dims("k", threads=(64, 10), group_size=(32, 4)) == ((2, 3, 1), (32, 4, 1))
    assert launch_dims("k", threads=(8, 8, 8), group_size=(4, 4, 4)) == ((2, 2, 2), (4, 4, 4))
    assert launch_dims("k", grid=(3, 2), block=128) == ((3, 2, 1), (128, 1, 1))
    assert launch_dims("k", threads=0, group_size=128) is None
    assert launch_dims("k", grid=(0,), block=(32,)) is None
    assert launch_dims("k", threads=torch.tensor(70), group_size=32) == ((3, 1, 1), (32, 1, 1))


@pytest.mark.parametrize("kw, msg", [
    ({}, "needs threads"),
    ({"threads": 10, "grid": 1}, "not both"),
    ({"threads": 10, "group_size": 0}, "positive"),
    ({"threads": 10, "group_size": 2048}, "exceeds"),
    ({"threads": (10, 10)}, "explicit group_size"),
    ({"grid": 1}, "needs block"),
    ({"grid": 1, "block": (32, 32, 2)}, "exceeds"),
    ({"grid": (1, 70000), "block": 32}, "exceeds"),
    ({"threads": 1.5, "group_size": 32}, "integers"),
    ({"threads": -1, "group_size": 32}, "negative"),
    ({"threads": (1, 2, 3, 4), "group_size": 1}, "1 to 3"),
])
def test_launch_dims_errors(kw, msg):
    with pytest.raises(KernelLaunchError, match=msg):
        launch_dims("k", **kw)


def test_cooperative_dims_sizes_the_grid_to_the_resident_blocks():
    asked = []

    def resident(threads: int) -> int:  # a fake occupancy: 4 blocks per SM on 132 SMs
        asked.append(threads)
        return 4 * 132
    assert cooperative_dims("k", block=256, resident=resident) == ((528, 1, 1), (256, 1, 1))
    assert cooperative_dims("k", block=(16, 16), resident=resident) == ((528, 1, 1), (16, 16, 1))
    assert asked == [256, 256]

    def never(threads: int) -> int:
        raise AssertionError("an explicit grid needs no occupancy query")
    assert cooperative_dims("k", grid=(8,), block=(128,), resident=never) == ((8, 1, 1), (128, 1, 1))
    assert cooperative_dims("k", grid=0, block=128, resident=never) is None


@pytest.mark.parametrize("kw, msg", [
    ({"threads": 1024, "block": 256}, "not threads"),
    ({"threads": 1024}, "not threads"),
    ({"group_size": 256, "block": 256}, "not threads"),
    ({}, "needs block"),
    ({"grid": 4}, "needs block"),
    ({"block": 2048}, "exceeds"),
    ({"block": 0}, "positive"),
    ({"grid": (1, 70000), "block": 32}, "exceeds"),
])
def test_cooperative_dims_errors(kw, msg):
    with pytest.raises(KernelLaunchError, match=msg):
        cooperative_dims("k", resident=lambda n: 132, **kw)


def test_cooperative_dims_needs_a_resident_block():
    with pytest.raises(KernelLaunchError, match="fits on a multiprocessor"):
        cooperative_dims("k", block=1024, resident=lambda n: 0)


def test_sandbox_accepts_cooperative_launches():
    from metal_accel.sandbox.host import check_host_code
    check_host_code("""
def forward(module, x):
    y = torch.empty_like(x)
    lib.k(x, y, x.numel(), block=(512,), shared_mem=200000, cooperative=True)
    lib.k(x, y, x.numel(), grid=(4,), block=(512,), cooperative=True)
    return y
""")


# ---------------------------------------------------------------- argument binding (CPU tensors stand in)

def _binder(src: str = SAXPY, device_type: str = "cpu") -> ArgBinder:
    (name, params), = parse_cuda_kernels(src).items()
    return ArgBinder(name, params, device_type)


def test_binding_packs_pointers_and_scalars():
    b = _binder()
    x, y = torch.ones(8), torch.zeros(8)
    vals = b.values([x, y, 2.0, 8])
    assert vals == [x.data_ptr(), y.data_ptr(), 2.0, 8]
    addr, keep = b.pack(vals)
    arr = (ctypes.c_void_p * 4).from_address(addr)
    ptrs = [arr[i] for i in range(4)]
    assert ctypes.c_void_p.from_address(ptrs[0]).value == x.data_ptr()
    assert ctypes.c_float.from_address(ptrs[2]).value == 2.0
    assert ctypes.c_int64.from_address(ptrs[3]).value == 8
    assert b.values([x, y, 1, torch.tensor(3)])[2:] == [1.0, 3]


def test_binding_packs_mixed_scalars_at_c_alignment():
    src = ('extern "C" __global__ void k(char c, double d, int i, const float* p, bool b, short s, float f, '
           'unsigned long long u, uint8_t n) {}')
    b = _binder(src)
    x = torch.ones(4)
    vals = [-3, 2.5, -7, x, True, -2, 0.25, 2**64 - 1, 255]
    addr, _keep = b.pack(b.values(vals))
    ptrs = (ctypes.c_void_p * 9).from_address(addr)
    kinds = [ctypes.c_int8, ctypes.c_double, ctypes.c_int32, ctypes.c_void_p, ctypes.c_bool, ctypes.c_int16,
             ctypes.c_float, ctypes.c_uint64, ctypes.c_uint8]
    got = [kind.from_address(ptrs[i]).value for i, kind in enumerate(kinds)]
    assert got == [-3, 2.5, -7, x.data_ptr(), True, -2, 0.25, 2**64 - 1, 255]

    class Layout(ctypes.Structure):  # what a C compiler lays out for these parameters
        _fields_ = [(f"a{i}", kind) for i, kind in enumerate(kinds)]
    assert [ptrs[i] - ptrs[0] for i in range(9)] == [getattr(Layout, f"a{i}").offset for i in range(9)]
    assert b.bind(vals) == addr  # the fused hot path fills the same per-thread buffer


@pytest.mark.parametrize("args, msg", [
    ([torch.ones(4)], "takes 4 arguments"),
    ([torch.ones(4, dtype=torch.float64), torch.ones(4), 1.0, 4], "dtype"),
    ([torch.ones(4, 4).t(), torch.ones(4), 1.0, 4], "not contiguous"),
    ([[1.0], torch.ones(4), 1.0, 4], "torch.Tensor"),
    ([torch.ones(4), torch.ones(4), "a", 4], "number"),
    ([torch.ones(4), torch.ones(4), 1.0, 2.5], "integer"),
    ([torch.ones(4), torch.ones(4), 1.0, 2**63], "out of range"),
])
def test_binding_errors(args, msg):
    with pytest.raises(KernelLaunchError, match=msg):
        _binder().values(args)


def test_binding_checks_device_and_vector_alignment():
    with pytest.raises(KernelLaunchError, match="cuda tensors"):
        _binder(device_type="cuda").values([torch.ones(4), torch.ones(4), 1.0, 4])
    b = _binder('extern "C" __global__ void k(const float4* a, __half* h, uint16_t* bits) {}')
    base = torch.zeros(12)
    b.values([base[:8], torch.zeros(2, dtype=torch.float16), torch.zeros(2, dtype=torch.bfloat16)])
    with pytest.raises(KernelLaunchError, match="aligned"):
        b.values([base[1:9], torch.zeros(2, dtype=torch.float16), torch.zeros(2, dtype=torch.float16)])
    with pytest.raises(KernelLaunchError, match="whole float4"):
        b.values([base[:6], torch.zeros(2, dtype=torch.float16), torch.zeros(2, dtype=torch.float16)])
    with pytest.raises(KernelLaunchError, match="dtype"):
        b.values([base[:8], torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.float16)])


# ---------------------------------------------------------------- compile options, targets, cache keys

def test_options_and_targets():
    opts = cb.nvrtc_options("sm_90", ("/usr/local/cuda/include",))
    assert opts[0] == "--gpu-architecture=sm_90" and "-std=c++17" in opts
    assert not any("fast" in o for o in opts), "fast math changes results"
    assert any(o.endswith("cuda_nvrtc") for o in opts)
    assert cb.target_for((9, 0), (80, 86, 89, 90, 100)) == ("sm_90", True)
    assert cb.target_for((12, 1), (80, 90, 100)) == ("compute_100", False)
    with pytest.raises(CompileError):
        cb.target_for((7, 0), (80, 90))


def test_cache_key_changes_with_every_input():
    base = cb.cache_key("src", "sm_90", "13.0", ["-a"], "h")
    assert base == cb.cache_key("src", "sm_90", "13.0", ["-a"], "h") and len(base) == 32
    assert len({base, cb.cache_key("src2", "sm_90", "13.0", ["-a"], "h"), cb.cache_key("src", "sm_80", "13.0", ["-a"], "h"),
                cb.cache_key("src", "sm_90", "12.8", ["-a"], "h"), cb.cache_key("src", "sm_90", "13.0", ["-b"], "h"),
                cb.cache_key("src", "sm_90", "13.0", ["-a"], "i")}) == 6


def test_timings_agree():
    assert cb.timings_agree(100e-6, 115e-6)
    assert not cb.timings_agree(100e-6, 400e-6)       # host stall the GPU did not see
    assert not cb.timings_agree(300e-6, 100e-6)       # event longer than the wall: broken timer
    assert not cb.timings_agree(0.0, 10e-6)
    assert cb.timings_agree(2e-3, 2.3e-3)


def test_bench_retries_refused_samples_and_gives_up_when_too_many():
    calls = {"n": 0}

    def flaky(fn, args, kwargs, sync):
        calls["n"] += 1
        if calls["n"] % 5 == 0:
            raise TimingRejected("disagree")
        fn(*args, **kwargs)
        return (1e-3 if fn is eager else 0.5e-3), None

    def eager(x):
        return x

    def kernel(x):
        return x
    res = compare_speed(eager, kernel, [((1,), {})], timer=flaky, min_reps=20, max_reps=20, warmup=0)
    assert res.accepted and res.rejected_samples > 0 and 1.9 < res.speedup < 2.1

    burst = {"n": 0}

    def one_bad_burst(fn, args, kwargs, sync):  # one call refused 4 times in a row: its pair is dropped, no more
        burst["n"] += 1
        if 10 <= burst["n"] < 14:
            raise TimingRejected("host stall")
        return (1e-3 if fn is eager else 0.5e-3), None
    res = compare_speed(eager, kernel, [((1,), {})], timer=one_bad_burst, min_reps=20, max_reps=20, warmup=0)
    assert res.accepted and res.rejected_samples == 4

    def broken(fn, args, kwargs, sync):
        raise TimingRejected("always")
    res = compare_speed(eager, kernel, [((1,), {})], timer=broken, min_reps=5, max_reps=5, warmup=0,
                        retry_pause_s=0.0)
    assert not res.accepted and "unreliable timing" in res.reason and "2 attempts" in res.reason

    stall = {"n": 0}

    def host_busy_at_first(fn, args, kwargs, sync):  # every sample refused for a while, then none
        stall["n"] += 1
        if stall["n"] <= 20:  # the first attempt gives up after 16 refusals, the second sees 4
            raise TimingRejected("host stall")
        return (1e-3 if fn is eager else 0.5e-3), None
    res = compare_speed(eager, kernel, [((1,), {})], timer=host_busy_at_first, min_reps=20, max_reps=20, warmup=0,
                        retry_pause_s=0.0)
    assert res.accepted and 1.9 < res.speedup < 2.1 and res.rejected_samples == 20
    stall["n"] = 0
    res = compare_speed(eager, kernel, [((1,), {})], timer=host_busy_at_first, min_reps=20, max_reps=20, warmup=0,
                        retry_pause_s=0.0, attempts=1)
    assert not res.accepted and "unreliable timing" in res.reason


def test_backend_registered_but_unavailable_without_gpu():
    from metal_accel.backends import get_backend, known_backends
    assert "cuda" in known_backends()
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError):
            get_backend("cuda")


@pytest.mark.skipif(not cb.nvrtc_available(), reason="NVRTC not installed")
def test_compile_caches_on_disk(monkeypatch, isolated_user_cache):
    monkeypatch.setattr(cb.CudaBackend, "target", lambda self, device=None: ("sm_90", True))
    cb.clear_memory_cache()
    be = cb.CudaBackend()
    before = cuda_nvrtc.compile_count
    lib = be.compile(SAXPY)
    assert lib.kernel_names == ("saxpy",) and lib.compiled_now and cuda_nvrtc.compile_count == before + 1
    assert lib.path.parent == isolated_user_cache / "build" / "cuda" and lib.path.suffix == ".cubin"
    cb.clear_memory_cache()
    again = be.compile(SAXPY)
    assert not again.compiled_now and cuda_nvrtc.compile_count == before + 1 and again.path == lib.path
    other = be.compile(SAXPY.replace("a * x[i]", "x[i] * a"))
    assert other.path != lib.path
    with pytest.raises(CompileError, match="NVRTC"):
        be.compile('extern "C" __global__ void k(float* a) { a[0] = undefined_thing; }')
    with pytest.raises(CompileError, match="no kernel"):
        be.compile("__device__ float f(float x) { return x; }")


# ---------------------------------------------------------------- on a GPU

@pytest.mark.cuda
def test_gpu_launch_conventions():
    from metal_accel.backends import get_backend
    be = get_backend("cuda")
    lib = be.compile(SAXPY)
    x = torch.randn(1000, device="cuda")
    y = torch.randn(1000, device="cuda")
    ref = 3 * x + y
    lib.saxpy(x, y, 3.0, 1000, threads=1000, group_size=128)
    torch.testing.assert_close(y, ref)
    lib.saxpy(x, y, 1.0, 1000, grid=(8,), block=(128,))
    torch.testing.assert_close(y, ref + x)
    s = torch.cuda.Stream()
    z = torch.zeros(1000, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):  # launched on PyTorch's current stream
        lib.saxpy(x, z, 2.0, 1000, threads=1000, group_size=256)
    s.synchronize()
    torch.testing.assert_close(z, 2 * x)
    lib.saxpy(x[:0], z[:0], 1.0, 0, threads=0, group_size=256)  # empty: no launch, no error
    with pytest.raises(KernelLaunchError, match="cuda tensors"):
        lib.saxpy(x.cpu(), y, 1.0, 1000, threads=1000, group_size=128)
    with pytest.raises(KernelLaunchError, match="dtype"):
        lib.saxpy(x.double(), y, 1.0, 1000, threads=1000, group_size=128)
    env = be.environment()
    assert env.backend == "cuda" and "sm_" in env.device_name and "driver" in env.device_name


@pytest.mark.cuda
def test_gpu_2d_half_and_large_shared_memory():
    from metal_accel.backends import get_backend
    src = r"""
    #include <cuda_fp16.h>
    #include <cuda_bf16.h>
    extern "C" __global__ void cast2d(const float* x, __half* h, __nv_bfloat16* b, int rows, int cols) {
        int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
        if (r < rows && c < cols) { h[r * cols + c] = __float2half(x[r * cols + c]);
                                    b[r * cols + c] = __float2bfloat16(x[r * cols + c]); }
    }
    extern "C" __global__ void rev(const float* x, float* y, int n) {
        extern __shared__ float buf[];
        for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
    }
    """
    lib = get_backend("cuda").compile(src)
    x = torch.randn(37, 70, device="cuda")
    h, b = torch.empty_like(x, dtype=torch.half), torch.empty_like(x, dtype=torch.bfloat16)
    lib.cast2d(x, h, b, 37, 70, threads=(70, 37), group_size=(32, 8))
    torch.testing.assert_close(h, x.half())
    torch.testing.assert_close(b, x.bfloat16())
    n = 20000  # 80 KB of dynamic shared memory: needs the opt-in attribute
    v = torch.randn(n, device="cuda")
    out = torch.empty_like(v)
    lib.rev(v, out, n, grid=(1,), block=(256,), shared_mem=n * 4)
    torch.testing.assert_close(out, v.flip(0))


COOPERATIVE = r"""
#include <cooperative_groups.h>
// y = x - mean(x): block sums, a grid-wide sync, then every block adds all block sums
extern "C" __global__ void center(const float* __restrict__ x, float* part, float* __restrict__ y, int* blocks, int n) {
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    __shared__ float sh[32];
    const int stride = gridDim.x * blockDim.x;
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) s += x[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh[w];
        part[blockIdx.x] = t;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *blocks = gridDim.x;
    grid.sync();
    float total = 0.0f;
    for (int b = 0; b < (int)gridDim.x; ++b) total += __ldcg(part + b);
    const float mean = total / n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = x[i] - mean;
}
"""


@pytest.mark.cuda
def test_gpu_cooperative_launch():
    from metal_accel.backends import get_backend
    lib = get_backend("cuda").compile(COOPERATIVE)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = 1_000_003
    x = torch.randn(n, device="cuda")
    part = torch.empty(1 << 16, device="cuda")
    y = torch.empty_like(x)
    blocks = torch.zeros(1, dtype=torch.int32, device="cuda")
    lib.center(x, part, y, blocks, n, block=(256,), cooperative=True)  # grid: every block that fits at once
    torch.testing.assert_close(y, x - x.mean(), atol=1e-4, rtol=1e-4)
    resident = int(blocks.item())
    assert resident >= sms and resident % sms == 0
    lib.center(x, part, y, blocks, n, block=(256,), shared_mem=100_000, cooperative=True)  # opted in first
    assert sms <= int(blocks.item()) <= 2 * sms
    torch.testing.assert_close(y, x - x.mean(), atol=1e-4, rtol=1e-4)
    y.zero_()
    lib.center(x, part, y, blocks, n, grid=(3,), block=(128,), cooperative=True)
    assert int(blocks.item()) == 3
    torch.testing.assert_close(y, x - x.mean(), atol=1e-4, rtol=1e-4)
    with pytest.raises(KernelLaunchError, match="holds at once"):
        lib.center(x, part, y, blocks, n, grid=(resident * 4,), block=(256,), cooperative=True)
    with pytest.raises(KernelLaunchError, match="not threads"):
        lib.center(x, part, y, blocks, n, threads=n, group_size=256, cooperative=True)


@pytest.mark.cuda
def test_gpu_event_timer():
    from metal_accel.backends import get_backend
    timer = get_backend("cuda").timer()
    a = torch.randn(4096, 4096, device="cuda")
    t, out = timer(torch.mm, (a, a), {}, torch.cuda.synchronize)
    assert 1e-5 < t < 1.0 and out.shape == a.shape


@pytest.mark.cuda
def test_gpu_optimize_installs_and_isolates_a_crashing_kernel(tmp_path):
    import metal_accel
    from metal_accel.blocks import SiluMul

    good = (tmp_path / "c" / "cuda" / "SiluMul")
    good.mkdir(parents=True)
    (good / "crash.py").write_text('''
SOURCE = r"""
extern "C" __global__ void bad(const float* a, float* out, long long n) {
    float* p = (float*)0x10; out[0] = *p + a[0];
}
"""
def forward(module, a, b):
    out = torch.empty_like(a)
    lib.bad(a, out, a.numel(), threads=1, group_size=1)
    return out
''')
    (good / "good.py").write_text((__import__("pathlib").Path(metal_accel.__file__).parent.parent / "kernels_src" /
                                   "cuda" / "SiluMul.py").read_text())
    model = SiluMul().cuda().eval()
    a, b = torch.randn(64, 8192, device="cuda"), torch.randn(64, 8192, device="cuda")
    metal_accel.optimize(model, (a, b), backend="cuda", providers=[f"dir:{tmp_path / 'c'}"])
    rep = metal_accel.explain(model).modules[0]
    assert any("crash.py" in r and ("illegal" in r or "crashed" in r or "failed" in r or "error" in r)
               for r in rep.rejected), rep.rejected
    # the good candidate is correct; whether it is also 1.05x faster at this small size is the speed gate's
    # business (the recorded H100 run measured 0.61x here: dispatch overhead dominates 2 MB tensors), and the
    # timer may refuse to judge a few-microsecond call at all (2026-11-25, H100: "unreliable timing")
    good_verdict = [r for r in rep.rejected if "good.py" in r]
    assert rep.status == "kernel" or all(any(why in r for why in ("not faster", "within noise", "unreliable timing"))
                                         for r in good_verdict), rep
    with torch.inference_mode():
        torch.testing.assert_close(model(a, b), torch.nn.functional.silu(a) * b)


@pytest.mark.skipif(not cb.nvrtc_available(), reason="NVRTC not installed")
def test_nvrtc_leaves_the_interpreter_intact(monkeypatch, isolated_user_cache):
    """Regression: NVRTC writing its (empty) log into CPython's cached b" " turned every 32 into 0 in torch.load."""
    import io
    cb.nvrtc_compile(SAXPY.replace("a * x[i]", "x[i] * a + 0.0f"), "sm_90", cb.nvrtc_options("sm_90", cb.toolkit_include_dirs()),
                     True)
    assert bytes([32]) == b" " and b" " == b"\x20"
    buf = io.BytesIO()
    torch.save(torch.zeros(32, 3), buf)
    assert torch.load(io.BytesIO(buf.getvalue())).shape == (32, 3)


class _HostBound(torch.nn.Module):
    """Forty small elementwise ops on a tiny tensor: all host time, the case a CUDA graph is for."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((256,), 0.999))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(20):
            x = torch.tanh(x * self.scale + 0.001)
        return x


@pytest.mark.cuda
def test_gpu_cuda_graph_candidate_wins_host_bound_module_and_keeps_outputs(monkeypatch):
    import metal_accel
    from metal_accel.runtime.graph import GraphedOp
    from metal_accel.runtime.dispatch import dispatcher_of, eager_only

    monkeypatch.setenv("METAL_ACCEL_COMPILE", "1")
    model, x = _HostBound().cuda().eval(), torch.randn(8, 256, device="cuda")
    metal_accel.optimize(model, (x,), backend="cuda", progress=False)
    rep = metal_accel.explain(model).modules[0]
    assert rep.status == "graph" and rep.graph_us is not None and rep.graph_us < rep.eager_us, rep
    op = next(iter(dispatcher_of(model).table.values()))
    assert isinstance(op, GraphedOp)
    x1, x2 = torch.randn_like(x), torch.randn_like(x)
    with torch.inference_mode():
        y1 = model(x1)
        y2 = model(x2)  # a replay must not overwrite the output the caller still holds
        with eager_only():
            e1, e2 = model(x1), model(x2)
    torch.testing.assert_close(y1, e1)
    torch.testing.assert_close(y2, e2)
    with torch.no_grad():  # outside inference mode too
        torch.testing.assert_close(model(x1), e1)
    captures = op.captures
    model.scale = torch.nn.Parameter(torch.full((256,), 0.5, device="cuda"))  # new memory: re-captured
    with torch.inference_mode():
        y = model(x1)
        with eager_only():
            e = model(x1)
    torch.testing.assert_close(y, e)
    assert op.captures == captures + 1


_STEP_CANDIDATE = '''
SOURCE = r"""
extern "C" __global__ void step(const float* x, const float* scale, float* out, long long n, long long c) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = tanhf(x[i] * scale[i % c] + 0.001f);
}
"""
def forward(module, x):
    for _ in range(20):
        out = torch.empty_like(x)
        lib.step(x, module.scale, out, x.numel(), module.scale.numel(), threads=x.numel(), group_size=256)
        x = out
    return x
'''


@pytest.mark.skipif(not cb.nvrtc_available(), reason="NVRTC not installed")
@pytest.mark.cuda
def test_gpu_kernel_is_timed_as_a_graph_too_and_the_faster_launch_is_reinstalled_from_the_cache(tmp_path,
                                                                                                isolated_user_cache):
    import metal_accel
    from metal_accel.store import cache as cache_mod
    from metal_accel.backends import get_backend
    from metal_accel.runtime.graph import GraphedOp
    from metal_accel.runtime.dispatch import dispatcher_of, eager_only

    d = tmp_path / "c" / "cuda" / "_HostBound"
    d.mkdir(parents=True)
    (d / "steps.py").write_text(_STEP_CANDIDATE)
    model, x = _HostBound().cuda().eval(), torch.randn(8, 256, device="cuda")
    metal_accel.optimize(model, (x,), backend="cuda", providers=[f"dir:{tmp_path / 'c'}"], progress=False)
    rep = metal_accel.explain(model).modules[0]
    assert rep.status == "kernel", rep
    verdict = cache_mod.lookup("cuda", rep.key).verdict_for(get_backend("cuda").environment())
    assert "graph_launch" in verdict.details, verdict.details  # the replay was timed, whatever it found
    graphed = verdict.details.get("launch") == "cuda-graph"
    assert graphed == ("replayed as a CUDA graph" in rep.reason)
    assert isinstance(next(iter(dispatcher_of(model).table.values())), GraphedOp) == graphed
    again = _HostBound().cuda().eval()
    metal_accel.optimize(again, (x,), backend="cuda", providers=[], progress=False)  # from the cache
    assert isinstance(next(iter(dispatcher_of(again).table.values())), GraphedOp) == graphed
    x1, x2 = torch.randn_like(x), torch.randn_like(x)
    with torch.inference_mode():
        y1, y2 = again(x1), again(x2)
        with eager_only():
            e1, e2 = again(x1), again(x2)
    torch.testing.assert_close(y1, e1)
    torch.testing.assert_close(y2, e2)
