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
from dataclasses import replace
from typing import Any

from ...core.errors import CompileError
from .msl_kernels import find_kernels, host_name, int_expr, substitute
from .msl_lang import (
    apply_function_constants,
    fix_address_space_overloads,
    fix_class_scope_specializations,
    fix_member_qualifiers,
    is_class_body,
    move_specializations,
)
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

__all__ = ["INCLUDE_MARK", "check_includes", "translate_unit", "HOST_CALLS", "POSITION_ATTRS", "SYNC_FUNCTIONS", "UNSUPPORTED_ATTRS", "UNSUPPORTED_IDS", "MslKernel",
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
    "double": "double (Metal has no 64-bit floating type)",
    "interpolant": "interpolants", "patch_control_point": "tessellation",
    # not Metal: host-only C++ that must never reach the CPU through a kernel source
    **{t: f"{t!r} (not part of Metal)" for t in (
        "asm", "__asm", "__asm__", "thread_local", "_Thread_local", "__thread", "extern",
        "_Pragma", "__builtin_trap")},
}
UNSUPPORTED_ATTRS: dict[str, str] = {
    "stage_in": "[[stage_in]] inputs",
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
# SIMD-group matrix operations that read a matrix: in a source that calls thread_elements(), they gather
# the lanes' elements (simdgroup_matrix.h), so they make a thread wait for others too
MATRIX_READS = frozenset({"simdgroup_multiply_accumulate", "simdgroup_multiply", "simdgroup_store"})


_NOT_FUNCTIONS = frozenset({"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype"})


def _before(tk: Tokens, p: int) -> str:
    """The token before sig position P, blanked ones (address-space qualifiers already dropped) skipped."""
    q = p - 1
    while q > 0 and tk.t(q) == "":
        q -= 1
    return tk.t(q)


def uses_thread_elements(tk: Tokens) -> bool:
    return any(tk.t(p) == "thread_elements" and tk.kind[tk.sig[p]] == "id" for p in range(len(tk.sig)))


def sync_functions(tk: Tokens) -> frozenset[str]:
    """The functions that make a thread of this source wait for others."""
    return SYNC_FUNCTIONS | MATRIX_READS if uses_thread_elements(tk) else SYNC_FUNCTIONS


INCLUDE_MARK = "#pragma ma_include_at_line "


def prepare_for_preprocessor(source: str) -> str:
    """Blank the <metal_*> includes (the emulator header replaces them); mark any other include, which is an
    error only if the preprocessor keeps it (an include in an inactive #if branch is fine)."""
    lines = source.split("\n")
    for i, line in enumerate(lines):
        if _METAL_HEADERS.match(line):
            lines[i] = ""
        elif _INCLUDE.match(line):
            lines[i] = f"{INCLUDE_MARK}{i + 1} {line.strip()}"
    return "\n".join(lines)


def check_includes(preprocessed: str) -> None:
    """Reject the includes that survived preprocessing (they are in an active branch)."""
    m = re.search(r"^\s*" + re.escape(INCLUDE_MARK) + r"(\d+) (.*)$", preprocessed, re.M)
    if m:
        raise CompileError(f"line {m.group(1)}: {m.group(2)!r}: only <metal_*> headers can be included (a kernel "
                           "source must be self-contained: paste the header's contents into the source)")


def translate(preprocessed: str, include: str = "msl_emu/metal_stdlib.h",
              function_constants: dict[Any, Any] | None = None) -> tuple[str, list[MslKernel]]:
    """C++ source (with a launcher per kernel) and kernel descriptions for a preprocessed MSL source."""
    body, kernels = translate_unit(preprocessed, include, function_constants)
    return body + "".join(launcher(k) for k in kernels), kernels


def loop_lines(tk: Tokens) -> list[tuple[int, int]]:
    """First and last source line of each for, while and do loop (a body without braces: to its first `;`)."""
    n, loops = len(tk.sig), []
    for p in range(n):
        t = tk.t(p)
        if tk.kind[tk.sig[p]] != "id" or t not in ("for", "while", "do"):
            continue
        if t == "do":
            q = p + 1
            if tk.t(q) != "{" or q not in tk.match:
                continue
            end = tk.match[q] + 1  # the `while` of `do { } while (c);`
            loops.append((tk.line(p), tk.line(min(end, n - 1))))
            continue
        if tk.t(p + 1) != "(" or p + 1 not in tk.match:
            continue
        close = tk.match[p + 1]
        if t == "while" and tk.t(p - 1) == "}" and p - 1 in tk.match and tk.t(tk.match[p - 1] - 1) == "do":
            continue  # the tail of a do loop
        q = close + 1
        if q < n and tk.t(q) == "{" and q in tk.match:
            end = tk.match[q]
        else:
            end = q
            while end < n and tk.t(end) != ";":
                end = tk.match[end] + 1 if tk.t(end) in ("(", "[", "{") and end in tk.match else end + 1
            end = min(end, n - 1)
        loops.append((tk.line(p), tk.line(end)))
    return loops


def translate_unit(preprocessed: str, include: str = "msl_emu/metal_stdlib.h",
                   function_constants: dict[Any, Any] | None = None) -> tuple[str, list[MslKernel]]:
    """C++ source without launchers (append `launcher(k)` for each kernel to run) and the kernel descriptions."""
    check_includes(preprocessed)
    tk = Tokens(preprocessed)
    n = len(tk.sig)
    # names of the functions the source defines (a helper may be called `read`, say)
    defined = {tk.t(p - 1) for p in range(1, n) if tk.t(p) == "(" and tk.t(tk.match[p] + 1) == "{"}
    for p in range(n):
        t, kind = tk.t(p), tk.kind[tk.sig[p]]
        if t == "__attribute__" and tk.t(p + 1) == "(":
            words = {tk.t(q) for q in range(p + 1, tk.match[p + 1]) if tk.kind[tk.sig[q]] == "id"}
            if words - _GNU_ATTRS_ALLOWED:
                raise CompileError(f"line {tk.line(p)}: __attribute__(({', '.join(sorted(words - _GNU_ATTRS_ALLOWED))})) "
                                   "is not allowed in kernel sources (allowed: always_inline, noinline, unused, "
                                   "aligned, ...)")
        if kind == "id" and t in HOST_CALLS and t not in defined and tk.t(p + 1) == "(" and tk.t(p - 1) not in (".", "->"):
            raise CompileError(f"line {tk.line(p)}: kernel sources may not call {t}(): it is not a Metal function")
        if kind == "id" and t in UNSUPPORTED_IDS:
            raise CompileError(f"line {tk.line(p)}: the MSL emulator does not support {UNSUPPORTED_IDS[t]} (found {t!r})")
        if tk.is_attr_open(p):
            for name, _ in tk.attr_items(p):
                if name in UNSUPPORTED_ATTRS:
                    raise CompileError(f"line {tk.line(p)}: the MSL emulator does not support {UNSUPPORTED_ATTRS[name]}")
    apply_function_constants(tk, function_constants or {})
    fix_member_qualifiers(tk)
    fix_address_space_overloads(tk)
    moves = fix_class_scope_specializations(tk)
    found = find_kernels(tk)
    if not any(k.instances or not k.template_params for k in found):
        raise CompileError("no kernel found; declare kernels as `kernel void name(...)`, or instantiate a templated "
                           "kernel with `template [[host_name(\"name\")]] [[kernel]] decltype(fn<T>) fn<T>;`")

    # ---- which functions reach a barrier or SIMD-group function
    bodies: dict[str, set[str]] = {}
    sync = sync_functions(tk)
    outside_sync = False
    kernel_bodies = {k.body: tk.t(k.name_p) for k in found}
    p = 0
    while p < n:
        fname = kernel_bodies.get(p)
        if fname is None and tk.t(p) == "{" and _before(tk, p) in (")", "const", "noexcept") and (
                tk.parent[p] == "" or (tk.t(tk.opener[p]) == "{" and is_class_body(tk, tk.opener[p]))):
            # a free function's body, or a member function's (called as obj.f(), p->f() or T::f())
            lp = p - 1
            while lp > 0 and tk.t(lp) != ")":
                lp -= 1
            fname = tk.t(tk.match[lp] - 1) if lp in tk.match else ""
            fname = fname if re.fullmatch(r"[A-Za-z_]\w*", fname) and fname not in _NOT_FUNCTIONS else ""
        if fname is not None:
            ids = {tk.t(q) for q in range(p, tk.match[p]) if tk.kind[tk.sig[q]] == "id"}
            bodies.setdefault(fname, set()).update(ids)
            p = tk.match[p] + 1
            continue
        if tk.kind[tk.sig[p]] == "id" and tk.t(p) in sync:
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
            if any(i in sync for i in ids):
                return True
            todo += [i for i in ids if i in bodies]
        return False

    # threadgroup memory: its threads run as fibers, in lockstep within each SIMD-group (shadow.h)
    uses_tg = any(tk.t(q) == "threadgroup" and tk.kind[tk.sig[q]] == "id" and tk.parent[q] != "[" for q in range(n))
    kernels: list[MslKernel] = []
    for k in found:
        fname = tk.t(k.name_p)
        fibers = outside_sync or uses_tg or reaches_sync(fname)
        if not k.template_params:
            host = host_name(k.fattrs.get("host_name", "")) or fname
            params = kernel_params(tk, host, k.lp)
            kernels.append(MslKernel(host, fname, params, fibers, max_threads_per_threadgroup(host, k.fattrs)))
            continue
        for host, args in k.instances:
            params = tuple(replace(prm, base_type=substitute(prm.base_type, k.template_params, args),
                                   cpp_type=substitute(prm.cpp_type, k.template_params, args))
                           for prm in kernel_params(tk, host, k.lp))
            attrs = {a: substitute(v, k.template_params, args) for a, v in k.fattrs.items()}
            mt = attrs.get("max_total_threads_per_threadgroup")
            if mt is not None:
                value = int_expr(mt)
                attrs["max_total_threads_per_threadgroup"] = str(value) if value is not None else "1024"
            kernels.append(MslKernel(host, f"{fname}<{args}>", params, fibers, max_threads_per_threadgroup(host, attrs)))
    for kn in kernels:
        if not re.fullmatch(r"[A-Za-z_]\w*", kn.name):
            raise CompileError(f"kernel {kn.function}: host name {kn.name!r} is not an identifier")
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise CompileError(f"duplicate kernel names: {sorted(x for x in set(names) if names.count(x) > 1)}")
    kernel_functions = {tk.t(k.name_p) for k in found}
    loops = loop_lines(tk)
    checks = msl_instrument.plan(tk)
    rewrite(tk, {f for f in bodies if f not in kernel_functions and f and reaches_sync(f)})
    msl_instrument.apply(tk, checks)
    move_specializations(tk, moves)
    table = ", ".join([str(len(loops))] + [f"{a}, {b}" for a, b in loops])
    fragments = ["#define MA_THREAD_ELEMENTS 1"] if uses_thread_elements(tk) else []
    out = [*fragments, f'#include "{include}"', tk.render(), "", "// ---- loops (generated): lockstep tells their iterations apart",
           '# 1 "ma_loops"',
           f'extern "C" __attribute__((visibility("hidden"))) const int ma_loop_lines[] = {{{table}}};',
           "", "// ---- launchers (generated)", '# 1 "ma_launchers"', ""]
    return "\n".join(out), kernels
