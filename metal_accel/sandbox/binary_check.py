"""Inspect a compiled kernel library before anything loads it: what will run, not what the source says.

`check_shared_object(path, policy, baseline)` reads the ELF file (pyelftools) and disassembles its
executable sections (capstone); it raises BinaryCheckError with a sentence naming what it found:
- an imported symbol outside the backend's allowlist (binary_allow.py), however the source spelled it;
- an instruction that enters the kernel (syscall, sysenter, int 0x80; svc on arm64), reads a clock or
  the CPU's identity (rdtsc, rdtscp, rdpid, rdrand, rdseed, cpuid), or changes the floating-point
  control or segment bases (ldmxcsr, fldcw, fxrstor, xrstor, wrfsbase, ...), at every instruction
  boundary of a linear sweep;
- code that runs at load: .init_array/.fini_array entries beyond the toolchain's own (measured by
  compiling an empty translation unit with the same flags), .ctors/.dtors/.preinit_array, GNU
  indirect functions (their resolvers run while the library is relocated), extra DT_NEEDED libraries,
  RPATH/RUNPATH;
- state a kernel could keep between calls: writable .data/.bss beyond the toolchain's own, other
  writable sections, thread-local storage (unless the backend's runtime needs it), an executable stack
  or a writable and executable segment.
Mach-O and other formats: BinaryCheckUnavailable (the backend refuses native code it cannot inspect).

Limits: native code in the process can still reach everything the process can without importing a
symbol (walking libc's tables from a pointer it is given, return-oriented use of loaded libraries'
code). The sweep does not see the bytes of a syscall hidden inside another instruction's immediate (reached by a
jump computed from a function's address): legit code holds such bytes (0f 05 in an immediate or a
displacement: 5 of the 32 shipped CPU candidates), so a raw-byte search would reject good kernels, and
such a gadget gains nothing libc's own code does not already offer. This check decides what a kernel
*imports and contains*, not what it can do with memory: which native code runs in the user's process at
all is decided elsewhere (the kernel server, native_policy).
"""
from __future__ import annotations

import bisect
import hashlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import capstone
from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from ..core.errors import CompileError
from .binary_allow import FILE_CAPABLE, NEEDED, Policy

MACHO_MAGIC = {b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe"}
X86_FORBIDDEN = {
    "syscall": "a system call", "sysenter": "a system call", "rdtsc": "a cycle-counter read",
    "rdtscp": "a cycle-counter read", "rdpid": "a processor-id read", "rdrand": "a hardware random number",
    "rdseed": "a hardware random number", "cpuid": "a CPU identification", "wrfsbase": "a segment-base write",
    "wrgsbase": "a segment-base write", "rdfsbase": "a segment-base read", "rdgsbase": "a segment-base read",
    "wrpkru": "a memory-protection-key write", "sysexit": "a system call", "sysret": "a system call",
}
X86_FP_CONTROL = {"ldmxcsr", "vldmxcsr", "fldcw", "fldenv", "frstor", "fxrstor", "fxrstor64", "xrstor", "xrstor64",
                  "xrstors", "xrstors64"}
ARM64_FORBIDDEN = {"svc": "a system call", "hvc": "a hypervisor call", "smc": "a monitor call"}
IRELATIVE = {"EM_X86_64": 37, "EM_AARCH64": 1032}
LOAD_TIME_SECTIONS = (".ctors", ".dtors", ".preinit_array")
# writable sections a normal shared object has; the loader's own, or relocation-read-only
WRITABLE_OK = {".init_array", ".fini_array", ".data.rel.ro", ".dynamic", ".got", ".got.plt", ".data", ".bss",
               ".tm_clone_table", ".tdata", ".tbss"}
# crtstuff's own data (the DSO handle, the "already finalized" flag, the TM clone table end) and the
# personality pointer of code with cleanups
# The toolchain's own writable objects. DW.ref.*: pointers to the personality routine and to the typeinfo of
# caught exceptions, filled in by the dynamic linker; the __cxxabiv1 handlers: what GCC 13 (Ubuntu 24.04) links
# in from libsupc++ when a kernel's code can throw (seen on the H100 host for a std::vector kernel).
TOOLCHAIN_DATA = re.compile(r"__dso_handle$|completed\.\d+$|__TMC_END__$|DW\.ref\.\S+$"
                            r"|_ZN10__cxxabiv1(?:20__unexpected_handler|19__terminate_handler)E$")
_TOOLCHAIN_POINTERS = re.compile(r"DW\.ref\.|_ZN10__cxxabiv1")


class BinaryCheckError(CompileError):
    """The compiled kernel library holds something a kernel may not."""

    def __init__(self, finding: str) -> None:
        super().__init__(f"binary check: {finding}")


class BinaryCheckUnavailable(BinaryCheckError):
    """The library's format cannot be inspected here, so it is not loaded."""


@dataclass(frozen=True)
class Baseline:
    """What the toolchain puts in a library compiled from an empty translation unit with the same flags."""

    init_array: int
    fini_array: int
    writable: dict[str, int] = field(default_factory=dict)  # .data / .bss sizes


# GCC's crtstuff on ELF: frame_dummy and __do_global_dtors_aux, __dso_handle, completed.0. Used where no
# compiler is present to measure the baseline (loading libraries built earlier); stricter than none.
DEFAULT_BASELINE = Baseline(8, 8, {".data": 8, ".bss": 8})


@dataclass(frozen=True)
class Verdict:
    """A passed check: the artifact's sha256 and a one-line summary."""

    sha256: str
    summary: str


def sha256_of(path: Path) -> str:
    """sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _open(data: bytes, name: str) -> ELFFile:
    if data[:4] in MACHO_MAGIC:
        raise BinaryCheckUnavailable(
            f"{name} is a Mach-O library, which this version cannot inspect; native kernels are refused on this "
            "platform rather than loaded unchecked")
    try:
        return ELFFile(io.BytesIO(data))
    except ELFError as e:
        raise BinaryCheckError(f"{name} is not a readable ELF shared object ({e}); it is not loaded") from None


def measure_baseline(path: Path) -> Baseline:
    """The toolchain's own load-time entries and writable data, read from a library built from an
    empty translation unit (see module docstring)."""
    elf = _open(path.read_bytes(), path.name)
    size = {s.name: s["sh_size"] for s in elf.iter_sections()}
    return Baseline(size.get(".init_array", 0), size.get(".fini_array", 0),
                    {n: size.get(n, 0) for n in (".data", ".bss")})


class _Symbols:
    """Defined symbols by address, to name the function or object at an offset."""

    def __init__(self, elf: ELFFile) -> None:
        rows = []
        for sec in elf.iter_sections():
            if isinstance(sec, SymbolTableSection):
                for s in sec.iter_symbols():
                    if s.name and s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["type"] in ("STT_FUNC", "STT_OBJECT",
                                                                                          "STT_NOTYPE", "STT_LOOS",
                                                                                          "STT_TLS"):
                        rows.append((s["st_value"], s["st_size"], s.name, s["st_info"]["type"]))
        rows.sort()
        self.has_symtab = elf.get_section_by_name(".symtab") is not None
        self.rows = rows
        self.addrs = [r[0] for r in rows]

    def at(self, addr: int) -> str | None:
        i = bisect.bisect_right(self.addrs, addr) - 1
        while i >= 0:
            start, size, name, _ = self.rows[i]
            if start <= addr < start + max(size, 1):
                return name
            if size or start < addr - 4096:
                return None if size else name
            i -= 1
        return None

    def in_range(self, lo: int, hi: int, everything: bool = False) -> list[str]:
        """Names of the symbols in [LO, HI): data objects, or all (EVERYTHING)."""
        names = [r[2] for r in self.rows if lo <= r[0] < hi and (everything or r[3] in ("STT_OBJECT", "STT_TLS"))]
        return list(dict.fromkeys(names))  # .symtab and .dynsym name the same symbols


def check_shared_object(path: Path, policy: Policy, baseline: Baseline) -> Verdict:
    """Raise BinaryCheckError (a sentence) if the library at PATH breaks POLICY; else its Verdict."""
    data = path.read_bytes()
    elf = _open(data, path.name)
    try:
        if elf["e_type"] != "ET_DYN":
            raise BinaryCheckError(f"{path.name} is not a shared object ({elf['e_type']})")
        syms = _Symbols(elf)
        if not syms.has_symtab:
            raise BinaryCheckError(f"{path.name} has no symbol table (stripped), so its data cannot be accounted for")
        _check_segments(elf, policy)
        _check_sections(elf, policy, baseline, syms)
        imports = _check_dynamic(elf, policy)
        n = _check_code(elf, policy, syms)
    except BinaryCheckError:
        raise
    except Exception as e:  # pyelftools and construct raise many kinds on malformed files
        raise BinaryCheckError(f"{path.name} is not a readable ELF shared object ({type(e).__name__}); it is not "
                               "loaded") from None
    return Verdict(hashlib.sha256(data).hexdigest(),
                   f"passed: {len(imports)} imported symbols, all allowed; {n} instructions inspected")


def _check_dynamic(elf: ELFFile, policy: Policy) -> list[str]:
    imports: list[str] = []
    for sec in elf.iter_sections():
        if isinstance(sec, DynamicSection):
            for tag in sec.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED" and not NEEDED.match(tag.needed):
                    raise BinaryCheckError(f"the library needs {tag.needed}, which is not a runtime library kernels "
                                           "may link (its constructors would run at load)")
                if tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                    raise BinaryCheckError(f"the library sets a library search path ({tag.entry.d_tag})")
        elif isinstance(sec, RelocationSection):
            irel = IRELATIVE.get(elf["e_machine"])
            if irel is not None and any(r["r_info_type"] == irel for r in sec.iter_relocations()):
                raise BinaryCheckError(f"section {sec.name} holds an IRELATIVE relocation: an indirect function "
                                       "whose resolver would run while the library loads")
        if sec.name == ".dynsym" and isinstance(sec, SymbolTableSection):
            for s in sec.iter_symbols():
                name = s.name.split("@")[0]
                if s["st_info"]["type"] in ("STT_LOOS", "STT_GNU_IFUNC") and s["st_shndx"] != "SHN_UNDEF":
                    raise BinaryCheckError(f"symbol {name} is an indirect function (its resolver runs "
                                           "while the library loads)")
                if not name or s["st_shndx"] != "SHN_UNDEF":
                    continue
                if not policy.allows_import(name):
                    raise BinaryCheckError(
                        f"the library imports {name}, which {policy.backend} kernels may not use (allowed: "
                        "math functions, memory copy/fill/allocation, the C++ and OpenMP runtimes' own entry points)")
                imports.append(name)
    return imports


def _check_segments(elf: ELFFile, policy: Policy) -> None:
    for seg in elf.iter_segments():
        t, flags = seg["p_type"], seg["p_flags"]
        if t == "PT_GNU_STACK" and flags & 1:
            raise BinaryCheckError("the library asks for an executable stack")
        if t == "PT_LOAD" and flags & 1 and flags & 2:
            raise BinaryCheckError("the library has a segment that is both writable and executable")
        if t == "PT_TLS" and not policy.allow_tls:
            raise BinaryCheckError("the library has thread-local storage (a TLS segment), where a kernel could keep "
                                   "state between calls")


def _check_sections(elf: ELFFile, policy: Policy, baseline: Baseline, syms: _Symbols) -> None:
    for sec in elf.iter_sections():
        name, size, flags = sec.name, sec["sh_size"], sec["sh_flags"]
        if name in LOAD_TIME_SECTIONS and size:
            raise BinaryCheckError(f"section {name} holds {size // 8} entries of code that runs at load time")
        if name == ".init_array" and size > baseline.init_array or name == ".fini_array" and size > baseline.fini_array:
            extra = (size - (baseline.init_array if name == ".init_array" else baseline.fini_array)) // 8
            raise BinaryCheckError(f"section {name} holds {extra} more entr{'y' if extra == 1 else 'ies'} than the "
                                   f"toolchain's own: code that runs when the library is loaded or unloaded (a "
                                   "constructor, a destructor or the dynamic initializer of a namespace-scope object)")
        if name in (".tdata", ".tbss") and size and not policy.allow_tls:
            raise BinaryCheckError(f"section {name} holds {size} bytes of thread-local storage, where a kernel could "
                                   "keep state between calls")
        if not flags & 1:  # SHF_WRITE
            continue
        if flags & 4:
            raise BinaryCheckError(f"section {name} is both writable and executable")
        if name not in WRITABLE_OK:
            raise BinaryCheckError(f"writable section {name} ({size} bytes) is not one the toolchain makes: a kernel "
                                   "could keep state there")
        if name in baseline.writable:
            lo = sec["sh_addr"]
            theirs = [n for n in syms.in_range(lo, lo + max(size, 1)) if not TOOLCHAIN_DATA.match(n)]
            if theirs:
                raise BinaryCheckError(f"section {name} holds writable data ({', '.join(theirs[:4])}): a kernel could "
                                       "keep state there between calls (a non-const global, a mutable member, or a "
                                       "lazily initialized constant)")
            own = syms.in_range(lo, lo + max(size, 1), everything=True)
            allowed = baseline.writable.get(name, 0) + 8 * sum(1 for n in own if _TOOLCHAIN_POINTERS.match(n))
            if size > allowed:
                raise BinaryCheckError(f"section {name} holds {size - allowed} bytes of writable data beyond the "
                                       "toolchain's own: a kernel could keep state there between calls")


def _check_code(elf: ELFFile, policy: Policy, syms: _Symbols) -> int:
    machine = elf["e_machine"]
    if machine == "EM_X86_64":
        md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        forbidden, fp_control = X86_FORBIDDEN, X86_FP_CONTROL
    elif machine == "EM_AARCH64":  # thin path, not exercised by the tests (x86-64 CI)
        md = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
        forbidden, fp_control = ARM64_FORBIDDEN, set()
    else:
        raise BinaryCheckUnavailable(f"no instruction check for {machine}; native kernels are refused on it")
    md.skipdata = True
    plt = _plt_targets(elf)
    count = 0
    for sec in elf.iter_sections():
        if not sec["sh_flags"] & 4 or sec["sh_type"] != "SHT_PROGBITS":
            continue
        code, base = sec.data(), sec["sh_addr"]
        for addr, _, mnem, ops in md.disasm_lite(code, base):
            count += 1
            why = forbidden.get(mnem)
            if mnem == "int" and ops.strip() != "3":
                why = "a software interrupt"
            if mnem == "mrs" and "cntv" in ops or mnem == "msr" and "fpcr" in ops:
                why = "a timer read or FP control write"
            if mnem in fp_control and syms.at(addr) not in policy.fp_control_in:
                why = "a write of the floating-point control register (rounding, denormals, exceptions)"
            if why is None and mnem in ("call", "jmp") and policy.runtime_callers and ops.startswith("0x"):
                target = plt.get(int(ops, 16))
                caller = syms.at(addr) or ""
                if target in FILE_CAPABLE and not caller.startswith(policy.runtime_callers):
                    why = f"a call of {target}() outside the emulator runtime"
            if why:
                raise BinaryCheckError(f"section {sec.name} holds {mnem} {ops}".rstrip() + f" ({why}) at offset "
                                       f"{addr:#x}, in {syms.at(addr) or 'unnamed code'}")
    return count


def _plt_targets(elf: ELFFile) -> dict[int, str]:
    """Address of each PLT stub -> the imported name it calls (x86-64 .plt.sec or .plt layout)."""
    rel = elf.get_section_by_name(".rela.plt")
    dynsym = elf.get_section_by_name(".dynsym")
    if rel is None or dynsym is None:
        return {}
    names = [dynsym.get_symbol(r["r_info_sym"]).name.split("@")[0] for r in rel.iter_relocations()]
    sec = elf.get_section_by_name(".plt.sec")
    if sec is not None:
        return {sec["sh_addr"] + 16 * i: n for i, n in enumerate(names)}
    sec = elf.get_section_by_name(".plt")
    if sec is None:
        return {}
    return {sec["sh_addr"] + 16 * (i + 1): n for i, n in enumerate(names)}
