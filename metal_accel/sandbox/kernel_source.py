"""Static checks of kernel sources (C++, CUDA, MSL): what a kernel may include and call.

The sandbox covers host code; this covers SOURCE. A kernel may compute, nothing else: an
allowlist of headers, no inline assembly, no file, process, network, environment or
dynamic-loading calls, no I/O, and no mutable state that survives between calls.
"""
from __future__ import annotations

import re

from ..core.errors import MetalAccelError

HEADERS: dict[str, frozenset[str]] = {
    "c++": frozenset({
        "cstdint", "stdint.h", "cstddef", "stddef.h", "cmath", "math.h", "cfloat", "float.h", "climits",
        "limits.h", "limits", "cstring", "string.h", "algorithm", "type_traits", "utility", "array",
        "numeric", "cstdlib", "stdlib.h", "immintrin.h", "x86intrin.h", "arm_neon.h", "omp.h", "ma_vecmath.h", "ma_bf16.h", "vector",
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
    "abort", "atexit", "at_quick_exit", "setjmp", "longjmp", "time", "clock", "rand", "srand", "write", "read", "pread",
    "pwrite", "writev", "readv", "gettimeofday", "clock_gettime", "nanosleep", "sleep", "usleep", "sysconf",
    "dl_iterate_phdr", "secure_getenv", "cudaMalloc", "cudaFree",
    "cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpyToSymbol", "cudaStreamCreate", "cudaDeviceSynchronize",
    "cudaStreamSynchronize", "cudaLaunchKernel", "cudaSetDevice",
)
_FORBIDDEN_WORDS = ("asm", "__asm", "__asm__", "thread_local", "_Thread_local", "__thread", "std::thread",
                    "std::async", "std::ifstream", "std::ofstream", "std::fstream", "std::cout", "std::cerr",
                    "std::random_device", "std::chrono", "__builtin_readcyclecounter", "__rdtsc", "clock64",
                    "globaltimer", "%globaltimer", "constructor", "destructor", "__attribute__((constructor",
                    "init_priority", "environ", "__environ", "_environ", "program_invocation_name", "include_next",
                    "__has_include_next", "__builtin_frame_address", "__builtin_return_address", "__builtin_apply",
                    "__builtin_apply_args")
# intrinsics that read clocks or the CPU's identity, draw hardware random numbers, or change the
# floating-point environment or segment bases; loader and libc internals
_HARDWARE = re.compile(r"(?<![\w:])(?:_*rdtscp?\w*|\w*rdrand\w*|\w*rdseed\w*|\w*rdpid\w*|_*(?:get_)?cpuid\w*|_mm_setcsr|"
                       r"_MM_SET_\w+|fe(?:setround|setenv|enableexcept|disableexcept|updateenv|holdexcept|setexceptflag)|"
                       r"__builtin_ia32_(?:ldmxcsr|xrstor\w*|fxrstor\w*|wr[fg]sbase\w*)|_write[fg]sbase\w*|_xrstor\w*|"
                       r"_fxrstor\w*|__libc_\w+|_dl_\w+)(?!\w)")
# attributes that run code at load, place data in chosen sections, or change linkage
_BAD_ATTRIBUTES = ("constructor", "destructor", "section", "used", "retain", "ifunc", "alias", "weakref", "weak",
                   "init_priority", "visibility", "externally_visible", "naked", "target_clones", "symver", "cleanup")
_ATTRIBUTE_OPEN = re.compile(r"__attribute__\s*\(\(|\[\[")
_ATTRIBUTE_END = re.compile(r"\)\)|\]\]|[;{}]")  # its close, or where an attribute cannot reach
MAX_SOURCE_CHARS = 1 << 20  # a kernel's source; the checks must stay fast on whatever text arrives
_ATTR_WORD = re.compile(r"(?:gnu::|__gnu__::)?_*(\w+?)_*(?=\W|$)")

_COMMENT_OR_LITERAL = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(\w+)", re.M)
_CALL = re.compile(r"(?<![\w.:>])(?:::)?(?:std::)?(" + "|".join(_FORBIDDEN_CALLS) + r")\s*\(")
# the same functions named as values: (system)("..."), &open, = socket, a function-pointer initializer
_DESIGNATOR = re.compile(r"(?:\(\s*|&\s*|=\s*|,\s*|return\s+)(?:::)?(?:std::)?(" + "|".join(_FORBIDDEN_CALLS)
                         + r")\s*[),;]")
_WORD = re.compile("|".join(r"(?<![\w:])" + re.escape(w) + r"(?!\w)" for w in _FORBIDDEN_WORDS))
_STATIC_MUTABLE = re.compile(r"\bstatic\b(?!\s+(?:const\b|constexpr\b|__device__\b|__forceinline__\b|"
                             r"__host__\b|void\b|__global__\b))")
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
    if len(source) > MAX_SOURCE_CHARS:
        raise SourceCheckError(f"the kernel source is {len(source)} characters long; at most {MAX_SOURCE_CHARS} "
                               "are checked and compiled")
    # the literal "C" of extern "C" is emptied with the rest; includes are read from the original
    _check_includes(source, language)
    if language == "cuda":
        source = _blank_allowed_ptx(source)
    text = strip_comments_and_literals(source)
    for m in _DIRECTIVE.finditer(text):
        if m.group(1) not in _ALLOWED_DIRECTIVES:
            raise SourceCheckError(f"line {_line(text, m.start())}: preprocessor directive #{m.group(1)} "
                                   "is not allowed")
    _check_defines(text)
    m = _WORD.search(text) or _HARDWARE.search(text)
    if m:
        what = "inline assembly" if "asm" in m.group(0) else m.group(0)
        raise SourceCheckError(f"line {_line(text, m.start())}: {what} is not allowed in a kernel")
    m = next((c for c in _CALL.finditer(text) if not _declares(text, c.start())), None)
    if m:
        raise SourceCheckError(f"line {_line(text, m.start())}: call to {m.group(1)}() is not allowed in a "
                               "kernel (no I/O, files, processes, network, environment or timers)")
    m = _DESIGNATOR.search(text)
    if m:
        raise SourceCheckError(f"line {_line(text, m.start())}: {m.group(1)} named as a value (a function pointer or "
                               "a parenthesized call) is not allowed in a kernel")
    _check_attributes(text)
    if language != "msl":
        _check_extern_declarations(text)
    for m in re.finditer(r"\bmutable\b", text):
        if not text[:m.start()].rstrip().endswith(")"):  # `[...](...) mutable {` is a lambda's, and local
            raise SourceCheckError(f"line {_line(text, m.start())}: a mutable member can change inside a const object "
                                   "and keep state between calls; kernels must be stateless")
    m = _function_static(text)
    if m:
        raise SourceCheckError(f"line {_line(text, m.start())}: a static variable inside a function or class "
                               "keeps state between calls; kernels must be stateless")
    m = _GLOBAL_STATE.search(text)
    if m:
        raise SourceCheckError(f"line {_line(text, m.start())}: a global device variable keeps state "
                               "between calls; kernels must be stateless")
    _check_top_level_state(text)


def _declares(text: str, pos: int) -> bool:
    """Whether the name at POS is being declared (a type before it: `float read(`), not called."""
    before = re.search(r"([\w>]+)[*&]*\s+$", text[max(0, pos - 80):pos])
    return bool(before) and before.group(1) not in ("return", "else", "do", "case", "throw", "co_return", "new")


def _check_includes(source: str, language: str) -> None:
    """Every include is a literal allowlisted name, without a path of its own; __has_include likewise."""
    for m in re.finditer(r"^[ \t]*#[ \t]*(include\w*|import)\b([^\n]*)", source, re.M):
        line, directive, rest = _line(source, m.start()), m.group(1), m.group(2).split("//")[0].strip()
        if directive != "include":
            raise SourceCheckError(f"line {line}: #{directive} is not allowed; include allowlisted headers by name")
        lit = re.fullmatch(r'(<([^<>"]+)>|"([^<>"]+)")', rest)
        if not lit:
            raise SourceCheckError(f"line {line}: #include must name a header in <...> or \"...\" (a macro or other "
                                   "computed include is not allowed)")
        header = (lit.group(2) or lit.group(3)).strip()
        quoted = lit.group(3) is not None
        if quoted and ("/" in header or "\\" in header or ".." in header):
            raise SourceCheckError(f"line {line}: #include \"{header}\" names a path and is not an allowed header; only allowlisted headers by "
                                   "name may be included")
        if header not in HEADERS[language]:
            shown = f'"{header}"' if quoted else f"<{header}>"
            raise SourceCheckError(f"line {line}: #include {shown} is not an allowed header for {language} kernels")
    for m in re.finditer(r"__has_include\s*\(\s*([<\"])([^>\")]*)[>\"]?\s*\)|__has_include\b", source):
        if m.lastindex is None or m.group(2).strip() not in HEADERS[language] or (
                m.group(1) == '"' and ("/" in m.group(2) or ".." in m.group(2))):
            raise SourceCheckError(f"line {_line(source, m.start())}: __has_include may only ask about allowlisted "
                                   "headers by name")


def _check_defines(text: str) -> None:
    """Macros may not hide what the other checks look for, nor build names by token pasting."""
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)([^\n]*(?:\\\n[^\n]*)*)", text, re.M):
        body, line = m.group(2), _line(text, m.start())
        if "##" in body:
            raise SourceCheckError(f"line {line}: token pasting (##) in #define {m.group(1)} is not allowed: it can "
                                   "build names the checks cannot see")
        bad = re.search(r"\b(extern|asm|__asm|__asm__|__attribute__|__declspec|_Pragma|__has_include|"
                        + "|".join(_FORBIDDEN_CALLS) + r")\b|\[\[", body)
        if bad:
            raise SourceCheckError(f"line {line}: #define {m.group(1)} hides {bad.group(0)}; a macro may not stand for "
                                   "linkage, assembly, attributes or forbidden functions")


def _check_attributes(text: str) -> None:
    """Every `__attribute__((...))` and `[[...]]`, in one pass over TEXT: the scan goes on from where an
    attribute ended (or from the `;`, `{` or `}` that shows an opener was none), so no character is read twice
    (a regex trying each opener afresh took time quadratic in a text of many unclosed `[[`)."""
    pos = 0
    while True:
        m = _ATTRIBUTE_OPEN.search(text, pos)
        if m is None:
            return
        end = _ATTRIBUTE_END.search(text, m.end())
        if end is None:
            return
        if end.group() in ("))", "]]"):  # the attribute's words (any opener inside it included) are checked
            for w in _ATTR_WORD.finditer(text, m.end(), end.start()):
                if w.group(1) in _BAD_ATTRIBUTES:
                    raise SourceCheckError(f"line {_line(text, m.start())}: attribute {w.group(1)} is not allowed "
                                           "in a kernel (code at load time, chosen sections or linkage)")
        pos = end.end()


_EXTERN_SCAN = re.compile(r'\bextern\s*""\s*(\{)?|[(){};]')


def _check_extern_declarations(text: str) -> None:
    """extern "C" may only introduce kernel definitions, never declare functions defined elsewhere (libc).
    One pass over the text (a scan from each extern "C" to its end once took time quadratic in the source)."""
    paren = brace = 0
    pending: dict[int, int] = {}            # paren depth -> `extern "C"` declarations not yet given a body there
    blocks: list[tuple[int, int]] = []      # (brace depth inside, paren depth) of open extern "C" { } blocks
    for m in _EXTERN_SCAN.finditer(text):
        tok = m.group(0)
        if tok[0] == "e":
            if m.group(1):
                brace += 1
                blocks.append((brace, paren))
            else:
                pending[paren] = pending.get(paren, 0) + 1
        elif tok == "(":
            paren += 1
        elif tok == ")":
            paren -= 1
        elif tok == "{":
            pending.pop(paren, None)  # a body: those were definitions
            brace += 1
        elif tok == "}":
            if blocks and blocks[-1][0] == brace:
                blocks.pop()
            brace -= 1
        elif pending.get(paren) or (blocks and blocks[-1] == (brace, paren)):
            raise SourceCheckError(f"line {_line(text, m.start())}: a declaration without a body inside extern \"C\" "
                                   "names a function defined elsewhere (libc); extern \"C\" is for kernels only")


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
    """Namespace-scope variables must be constants (MSL program scope is `constant` by rule), initialized
    without calling anything (a call is a dynamic initializer: code that runs at load). Namespaces and
    extern "C" blocks are namespace scope too."""
    text = re.sub(r"^[ \t]*#[^\n]*", "", text, flags=re.M)  # directives, keeping line numbers
    stack: list[str] = []  # per open brace: "ns" (namespace, extern "C"), "init" (an initializer), "body"
    inside = 0  # braces on the stack that are not "ns" (counted, not searched: a deep nest once took quadratic time)
    start = 0
    for m in re.finditer(r"[{};]", text):
        i, ch = m.start(), m.group(0)
        at_ns = not inside
        if ch == "{":
            opener = " ".join(text[start:i].split()) if at_ns else ""
            if not at_ns:
                kind = "body"
            elif re.fullmatch(r'(?:inline\s+)?namespace(?:\s+[\w:]+)?|extern\s*""', opener):
                kind = "ns"
            elif re.match(r"(?:template\b.*?>\s*)?(?:struct|class|union|enum)\b", opener) or re.search(
                    r"\)\s*(?:const|noexcept|override|final|->\s*[\w:<>*&\s]+|\s)*$", opener):
                kind = "body"
            else:
                kind = "init"
            stack.append(kind)
            inside += kind != "ns"
            if kind == "ns":
                start = i + 1
        elif ch == "}":
            kind = stack.pop() if stack else "ns"  # a stray `}`: nothing was open
            inside -= kind != "ns"
            if kind != "init" and not inside:
                start = i + 1
        elif ch == ";" and at_ns:
            decl = " ".join(text[start:i].split())
            start = i + 1
            _check_namespace_declaration(decl, _line(text, i))


def _check_namespace_declaration(decl: str, line: int) -> None:
    head = re.split(r"[={]", decl, maxsplit=1)[0]
    if not decl or re.match(r"(?:typedef|using|template|struct|class|union|enum|namespace|extern|static_assert)\b", decl):
        return
    if "(" in head and "=" not in decl and "{" not in decl.split(")")[-1]:
        return  # a function declaration (extern "C" ones are checked separately)
    if "(" in head and not re.search(r"\b(?:const|constexpr|constant|__constant__)\b", head):
        if re.search(r"\)\s*(?:const\s*)?(?:noexcept\s*)?(?:->[^=]*)?$", head):
            return  # a function declaration with a trailing qualifier
    if not re.search(r"\b(?:const|constexpr|constant|__constant__)\b", head):
        raise SourceCheckError(f"line {line}: global variable `{decl[:60]}` keeps state between "
                               "calls; kernels must be stateless (make it const or constexpr)")
    init = decl[len(head):]
    if re.search(r"\bconstexpr\b", head) or "(" not in init and "(" not in head:
        return
    raise SourceCheckError(f"line {line}: namespace-scope constant `{decl[:60]}` is initialized by a call, which runs "
                           "when the library loads; use constexpr or a literal")
