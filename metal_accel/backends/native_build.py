"""Compile an untrusted C++ kernel into a shared object in a scratch directory, and check it.

The compiler runs in a fresh directory holding only kernel.cpp (never the user's working directory),
with the include-path variables of the environment removed, and lists the headers it opens (-H).
Every header the kernel includes directly must be an allowlisted name found in the compiler's own
system include directories or metal_accel's include directory, and no opened file may lie outside
them. Diagnostics quote the kernel only: lines located in any other file, their source excerpts and
the header listing are dropped, the scratch path becomes kernel.cpp, and the home directory `~`.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

from ..core.errors import CompileError

MAX_DIAGNOSTICS = 4000
# variables that would add include directories or write dependency files behind our back
_SCRUBBED_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "DEPENDENCIES_OUTPUT",
                 "SUNPRO_DEPENDENCIES", "GCC_EXEC_PREFIX", "COMPILER_PATH")
_HEADER_LINE = re.compile(r"^(\.+)[!x]? (.+)$")
_INCLUDED_FROM = re.compile(r"^(?:In file included from|\s+from) (.+?):\d+[:,]")
_LOCATION = re.compile(r"^([^\s:|][^:]*?):(?:\d+:)?(?:\d+:)? ")
_EXCERPT = re.compile(r"^\s*(?:\d+\s*)?\|")
_ABS_PATH = re.compile(r"(?<![\w)\]])/(?:[\w.+-]+/)+[\w.+-]+")


class HeaderCheckError(CompileError):
    """The kernel reached a header outside the allowlist or outside the compiler's own directories."""


def compiler_env() -> dict[str, str]:
    """The environment the compiler runs in: ours without include-path and dependency variables."""
    return {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}


@functools.cache
def system_include_dirs(cxx: str) -> tuple[str, ...]:
    """The compiler's own <...> search directories (real paths)."""
    try:
        proc = subprocess.run([cxx, "-x", "c++", "-E", "-v", os.devnull], capture_output=True, text=True,
                              timeout=60, env=compiler_env())
    except (OSError, subprocess.SubprocessError):
        return ()
    lines = proc.stderr.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("#include <...> search starts here"))
    except StopIteration:
        return ()
    dirs = []
    for ln in lines[start + 1:]:
        if ln.startswith("End of search list"):
            break
        d = ln.strip().removesuffix(" (framework directory)")
        dirs.append(os.path.realpath(d))
    return tuple(dirs)


def _under(path: str, root: str) -> str | None:
    """PATH relative to ROOT when it lies under it."""
    rel = os.path.relpath(path, root)
    return None if rel.startswith("..") or os.path.isabs(rel) else rel


def check_headers(listing: list[tuple[int, str]], roots: tuple[str, ...], allowed: frozenset[str]) -> None:
    """Raise HeaderCheckError if a depth-1 header of LISTING ((depth, path) as -H prints them, relative paths
    from the scratch directory already made absolute) is not an allowed name under ROOTS, or if any file lies
    outside ROOTS. Messages name the header's file name only (its path may hold the user's home)."""
    for depth, path in listing:
        real = os.path.realpath(path)
        rels = [r for r in (_under(real, root) for root in roots) if r is not None]
        name = os.path.basename(path)
        if not rels:
            raise HeaderCheckError(f"header check: the kernel reached a file ({name}) outside the compiler's system "
                                   "include directories and metal_accel's include directory; kernels may include "
                                   "allowlisted headers by name only")
        if depth == 1 and not any(r in allowed for r in rels):
            raise HeaderCheckError(f"header check: the kernel includes {rels[0]}, which is not an allowed header "
                                   f"(allowed: {', '.join(sorted(allowed))})")


def scrub_diagnostics(log: str, work: Path, kernel_names: tuple[str, ...]) -> str:
    """The compiler's output with only what concerns the kernel's own files (see module docstring)."""
    work_s = str(work) + os.sep
    keep: list[str] = []
    keeping, dropped = True, 0
    for line in log.replace(work_s, "").splitlines():
        if line.startswith("Multiple include guards may be useful for:"):
            break  # -H's closing list of header files
        if _HEADER_LINE.match(line):
            continue
        m = _INCLUDED_FROM.match(line) or _LOCATION.match(line)
        if m:
            keeping = m.group(1) in kernel_names
        elif not _EXCERPT.match(line) and not line.startswith(" "):
            keeping = True  # a plain line ("compilation terminated.")
        if keeping:
            keep.append(line)
        else:
            dropped += 1
    if dropped:
        keep.append(f"({dropped} diagnostic lines about files other than the kernel are not shown)")
    text = "\n".join(keep).strip()
    home = str(Path.home())
    if len(home) > 1:
        text = text.replace(home, "~")
    text = _ABS_PATH.sub("<path>", text)
    if len(text) > MAX_DIAGNOSTICS:
        text = text[:MAX_DIAGNOSTICS] + f"\n... ({len(text) - MAX_DIAGNOSTICS} more characters)"
    return text


def header_listing(stderr: str, work: Path) -> list[tuple[int, str]]:
    """(depth, absolute path) of each file -H reports as opened."""
    out = []
    for line in stderr.splitlines():
        m = _HEADER_LINE.match(line)
        if m:
            p = m.group(2).strip()
            out.append((len(m.group(1)), p if os.path.isabs(p) else str(work / p)))
    return out


def compile_shared(cxx: str, flags: tuple[str, ...], work: Path, source_name: str, timeout_s: int,
                   include_dir: Path, allowed: frozenset[str], what: str = "C++ compilation",
                   libs: tuple[str, ...] = ()) -> Path:
    """Compile WORK/SOURCE_NAME into WORK/kernel.so with the compiler run in WORK; check the headers it opened.
    LIBS go after the source (libraries to link). Raises CompileError with scrubbed diagnostics."""
    try:
        proc = subprocess.run([cxx, *flags, "-H", source_name, "-o", "kernel.so", *libs], cwd=work, capture_output=True,
                              encoding="utf-8", errors="replace", timeout=timeout_s, env=compiler_env())
    except subprocess.TimeoutExpired:
        raise CompileError(f"{what} timed out after {timeout_s} s") from None
    names = (source_name, "kernel.cpp", "kernel.metal")  # the emulator's C++ points back at the MSL with #line
    if proc.returncode != 0:
        log = scrub_diagnostics(proc.stderr or proc.stdout, work, names)
        raise CompileError(f"{what} failed ({Path(cxx).name}, exit {proc.returncode}):\n{log}")
    roots = (*system_include_dirs(cxx), os.path.realpath(include_dir))
    check_headers(header_listing(proc.stderr, work), roots, allowed)
    return work / "kernel.so"
