"""Static checks of kernel sources (C++, CUDA, MSL): what a kernel may include and call.

The sandbox covers host code; this covers SOURCE. A kernel may compute, nothing else: an
allowlist of headers, no inline assembly, no file, process, network, environment or
dynamic-loading calls, no I/O, and no mutable state that survives between calls.
"""
from __future__ import annotations

import re

from .errors import MetalAccelError

HEADERS: dict[str, frozenset[str]] = {
    "c++": frozenset({
        "cstdint", "stdint.h", "cstddef", "stddef.h", "cmath", "math.h", "cfloat", "float.h", "climits",
        "limits.h", "limits", "cstring", "string.h", "algorithm", "type_traits", "utility", "array",
        "numeric", "cstdlib", "stdlib.h", "immintrin.h", "x86intrin.h", "arm_neon.h", "omp.h", "ma_vecmath.h", "vector",
    }),
    "cuda": frozenset({
        "cstdint", "stdint.h", "cstddef", "cmath", "math.h", "cfloat", "climits", "limits", "type_traits",
        "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_runtime.h", "cooperative_groups.h",
        "cooperative_groups/reduce.h", "mma.h", "cuda/pipeline", "cuda/barrier", "cuda_pipeline.h",
        "cuda/std/cstdint", "cuda/std/limits", "cuda/std/type_traits",
    }),
    "msl": frozenset({
        "metal_stdlib", "metal_simdgroup_matrix", "metal_simdgroup", "metal_atomic", "metal_math",
        "metal_compute", "metal_integer", "metal_common", "metal_relational", "metal_geometric",
    }),
}

LANGUAGE_OF_BACKEND = {"cpu": "c++", "cuda": "cuda", "mps": "msl", "mps-emu": "msl"}

# Calls a kernel never needs: I/O, files, processes, network, environment, dynamic loading, threads.
_FORBIDDEN_CALLS = (
    "system", "popen", "fork", "vfork", "execl", "execlp", "execle", "execv", "execvp", "execve", "fopen",
    "freopen", "fwrite", "fread", "fprintf", "printf", "puts", "fputs", "open", "openat", "creat", "remove",
    "unlink", "rename", "mkdir", "rmdir", "dlopen", "dlsym", "dlclose", "socket", "connect", "bind", "listen",
    "accept", "send", "recv", "sendto", "recvfrom", "getenv", "setenv", "putenv", "mmap", "munmap", "mprotect",
    "syscall", "ioctl", "getpid", "getppid", "kill", "signal", "sigaction", "pthread_create", "clone", "ptrace", "exit", "_exit",
    "abort", "atexit", "setjmp", "longjmp", "time", "clock", "rand", "srand", "cudaMalloc", "cudaFree",
    "cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpyToSymbol", "cudaStreamCreate", "cudaDeviceSynchronize",
    "cudaStreamSynchronize", "cudaLaunchKernel", "cudaSetDevice",
)
_FORBIDDEN_WORDS = ("asm", "__asm", "__asm__", "thread_local", "_Thread_local", "__thread", "std::thread",
                    "std::async", "std::ifstream", "std::ofstream", "std::fstream", "std::cout", "std::cerr",
                    "std::random_device", "std::chrono", "__builtin_readcyclecounter", "__rdtsc", "clock64",
                    "globaltimer", "%globaltimer", "constructor", "destructor", "__attribute__((constructor",
                    "init_priority")

_COMMENT_OR_LITERAL = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(\w+)", re.M)
_CALL = re.compile(r"(?<![\w.:>])(?:::)?(?:std::)?(" + "|".join(_FORBIDDEN_CALLS) + r")\s*\(")
_WORD = re.compile("|".join(r"(?<![\w:])" + re.escape(w) + r"(?!\w)" for w in _FORBIDDEN_WORDS))
_STATIC_MUTABLE = re.compile(r"\bstatic\b(?!\s+(?:const\b|constexpr\b|inline\b|__device__\b|__forceinline__\b|"
                             r"__host__\b|void\b|__global__\b|__inline__\b))")
_GLOBAL_STATE = re.compile(r"^\s*(?:__device__|__managed__|__constant__)\s+(?!.*\()[^;{]*;", re.M)
# The inline PTX a CUDA kernel may hold: L2 prefetches (the bulk-copy engine's and the load unit's).
# They move nothing into registers and name no special register (timers, SM ids), so they can neither
# observe nor leak; operands are %N only. Anything else written with asm stays rejected.
_PTX_PREFETCH = re.compile(r"(?:cp\.async\.bulk\.prefetch\.L2\.global|prefetch\.global\.L2(?:::evict_(?:last|normal))?)"
                           r"\s+\[%\d+\](?:\s*,\s*%\d+)?\s*;?")
_ASM_INPUTS_ONLY = re.compile(r'\basm\s+volatile\s*\(\s*"((?:\\.|[^"\\\n])*)"\s*::')
_ALLOWED_DIRECTIVES = {"include", "define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif",
                       "pragma", "error"}


class SourceCheckError(MetalAccelError):
    """A kernel source uses something a kernel may not."""


def strip_comments_and_literals(source: str) -> str:
    """Comments blanked (newlines kept, so line numbers hold) and string/char literals emptied."""
    def repl(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.startswith("/"):
            return " " + "\n" * tok.count("\n")
        return '""' if tok[0] == '"' else "' '"
    return _COMMENT_OR_LITERAL.sub(repl, source)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _function_static(text: str) -> re.Match[str] | None:
    """A `static` variable declared inside a function body (it would keep state between calls)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif depth and ch == "s" and text.startswith("static", i):
            m = _STATIC_MUTABLE.match(text, i)
            if m:
                rest = text[m.end():text.find(";", m.end())]
                if "(" not in rest.split("=")[0]:  # a variable, not a function declaration
                    return m
    return None


def check_kernel_source(source: str, language: str) -> None:
    """Raise SourceCheckError naming the construct and line if SOURCE breaks the kernel rules."""
    if language not in HEADERS:
        raise SourceCheckError(f"unknown kernel language {language!r}")
    # the literal "C" of extern "C" is emptied with the rest; includes are read from the original
    for m in _INCLUDE.finditer(source):
        header = m.group(2).strip()
        if header not in HEADERS[language]:
            shown = f"<{header}>" if m.group(1) == "<" else f'"{header}"'
            raise SourceCheckError(f"line {_line(source, m.start())}: #include {shown} is not an allowed header "
                                   f"for {language} kernels")
    if language == "cuda":
        source = _blank_allowed_ptx(source)
    text = strip_comments_and_literals(source)
    for m in _DIRECTIVE.finditer(text):
        if m.group(1) not in _ALLOWED_DIRECTIVES:
            raise SourceCheckError(f"line {_line(text, m.start())}: preprocessor directive #{m.group(1)} "
                                   "is not allowed")
    m = _WORD.search(text)
    if m:
        what = "inline assembly" if "asm" in m.group(0) else m.group(0)
        raise SourceCheckError(f"line {_line(text, m.start())}: {what} is not allowed in a kernel")
    m = _CALL.search(text)
    if m:
        raise SourceCheckError(f"line {_line(text, m.start())}: call to {m.group(1)}() is not allowed in a "
                               "kernel (no I/O, files, processes, network, environment or timers)")
    m = _function_static(text)
    if m:
        raise SourceCheckError(f"line {_line(text, m.start())}: a static variable inside a function keeps "
                               "state between calls; kernels must be stateless")
    m = _GLOBAL_STATE.search(text)
    if m:
        raise SourceCheckError(f"line {_line(text, m.start())}: a global device variable keeps state "
                               "between calls; kernels must be stateless")
    _check_top_level_state(text)


def _blank_allowed_ptx(source: str) -> str:
    """SOURCE with the head `asm volatile("<allowed prefetch>" ::` of each allowed statement replaced by a
    plain call of the same length; its operand expressions stay, and are checked like any code."""
    def repl(m: re.Match[str]) -> str:
        if not _PTX_PREFETCH.fullmatch(m.group(1).strip()):
            return m.group(0)
        head = "ptx_prefetch("
        return head + " " * (len(m.group(0)) - len(head))
    return _ASM_INPUTS_ONLY.sub(repl, source)


def _check_top_level_state(text: str) -> None:
    """Namespace-scope variables must be constants (MSL program scope is `constant` by rule)."""
    text = re.sub(r"^[ \t]*#[^\n]*", "", text, flags=re.M)  # directives, keeping line numbers
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
            if depth == 0:
                start = i + 1
        elif ch == ";" and depth == 0:
            decl = " ".join(text[start:i].split())
            start = i + 1
            if not decl or "(" in decl.split("=")[0] or re.match(
                    r"(?:typedef|using|template|struct|class|union|enum|namespace|extern|static_assert)\b", decl):
                continue
            if re.search(r"\b(?:const|constexpr|constant|__constant__)\b", decl):
                continue
            raise SourceCheckError(f"line {_line(text, i)}: global variable `{decl[:60]}` keeps state between "
                                   "calls; kernels must be stateless (make it const or constexpr)")
