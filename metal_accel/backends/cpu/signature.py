"""Parsing the extern "C" kernel signatures of CPU sources, and the C types they may use."""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...core.errors import CompileError, KernelLaunchError

# pointer base type -> tensor dtypes it accepts
POINTER_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "float": (torch.float32,), "double": (torch.float64,),
    "int8_t": (torch.int8,), "uint8_t": (torch.uint8, torch.bool), "bool": (torch.bool,),
    "int16_t": (torch.int16,), "uint16_t": (torch.float16, torch.bfloat16),
    "int32_t": (torch.int32,), "int": (torch.int32,),
    "int64_t": (torch.int64,), "long": (torch.int64,), "long long": (torch.int64,),
}
# scalar type -> (ctypes type, is_integer, min, max)
SCALAR_TYPES: dict[str, tuple[Any, bool, int, int]] = {
    "float": (ctypes.c_float, False, 0, 0), "double": (ctypes.c_double, False, 0, 0),
    "bool": (ctypes.c_bool, True, 0, 1),
    "int": (ctypes.c_int32, True, -2**31, 2**31 - 1), "int32_t": (ctypes.c_int32, True, -2**31, 2**31 - 1),
    "uint32_t": (ctypes.c_uint32, True, 0, 2**32 - 1),
    "int64_t": (ctypes.c_int64, True, -2**63, 2**63 - 1), "long": (ctypes.c_int64, True, -2**63, 2**63 - 1),
    "long long": (ctypes.c_int64, True, -2**63, 2**63 - 1),
    "uint64_t": (ctypes.c_uint64, True, 0, 2**64 - 1), "size_t": (ctypes.c_size_t, True, 0, 2**64 - 1),
}


@dataclass(frozen=True)
class CParam:
    """One parameter of an extern "C" kernel."""

    name: str
    base_type: str
    is_pointer: bool
    is_const: bool

    def __str__(self) -> str:
        return f"{'const ' if self.is_const else ''}{self.base_type}{'*' if self.is_pointer else ''} {self.name}"


_TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")
_HEADER = re.compile(r"^(?P<ret>[\w\s\*&:<>,]*?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<params>[^()]*)\)[\w\s]*$", re.S)
_QUALIFIERS = {"__restrict__", "__restrict", "restrict", "volatile", "signed"}


def _clean(source: str) -> str:
    """Drop comments, preprocessor lines and attributes; blank string and char literals."""
    def repl(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.startswith("/"):
            return " " if tok.startswith("//") else " " + "\n" * tok.count("\n")
        return '"C"' if tok == '"C"' else ('""' if tok[0] == '"' else "' '")
    text = _TOKEN.sub(repl, source)
    text = re.sub(r"^[ \t]*#.*?(?<!\\)$", "", text, flags=re.M | re.S)
    return _ATTRIBUTE.sub(" ", text)


def _match_brace(text: str, start: int) -> int:
    """Index just past the '}' matching the '{' at START."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    raise CompileError("unbalanced braces in kernel source")


def _declarations(block: str) -> list[str]:
    """Top-level declarations of BLOCK: text before each ';' or '{...}' body."""
    out, start, i = [], 0, 0
    while i < len(block):
        if block[i] == ";":
            out.append(block[start:i]); start = i = i + 1
        elif block[i] == "{":
            out.append(block[start:i]); i = _match_brace(block, i)
            start = i
        else:
            i += 1
    return out


def _first_declarator(words: list[str]) -> int:
    """The index of the first `*` or `[...]` among WORDS (their count where there is none): a `const` before it
    qualifies the pointee, one after it the pointer itself."""
    return next((i for i, w in enumerate(words) if w == "*" or w.startswith("[")), len(words))


def _parse_param(func: str, index: int, text: str) -> CParam:
    tokens = re.findall(r"[A-Za-z_]\w*|\*|&|\[[^\]]*\]", text.replace("std::", ""))
    words = [w for w in tokens if w not in _QUALIFIERS]
    is_const = "const" in words[:_first_declarator(words)]  # the pointee's: `float* const out` is written
    words = [w for w in words if w != "const"]
    stars = sum(w == "*" or w.startswith("[") for w in words)
    if "&" in words:
        raise CompileError(f"kernel {func}: parameter {text.strip()!r}: references are not supported")
    names = [w for w in words if w != "*" and not w.startswith("[")]
    # the last identifier is the name unless the words alone form a known type
    if len(names) > 1 and " ".join(names) not in SCALAR_TYPES:
        name, base = names[-1], " ".join(names[:-1])
    else:
        name, base = f"arg{index}", " ".join(names)
    base = {"unsigned": "uint32_t", "unsigned int": "uint32_t", "long int": "long",
            "long long int": "long long"}.get(base, base)
    ok = (stars == 1 and base in POINTER_DTYPES) or (stars == 0 and base in SCALAR_TYPES)
    if not ok:
        raise CompileError(
            f"kernel {func}: parameter {index} {text.strip()!r} has an unsupported type; pointers may be to "
            f"{', '.join(POINTER_DTYPES)}; scalars may be {', '.join(SCALAR_TYPES)}")
    return CParam(name, base, stars == 1, is_const)


def extern_c_declarations(text: str) -> list[str]:
    """The declarations (text before each ';' or body) under `extern "C"` in cleaned source TEXT,
    whether each is marked alone or inside an `extern "C" { ... }` block."""
    headers: list[str] = []
    for m in re.finditer(r'\bextern\s*"C"\s*', text):
        if text.startswith("{", m.end()):
            end = _match_brace(text, m.end())
            headers += _declarations(text[m.end() + 1:end - 1])
        else:
            stop = re.compile(r"[;{]").search(text, m.end())
            headers.append(text[m.end():stop.start() if stop else len(text)])
    return headers


def parse_extern_c(source: str) -> dict[str, list[CParam]]:
    """The extern "C" functions of SOURCE with their parameters, in source order."""
    headers = extern_c_declarations(_clean(source))
    funcs: dict[str, list[CParam]] = {}
    for header in headers:
        header = " ".join(header.split())
        words = header.split(" ")
        if "(" not in header or "=" in header.split("(")[0] or {"static", "typedef", "using", "inline"} & set(words):
            continue  # variables, typedefs and internal helpers are not kernels
        m = _HEADER.match(header)
        if m is None:
            raise CompileError(f"cannot parse extern \"C\" declaration {header!r}")
        name, ret = m["name"], " ".join(m["ret"].replace("extern", "").split())
        if ret != "void":
            raise CompileError(f"kernel {name} returns {ret or '?'!r}; extern \"C\" kernels must return void "
                               "and write results through non-const pointer parameters")
        raw = m["params"].split(",") if m["params"].strip() not in ("", "void") else []
        funcs.setdefault(name, [_parse_param(name, i, p) for i, p in enumerate(raw)])
    return funcs


def scalar_converter(kernel: str, i: int, p: Any, table: dict[str, tuple[Any, bool, int, int]] = SCALAR_TYPES
                     ) -> Callable[[Any], Any]:
    """A function from a Python number (or 0-dim tensor) to parameter `p`'s C scalar value.

    `table` maps the base type to (ctypes type, is integer, min, max); the exact Python type is the
    fast path, everything else is checked and converted or refused with KernelLaunchError.
    """
    _, integral, lo, hi = table[p.base_type]
    where = f"kernel {kernel}, argument {i} ({p})"

    def slow(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.dim() != 0:
                raise KernelLaunchError(f"{where}: expected a scalar or 0-dim tensor, got shape {tuple(x.shape)}")
            x = x.item()
        if integral:
            if isinstance(x, float) or not hasattr(x, "__index__"):
                raise KernelLaunchError(f"{where}: expected an integer, got {type(x).__name__} {x!r}")
            v = int(x.__index__())
            if not lo <= v <= hi:
                raise KernelLaunchError(f"{where}: {v} is out of range for {p.base_type}")
            return v
        if not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
            raise KernelLaunchError(f"{where}: expected a number, got {type(x).__name__}")
        return float(x)

    if integral:
        return lambda x: x if type(x) is int and lo <= x <= hi else slow(x)
    return lambda x: x if type(x) is float else slow(x)
