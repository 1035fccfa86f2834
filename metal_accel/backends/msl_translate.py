"""Metal Shading Language -> C++ for the MSL emulator: kernel signatures, rewriting, launchers.

The source is first run through the C preprocessor (so macros cannot hide kernels or qualifiers),
then rewritten token by token: address spaces become C++ qualifiers, `threadgroup` variables become
storage shared by the threads of a group, attributes are parsed and removed, and each kernel gets
an extern "C" launcher that runs it over a grid (metal_accel/include/msl_emu/runtime.h).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..errors import CompileError

# attribute -> (field of ma_rt::Ids, is a 3-vector)
POSITION_ATTRS: dict[str, tuple[str, bool]] = {
    "thread_position_in_grid": ("tpig", True), "thread_position_in_threadgroup": ("tpitg", True),
    "threadgroup_position_in_grid": ("tgpig", True), "threads_per_threadgroup": ("tptg", True),
    "dispatch_threads_per_threadgroup": ("dtptg", True), "threadgroups_per_grid": ("tgpg", True),
    "threads_per_grid": ("tpg", True), "grid_size": ("tpg", True), "grid_origin": ("zero3", True),
    "thread_index_in_threadgroup": ("tiitg", False), "thread_index_in_simdgroup": ("lane", False),
    "simdgroup_index_in_threadgroup": ("sgid", False), "simdgroups_per_threadgroup": ("nsg", False),
    "dispatch_simdgroups_per_threadgroup": ("dnsg", False), "threads_per_simdgroup": ("simd_width", False),
    "thread_execution_width": ("simd_width", False), "thread_index_in_quadgroup": ("qlane", False),
    "quadgroup_index_in_threadgroup": ("qid", False), "quadgroups_per_threadgroup": ("nq", False),
    "dispatch_quadgroups_per_threadgroup": ("dnq", False),
}
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
_TOKEN = re.compile(r"""
 (?P<nl>\n)|(?P<ws>[ \t\r\f\v]+|\\\n)|(?P<comment>//[^\n]*|/\*.*?\*/)
|(?P<str>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
|(?P<num>0[xX][0-9a-fA-F']*(?:\.[0-9a-fA-F']*)?(?:[pP][+-]?\d+)?\w*|(?:\d[\d']*\.?[\d']*|\.\d[\d']*)(?:[eE][+-]?\d+)?\w*)
|(?P<id>[A-Za-z_]\w*)
|(?P<punct>::|->|\.\.\.|<<=|>>=|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%&|^<>!=]=|<<|>>|[^\s\w])""", re.X | re.S)
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
_QUALIFIERS = {"device", "constant", "const", "volatile", "thread", "threadgroup", "restrict", "__restrict",
               "__restrict__"}
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


@dataclass(frozen=True)
class MslParam:
    """One kernel parameter: a buffer bound by argument index, or a built-in thread position."""

    name: str
    decl: str                 # the declaration as written, attributes removed
    cpp_type: str             # its C++ type after translation, e.g. "const float*", "const uint&"
    base_type: str            # element type, e.g. "float4", "atomic_int", "MyStruct"
    index: int | None         # buffer index for buffers
    attribute: str | None     # position attribute for built-ins
    is_pointer: bool
    is_reference: bool

    def __str__(self) -> str:
        return self.decl


@dataclass(frozen=True)
class MslKernel:
    name: str                 # host name (lib.<name>)
    function: str             # C++ function name
    params: tuple[MslParam, ...]
    uses_fibers: bool         # calls barriers or SIMD-group functions (directly or through helpers)
    max_threads: int          # [[max_total_threads_per_threadgroup]] or 1024

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MslKernel":
        return cls(d["name"], d["function"], tuple(MslParam(**p) for p in d["params"]), d["uses_fibers"],
                   d["max_threads"])


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


class _Tokens:
    def __init__(self, text: str) -> None:
        self.kind: list[str] = []
        self.text: list[str] = []
        pos, line_start = 0, True
        while pos < len(text):
            if line_start and text[pos] == "#":  # a preprocessor line (line markers, #pragma)
                end = pos
                while True:
                    end = text.find("\n", end)
                    if end < 0:
                        end = len(text)
                        break
                    if text[end - 1] != "\\":
                        break
                    end += 1
                self.kind.append("pp"); self.text.append(text[pos:end]); pos = end
                continue
            m = _TOKEN.match(text, pos)
            assert m is not None
            kind = m.lastgroup or "punct"
            self.kind.append(kind); self.text.append(m.group(0))
            line_start = kind == "nl" or (line_start and kind == "ws")
            pos = m.end()
        self.sig = [i for i, k in enumerate(self.kind) if k not in ("nl", "ws", "comment", "pp")]
        self.match: dict[int, int] = {}  # sig position -> matching bracket's sig position
        self.parent: list[str] = []       # innermost enclosing bracket of each sig position
        stack: list[int] = []
        for p, i in enumerate(self.sig):
            t = self.text[i]
            self.parent.append(self.text[self.sig[stack[-1]]] if stack else "")
            if t in "([{" and self.kind[i] == "punct":
                stack.append(p)
            elif t in ")]}" and self.kind[i] == "punct":
                if not stack or "([{"[")]}".index(t)] != self.text[self.sig[stack[-1]]]:
                    raise CompileError(f"unbalanced {t!r} in kernel source")
                q = stack.pop()
                self.match[q], self.match[p] = p, q
        if stack:
            raise CompileError(f"unbalanced {self.text[self.sig[stack[-1]]]!r} in kernel source")

    def t(self, p: int) -> str:
        return self.text[self.sig[p]] if 0 <= p < len(self.sig) else ""

    def set(self, p: int, value: str) -> None:
        self.text[self.sig[p]] = value

    def is_attr_open(self, p: int) -> bool:
        return self.t(p) == "[" and self.t(p + 1) == "["

    def attr_end(self, p: int) -> int:
        """Sig position just after the `]]` closing the attribute opened at P."""
        return self.match[p] + 1

    def attr_items(self, p: int) -> list[tuple[str, str]]:
        """(name, argument text) of each attribute in the [[...]] at P."""
        inner = " ".join(self.t(q) for q in range(p + 2, self.match[p] - 1))
        items = []
        for m in re.finditer(r"([A-Za-z_][\w:]*)\s*(?:\(([^()]*)\))?", inner):
            items.append((m.group(1).split("::")[-1], (m.group(2) or "").strip()))
        return items

    def render(self) -> str:
        return "".join(self.text)


def _int_arg(text: str, what: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*[uU]?[lL]*\s*", text)
    if not m:
        raise CompileError(f"{what}: expected an integer literal, got {text!r}")
    return int(m.group(1))


def _split_params(tk: _Tokens, lo: int, hi: int) -> list[tuple[int, int]]:
    """Sig ranges of the comma-separated parameters between LO and HI (exclusive)."""
    out, start, angle, p = [], lo, 0, lo
    while p < hi:
        t = tk.t(p)
        if t in ("(", "[", "{"):
            p = tk.match[p]
        elif t == "<":
            angle += 1
        elif t in (">", ">>"):
            angle = max(0, angle - len(t))
        elif t == "," and angle == 0:
            out.append((start, p)); start = p + 1
        p += 1
    if start < hi:
        out.append((start, hi))
    return out


def _parse_param(tk: _Tokens, kernel: str, lo: int, hi: int) -> tuple[list[int], str | None, str, str | None]:
    """(sig positions of the declaration without attributes, attribute, attribute argument, name)."""
    attrs: list[tuple[str, str]] = []
    decl: list[int] = []
    p = lo
    while p < hi:
        if tk.is_attr_open(p):
            attrs += tk.attr_items(p)
            p = tk.attr_end(p)
        else:
            decl.append(p); p += 1
    text = " ".join(tk.t(q) for q in decl)
    if len(attrs) > 1:
        raise CompileError(f"kernel {kernel}: parameter {text!r}: more than one attribute is not supported")
    attr, arg = attrs[0] if attrs else (None, "")
    names = [q for q in decl if tk.kind[tk.sig[q]] == "id" and tk.t(q) not in _QUALIFIERS]
    if len(names) < 2:
        raise CompileError(f"kernel {kernel}: cannot parse parameter {text!r}")
    return decl, attr, arg, tk.t(names[-1])


def _base_type(tk: _Tokens, decl: list[int], name: str) -> str:
    words = [tk.t(q) for q in decl if tk.t(q) not in _QUALIFIERS and tk.t(q) not in ("*", "&") and tk.t(q) != name]
    return re.sub(r"^metal::", "", "".join(w if w in ("::", "<", ">", ",") else f" {w}" for w in words).strip()
                  .replace(" ::", "::").replace(" <", "<").replace(" >", ">"))


def _rewrite(tk: _Tokens, wrap: set[str]) -> None:
    """Address spaces, threadgroup variables, literals, pragmas and attributes, in place; calls to the
    helper functions in WRAP (they reach SIMD-group functions) record their line on the call path."""
    n = len(tk.sig)
    for i, k in enumerate(tk.kind):
        if k == "pp" and re.match(r"#\s*pragma\b", tk.text[i]):
            tk.text[i] = ""
    p = 0
    while p < n:
        t, kind = tk.t(p), tk.kind[tk.sig[p]]
        if tk.is_attr_open(p):
            end = tk.attr_end(p)
            for q in range(p, end):
                tk.set(q, "")
            p = end
            continue
        if kind == "num":
            tk.set(p, _literal(t))
        elif kind == "id":
            if t in ("device", "thread"):
                tk.set(p, "")
            elif t == "restrict":
                tk.set(p, "__restrict")
            elif t == "constant":
                tk.set(p, "" if "const" in (tk.t(p - 1), tk.t(p + 1)) else "const")
            elif t == "threadgroup":
                _rewrite_threadgroup(tk, p)
            elif t in wrap and tk.t(p + 1) == "(" and tk.parent[p] != "" and tk.t(p - 1) not in (".", "->"):
                start = p - 2 if tk.t(p - 1) == "::" and tk.kind[tk.sig[p - 2]] == "id" else p
                tk.set(start, "(ma_rt::SiteGuard(__LINE__), " + tk.t(start))
                close = tk.match[p + 1]
                tk.set(close, tk.t(close) + ")")
        p += 1


def _literal(t: str) -> str:
    if t[:2].lower() == "0x":
        return t
    m = re.fullmatch(r"([\d'.]+(?:[eE][+-]?\d+)?)([A-Za-z_]*)", t)
    if not m:
        return t
    mant, suffix = m.groups()
    is_float = "." in mant or "e" in mant.lower()
    if suffix in ("h", "H"):
        return f"metal::half({mant}{'f' if is_float else ''})"
    if suffix == "" and is_float:
        return mant + "f"  # Metal has no double: an unsuffixed floating literal is a float
    return t


def _rewrite_threadgroup(tk: _Tokens, p: int) -> None:
    """`threadgroup T x[N];` in a function body -> shared static storage; elsewhere drop the qualifier."""
    q, names, expect_name = p + 1, [], False
    pointer = tk.parent[p] != "{"
    last_id = None
    while not pointer and q < len(tk.sig):
        t = tk.t(q)
        if t in ("*", "&", "&&"):
            pointer = True
        elif t in ("(", "[", "{"):
            if t == "[" and last_id is not None and not names:
                names.append(last_id)
            q = tk.match[q]
        elif t in (";", "="):
            break
        elif t == ",":
            expect_name = True
            if last_id is not None and not names:
                names.append(last_id)
        elif tk.kind[tk.sig[q]] == "id":
            if expect_name:
                names.append(t); expect_name = False
            last_id = t
        q += 1
    if pointer:
        tk.set(p, "")
        return
    if not names and last_id is not None:
        names.append(last_id)
    if tk.t(q) == "=":
        raise CompileError("threadgroup variables cannot have initializers in Metal")
    tk.set(p, "static thread_local")
    tk.set(q, ";" + "".join(f" ma_rt::tg_note(&{nm}, sizeof({nm}));" for nm in dict.fromkeys(names)))


def translate(preprocessed: str, include: str = "msl_emu/metal_stdlib.h") -> tuple[str, list[MslKernel]]:
    """C++ source and kernel descriptions for a preprocessed MSL source."""
    tk = _Tokens(preprocessed)
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

    kernels: list[MslKernel] = []
    for (_, name_p, lp, _, host, fattrs) in found:
        fname = tk.t(name_p)
        params, explicit, raw = [], set(), []
        for lo, hi in _split_params(tk, lp + 1, tk.match[lp]):
            decl, attr, arg, pname = _parse_param(tk, host, lo, hi)
            raw.append((decl, attr, arg, pname))
            if attr == "buffer":
                idx = _int_arg(arg, f"kernel {host}: parameter {pname} [[buffer]]")
                if idx in explicit:
                    raise CompileError(f"kernel {host}: buffer index {idx} is used twice")
                explicit.add(idx)
        free = (i for i in range(10 ** 6) if i not in explicit)
        for decl, attr, arg, pname in raw:
            words = [tk.t(q) for q in decl]
            if attr is not None and attr not in POSITION_ATTRS and attr != "buffer":
                raise CompileError(f"kernel {host}: parameter {pname}: attribute [[{attr}]] is not supported "
                                   "by the MSL emulator")
            if attr is None and not ({"device", "constant"} & set(words)):
                raise CompileError(f"kernel {host}: parameter {pname} needs an address space (device or "
                                   "constant) or a thread-position attribute such as [[thread_position_in_grid]]")
            is_ptr, is_ref = "*" in words, "&" in words
            index = (_int_arg(arg, "") if attr == "buffer" else next(free)) if attr in (None, "buffer") else None
            text = " ".join(words)
            cpp = " ".join(_render_type(tk, q) for q in decl if tk.t(q) != pname).split()
            params.append(MslParam(pname, text, " ".join(cpp), _base_type(tk, decl, pname), index,
                                   attr if attr in POSITION_ATTRS else None, is_ptr, is_ref))
        max_threads = 1024
        if "max_total_threads_per_threadgroup" in fattrs:
            max_threads = _int_arg(fattrs["max_total_threads_per_threadgroup"], f"kernel {host}: max_total_threads_per_threadgroup")
            if not 1 <= max_threads <= 1024:
                raise CompileError(f"kernel {host}: max_total_threads_per_threadgroup must be in 1..1024")
        fibers = outside_sync or reaches_sync(fname)
        kernels.append(MslKernel(host, fname, tuple(params), fibers, max_threads))
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise CompileError(f"duplicate kernel names: {sorted(x for x in set(names) if names.count(x) > 1)}")
    kernel_functions = {k.function for k in kernels}
    _rewrite(tk, {f for f in bodies if f not in kernel_functions and f and reaches_sync(f)})
    out = [f'#include "{include}"', tk.render(), "", "// ---- launchers (generated)"]
    for k in kernels:
        out.append(launcher(k))
    return "\n".join(out) + "\n", kernels


def _render_type(tk: _Tokens, q: int) -> str:
    """The C++ text of a parameter's type token, as the launcher names it."""
    t = tk.t(q)
    if t in ("device", "thread"):
        return ""
    if t in ("restrict", "__restrict", "__restrict__"):
        return ""  # the launcher passes a plain pointer
    if t == "constant":
        return "" if "const" in (tk.t(q - 1), tk.t(q + 1)) else "const"
    return t


def launcher(k: MslKernel) -> str:
    args = []
    for prm in k.params:
        if prm.attribute is None:
            args.append(f"ma_rt::bindp<{prm.cpp_type}>(ma_b[{prm.index}])")
            continue
        field, is3 = POSITION_ATTRS[prm.attribute]
        if field == "simd_width":
            args.append(f"ma_rt::attr1<{prm.cpp_type}>(ma_rt::kSimdWidth)")
        elif field == "zero3":
            args.append(f"ma_rt::attr3<{prm.cpp_type}>(ma_zero)")
        elif is3:
            args.append(f"ma_rt::attr3<{prm.cpp_type}>(ma_t.{field})")
        else:
            args.append(f"ma_rt::attr1<{prm.cpp_type}>(ma_t.{field})")
    joined = ",\n        ".join(args)
    return (f'extern "C" __attribute__((visibility("default"))) int ma_launch_{k.name}('
            f"void** ma_b, const uint64_t* ma_dims, char* ma_err, int ma_errlen) {{\n"
            f"  (void)ma_b; static const uint32_t ma_zero[3] = {{0, 0, 0}}; (void)ma_zero;\n"
            f"  auto ma_body = [&](const ma_rt::Ids& ma_t) {{\n    (void)ma_t;\n    {k.function}(\n        {joined});\n  }};\n"
            f"  return ma_rt::launch(ma_dims, {int(k.uses_fibers)}, ma_body, ma_err, ma_errlen);\n}}\n")
