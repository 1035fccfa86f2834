"""Prompts: what an LLM is told about the module, the backend and the rules, and the feedback it gets.

The system prompt (per kernel language) holds the candidate format, the host-code sandbox and
kernel-source rules, the language guide and a worked example; the task prompt holds one module
call: source, attributes, parameter shapes, input/output specs, device, eager time, profile and
reference kernels. Repair rounds append the verdict of the previous answer.
"""
from __future__ import annotations

import functools
import inspect
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from torch import nn

from ..backends.cpu.backend import compile_flags
from ..core import config
from ..core.keys import class_path, class_source, module_config
from ..core.provider import Evaluation, SynthesisRequest
from ..core.specs import TensorSpec, UnsupportedCall
from ..proof.speed import DEFAULT_MARGIN
from ..sandbox.host_rules import (
    BUILTINS_ALLOWED,
    MATH_ALLOWED,
    TENSOR_ATTRS,
    TENSOR_METHODS,
    TORCH_ALLOWED,
)
from ..sandbox.kernel_source import HEADERS
from .context import Reference
from .facts import trim_inductor

GUIDES = Path(__file__).parent / "guides"
LANGUAGE_FILES = {"c++": "cpp", "msl": "msl", "cuda": "cuda"}
LANGUAGE_NAMES = {"c++": "C++ (CPU)", "msl": "Metal Shading Language", "cuda": "CUDA C++"}
_MAX_SOURCE_CHARS = 16000
_MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Prompt:
    system: str
    user: str


@dataclass(frozen=True)
class Best:
    """The fastest accepted candidate of a module so far."""

    speedup: float
    kernel_us: float | None
    origin: str


def _guide_file(name: str) -> str:
    return (GUIDES / name).read_text()


def vecmath_functions() -> list[tuple[str, str]]:
    """(signature, description) of each public function of ma_vecmath.h, from its header comment."""
    text = (config.include_dir() / "ma_vecmath.h").read_text()
    signatures = dict(re.findall(r"static inline float (ma_\w+)\(([^)]*)\)", text))
    out = []
    for name, desc in re.findall(r"^\s*\*\s+(ma_\w+)\s+(.+?)\s*$", text, re.M):
        if name in signatures:
            out.append((f"float {name}({signatures[name]})", " ".join(desc.split())))
    return out


@functools.lru_cache(maxsize=None)
def language_guide(language: str) -> str:
    """The guide for one kernel language, with machine facts filled in."""
    if language not in LANGUAGE_FILES:
        raise ValueError(f"no prompt guide for kernel language {language!r}")
    guide = _guide_file(f"{LANGUAGE_FILES[language]}.md")
    listing = "\n".join(f"  - `{sig}`: {desc}" for sig, desc in vecmath_functions())
    return (guide.replace("<<VECMATH>>", listing).replace("<<NCPU>>", str(os.cpu_count() or 1))
            .replace("<<CXXFLAGS>>", " ".join(cpp_guide_flags())))


def cpp_guide_flags() -> list[str]:
    """The CPU backend's compiler flags as a kernel author needs them (no output or include options)."""
    return [f for f in compile_flags() if f not in ("-shared", "-fPIC") and not f.startswith("-I")]


def sandbox_rules(language: str) -> str:
    """The host-code whitelist and kernel-source rules, generated from the checkers themselves."""
    torch_fns = ", ".join(sorted(n.replace("torch.nn.functional.", "F.") for n in TORCH_ALLOWED))
    return "\n".join([
        "## Rules (checked before anything runs; a violation rejects the answer)",
        "Host code (`forward` and top-level helper functions) is a restricted subset of Python:",
        "- Globals: `torch`, `F` (torch.nn.functional), `math`, `lib` (your compiled kernels: `lib.<name>(...)` "
        "only) and the builtins " + ", ".join(f"`{b}`" for b in sorted(BUILTINS_ALLOWED)) + ".",
        f"- torch functions and dtypes: {torch_fns}.",
        "- math: " + ", ".join(sorted(m.split(".", 1)[1] for m in MATH_ALLOWED)) + ".",
        "- Tensor methods: " + ", ".join(sorted(TENSOR_METHODS)) + "; attributes: "
        + ", ".join(sorted(TENSOR_ATTRS)) + ".",
        "- `module` is a read-only view of the module: read its tensors and plain attributes "
        "(`module.weight`, `module.eps`, `module.proj.weight`, a numbered child of an nn.Sequential or "
        "nn.ModuleList as `module.layers[0].weight` or `module.layers[i].bias`); submodules cannot be called, "
        "methods neither.",
        "- Change in place (`x.add_(...)`, `out[...] = ...`, `out=`, `+=`) only tensors `forward` allocated "
        "itself, never an input, a weight or a view of them.",
        "- Allowed statements: assignment, if, for, return, assert, arithmetic, comparisons, subscripts, "
        "tuple/list literals and comprehensions; top-level constants and plain helper functions.",
        "- Forbidden: import, while, try, with, lambda, class, raise, del, global, f-strings, dict/set "
        "literals, the walrus, decorators, nested functions, calling a value stored in a variable, any "
        "name or attribute starting with `_`, exec/eval/compile/open/getattr/setattr/globals/vars/type/print.",
        f"Kernel source ({LANGUAGE_NAMES.get(language, language)}): computation only. Allowed #include headers: "
        + ", ".join(f"`{h}`" for h in sorted(HEADERS.get(language, ()))) + "; "
        + ("no inline assembly except L2 prefetches (`asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: "
           "\"l\"(ptr), \"r\"(bytes));` or `prefetch.global.L2 [%0];`)" if language == "cuda" else "no inline assembly")
        + ", no I/O, "
        "files, processes, network, environment, time or random calls, no `static` or global mutable state, no "
        "load-time constructors; only your kernels' own code runs (the compiled library is inspected: imports "
        "beyond math, memory and the OpenMP/runtime basics, system calls and timers reject it).",
    ])


def candidate_format(language: str) -> str:
    return "\n".join([
        "## Answer format",
        "Reply with exactly one fenced ```python block (a short explanation before it is fine) defining:",
        f'- `SOURCE = r"""..."""`: the kernel source in {LANGUAGE_NAMES.get(language, language)};',
        "- `def forward(module, <the module's forward arguments>)`: host code that allocates the outputs, "
        "launches the kernels through `lib` and returns exactly what the module's forward returns "
        "(same shapes, dtypes and values, within float tolerance).",
        "Your forward replaces the module's forward only for the input specs given in the task; other calls "
        "keep running eagerly. Write every output element; never modify inputs or parameters.",
    ])


@functools.lru_cache(maxsize=None)
def worked_example(language: str) -> str:
    module = _guide_file("example_module.txt")
    answer = _guide_file(f"example_{LANGUAGE_FILES[language]}.txt")
    return ("## Worked example\nModule:\n```python\n" + module.rstrip() + "\n```\n"
            "Call: forward(x) with x: float32[4,512,1024] (contiguous); returns float32[4,512,1024].\n"
            "Answer:\n```python\n" + answer.rstrip() + "\n```")


def system_prompt(language: str) -> str:
    """Everything that does not depend on the module: role, format, rules, guide, example."""
    return "\n\n".join([
        "You write fast, correct compute kernels that replace the forward of one PyTorch module for fixed "
        "input shapes. Each answer is compiled, checked against the eager module on fresh random inputs of "
        "several distributions and structured rows (output buffers hold arbitrary values, so every element must be "
        "written; writes outside a buffer and changed inputs or weights are rejected), and timed against "
        f"eager in interleaved pairs; it is used only if correct and at least {1 + DEFAULT_MARGIN:.2f}x faster "
        "including its launch overhead. You get the verdict back and may improve your answer.",
        candidate_format(language), sandbox_rules(language), language_guide(language), worked_example(language)])


def _forward_params(module: nn.Module) -> list[str]:
    try:
        params = list(inspect.signature(type(module).forward).parameters)[1:]
    except (TypeError, ValueError):
        return []
    return [p for p in params if p not in ("args", "kwargs")]


def _tensor_line(name: str, t: TensorSpec) -> str:
    layout = "contiguous" if t.contiguous else f"strides {list(t.stride)}"
    return f"{name}: {t.dtype}[{','.join(map(str, t.shape))}] ({layout}) on {t.device}"


def describe_call(request: SynthesisRequest) -> str:
    """forward's arguments with their specs, and what it returns."""
    names = _forward_params(request.module)
    lines = []
    for i, spec in enumerate(request.input_spec.args):
        name = names[i] if i < len(names) else f"arg{i}"
        lines.append(f"- {_tensor_line(name, spec)}" if isinstance(spec, TensorSpec) else f"- {name} = {spec.describe()}")
    for name, spec in request.input_spec.kwargs:
        lines.append(f"- {_tensor_line(name, spec)}" if isinstance(spec, TensorSpec) else f"- {name} = {spec.describe()}")
    outs = request.output_spec.tensors
    ret = (f"one tensor, {_tensor_line('out', outs[0]).split(': ', 1)[1]}" if request.output_spec.single else
           "a tuple: " + "; ".join(_tensor_line(f"out{i}", t) for i, t in enumerate(outs)))
    if request.output_spec.tree is not None:  # a container: the kernel returns its tensors, they are put back
        ret += f" (the module returns {request.output_spec.tree.describe()}: return its tensors in order, Nones left out)"
    call = ", ".join(names[: len(request.input_spec.args)] + [k for k, _ in request.input_spec.kwargs])
    return f"forward({call}) is called with:\n" + "\n".join(lines) + f"\nand returns {ret}."


def describe_module(module: nn.Module) -> str:
    """Source of the class (and of its custom submodules), attributes, parameters, buffers, children."""
    parts = []
    classes = [type(module)] + [type(m) for m in module.modules() if not type(m).__module__.startswith("torch.")]
    seen: list[type] = []
    for cls in classes:
        if cls in seen:
            continue
        seen.append(cls)
        try:
            src = class_source(cls)
        except UnsupportedCall:
            src = f"# source of {class_path(cls)} is not available"
        if len(src) > _MAX_SOURCE_CHARS:
            src = src[:_MAX_SOURCE_CHARS] + "\n# ...(cut)"
        parts.append(f"```python\n{src.rstrip()}\n```")
    cfg = {k: v for k, v in module_config(module).items() if k != "training"}
    parts.append("Plain attributes: " + (", ".join(f"{k}={v!r}" for k, v in cfg.items()) or "none"))
    tensors = [("parameter", n, p) for n, p in module.named_parameters()] + \
              [("buffer", n, b) for n, b in module.named_buffers()]
    if tensors:
        lines = [f"- module.{n}: {kind} {str(t.dtype).removeprefix('torch.')}[{','.join(map(str, t.shape))}]"
                 + ("" if t.is_contiguous() else " (not contiguous)") for kind, n, t in tensors[:64]]
        parts.append("Parameters and buffers:\n" + "\n".join(lines))
    children = [(n, m) for n, m in module.named_modules() if n]
    if children:
        parts.append("Submodules (read their tensors through `module.<name>`):\n"
                     + "\n".join(f"- {n}: {' '.join(repr(m).split())[:200]}" for n, m in children[:32]))
    return "\n\n".join(parts)


MAX_COMPILED_CODE = 12000  # characters of inductor output put in a prompt


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters cut)"


def task_prompt(request: SynthesisRequest, *, device: str, profile: str = "",
                references: Sequence[Reference] = (), device_facts: str = "", proof: str = "",
                eager_runs: int = 0) -> str:
    """The user message of the first round: one module call to replace."""
    lang = LANGUAGE_NAMES.get(request.language, request.language)
    sections = [
        f"# Task\nWrite a {lang} kernel and host code replacing the forward of `{request.module_class}` for the "
        "call below. Specialize for these exact shapes and dtypes if that helps.",
        "## Module\n" + describe_module(request.module),
        "## Call\n" + describe_call(request),
        f"## Device\n{device} (backend `{request.backend}`, kernel language {lang})."
        + (f"\n{device_facts}" if device_facts else ""),
    ]
    if proof:
        sections.append("## How your answer is checked\n" + proof)
    if request.eager_us:
        how = (" (the benchmark's median)" if request.eager_benchmarked else
               f" (median of {eager_runs} calls)" if eager_runs else "")
        sections.append(f"## Eager time\n{request.eager_us:.1f} µs per call{how}. To be used, your forward must take "
                        f"at most {request.eager_us / (1 + DEFAULT_MARGIN):.1f} µs including launch overhead.")
    if request.compile_us is not None:
        best = min(request.compile_us, request.eager_us) if request.eager_us else request.compile_us
        sections.append(f"## torch.compile\ntorch.compile (inductor) of this module takes {request.compile_us:.1f} µs "
                        f"per call. The goal is to be faster than both eager and torch.compile: at most "
                        f"{best / (1 + DEFAULT_MARGIN):.1f} µs.")
    if request.compiled_code:
        sections.append("## Code inductor generated for this call (its kernels and the function that calls them, "
                        "in order: a working starting point to beat)\n```\n"
                        + _clip(trim_inductor(request.compiled_code), MAX_COMPILED_CODE) + "\n```")
    if profile:
        sections.append("## Profile of the eager forward (top ops by self time)\n" + profile)
    if references:
        sections.append("## Reference kernels (proven correct and faster; adapt, do not copy blindly)\n"
                        + "\n\n".join(r.render() for r in references))
    sections.append("Reply with one ```python block defining SOURCE and forward.")
    return "\n\n".join(sections)


def build_prompt(request: SynthesisRequest, *, device: str, profile: str = "",
                 references: Sequence[Reference] = (), device_facts: str = "", proof: str = "",
                 eager_runs: int = 0) -> Prompt:
    return Prompt(system_prompt(request.language),
                  task_prompt(request, device=device, profile=profile, references=references,
                              device_facts=device_facts, proof=proof, eager_runs=eager_runs))


def feedback_malformed(error: object) -> str:
    return (f"Your answer had no ```python block defining SOURCE and forward ({error}). Reply with exactly one "
            '```python block that defines SOURCE = r"""...""" and def forward(module, ...).')


def feedback_truncated(limit: int, reasoning_tokens: int = 0) -> str:
    """The previous answer hit the output limit before its code block was complete."""
    spent = f" ({reasoning_tokens} of them on reasoning)" if reasoning_tokens else ""
    cap = f" of {limit} tokens{spent}" if limit else ""
    return (f"Your answer was cut off at the output limit{cap} before its code block was complete, so nothing "
            "could be evaluated. Reply again with a shorter answer: one complete ```python block defining SOURCE "
            "and forward, little prose before it, and less reasoning.")


def feedback_empty(kind: str) -> str:
    """The previous reply held no answer at all ('empty') or only a thinking section ('thinking-only')."""
    what = "held only a thinking section" if kind == "thinking-only" else "was empty"
    return (f"Your previous reply {what}: no code was received. Reply with one ```python block that defines "
            'SOURCE = r"""...""" and def forward(module, ...).')


def _best_line(best: Best | None, this_origin: str) -> str:
    if best is None:
        return "No candidate has been accepted yet."
    if best.origin == this_origin:
        return "This is the fastest accepted candidate so far."
    us = f", {best.kernel_us:.1f} µs" if best.kernel_us else ""
    return f"The fastest accepted candidate so far runs at {best.speedup:.2f}x eager{us}."


def feedback_speed(ev: Evaluation, best: Best | None, compile_us: float | None, rounds_left: int, *,
                   duplicate: bool = False, profile: str = "") -> str:
    """A correct kernel that is not yet the fastest: its measured standing, the profile of its kernel next to
    eager's where the device gives one (`synth/profile.py`), and a request for a faster one."""
    v = ev.verdict
    kernel = v.kernel_us or 0.0
    dup = "Your answer is identical to a candidate already evaluated. " if duplicate else ""
    eager = f"{v.eager_us:.1f} µs ({v.speedup or 0:.2f}x eager)." if v.eager_us is not None else "not measured."
    lines = [f"{dup}Accepted: correct. Yours: {kernel:.1f} µs per call; eager: {eager}"]
    if compile_us is not None and kernel:
        ratio = compile_us / kernel
        lines.append(f"torch.compile: {compile_us:.1f} µs per call: yours is "
                     + (f"{ratio:.2f}x faster." if ratio > 1 else f"{1 / ratio:.2f}x slower: it still loses to torch.compile."))
    if best is not None and best.origin != ev.candidate.origin and (v.speedup or 0) < best.speedup:
        us = f" ({best.kernel_us:.1f} µs)" if best.kernel_us else ""
        lines.append(f"Another candidate is faster: {best.speedup:.2f}x eager{us}.")
    if profile:
        lines.append(profile)
    lines.append(f"Make it faster (the fastest correct candidate is used; {rounds_left} more answer"
                 f"{'s' if rounds_left != 1 else ''} for speed): reply with one improved ```python block.")
    return "\n".join(lines)


def feedback_for(ev: Evaluation, best: Best | None, *, duplicate: bool = False) -> str:
    """What the model is told about its previous answer."""
    v = ev.verdict
    reason = v.reason if len(v.reason) <= _MAX_ERROR_CHARS else v.reason[:_MAX_ERROR_CHARS] + "\n...(cut)"
    dup = "Your answer is identical to a candidate already evaluated. " if duplicate else ""
    timing = ""
    if v.eager_us is not None and v.kernel_us is not None:
        timing = f" Eager: {v.eager_us:.1f} µs; yours: {v.kernel_us:.1f} µs ({v.speedup or 0:.2f}x)."
    if v.accepted:
        return (f"{dup}Accepted: correct and faster.{timing} {_best_line(best, ev.candidate.origin)} "
                "If you can make it faster still, reply with an improved block.")
    if reason.startswith("compile error"):
        head = f"The kernel did not compile:\n```\n{reason.removeprefix('compile error:').strip()}\n```\nFix it."
    elif reason.startswith(("sandbox", "source check", "malformed")):
        head = f"Your answer broke a rule: {reason}\nRewrite it within the rules."
    elif reason.startswith("incorrect"):
        head = (f"The kernel compiled but its results are wrong: {reason.removeprefix('incorrect:').strip()}\n"
                "Find the bug (indexing, reductions, edge values, unwritten outputs) and fix it.")
    elif reason.startswith(("not faster", "within noise")):
        head = f"Correct, but not fast enough: {reason}.{timing} Make it faster."
    else:
        head = f"Rejected: {reason}"
    return f"{dup}{head}\n{_best_line(best, ev.candidate.origin)} Reply with one corrected ```python block."
