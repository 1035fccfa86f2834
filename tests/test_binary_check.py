"""The binary check decides: each construct is compiled with the real compiler (source check bypassed) and
the shared object is rejected with a sentence naming what was found; legit kernels pass."""
from __future__ import annotations

import json
import os
import runpy
import subprocess
from pathlib import Path

import pytest

from metal_accel.core import config
from metal_accel.backends.cpu import backend as cpu
from metal_accel.backends.artifact import baseline, record_path
from metal_accel.backends.cpu.backend import CpuBackend, compile_flags, find_compiler
from metal_accel.backends.native_build import HeaderCheckError, compile_shared
from metal_accel.sandbox.binary_allow import CPU, MPS_EMU
from metal_accel.sandbox.binary_check import BinaryCheckError, BinaryCheckUnavailable, check_shared_object
from metal_accel.core.errors import CompileError
from metal_accel.sandbox.kernel_source import HEADERS

from toymodels import GOOD

pytestmark = pytest.mark.needs_cxx
KERNELS_SRC = Path(__file__).resolve().parents[1] / "kernels_src" / "cpu"
TAIL = '\nextern "C" void k(float* o) { o[0] = 1.0f; }\n'


def build(tmp_path: Path, source: str, name: str = "k") -> Path:
    """SOURCE compiled with the CPU backend's flags, no source check, no header check."""
    src, out = tmp_path / f"{name}.cpp", tmp_path / f"{name}.so"
    src.write_text(source)
    subprocess.run([find_compiler(), *compile_flags(), str(src), "-o", str(out)], check=True, capture_output=True)
    return out


def check(path: Path, policy=CPU) -> None:
    cxx = find_compiler()
    check_shared_object(path, policy, baseline(cxx, compile_flags(), str(config.include_dir())))


@pytest.mark.parametrize("source, found", [
    ('#include <cstdlib>\nextern "C" void k(float* o) { (system)("true"); }', "imports system"),
    ('#include <fcntl.h>\nextern "C" void k(float* o) { int (*f)(const char*, int, ...) = open; o[0] = f("x", 0); }',
     "imports open"),
    ('#include <sys/socket.h>\nextern "C" void k(float* o) { auto f = &socket; o[0] = f(2, 1, 0); }', "imports socket"),
    ('#include <cstdlib>\nextern "C" void k(float* o) { auto f = getenv; o[0] = f("HOME") != 0; }', "imports getenv"),
    ('extern "C" long write(int, const void*, unsigned long);\nextern "C" void k(float* o) { write(1, o, 4); }',
     "imports write"),
    ('#include <sys/time.h>\nextern "C" void k(float* o) { timeval t; gettimeofday(&t, 0); o[0] = t.tv_usec; }',
     "imports gettimeofday"),
    ('extern char** environ;\nextern "C" void k(float* o) { o[0] = environ[0][0]; }', "imports environ"),
    ('#define EXTC extern "C"\nEXTC int puts(const char*);\nextern "C" void k(float* o) { puts("x"); }', "imports puts"),
    ('#include <x86intrin.h>\nextern "C" void k(float* o) { o[0] = float(__rdtsc()); }', "rdtsc"),
    ('#include <cpuid.h>\nextern "C" void k(unsigned* o) { __get_cpuid(0, o, o + 1, o + 2, o + 3); }', "cpuid"),
    ('#include <xmmintrin.h>\nextern "C" void k(float* o) { _mm_setcsr(0x9fc0); o[0] = 1; }', "floating-point control"),
    ('#define A(x) a##x\nextern "C" void k(float* o) { A(sm)("syscall"); }', "syscall"),
    ('#include <cstdlib>\n__attribute__((__constructor__)) static void at_load() { void* volatile p = malloc(8); free(p); }'
     + TAIL, ".init_array"),
    ('#include <cstdlib>\n[[gnu::constructor]] static void at_load() { void* volatile p = malloc(8); free(p); }' + TAIL,
     ".init_array"),
    ('#include <cstdlib>\nstatic void at_load() { void* volatile p = malloc(8); free(p); }\n'
     '__attribute__((section(".init_array"), used)) static void (*p)() = at_load;' + TAIL, ".init_array"),
    ('int calls() { static int n; return ++n; }\nconst int k0 = calls();' + TAIL, ".init_array"),
    ('struct C { mutable int n; };\nconst C c{0};\nextern "C" void k(float* o) { o[0] = ++c.n; }', "writable data"),
    ('int counter;\nextern "C" void k(float* o) { o[0] = ++counter; }', "writable data"),
    ('struct S { static inline int n = 0; };\nextern "C" void k(float* o) { o[0] = ++S::n; }', "writable data"),
    ('thread_local int n;\nextern "C" void k(float* o) { o[0] = ++n; }', "thread-local"),
    ('extern "C" void impl(float* o) { o[0] = 1; }\nextern "C" void (*pick())(float*) { return impl; }\n'
     'extern "C" void k(float* o) __attribute__((ifunc("pick")));', "indirect function"),
])
def test_rejected_constructs_name_what_was_found(tmp_path, source, found):
    so = build(tmp_path, source)
    with pytest.raises(BinaryCheckError, match=found) as info:
        check(so)
    msg = str(info.value)
    assert msg.startswith("binary check: ") and "\n" not in msg and "Traceback" not in msg


@pytest.mark.parametrize("name", sorted(p.stem for p in KERNELS_SRC.glob("*.py")))
@pytest.mark.slow
def test_shipped_cpu_kernels_pass(tmp_path, name):
    check(build(tmp_path, runpy.run_path(str(KERNELS_SRC / f"{name}.py"))["SOURCE"]
                .replace('"ma_vecmath.h"', f'"{config.include_dir() / "ma_vecmath.h"}"')))


def test_syscall_bytes_inside_an_immediate_are_not_an_instruction(tmp_path):
    """0f 05 inside a constant is data to a linear sweep: legit kernels hold such bytes (documented limit)."""
    check(build(tmp_path, 'extern "C" void k(unsigned* o) { o[0] = 0x050f; }'))


@pytest.mark.slow
def test_toy_chain_and_stdlib_kernels_pass(tmp_path):
    check(build(tmp_path, GOOD.split('"""')[1], "chain"))
    check(build(tmp_path, '#include <vector>\n#include <algorithm>\n#include <cmath>\n'
                          'extern "C" void k(float* x, long n) { std::vector<float> v(x, x + n); '
                          'std::sort(v.begin(), v.end()); for (long i = 0; i < n; ++i) x[i] = std::exp(v[i]); }',
                "vec"))


@pytest.mark.slow
def test_emulator_runtime_passes_its_policy_but_not_the_cpus():
    from metal_accel.backends.mps_emu.backend import MpsEmuBackend
    lib = MpsEmuBackend().compile("#include <metal_stdlib>\nusing namespace metal;\nkernel void k(device float* x "
                                  "[[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] += 1.0f; }")
    from metal_accel.backends.mps_emu.backend import _baseline  # the runtime's own load-time entries (its checks' ctor)
    check_shared_object(lib._path, MPS_EMU, _baseline(find_compiler()))
    with pytest.raises(BinaryCheckError, match="thread-local|imports|loaded"):
        check(lib._path, CPU)


def test_unreadable_and_foreign_formats_are_refused(tmp_path):
    macho = tmp_path / "k.dylib"
    macho.write_bytes(b"\xcf\xfa\xed\xfe" + bytes(60))
    with pytest.raises(BinaryCheckUnavailable, match="Mach-O.*refused"):
        check(macho)
    so = build(tmp_path, TAIL)
    so.write_bytes(so.read_bytes()[:200])
    with pytest.raises(BinaryCheckError, match="not a readable ELF"):
        check(so)


# ---------------------------------------------------------------- artifacts: record, verify, rebuild once

FMA = '#include <cstdint>\nextern "C" void fma_k(const float* a, float* o, int64_t n) { for (int64_t i = 0; i < n; ++i) o[i] = a[i] * 2.0f; }\n'


def test_build_record_holds_sha_and_verdict():
    lib = CpuBackend().compile(FMA)
    rec = json.loads(record_path(lib.path).read_text())
    assert rec["backend"] == "cpu" and rec["binary_check"].startswith("passed") and len(rec["sha256"]) == 64


@pytest.mark.parametrize("damage", ["truncate", "swap", "record"])
def test_changed_artifact_is_rebuilt_once(tmp_path, damage):
    path = CpuBackend().compile(FMA).path
    cpu.clear_memory_cache()
    # a new file moved over the artifact (rewriting a library this process has mapped would crash it)
    bad = tmp_path / "bad.so"
    if damage == "truncate":
        bad.write_bytes(path.read_bytes()[:100])
    elif damage == "swap":
        bad = build(tmp_path, '#include <cstdint>\nextern "C" void fma_k(const float* a, float* o, int64_t n)'
                              ' { for (int64_t i = 0; i < n; ++i) o[i] = 0.0f; }')
    else:
        bad.write_bytes(path.read_bytes())
        record_path(path).unlink()
    os.replace(bad, path)
    before = cpu.compile_count
    lib = CpuBackend().compile(FMA)
    assert lib.compiled_now and cpu.compile_count == before + 1
    rec = json.loads(record_path(path).read_text())
    from metal_accel.sandbox.binary_check import sha256_of
    assert rec["sha256"] == sha256_of(path)


def test_artifact_that_stays_bad_is_a_compile_error_once(monkeypatch):
    real = cpu._run_compiler

    def corrupting(cxx, source, out):
        real(cxx, source, out)
        out.write_bytes(b"\x7fELF garbage")

    monkeypatch.setattr(cpu, "_run_compiler", corrupting)
    with pytest.raises(CompileError, match="rebuilding it did not help; it is not loaded"):
        CpuBackend().compile(FMA)


# ---------------------------------------------------------------- headers and diagnostics

def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "home" / "secret.h"
    secret.parent.mkdir()
    secret.write_text("API_KEY=sk-secret-4242\n")
    return secret


def test_relative_include_outside_is_refused_and_not_quoted(tmp_path):
    secret = _secret(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "kernel.cpp").write_text(f'#include "../home/{secret.name}"\n' + TAIL)
    with pytest.raises(CompileError) as info:
        compile_shared(find_compiler(), compile_flags(), work, "kernel.cpp", 120, config.include_dir(), HEADERS["c++"])
    msg = str(info.value)
    assert "sk-secret" not in msg and str(tmp_path) not in msg and "API_KEY" not in msg


def test_header_outside_the_allowlist_is_refused(tmp_path):
    (tmp_path / "kernel.cpp").write_text("#include <cstdio>\n" + TAIL)
    with pytest.raises(HeaderCheckError, match="cstdio, which is not an allowed header"):
        compile_shared(find_compiler(), compile_flags(), tmp_path, "kernel.cpp", 120, config.include_dir(),
                       HEADERS["c++"])


def test_diagnostics_quote_only_the_kernel():
    with pytest.raises(CompileError) as info:
        CpuBackend().compile('#include <cmath>\nextern "C" void k(float* o) { o[0] = std::sqrt("x"); }\n')
    msg = str(info.value)
    assert "kernel.cpp:2" in msg and "/usr/" not in msg and str(Path.home()) not in msg
    assert str(config.user_cache_dir()) not in msg


# ---------------------------------------------------------------- CUDA: device globals in the compiled module

PTX_HEAD = ".version 8.0\n.target sm_90\n.address_size 64\n"
PTX_KERNEL = (".visible .entry k(.param .u64 k_param_0)\n{\n  .reg .f32 %f<2>;\n  .reg .b64 %rd<2>;\n"
              "  ld.param.u64 %rd1, [k_param_0];\n  ld.global.f32 %f1, [%rd1];\n  st.global.f32 [%rd1], %f1;\n  ret;\n}\n")


@pytest.mark.parametrize("decl, name", [
    (".global .align 4 .u32 counter;\n", "counter"),
    (".visible .global .align 4 .b8 memo[64] = {0};\n", "memo"),
    (".extern .global .align 8 .u64 clock_seen;\n", "clock_seen"),
])
def test_ptx_device_globals_are_rejected(decl, name):
    from metal_accel.backends.cuda.nvrtc import check_device_state, device_state
    assert device_state((PTX_HEAD + decl + PTX_KERNEL).encode(), cubin=False) == \
        f"the PTX declares the device global variable {name}"
    with pytest.raises(BinaryCheckError, match=f"binary check: .*{name}.*stateless"):
        check_device_state((PTX_HEAD + decl + PTX_KERNEL).encode(), cubin=False)


def test_ptx_without_device_globals_passes():
    from metal_accel.backends.cuda.nvrtc import device_state
    const = ".const .align 4 .f32 scale = 0f3F800000;\n.shared .align 4 .b8 tile[128];\n"
    assert device_state((PTX_HEAD + const + PTX_KERNEL).encode(), cubin=False) is None


def test_ptx_toolkit_static_members_pass_but_a_kernel_global_in_their_company_does_not():
    """libcu++ (pulled in by cooperative_groups.h) emits static constexpr members as module globals."""
    from metal_accel.backends.cuda.nvrtc import device_state
    toolkit = (".global .align 1 .b8 _ZN4cuda3std3__417integral_constantIbLb1EE5valueE = {1};\n"
               ".global .align 4 .u32 _ZN37_INTERNAL_00000000_9_kernel_cu_center18cooperative_groups4__v17details4tile"
               "20_MemoryShuffleCutoffE = 32;\n"
               ".global .align 8 .u64 _ZN4cuda3std3__411__type_listIJasilxEE6__sizeE = 5;\n")
    assert device_state((PTX_HEAD + toolkit + PTX_KERNEL).encode(), cubin=False) is None
    for own in ("counter", "_ZN37_INTERNAL_00000000_9_kernel_cu_center7counterE"):
        assert own in device_state((PTX_HEAD + toolkit + f".global .align 4 .u32 {own};\n" + PTX_KERNEL).encode(),
                                   cubin=False)


def test_cubin_global_symbols_are_judged_by_owner(tmp_path):
    from metal_accel.backends.cuda.nvrtc import device_state
    obj = tmp_path / "t.o"
    (tmp_path / "t.s").write_text('.section .nv.global.init,"aw"\n'
                                  '.globl _ZN4cuda3std3__417integral_constantIbLb1EE5valueE\n'
                                  '_ZN4cuda3std3__417integral_constantIbLb1EE5valueE: .byte 1\n'
                                  '.globl memo\nmemo: .zero 8\n')
    subprocess.run(["as", str(tmp_path / "t.s"), "-o", str(obj)], check=True)
    assert "device global variable memo" in device_state(obj.read_bytes(), cubin=True)
    (tmp_path / "t.s").write_text('.section .nv.global.init,"aw"\n'
                                  '.globl _ZN4cuda3std3__417integral_constantIbLb1EE5valueE\n'
                                  '_ZN4cuda3std3__417integral_constantIbLb1EE5valueE: .byte 1\n')
    subprocess.run(["as", str(tmp_path / "t.s"), "-o", str(obj)], check=True)
    assert device_state(obj.read_bytes(), cubin=True) is None


def test_cubin_global_sections_are_rejected(tmp_path):
    from metal_accel.backends.cuda.nvrtc import device_state
    # an ELF with a .nv.global section stands in for a cubin (no NVRTC here)
    obj = tmp_path / "g.o"
    (tmp_path / "g.s").write_text('.section .nv.global,"aw",@nobits\n.zero 4\n')
    subprocess.run(["as", str(tmp_path / "g.s"), "-o", str(obj)], check=True)
    assert ".nv.global" in device_state(obj.read_bytes(), cubin=True)
    plain = build(tmp_path, TAIL)
    assert device_state(plain.read_bytes(), cubin=True) is None
    assert "not a readable ELF" in device_state(b"junk", cubin=True)
