"""CPU backend: extern "C" parsing, compile + disk cache, argument binding."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from metal_accel.backends import available_backends, backend_for_device, get_backend
from metal_accel.backends.cpu import backend as cpu
from metal_accel.backends.cpu.backend import CParam, CpuBackend, parse_extern_c
from metal_accel.core.errors import BackendUnavailableError, CompileError, KernelLaunchError
from limits import HANG_S

pytestmark = pytest.mark.skipif(not CpuBackend().is_available(), reason="no C++ compiler")

FMA = r"""
#include <cstdint>
// out[i] = a[i] * b[i] + s
extern "C" void fma_k(const float* __restrict__ a, const float* __restrict__ b,
                      float* __restrict__ out, float s, int64_t n) {
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i] + s;
}
extern "C" void fill_i(int32_t* out, int v, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = v;
}
"""


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "cache"))
    cpu.clear_memory_cache()
    yield tmp_path / "cache"
    cpu.clear_memory_cache()


@pytest.fixture
def lib():
    return CpuBackend().compile(FMA)


# ---------------------------------------------------------------- parser

def test_parse_single_form_with_const_restrict_and_comments():
    src = """
    /* extern "C" int not_a_kernel(float x); */
    // extern "C" int nor_this(float x);
    extern "C" void k(const float* __restrict__ x, double *restrict y, const int64_t* __restrict z,
                      uint16_t* h, float s, long long n, size_t m, bool flag) { const char* t = "}"; }
    """
    assert parse_extern_c(src) == {"k": [
        CParam("x", "float", True, True), CParam("y", "double", True, False),
        CParam("z", "int64_t", True, True), CParam("h", "uint16_t", True, False),
        CParam("s", "float", False, False), CParam("n", "long long", False, False),
        CParam("m", "size_t", False, False), CParam("flag", "bool", False, False),
    ]}


def test_parse_block_form():
    src = """
    #ifdef __cplusplus
    extern "C" {
    #endif
    static inline float helper(float x) { return x * 2; }
    struct Pair { int a; int b; };
    void first(int8_t* a, uint8_t* b) { if (a) { b[0] = 1; } }
    void second(void);
    void second(void) {}
    #ifdef __cplusplus
    }
    #endif
    """
    assert parse_extern_c(src) == {
        "first": [CParam("a", "int8_t", True, False), CParam("b", "uint8_t", True, False)],
        "second": [],
    }


def test_parse_unsupported_type_names_function_and_parameter():
    with pytest.raises(CompileError, match=r"kernel k: parameter 1 .*std::vector"):
        parse_extern_c('extern "C" void k(float* a, std::vector<float> v) {}')
    with pytest.raises(CompileError, match=r"kernel k: parameter 0 'float\*\* a'"):
        parse_extern_c('extern "C" void k(float** a) {}')


def test_parse_non_void_return():
    with pytest.raises(CompileError, match=r"kernel k returns 'int'.*must return void"):
        parse_extern_c('extern "C" int k(float* a) { return 0; }')
    with pytest.raises(CompileError, match="returns"):
        parse_extern_c('extern "C" { float* k(float* a) { return a; } }')


# ---------------------------------------------------------------- compile and call

def test_compile_and_call_matches_torch(lib):
    assert lib.kernel_names == ("fma_k", "fill_i")
    a, b = torch.randn(1001), torch.randn(1001)
    out = torch.empty(1001)
    lib.fma_k(a, b, out, 0.5, a.numel())
    torch.testing.assert_close(out, a * b + 0.5, rtol=1e-5, atol=1e-5)
    ints = torch.zeros(7, dtype=torch.int32)
    lib.fill_i(ints, torch.tensor(3), 7)  # 0-dim tensor scalar
    assert ints.tolist() == [3] * 7


def test_unknown_kernel_lists_available(lib):
    with pytest.raises(AttributeError, match="fma_k, fill_i"):
        lib.nope


def test_disk_cache_hit_in_process(user_cache):
    before = cpu.compile_count
    first = CpuBackend().compile(FMA)
    assert first.compiled_now and cpu.compile_count == before + 1
    assert CpuBackend().compile(FMA) is first  # in-process cache
    cpu.clear_memory_cache()
    again = CpuBackend().compile(FMA)  # disk cache
    assert not again.compiled_now and cpu.compile_count == before + 1
    assert again.path == first.path and again.path.parent == user_cache / "build" / "cpu"


@pytest.mark.slow
def test_disk_cache_hit_in_subprocess_without_compiler(user_cache):
    CpuBackend().compile(FMA)
    code = textwrap.dedent("""
        import sys, torch
        from metal_accel.backends.cpu import backend as cpu
        lib = cpu.CpuBackend().compile(sys.stdin.read())
        a = torch.ones(4); out = torch.empty(4)
        lib.fma_k(a, a, out, 1.0, 4)
        assert out.tolist() == [2.0] * 4
        print(cpu.compile_count, lib.compiled_now)
    """)
    env = dict(os.environ, METAL_ACCEL_USER_CACHE=str(user_cache), CXX="/nonexistent/c++")
    proc = subprocess.run([sys.executable, "-c", code], input=FMA, env=env, capture_output=True, text=True,
                          timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "False"]


def test_syntax_error_raises_compile_error_with_diagnostics():
    with pytest.raises(CompileError, match="(?s)compilation failed.*error"):
        CpuBackend().compile('extern "C" void broken(float* a) { a[0] = ; }')


def test_no_kernel_raises_compile_error():
    with pytest.raises(CompileError, match="no extern"):
        CpuBackend().compile("int x = 1;")


# ---------------------------------------------------------------- binding errors

def _args():
    a = torch.randn(8)
    return a, a.clone(), torch.empty(8)


def test_wrong_dtype(lib):
    a, b, out = _args()
    with pytest.raises(KernelLaunchError, match=r"argument 1 .*torch.float32.*torch.float64"):
        lib.fma_k(a, b.double(), out, 1.0, 8)
    with pytest.raises(KernelLaunchError, match="expected a torch.Tensor"):
        lib.fma_k(a, [1.0] * 8, out, 1.0, 8)


def test_non_contiguous(lib):
    a, _, out = _args()
    strided = torch.randn(16)[::2]
    with pytest.raises(KernelLaunchError, match=r"\.contiguous\(\)"):
        lib.fma_k(a, strided, out, 1.0, 8)


def test_wrong_arity(lib):
    a, b, out = _args()
    with pytest.raises(KernelLaunchError, match="takes 5 arguments, got 4"):
        lib.fma_k(a, b, out, 1.0)


def test_kwargs_rejected_on_cpu(lib):
    a, b, out = _args()
    with pytest.raises(KernelLaunchError, match="GPU-only"):
        lib.fma_k(a, b, out, 1.0, 8, threads=(8, 1, 1))


def test_float_for_int_param(lib):
    a, b, out = _args()
    with pytest.raises(KernelLaunchError, match=r"argument 4 .*expected an integer"):
        lib.fma_k(a, b, out, 1.0, 8.0)
    lib.fma_k(a, b, out, 1, 8)  # an int for a float parameter is fine
    torch.testing.assert_close(out, a * b + 1, rtol=1e-5, atol=1e-5)


def test_int_out_of_range(lib):
    with pytest.raises(KernelLaunchError, match="out of range"):
        lib.fill_i(torch.zeros(1, dtype=torch.int32), 2**40, 1)


# ---------------------------------------------------------------- registry

def test_registry():
    assert "cpu" in available_backends()
    assert get_backend("cpu") is backend_for_device(torch.device("cpu"))
    assert get_backend("cpu").environment().backend == "cpu"
    with pytest.raises(BackendUnavailableError, match="known backends: cpu"):
        get_backend("tpu")
    with pytest.raises(BackendUnavailableError, match="no backend for device type 'xpu'"):
        backend_for_device("xpu")
