"""Access sites of a compiled emulator kernel: where each memory-access check sits in the source.

The kernel is compiled with line tables (-g1). Each call to an access check (`__tsan_read4`, `__tsan_write4`, ...,
include/msl_emu/shadow.h) is a site; its return address, as an offset in the library, is what the
runtime sees. `build(so)` lists the sites with their path in kernel.metal (the lines of the calls
that inlined the site, outermost first, then the site's line), which the runtime uses to order
waiting threads by program position, and which `describe` uses to turn `{pc:...}` in error messages
into source lines. Uses binutils' objdump and addr2line; without them, sites have no lines.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

SOURCE_FILE = "kernel.metal"
MAX_PATH = 9  # kMaxDepth + 1 in runtime.h
_CALL = re.compile(r"^\s*([0-9a-f]+):\s+call\w*\s+[0-9a-f]+\s+<(__tsan_(?:unaligned_)?(?:read|write)\w*)(?:@plt)?>")
_INSN = re.compile(r"^\s*([0-9a-f]+):")
_LOC = re.compile(r"^(.*?):(\d+)(?: \(discriminator \d+\))?$")

Sites = dict[int, list[int]]  # return-address offset -> path of lines


def build(so: Path, timeout: float = 120) -> Sites:
    """Sites of the library SO (empty when binutils are missing)."""
    objdump, addr2line = shutil.which("objdump"), shutil.which("addr2line")
    if not objdump or not addr2line:
        return {}
    try:
        dis = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True,
                             timeout=timeout, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    rets: list[int] = []
    for i, line in enumerate(dis):
        if _CALL.match(line):
            for nxt in dis[i + 1:i + 4]:
                m = _INSN.match(nxt)
                if m:
                    rets.append(int(m.group(1), 16))
                    break
    if not rets:
        return {}
    return _lines(addr2line, so, rets, timeout)


def _lines(addr2line: str, so: Path, rets: list[int], timeout: float) -> Sites:
    try:
        out = subprocess.run([addr2line, "-i", "-a", "-e", str(so)], input="\n".join(hex(r - 1) for r in rets),
                             capture_output=True, text=True, timeout=timeout, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    sites: Sites = {}
    frames: list[int] = []
    cur: int | None = None
    for line in out + ["0x0"]:
        if line.startswith("0x"):
            if cur is not None:
                sites[cur + 1] = list(reversed(frames))[:MAX_PATH]
            cur, frames = int(line, 16), []
            continue
        m = _LOC.match(line.strip())
        if m and Path(m.group(1)).name == SOURCE_FILE and m.group(2) != "0":
            frames.append(int(m.group(2)))
    sites.pop(1, None)
    return sites


def save(sites: Sites, path: Path) -> None:
    path.write_text(json.dumps({str(k): v for k, v in sorted(sites.items())}))


def load(path: Path) -> Sites | None:
    try:
        return {int(k): [int(x) for x in v] for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def where(sites: Sites, pc: int) -> str:
    """`line N` (or `line N, in a function called at line M`) for the site PC."""
    path = sites.get(pc)
    if not path:
        return "an unknown line"
    if len(path) == 1:
        return f"line {path[0]}"
    return f"line {path[-1]} (in a function called at line {path[0]})"
