"""The kernel-source check runs in the user's process on every candidate and cache entry: its time must grow
linearly with the source (red-team pass 3: `extern "C"` repeated took 12.8 s for 32 KiB of CUDA, quadratic, hours
at the 1 MiB cap; nested braces and long declarations were quadratic too). Ratios of two sizes, best of three:
linear is 8x, quadratic 64x, whatever the machine's load."""
from __future__ import annotations

import time

import pytest

from metal_accel.sandbox.kernel_source import SourceCheckError, check_kernel_source


def _best(src: str, language: str) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        try:
            check_kernel_source(src, language)
        except SourceCheckError:
            pass
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("fragment", ['extern "C" ', "{", "static int f() {", "a) {"])
def test_check_time_grows_linearly(fragment: str) -> None:
    small = (fragment * (16384 // len(fragment) + 1))[:16384]
    big = (fragment * (131072 // len(fragment) + 1))[:131072]
    assert _best(big, "cuda") < 32 * max(_best(small, "cuda"), 1e-3)


def test_extern_c_rule_still_holds() -> None:
    head = "#include <cuda_runtime.h>\n"
    with pytest.raises(SourceCheckError, match="defined elsewhere"):
        check_kernel_source(head + 'extern "C" int system(const char*);\n', "cuda")
    with pytest.raises(SourceCheckError, match="defined elsewhere"):
        check_kernel_source(head + 'extern "C" {\n__global__ void k(float* x) { x[0] = 1; }\nint puts(const char*);\n}\n',
                            "cuda")
    check_kernel_source(head + 'extern "C" {\n__global__ void k(float* x) { if (x) { x[0] = 1; } }\n}\n'
                        'extern "C" __global__ void j(float* x) { x[0] = 2; }\n', "cuda")
