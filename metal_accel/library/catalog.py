"""What the shipped kernel library holds: per family, the backends with a kernel file and the dtypes each
serves, and the classes known to compute it. For `metal-accel doctor` and docs/library.md."""
from __future__ import annotations

from dataclasses import dataclass

from .families import FAMILIES
from .known import known_classes
from .provider import _LANGUAGE_DIR, kernel_file

ALL_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Coverage:
    family: str
    summary: str
    backends: dict[str, tuple[str, ...]]   # backend -> dtypes its kernel serves (all three when it names none)
    classes: tuple[str, ...]               # known classes that compute it (shipped list and matches made here)


# computations served below modules the library cannot replace, by routing a function HF models call
# (library/hf_attention.py, library/rotary.py): optimize() attaches them; they match no class
ROUTED = (("attention_decode", "decode attention below HF's attention modules (AttentionInterface; optimize())"),
          ("rotary", "HF's apply_rotary_pos_emb to q and k (the modeling module's function; optimize())"))


def catalog(backends: tuple[str, ...] = ("cpu", "cuda", "mps")) -> list[Coverage]:
    known = known_classes()
    out = []
    for name, summary in [(f.name, f.summary) for f in FAMILIES.values()] + list(ROUTED):
        served = {}
        for backend in backends:
            kernel = kernel_file(backend, name) if backend in _LANGUAGE_DIR else None
            if kernel is not None:
                served[backend] = kernel[1] or ALL_DTYPES
        out.append(Coverage(name, summary, served,
                            tuple(sorted(c.rsplit(".", 1)[-1] for c, f in known.items() if f == name))))
    return out


def describe(usable: list[str]) -> list[str]:
    """Lines for doctor: each family, which of this machine's backends run it (and in which dtypes)."""
    names = tuple(dict.fromkeys("mps" if b == "mps-emu" else b for b in usable))
    label = {"mps": "mps" if "mps" in usable else "mps-emu (emulated: correctness only)"}
    lines = []
    rows = catalog()
    width = max(len(c.family) for c in rows)
    for c in rows:
        here = [f"{label.get(b, b)} ({', '.join(_short(d) for d in dtypes)})"
                for b, dtypes in c.backends.items() if b in names]
        elsewhere = [b for b in c.backends if b not in names]
        text = f"library {c.family:{width}s} " + ("; ".join(here) if here else "no kernel for this machine's backends")
        if elsewhere:
            text += f" [also: {', '.join(elsewhere)}]"
        if c.classes:
            shown = ", ".join(c.classes[:4]) + (f" +{len(c.classes) - 4}" if len(c.classes) > 4 else "")
            text += f"  e.g. {shown}"
        lines.append(text)
    return lines


def _short(dtype: str) -> str:
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)


def markdown_table() -> str:
    """The kernels-by-backend table of docs/library.md (a test keeps the page equal to it)."""
    lines = ["| family | cpu (C++) | cuda | mps (Metal) |", "|---|---|---|---|"]
    for c in catalog():
        cells = [", ".join(_short(d) for d in c.backends[b]) if b in c.backends else "–" for b in ("cpu", "cuda", "mps")]
        lines.append(f"| `{c.family}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
