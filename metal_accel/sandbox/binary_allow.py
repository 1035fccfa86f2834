"""What a compiled kernel library may import, per backend (the allowlists of binary_check.py).

A CPU kernel computes: it may call libm, copy and fill memory, allocate, use what std::vector,
std::sort and exceptions pull in, and the OpenMP runtime's parallel-region entry points and
read-only queries. Nothing here opens a file, a socket or a process, reads the environment or a
clock, or changes process-wide settings (omp_set_*, FP environment, signals).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_MATH_BASE = (
    "acos asin atan atan2 cos sin tan acosh asinh atanh cosh sinh tanh exp exp2 exp10 expm1 frexp ilogb ldexp "
    "log log10 log1p log2 logb modf scalbn scalbln cbrt fabs hypot pow pow10 sqrt erf erfc lgamma tgamma ceil floor "
    "nearbyint rint lrint llrint round lround llround roundeven trunc fmod remainder remquo copysign nan nextafter "
    "nexttoward fdim fmax fmin fma sincos significand j0 j1 jn y0 y1 yn gamma drem"
).split()
_MATH_PRIVATE = "__isnan __isinf __finite __fpclassify __signbit __issignaling __iseqsig".split()
LIBM = frozenset(f"{b}{s}" for b in (*_MATH_BASE, *_MATH_PRIVATE) for s in ("", "f", "l"))

MEMORY = frozenset({
    "memcpy", "memset", "memmove", "__memcpy_chk", "__memset_chk", "__memmove_chk",
    "malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign",
})
CXX_RUNTIME = frozenset({"__gxx_personality_v0", "_ZSt9terminatev", "__stack_chk_fail", "__stack_chk_guard"})
OPENMP = frozenset({"omp_get_thread_num", "omp_get_num_threads", "omp_get_max_threads", "omp_get_num_procs",
                    "omp_in_parallel", "omp_get_level", "omp_get_team_num", "omp_get_num_teams"})
# weak references every shared object made by GCC carries (crtstuff), whatever its source
TOOLCHAIN = frozenset({"__cxa_finalize", "_ITM_registerTMCloneTable", "_ITM_deregisterTMCloneTable", "__gmon_start__"})

# libmvec (_ZGV...), glibc's *_finite entry points, operator new/delete, the C++ ABI (__cxa_*: guards,
# exception allocation, thread-exit destructors), the unwinder, std::__throw_*, libgomp's GOMP_*, and
# libgcc's arithmetic helpers (half/bfloat conversions, 128-bit and complex arithmetic, bit counts)
_PREFIXES = re.compile(r"_ZGV|__\w+_finite$|_Zn[wa]|_Zd[la]|__cxa_|_Unwind_|_ZSt\d+__throw_|GOMP_|"
                       r"__(?:trunc|extend)[a-z]+f2$|__(?:float|fixuns|fix)[a-z]+$|__(?:add|sub|mul|div|neg|pow)[a-z]+[23]$|"
                       r"__(?:u?div|u?mod|u?divmod)[a-z]+[34]$|__(?:popcount|clz|ctz|ffs|parity|bswap)[a-z]+2$|"
                       r"__(?:eq|ne|lt|le|gt|ge|unord|cmp)[a-z]+2$")

# The MSL emulator's runtime (include/msl_emu/runtime.h), measured from compiled emulator kernels:
# fiber stacks (mmap, guard pages with mprotect, munmap), error messages (vsnprintf/snprintf into a
# buffer), thread-local threadgroup storage (__tls_get_addr), ucontext switching where the assembly
# switch is not used (non-x86-64 or non-Linux). None of them reaches a file, the network, a process
# or the environment by itself; mmap of an inherited descriptor is the one way out (see FILE_CAPABLE).
EMULATOR = frozenset({"mmap", "munmap", "mprotect", "snprintf", "vsnprintf", "__snprintf_chk", "__vsnprintf_chk",
                      "__tls_get_addr", "getcontext", "makecontext", "swapcontext", "setcontext"})
# imports that could touch a file given a descriptor: their call sites must be in the emulator runtime
FILE_CAPABLE = frozenset({"mmap", "mprotect"})

NEEDED = re.compile(r"lib(?:stdc\+\+|m|mvec|gomp|omp|gcc_s|c|pthread|dl)\.so(?:\.[\d.]+)?$|ld-linux[\w.-]*\.so[\d.]*$")


@dataclass(frozen=True)
class Policy:
    """What one backend's compiled libraries may hold."""

    backend: str
    extra_imports: frozenset[str] = frozenset()
    allow_tls: bool = False
    fp_control_in: frozenset[str] = frozenset()  # functions whose code may load the FP control registers
    runtime_callers: tuple[str, ...] = ()  # symbol prefixes (mangled) where FILE_CAPABLE calls may sit

    def allows_import(self, name: str) -> bool:
        """Whether an undefined dynamic symbol NAME (version suffix stripped) may be imported."""
        return (name in LIBM or name in MEMORY or name in CXX_RUNTIME or name in OPENMP or name in TOOLCHAIN
                or name in self.extra_imports or bool(_PREFIXES.match(name)))


CPU = Policy("cpu")
# The emulator's runtime keeps threadgroup memory and its launch state in thread_local storage, and its
# fiber switch (ma_fiber_switch_, hand-written assembly) saves and restores MXCSR and the x87 control word.
MPS_EMU = Policy("mps-emu", extra_imports=EMULATOR, allow_tls=True, fp_control_in=frozenset({"ma_fiber_switch_"}),
                 runtime_callers=("_ZN5ma_rt",))

POLICIES = {"cpu": CPU, "mps-emu": MPS_EMU}
