"""Which buffers each kernel of an MSL source may write, read from its signatures with the emulator's parser
(mps_emu.msl_signature), so that the Metal launchers refuse a protected tensor bound where a kernel writes
(backends/protected.py), as the CPU, CUDA and emulator launchers do.

Signatures are read as Metal's compiler reads them: a source with preprocessor directives is run through the
C preprocessor first (the emulator's own step). Where that cannot be done, or the parser does not read a
kernel, the kernel is left out of the result and every buffer it binds counts as written.
"""
from __future__ import annotations

import re

from ...core.errors import CompileError
from ..cpu.backend import find_compiler
from ..mps_emu.msl_translate import prepare_for_preprocessor, translate_unit
from ..protected import msl_param_written

_DIRECTIVE = re.compile(r"#|%:|\?\?=")  # a directive, its digraph or its trigraph anywhere: preprocess first


def _preprocessed(source: str) -> str | None:
    """SOURCE as the parser should read it; None when it has directives and no preprocessor is at hand."""
    text = prepare_for_preprocessor(source)
    if not _DIRECTIVE.search(text):
        return text
    cxx = find_compiler()
    if cxx is None:
        return None
    from ..mps_emu.backend import _preprocess
    return _preprocess(cxx, source)


def written_buffers(source: str) -> dict[str, frozenset[int]]:
    """Kernel name -> the buffer indices it may write. A kernel not in the result writes every buffer."""
    try:
        text = _preprocessed(source)
        if text is None:
            return {}
        _, kernels = translate_unit(text)
    except (CompileError, ValueError, KeyError, IndexError, OSError):  # not read: every buffer counts as written
        return {}
    return {k.name: frozenset(p.index for p in k.params
                              if p.attribute is None and p.index is not None and msl_param_written(p))
            for k in kernels}
