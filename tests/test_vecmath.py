"""metal_accel/include/ma_vecmath.h: accuracy against float64 references, special values, and
that GCC vectorizes loops calling the functions. Compiled with g++ and loaded with ctypes."""
from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import pytest
import torch

from metal_accel.backends.cpu.backend import compile_flags as cpu_compile_flags
from metal_accel.core.config import include_dir

CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = [pytest.mark.needs_cxx, pytest.mark.skipif(CXX is None, reason="no C++ compiler")]

FUNCS = {
    # name: (C function, float64 reference, max ulp on normal results)
    "exp": ("ma_expf", torch.exp, 2.0),
    "sigmoid": ("ma_sigmoidf", torch.sigmoid, 3.0),
    "silu": ("ma_siluf", torch.nn.functional.silu, 4.0),
    "tanh": ("ma_tanhf", torch.tanh, 3.0),
    "erf": ("ma_erff", torch.erf, 3.0),
    "log": ("ma_logf", torch.log, 1.0),
    "log1p": ("ma_log1pf", torch.log1p, 2.0),
    "expm1": ("ma_expm1f", torch.expm1, 3.0),
}

KERNEL = '#include "ma_vecmath.h"\nextern "C" {\n' + "".join(
    f"void v_{name}(const float* x, float* y, long n) {{\n"
    f"  #pragma omp simd\n  for (long i = 0; i < n; ++i) y[i] = {fn}(x[i]);\n}}\n"
    for name, (fn, _, _) in [*FUNCS.items(), ("gelu", ("ma_geluf", None, None))]
) + "}\n"

# The CPU backend's own flags: what kernels are really compiled with (the include dir is one of them).
FLAGS = [f for f in cpu_compile_flags() if not f.startswith("-I")]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vecmath")
    src, so = tmp / "vecmath.cpp", tmp / "vecmath.so"
    src.write_text(KERNEL)
    res = subprocess.run([CXX, *FLAGS, "-I", str(include_dir()), str(src), "-o", str(so)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return ctypes.CDLL(str(so))


def apply(lib, name: str, x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.full_like(x, 12345.0)
    getattr(lib, f"v_{name}")(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                              ctypes.c_long(x.numel()))
    return y


def ulp_error(got: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """|got - ref| in units of the float32 ulp at the reference (float64 arithmetic)."""
    ref32 = ref64.float().abs()
    _, e = torch.frexp(ref32)
    ulp = torch.ldexp(torch.ones_like(ref64), (e.to(torch.int64) - 24).clamp(min=-149))
    return (got.double() - ref64).abs() / ulp


def dense_inputs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.cat([
        torch.linspace(-110.0, 110.0, 1_000_001),
        torch.linspace(-6.0, 6.0, 1_000_001),
        torch.linspace(-1e-3, 1e-3, 100_001),
        torch.randn(200_000, generator=gen) * 4,
        torch.exp2(torch.linspace(-149.0, 127.99, 400_001)),  # every binade, subnormals too (log, log1p)
        torch.linspace(0.5, 2.0, 100_001),  # log's polynomial range and its seam at sqrt(1/2)
        torch.tensor([0.625, -0.625, 0.875, -0.875, 4.0, -4.0, 88.72, -87.33, -103.9]),
    ])


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.slow
def test_accuracy_dense(lib, name):
    _, ref_fn, max_ulp = FUNCS[name]
    x = dense_inputs()
    got = apply(lib, name, x)
    ref = ref_fn(x.double())
    normal = torch.isfinite(ref.float()) & (ref.float().abs() >= 2.0 ** -126)
    err = ulp_error(got[normal], ref[normal])
    worst = int(err.argmax())
    assert err.max().item() <= max_ulp, f"{name}: {err.max().item()} ulp at x={x[normal][worst].item()!r}"
    # subnormal results: within a few subnormal steps of the reference
    sub = torch.isfinite(ref.float()) & ~normal
    if sub.any():
        assert ((got[sub].double() - ref[sub]).abs() <= 4 * 2.0 ** -149).all()
    # and close to torch's own float32 result (where that is not flushed to zero)
    ours = ref_fn(x)
    keep = ~torch.isfinite(ours) | (ours.abs() >= 2.0 ** -126)
    torch.testing.assert_close(got[keep], ours[keep], rtol=4e-7, atol=0.0, equal_nan=True)


SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30, 1e-45, -1e-45, 1e30, -1e30,
           88.0, 88.72, 88.73, 89.0, 100.0, -87.0, -88.0, -100.0, -103.9, -104.0, -105.0,
           3.4e38, -3.4e38]


@pytest.mark.parametrize("name", list(FUNCS))
def test_special_values(lib, name):
    _, ref_fn, _ = FUNCS[name]
    x = torch.tensor(SPECIAL, dtype=torch.float32)
    got = apply(lib, name, x)
    ref = ref_fn(x.double()).float()
    if name == "silu":  # silu(-inf) = -inf * 0 is NaN in torch too
        ref = torch.where(x == -math.inf, torch.tensor(math.nan), ref)
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), (x, got, ref)
    fin = ~torch.isnan(ref)
    assert torch.equal(torch.isinf(got[fin]), torch.isinf(ref[fin])), (x, got, ref)
    torch.testing.assert_close(got[fin], ref[fin], rtol=4e-7, atol=4 * 2.0 ** -149)
    # signs of zeros and infinities are exact
    same_sign = torch.signbit(got[fin]) == torch.signbit(ref[fin])
    assert same_sign[(ref[fin] == 0) | torch.isinf(ref[fin])].all(), (x, got, ref)


def test_gelu_matches_torch(lib):
    """gelu = 0.5 x (1 + erf(x / sqrt2)): like torch's, its relative error grows where 1 + erf cancels."""
    x = torch.cat([torch.linspace(-12.0, 12.0, 200_001), torch.tensor([math.inf, -math.inf, math.nan])])
    got = apply(lib, "gelu", x)
    ref = torch.nn.functional.gelu(x.double()).float()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_exp_saturation_and_torch_silu_nan():
    assert torch.isnan(torch.nn.functional.silu(torch.tensor(-math.inf)))  # the behaviour copied


def test_exp_edges(lib):
    x = torch.tensor([-math.inf, math.inf, math.nan, 1000.0, -1000.0, 88.72283, -103.972077])
    got = apply(lib, "exp", x)
    assert got[0].item() == 0.0 and got[1].item() == math.inf and math.isnan(got[2].item())
    assert got[3].item() == math.inf and got[4].item() == 0.0
    assert math.isfinite(got[5].item())


@pytest.mark.slow
def test_loops_vectorize(tmp_path):
    """GCC vectorizes a simd loop over each function with the backend's flags (no -ffast-math).

    Without -fno-trapping-math, GCC 12 if-converts the functions' selects only where the ISA has
    masked vector ops (AVX-512); on an AVX2 machine every loop stayed scalar."""
    version = subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout
    if "GCC" not in version and "g++" not in version:
        pytest.skip("vectorization report is GCC-specific")
    src = tmp_path / "v.cpp"
    src.write_text(KERNEL)
    res = subprocess.run([CXX, *FLAGS, "-fopt-info-vec-optimized", "-I", str(include_dir()), str(src),
                          "-o", str(tmp_path / "v.so")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = {line.split(":")[1] for line in res.stderr.splitlines() if "loop vectorized" in line}
    loop_lines = {str(i + 1) for i, line in enumerate(KERNEL.splitlines()) if "for (long i" in line}
    assert loop_lines <= lines, res.stderr
