"""Static checks of kernel sources: what a kernel may include and call."""
from __future__ import annotations

import pytest

from metal_accel.sandbox.kernel_source import SourceCheckError, check_kernel_source

from toymodels import GOOD

OK_CPP = """
#include <cstdint>
#include <cmath>
#include "ma_vecmath.h"
static inline float sq(float x) { return x * x; }
static const float kHalf = 0.5f;
constexpr int kTile = 16;
// a comment that mentions system("rm -rf /") and fopen() is fine
extern "C" void k(const float* x, float* out, int64_t n) {
    const char* s = "printf(\\"hi\\")";
    (void)s;
    for (int64_t i = 0; i < n; ++i) out[i] = sq(x[i]) * kHalf + kTile;
}
"""


def test_realistic_sources_pass():
    check_kernel_source(OK_CPP, "c++")
    check_kernel_source(GOOD.split('"""')[1], "c++")
    check_kernel_source("#include <metal_stdlib>\nusing namespace metal;\nconstant float k = 2.0f;\n"
                        "kernel void f(device float* o [[buffer(0)]], uint i [[thread_position_in_grid]]) "
                        "{ threadgroup float t[32]; o[i] = k; }", "msl")
    check_kernel_source("#include <cuda_fp16.h>\n__global__ void f(float* o) { __shared__ float t[32]; "
                        "o[threadIdx.x] = 1.0f; }", "cuda")


@pytest.mark.parametrize("snippet, message", [
    ("#include <cstdio>", "not an allowed header"),
    ("#include <fstream>", "not an allowed header"),
    ('#include "/etc/passwd"', "not an allowed header"),
    ("#include <dlfcn.h>", "not an allowed header"),
    ("void f() { asm volatile(\"nop\"); }", "inline assembly"),
    ("void f() { __asm__(\"nop\"); }", "inline assembly"),
    ("void f() { system(\"ls\"); }", "system()"),
    ("void f() { std::getenv(\"HOME\"); }", "getenv()"),
    ("void f() { void* h = dlopen(\"x\", 0); }", "dlopen()"),
    ("void f() { auto fp = fopen(\"x\", \"w\"); }", "fopen()"),
    ("void f() { printf(\"x\"); }", "printf()"),
    ("void f() { int s = socket(2, 1, 0); }", "socket()"),
    ("void f(float* o) { static float memo[16]; o[0] = memo[0]; }", "static variable"),
    ("void f(float* o) { static int calls = 0; o[0] = calls++; }", "static variable"),
    ("float* f() { static thread_local float b[4]; return b; }", "thread_local"),
    ("float cache_[1024];\nvoid f() {}", "global variable"),
    ("int calls = 0;\nvoid f() { calls++; }", "global variable"),
    ("#pragma once\n#line 1 \"x\"\nvoid f() {}", "#line"),
    ("__attribute__((constructor)) static void at_load() {}", "constructor"),
    ("void f(int* o) { o[0] = getpid(); }", "getpid()"),
])
def test_forbidden_constructs_are_rejected_with_line(snippet, message):
    with pytest.raises(SourceCheckError, match=message) as info:
        check_kernel_source("#include <cstdint>\n" + snippet, "c++")
    assert "line " in str(info.value)


def test_cuda_global_device_state_is_rejected():
    with pytest.raises(SourceCheckError, match="global device variable"):
        check_kernel_source("__device__ float memo[64];\n__global__ void f(float* o) { o[0] = memo[0]; }", "cuda")
    with pytest.raises(SourceCheckError, match="clock64"):
        check_kernel_source("__global__ void f(long long* o) { o[0] = clock64(); }", "cuda")


def test_language_headers_do_not_cross():
    with pytest.raises(SourceCheckError, match="metal_stdlib"):
        check_kernel_source("#include <metal_stdlib>\n", "c++")


PREFETCH = ('__global__ void k(const char* p, unsigned n) {\n'
            '    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(n) : "memory");\n'
            '    asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(p + 128));\n}\n')


def test_cuda_kernels_may_hold_l2_prefetch_ptx_only():
    check_kernel_source(PREFETCH, "cuda")
    with pytest.raises(SourceCheckError, match="inline assembly"):
        check_kernel_source(PREFETCH, "c++")  # CPU kernels: no inline assembly at all


@pytest.mark.parametrize("statement, message", [
    ('asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t[0]));', "inline assembly"),  # a timer
    ('asm volatile("prefetch.global.L2 [%0]; mov.u32 %1, %%smid;" :: "l"(p), "r"(0));', "inline assembly"),
    ('asm volatile("ld.global.f32 %0, [%1];" :: "l"(p));', "inline assembly"),
    ('asm("prefetch.global.L2 [%0];" :: "l"(p));', "inline assembly"),  # only the volatile form
    ('asm volatile("prefetch.global.L2 [%0];" "mov.u32 %1, %%clock;" :: "l"(p));', "inline assembly"),
    ('asm volatile("prefetch.global.L2 [%0];" :: "l"(fopen("x", "r")));', "fopen()"),  # operands are checked
])
def test_other_inline_ptx_is_rejected(statement, message):
    with pytest.raises(SourceCheckError, match=message):
        check_kernel_source("__global__ void k(const char* p, long long* t) {\n    " + statement + "\n}\n", "cuda")


# ---------------------------------------------------------------- issue 25: spellings that got around the word list

@pytest.mark.parametrize("snippet, message", [
    ('void f() { (system)("ls"); }', "system named as a value"),
    ('void f() { auto g = &getenv; }', "getenv named as a value"),
    ("int (*g)(const char*, int, ...) = open;", "open named as a value"),
    ("void f(int fd) { write(fd, \"x\", 1); }", r"write\(\)"),
    ("void f(long* o) { o[0] = gettimeofday(0, 0); }", r"gettimeofday\(\)"),
    ("void f(long* o) { o[0] = _rdtsc(); }", "_rdtsc"),
    ("void f() { _mm_setcsr(0); }", "_mm_setcsr"),
    ("extern char** environ;", "environ"),
    ('extern "C" int creat64(const char*, unsigned);', "declaration without a body"),
    ('extern "C" { int creat64(const char*, unsigned); }', "declaration without a body"),
    ('#define EXTC extern "C"\nvoid f() {}', "#define EXTC hides extern"),
    ("#define CAT(a, b) a##b\nvoid f() {}", r"token pasting \(##\)"),
    ("#define H <cstdio>\n#include H", "computed include"),
    ("#include_next <cmath>", "#include_next"),
    ('#include "../secret.h"', "names a path"),
    ("#if __has_include(<cstdio>)\n#endif", "__has_include"),
    ("__attribute__((__constructor__)) static void at_load() {}", "attribute constructor"),
    ("[[gnu::constructor]] static void at_load() {}", "attribute constructor"),
    ('__attribute__((section(".init_array"), used)) static void (*p)() = 0;', "attribute section"),
    ("struct C { mutable int n; };\nconst C c{0};", "mutable member"),
    ("int g();\nconst int k = g();", "initialized by a call"),
    ("int g();\nnamespace {\nconst int k{g()};\n}", "initialized by a call"),
    ("namespace a { int counter; }", "global variable"),
    ("struct S { static inline int n = 0; };", "static variable"),
])
def test_issue25_spellings_are_rejected(snippet, message):
    with pytest.raises(SourceCheckError, match=message):
        check_kernel_source("#include <cstdint>\n" + snippet, "c++")


@pytest.mark.parametrize("snippet", [
    "const float a[] = {1.0f, 2.0f};\nconstexpr float b[2] = {1, 2};\nstruct P { float x; };\nconst P p{1.0f};",
    "namespace q { constexpr int z = 3; }\ntemplate <int N> struct T { float v[N]; };",
    'extern "C" { void k1(float* o) { o[0] = 1; } void k2(float* o) { o[0] = 2; } }',
    "void f(float* o) { auto g = [n = 0]() mutable { return ++n; }; o[0] = g(); }",
    "typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));",
    "static inline __attribute__((always_inline)) float sq(float x) { return x * x; }",
    "struct Tile { float read(int i) const { return 0.0f * i; } };\nvoid f(Tile t, float* o) { o[0] = t.read(0); }",
])
def test_issue25_legit_constructs_pass(snippet):
    check_kernel_source("#include <cstdint>\n" + snippet, "c++")


def test_shipped_cpu_kernels_pass():
    import runpy
    from pathlib import Path
    for f in sorted((Path(__file__).resolve().parents[1] / "kernels_src" / "cpu").glob("*.py")):
        check_kernel_source(runpy.run_path(str(f))["SOURCE"], "c++")
