"""Metal Shading Language -> C++ for the MSL emulator: the driver of the translation.

The source is first run through the C preprocessor (so macros cannot hide kernels or qualifiers;
`prepare_for_preprocessor` blanks the <metal_*> includes), then `translate` tokenizes it
(msl_lexer.py), rejects what the emulator cannot run or a kernel must not call, finds the kernels
and their signatures (msl_signature.py), rewrites the tokens into C++ (msl_rewrite.py: address
spaces become C++ qualifiers, `threadgroup` variables become storage shared by the threads of a
group, attributes are removed), and appends an extern "C" launcher per kernel that runs it over a
grid (metal_accel/include/msl_emu/runtime.h).
"""
from __future__ import annotations

import re

from ...core.errors import CompileError
from . import msl_instrument
from .msl_lexer import Tokens
from .msl_rewrite import rewrite
from .msl_signature import (
    POSITION_ATTRS,
    MslKernel,
    MslParam,
    kernel_params,
    launcher,
    max_threads_per_threadgroup,
)

__all__ = ["HOST_CALLS", "POSITION_ATTRS", "SYNC_FUNCTIONS", "UNSUPPORTED_ATTRS", "UNSUPPORTED_IDS", "MslKernel",
           "MslParam", "launcher", "prepare_for_preprocessor", "translate"]

UNSUPPORTED_IDS: dict[str, str] = {
    **{t: "textures" for t in (
        "texture1d", "texture1d_array", "texture2d", "texture2d_array", "texture2d_ms", "texture2d_ms_array",
        "texture3d", "texturecube", "texturecube_array", "texture_buffer", "depth2d", "depth2d_array",
        "depth2d_ms", "depth2d_ms_array", "depthcube", "depthcube_array")},
    "sampler": "samplers", "imageblock": "imageblocks", "threadgroup_imageblock": "imageblocks",
    **{t: "ray tracing" for t in ("raytracing", "intersector", "acceleration_structure", "intersection_function_table",
                                   "primitive_acceleration_structure", "instance_acceleration_structure", "ray_data")},
    "visible_function_table": "function tables", "indirect_command_buffer": "indirect command buffers",
    "compute_pipeline_state": "indirect command buffers", "render_pipeline_state": "indirect command buffers",
    "vertex": "vertex functions", "fragment": "fragment functions", "object_data": "object shaders",
    "simdgroup_async_copy": "asynchronous copies", "simdgroup_event": "asynchronous copies",
    "thread_elements": "simdgroup_matrix thread_elements()", "double": "double (Metal has no 64-bit floating type)",
    "interpolant": "interpolants", "patch_control_point": "tessellation",
    # not Metal: host-only C++ that must never reach the CPU through a kernel source
    **{t: f"{t!r} (not part of Metal)" for t in (
        "asm", "__asm", "__asm__", "thread_local", "_Thread_local", "__thread", "extern",
        "_Pragma", "__builtin_trap")},
}
UNSUPPORTED_ATTRS: dict[str, str] = {
    "function_constant": "function constants ([[function_constant]])", "stage_in": "[[stage_in]] inputs",
    "threadgroup": "[[threadgroup(n)]] kernel parameters (torch.mps.compile_shader cannot size them; "
                   "declare `threadgroup` arrays inside the kernel instead)",
    "texture": "textures", "sampler": "samplers", "imageblock_data": "imageblocks", "color": "render targets",
    "visible": "visible functions", "user": "user attributes", "payload": "mesh payloads", "mesh": "mesh shaders",
    "object": "object shaders", "intersection": "intersection functions",
}
_METAL_HEADERS = re.compile(r"^\s*#\s*include\s*<metal_\w+>\s*$")
_INCLUDE = re.compile(r"^\s*#\s*include\b.*$")
# C library calls a Metal kernel cannot make but that the emulator's C++ could: rejected as calls
HOST_CALLS = frozenset({
    "system", "popen", "pclose", "fork", "vfork", "execl", "execlp", "execle", "execv", "execvp", "execve", "dlopen",
    "dlsym", "syscall", "fopen", "freopen", "fwrite", "fread", "fprintf", "printf", "puts", "open", "openat",
    "creat", "remove", "unlink", "rename", "mkdir", "rmdir", "socket", "connect", "kill", "mmap", "munmap",
    "mprotect", "getenv", "setenv", "putenv", "exit", "_exit", "abort", "atexit", "malloc", "calloc", "realloc",
    "free", "setjmp", "longjmp", "signal", "sigaction", "raise", "pthread_create", "ptrace", "write", "read",
    "memcpy", "memset", "memmove", "strcpy", "sprintf", "snprintf", "time", "clock", "rand", "srand"})
_GNU_ATTRS_ALLOWED = {"always_inline", "noinline", "unused", "aligned", "packed", "const", "pure", "maybe_unused",
                      "__always_inline__", "__noinline__", "__unused__", "__aligned__", "__packed__", "__const__",
                      "__pure__", "flatten", "__flatten__", "hot", "cold"}
_GROUP_FUNCS = ("sum", "product", "min", "max", "and", "or", "xor", "prefix_inclusive_sum", "prefix_exclusive_sum",
                "prefix_inclusive_product", "prefix_exclusive_product", "broadcast", "broadcast_first", "shuffle",
                "shuffle_down", "shuffle_up", "shuffle_xor", "shuffle_rotate_down", "shuffle_rotate_up",
                "shuffle_and_fill_down", "shuffle_and_fill_up", "all", "any", "ballot", "is_first",
                "active_threads_mask")
# functions that make a thread wait for others (the kernel then runs its threads as fibers)
SYNC_FUNCTIONS = frozenset({"threadgroup_barrier", "simdgroup_barrier"} |
                           {f"{g}_{f}" for g in ("simd", "quad") for f in _GROUP_FUNCS})


def _is_sync(name: str) -> bool:
    return name in SYNC_FUNCTIONS


def prepare_for_preprocessor(source: str) -> str:
    """Blank the <metal_*> includes (the emulator header replaces them); reject any other include."""
    lines = source.split("\n")
    for i, line in enumerate(lines):
        if _METAL_HEADERS.match(line):
            lines[i] = ""
        elif _INCLUDE.match(line):
            raise CompileError(f"line {i + 1}: {line.strip()!r}: only <metal_*> headers can be included "
                               "(a kernel source must be self-contained)")
    return "\n".join(lines)


def translate(preprocessed: str, include: str = "msl_emu/metal_stdlib.h") -> tuple[str, list[MslKernel]]:
    """C++ source and kernel descriptions for a preprocessed MSL source."""
    tk = Tokens(preprocessed)
    n = len(tk.sig)
    # names of the functions the source defines (a helper may be called `read`, say)
    defined = {tk.t(p - 1) for p in range(1, n) if tk.t(p) == "(" and tk.parent[p] == "" and tk.t(tk.match[p] + 1) == "{"}
    for p in range(n):
        t, kind = tk.t(p), tk.kind[tk.sig[p]]
        if t == "__attribute__" and tk.t(p + 1) == "(":
            words = {tk.t(q) for q in range(p + 1, tk.match[p + 1]) if tk.kind[tk.sig[q]] == "id"}
            if words - _GNU_ATTRS_ALLOWED:
                raise CompileError(f"__attribute__(({', '.join(sorted(words - _GNU_ATTRS_ALLOWED))})) is not allowed "
                                   f"in kernel sources (allowed: always_inline, noinline, unused, aligned, ...)")
        if kind == "id" and t in HOST_CALLS and t not in defined and tk.t(p + 1) == "(" and tk.t(p - 1) not in (".", "->"):
            raise CompileError(f"kernel sources may not call {t}(): it is not a Metal function")
        if kind == "id" and t in UNSUPPORTED_IDS:
            raise CompileError(f"the MSL emulator does not support {UNSUPPORTED_IDS[t]} (found {t!r})")
        if tk.is_attr_open(p):
            for name, _ in tk.attr_items(p):
                if name in UNSUPPORTED_ATTRS and not (name == "threadgroup" and tk.parent[p] != "("):
                    raise CompileError(f"the MSL emulator does not support {UNSUPPORTED_ATTRS[name]}")

    # ---- kernels: [attributes] kernel void name(params) [attributes] { body }
    found: list[tuple[int, int, int, int, str, dict]] = []  # kernel token, name, (, {, host name, attrs
    for p in range(n):
        attr_kernel = tk.is_attr_open(p) and any(a == "kernel" for a, _ in tk.attr_items(p))
        if not (tk.t(p) == "kernel" and tk.kind[tk.sig[p]] == "id" and tk.parent[p] != "[") and not attr_kernel:
            continue
        fattrs: dict[str, str] = dict(tk.attr_items(p)) if attr_kernel else {}
        q = p
        while q > 0 and tk.t(q - 1) == "]" and tk.t(q - 2) == "]":  # attributes before
            q = tk.match[q - 2] - 1
            fattrs.update(dict(tk.attr_items(q)))
        start = q
        r = tk.attr_end(p) if attr_kernel else p + 1
        while tk.is_attr_open(r):
            fattrs.update(dict(tk.attr_items(r))); r = tk.attr_end(r)
        if tk.t(start - 1) == ">" or tk.t(start - 1) == "template" or tk.t(r + 2) == "<":
            raise CompileError("templated kernels are not supported by the MSL emulator; write one kernel per type")
        if tk.parent[p] != "":
            raise CompileError("kernels must be declared at global scope (not inside a namespace or struct)")
        if tk.t(r) != "void" or tk.kind[tk.sig[r + 1]] != "id" or tk.t(r + 2) != "(":
            raise CompileError(f"cannot parse the kernel declaration near {' '.join(tk.t(x) for x in range(p, r + 3))!r}")
        name_p, lp = r + 1, r + 2
        b = tk.match[lp] + 1
        while tk.is_attr_open(b):
            fattrs.update(dict(tk.attr_items(b))); b = tk.attr_end(b)
        if attr_kernel:
            tk.set(tk.attr_end(p), "static inline " + tk.t(tk.attr_end(p)))
        else:
            tk.set(p, "static inline")
        if tk.t(b) == ";":
            continue  # a declaration; the definition comes elsewhere
        if tk.t(b) != "{":
            raise CompileError(f"kernel {tk.t(name_p)}: expected a body after the parameter list")
        host = fattrs.get("host_name", "").strip().strip('"') or tk.t(name_p)
        if not re.fullmatch(r"[A-Za-z_]\w*", host):
            raise CompileError(f"kernel {tk.t(name_p)}: host name {host!r} is not an identifier")
        found.append((p, name_p, lp, b, host, fattrs))
    if not found:
        raise CompileError("no kernel found; declare kernels as `kernel void name(...)`")

    # ---- which functions reach a barrier or SIMD-group function
    bodies: dict[str, set[str]] = {}
    outside_sync = False
    kernel_bodies = {b: tk.t(name_p) for (_, name_p, _, b, _, _) in found}
    p = 0
    while p < n:
        fname = kernel_bodies.get(p)
        if fname is None and tk.t(p) == "{" and tk.parent[p] == "" and tk.t(p - 1) in (")", "const", "noexcept"):
            lp = p - 1
            while lp > 0 and tk.t(lp) != ")":
                lp -= 1
            fname = tk.t(tk.match[lp] - 1) if lp in tk.match else ""
        if fname is not None:
            ids = {tk.t(q) for q in range(p, tk.match[p]) if tk.kind[tk.sig[q]] == "id"}
            bodies.setdefault(fname, set()).update(ids)
            p = tk.match[p] + 1
            continue
        if tk.kind[tk.sig[p]] == "id" and _is_sync(tk.t(p)):
            outside_sync = True
        p += 1

    def reaches_sync(fname: str) -> bool:
        seen, todo = set(), [fname]
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            ids = bodies.get(f, set())
            if any(_is_sync(i) for i in ids):
                return True
            todo += [i for i in ids if i in bodies]
        return False

    # threadgroup memory: its threads run as fibers, in lockstep within each SIMD-group (shadow.h)
    uses_tg = any(tk.t(q) == "threadgroup" and tk.kind[tk.sig[q]] == "id" and tk.parent[q] != "[" for q in range(n))
    kernels: list[MslKernel] = []
    for (_, name_p, lp, _, host, fattrs) in found:
        fname = tk.t(name_p)
        params = kernel_params(tk, host, lp)
        max_threads = max_threads_per_threadgroup(host, fattrs)
        fibers = outside_sync or uses_tg or reaches_sync(fname)
        kernels.append(MslKernel(host, fname, params, fibers, max_threads))
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise CompileError(f"duplicate kernel names: {sorted(x for x in set(names) if names.count(x) > 1)}")
    kernel_functions = {k.function for k in kernels}
    checks = msl_instrument.plan(tk)
    rewrite(tk, {f for f in bodies if f not in kernel_functions and f and reaches_sync(f)})
    msl_instrument.apply(tk, checks)
    out = [f'#include "{include}"', tk.render(), "", "// ---- launchers (generated)", '# 1 "ma_launchers"']
    for k in kernels:
        out.append(launcher(k))
    return "\n".join(out) + "\n", kernels
