"""Kernel signatures of the MSL emulator: parameters, buffer indices, and the generated launcher.

Each `kernel void name(...)` becomes an `MslKernel`: its parameters (buffers bound by argument index,
or built-in thread positions from attributes such as [[thread_position_in_grid]]) and the extern "C"
launcher that binds them and runs the kernel over the grid (metal_accel/include/msl_emu/runtime.h).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ...core.errors import CompileError
from .msl_lexer import Tokens

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
_QUALIFIERS = {"device", "constant", "const", "volatile", "thread", "threadgroup", "restrict", "__restrict",
               "__restrict__"}


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
    def from_dict(cls, d: dict) -> MslKernel:
        return cls(d["name"], d["function"], tuple(MslParam(**p) for p in d["params"]), d["uses_fibers"],
                   d["max_threads"])


def kernel_params(tk: Tokens, host: str, lp: int) -> tuple[MslParam, ...]:
    """The parameters of kernel HOST, whose parameter list opens at sig position LP; a parameter
    without [[buffer(i)]] takes the lowest index no other parameter names."""
    params, explicit, raw, tg_seen = [], set(), [], set()
    for lo, hi in _split_params(tk, lp + 1, tk.match[lp]):
        decl, attr, arg, pname = _parse_param(tk, host, lo, hi)
        raw.append((decl, attr, arg, pname))
        if attr == "buffer":
            idx = _int_arg(arg, f"kernel {host}: parameter {pname} [[buffer]]")
            if idx in explicit:
                raise CompileError(f"kernel {host}: buffer index {idx} is used twice")
            explicit.add(idx)
        elif attr == "threadgroup":
            idx = _int_arg(arg, f"kernel {host}: parameter {pname} [[threadgroup]]")
            if idx in tg_seen or idx > 31:
                raise CompileError(f"kernel {host}: [[threadgroup({idx})]] is used twice or is above 31")
            tg_seen.add(idx)
    free = (i for i in range(10 ** 6) if i not in explicit)
    for decl, attr, arg, pname in raw:
        words = [tk.t(q) for q in decl]
        if attr == "threadgroup":
            if "*" not in words:
                raise CompileError(f"kernel {host}: parameter {pname} [[threadgroup]] must be a `threadgroup T*` pointer")
            params.append(MslParam(pname, " ".join(words), " ".join(_render_type(tk, q) for q in decl if tk.t(q) != pname),
                                   _base_type(tk, decl, pname), _int_arg(arg, ""), "threadgroup", True, False))
            continue
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
    return tuple(params)


def max_threads_per_threadgroup(host: str, fattrs: dict[str, str]) -> int:
    """[[max_total_threads_per_threadgroup(N)]] of kernel HOST, else 1024."""
    max_threads = 1024
    if "max_total_threads_per_threadgroup" in fattrs:
        max_threads = _int_arg(fattrs["max_total_threads_per_threadgroup"], f"kernel {host}: max_total_threads_per_threadgroup")
        if not 1 <= max_threads <= 1024:
            raise CompileError(f"kernel {host}: max_total_threads_per_threadgroup must be in 1..1024")
    return max_threads


def _int_arg(text: str, what: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*[uU]?[lL]*\s*", text)
    if not m:
        raise CompileError(f"{what}: expected an integer literal, got {text!r}")
    return int(m.group(1))


def _split_params(tk: Tokens, lo: int, hi: int) -> list[tuple[int, int]]:
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


def _parse_param(tk: Tokens, kernel: str, lo: int, hi: int) -> tuple[list[int], str | None, str, str | None]:
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


def _base_type(tk: Tokens, decl: list[int], name: str) -> str:
    words = [tk.t(q) for q in decl if tk.t(q) not in _QUALIFIERS and tk.t(q) not in ("*", "&") and tk.t(q) != name]
    return re.sub(r"^metal::", "", "".join(w if w in ("::", "<", ">", ",") else f" {w}" for w in words).strip()
                  .replace(" ::", "::").replace(" <", "<").replace(" >", ">"))


def _render_type(tk: Tokens, q: int) -> str:
    """The C++ text of a parameter's type token, as the launcher names it."""
    t = tk.t(q)
    if t in ("device", "thread", "threadgroup"):
        return ""
    if t in ("restrict", "__restrict", "__restrict__"):
        return ""  # the launcher passes a plain pointer
    if t == "constant":
        return "" if "const" in (tk.t(q - 1), tk.t(q + 1)) else "const"
    return t


def threadgroup_slots(k: MslKernel) -> int:
    """How many [[threadgroup(n)]] sizes a launch of K passes after the grid (the highest n + 1)."""
    return max((p.index + 1 for p in k.params if p.attribute == "threadgroup" and p.index is not None), default=0)


def launcher(k: MslKernel) -> str:
    """The extern "C" entry `ma_launch_<host name>` that binds K's arguments and runs it over the grid."""
    args = []
    for i, prm in enumerate(k.params):
        # a kernel instantiated from a template names its parameter types through the function's own type
        ptype = f"ma_rt::param_t<{i}, decltype(&{k.function})>" if "<" in k.function else prm.cpp_type
        if prm.attribute is None:
            args.append(f"ma_rt::bindp<{ptype}>(ma_rt::arg(ma_b, {prm.index}))")
            continue
        if prm.attribute == "threadgroup":
            args.append(f"ma_rt::tg_param<{ptype}>({prm.index}, ma_rt::dim(ma_dims, {6 + (prm.index or 0)}))")
            continue
        field, is3 = POSITION_ATTRS[prm.attribute]
        if field == "simd_width":
            args.append(f"ma_rt::attr1<{ptype}>(ma_rt::kSimdWidth)")
        elif field == "zero3":
            args.append(f"ma_rt::attr3<{ptype}>(ma_zero)")
        elif is3:
            args.append(f"ma_rt::attr3<{ptype}>(ma_t.{field})")
        else:
            args.append(f"ma_rt::attr1<{ptype}>(ma_t.{field})")
    joined = ",\n        ".join(args)
    return (f'extern "C" __attribute__((visibility("default"))) int ma_launch_{k.name}('
            f"void** ma_b, const uint64_t* ma_dims, char* ma_err, int ma_errlen, const ma_rt::Config* ma_cfg) {{\n"
            f"  (void)ma_b; static const uint32_t ma_zero[3] = {{0, 0, 0}}; (void)ma_zero;\n"
            f"  auto ma_body = [&](const ma_rt::Ids& ma_t) {{\n    (void)ma_t;\n    {k.function}(\n        {joined});\n  }};\n"
            f"  return ma_rt::launch(ma_dims, {int(k.uses_fibers)}, ma_body, ma_err, ma_errlen, ma_cfg);\n}}\n")
