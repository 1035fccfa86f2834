"""Write one benchmark's section of docs/benchmarks.md, leaving the other sections alone."""
from __future__ import annotations

import datetime
import platform
import re
import subprocess
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = ("# Benchmarks\n\nEvery figure here comes from a script under `benchmarks/`, with its command, machine and "
          "date. Ratios on the shared CPU machines are measured side by side in one run (interleaved pairs); "
          "CPU and GPU figures are never mixed, and emulator timings are never Metal speed.\n")


def machine() -> str:
    from metal_accel.backends.cpu.backend import cpu_name
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    except OSError:
        nproc = "?"
    return (f"{cpu_name()}, {nproc} cores, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def write_section(name: str, title: str, command: str, body: str, machine_text: str | None = None,
                  date: str | None = None) -> None:
    """`machine_text`/`date` describe where and when the figures were measured when that was not this
    machine today (e.g. a GPU machine whose results were copied back)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    section = (f"{start}\n## {title}\n\n- command: `{command}`\n- machine: {machine_text or machine()}\n"
               f"- date: {date or datetime.date.today().isoformat()}\n\n{body.rstrip()}\n{end}")
    text = DOC.read_text() if DOC.exists() else HEADER
    if start in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: section, text, flags=re.DOTALL)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
