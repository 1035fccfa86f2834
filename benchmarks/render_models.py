"""Markdown for the model zoo (benchmarks/models.py): `section()` the headline table, `details()` per run.

Both take the runs' JSON documents (docs/results/models/*.json), oldest first; a later run's row replaces an
earlier one for the same model, dtype and device. Ratios are eager's (or torch.compile's) median time over the
contender's: above 1 is faster. "self-noise" is eager timed against itself in the same run.
"""
from __future__ import annotations

from typing import Any

COMMANDS = """\
Run it (needs `pip install -e '.[bench]'`: transformers, torchvision, timm; nothing is downloaded, every model is
built from its config with random weights; each model runs in its own process with a fresh user cache):

- CPU: `python benchmarks/models.py --device cpu` (CPU sizes: a few narrow layers)
- CUDA: `python benchmarks/models.py --device cuda --dtype fp32,bf16,fp16 --out docs/results/models`
  (GPU sizes: 1B-class widths, 4-8 layers, batch 4 x 512 tokens / 32-64 images)
- Metal on a Mac: `python benchmarks/models.py --device mps --dtype fp32,fp16 --out docs/results/models`
  (bf16 needs macOS 14 or newer; GPU sizes)
- one model: `--models llama`; fewer rounds: `--rounds 6 --gen-rounds 2`
"""


def _device(result: dict) -> str:
    """A short name for where a run was made: the GPU's name, 'MPS', or the CPU with its core count."""
    machine = str(result.get("machine", ""))
    dev = str(result.get("device", "cpu"))
    if dev.startswith("cuda"):
        return machine.split(";")[0].replace("NVIDIA ", "").strip() or "CUDA"
    if dev.startswith("mps"):
        return "MPS"
    parts = [p.strip() for p in machine.split(",")]
    cores = next((p for p in parts if p.endswith("cores")), "")
    return "CPU" + (f" ({cores})" if cores else "")


def _x(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "–"


def _latest_rows(results: list[dict]) -> list[tuple[dict, dict]]:
    rows: dict[tuple, tuple[dict, dict]] = {}
    for res in results:
        for row in res.get("rows", []):
            rows[(row.get("model"), row.get("dtype"), _device(res))] = (res, row)
    return list(rows.values())


def _failed(row: dict, what: str) -> bool:
    return what in row.get("errors", {})


def _tokens(row: dict) -> str:
    ident = row.get("generate", {}).get("tokens_identical")
    if row.get("kind") != "lm":
        return "–"
    if not ident:
        return "not run"
    differ = [k for k, v in ident.items() if not v]
    return "yes" if not differ else "no: " + ", ".join(differ)


def _outputs_flag(row: dict, contender: str) -> str:
    out = row.get("outputs", {}).get(contender)
    return "" if out is None or out.get("ok") else " (outputs differ)"


def _library(row: dict) -> str:
    """The shipped library's kernels optimize() installed, by family (runs since issue 29 record them)."""
    used = (row.get("optimize") or {}).get("library_kernels") or {}
    return " (library: " + ", ".join(f"{k.split(':', 1)[-1]} x{n}" for k, n in sorted(used.items())) + ")" if used else ""


def _patched(row: dict) -> str:
    """Where the import hook patched no class the model uses, import-alone runs eager's code: a noise gauge."""
    return " (nothing patched)" if row.get("import_patched_classes") == [] and "import" in row.get(
        "forward", {}).get("speedup_vs_eager", {}) else ""


def section(results: list[dict]) -> str:
    """One table: each model and dtype on each device, the newest run's figures."""
    head = ["model", "dtype", "device", "optimize() vs eager", "vs torch.compile", "import alone vs eager",
            "decode tok/s vs eager", "optimize() s", "tokens identical", "self-noise"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res, row in _latest_rows(results):
        fwd = row.get("forward", {})
        sp = fwd.get("speedup_vs_eager", {})
        if "run" in row.get("errors", {}):
            why = str(row["errors"]["run"])
            opt = why.splitlines()[0] + " (the run's per-model limit)" if why.startswith("timed out") else "run failed"
        elif _failed(row, "optimize"):
            opt = "optimize() failed"
        else:
            opt = _x(sp.get("optimize")) + _outputs_flag(row, "optimize") + _library(row)
        gen = row.get("generate", {})
        dec = gen.get("decode_vs_eager", {}).get("optimize") if gen else None
        dec_s = "–" if row.get("kind") != "lm" else _x(dec)
        if dec is not None and gen.get("decode_tok_s", {}).get("eager"):
            dec_s += f" ({gen['decode_tok_s']['eager']:.0f} tok/s eager"
            dec_s += f", noise {gen['self_noise'] * 100:.0f}%)" if gen.get("self_noise") is not None else ")"
        secs = row.get("optimize_s")
        secs_s = "–" if secs is None else f"{secs:.0f}"
        if row.get("optimize_warm_s") is not None:
            first = row.get("warm_first_call_s")
            secs_s += f" (warm {row['optimize_warm_s']:.1f}" + (f" + first call {first:.1f})" if first is not None
                                                                  else ")")
        noise = fwd.get("self_noise")
        cells = [row.get("model", "?"), row.get("dtype", "?"), _device(res), opt, _x(fwd.get("optimize_vs_compile")),
                 _x(sp.get("import")) + _outputs_flag(row, "import") + _patched(row), dec_s, secs_s, _tokens(row),
                 "–" if noise is None else f"{noise * 100:.1f}%"]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    notes = ("Forward latency of the whole model as it runs (blocks of back-to-back calls, one synchronization "
             "each, contenders in balanced order, median over rounds); decode tokens/s from greedy generate() "
             "(32 new tokens after a 32-token prompt; decode time per round compared within the round; noise: eager "
             "against itself). optimize() s: cold, with a fresh user cache (warm: again on the cache it filled, in "
             "a new process where the run records it, with the first forward after it, where a whole-model "
             "compile it installed compiles). self-noise: eager timed against itself in the same run; ratios within it "
             "are a tie. Per model: [Model zoo, per model](#model-zoo-per-model).")
    return "\n".join(lines) + "\n\n" + notes + "\n"


def _ms(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "–"


def _first_line(text: str, n: int = 240) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line[:n] + ("..." if len(line) > n else "")


def _round_ratio_iqr(samples: dict) -> tuple[float, float] | None:
    """The interquartile range of eager / eager_again, round by round: how far one round's comparison strays."""
    import statistics
    ratios = [a / b for a, b in zip(samples.get("eager", []), samples.get("eager_again", [])) if b]
    if len(ratios) < 4:
        return None
    q = statistics.quantiles(ratios, n=4)
    return q[0], q[2]


def _run_details(runs: list[dict], rows: list[dict]) -> list[str]:
    """One device: the runs its rows come from, then the rows' times, generate() figures and failures."""
    out = []
    for res in runs:
        v = res.get("versions", {})
        out += [f"- command: `{res.get('command', '?')}`",
                f"  - machine: {res.get('machine', '?')}; date: {str(res.get('date', '?'))[:16].replace('T', ' ')}",
                "  - versions: " + ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "torchvision", "timm")
                                             if v.get(k)) + (f"; metal_accel {v['metal_accel_commit']}"
                                                              if v.get("metal_accel_commit") else "")]
    out.append("")
    head = ["model", "dtype", "class", "params (M)", "input", "eager ms", "compile ms", "optimize ms", "import ms",
            "self-noise (IQR of round ratios)", "compile 1st call s", "optimize(): modules replaced"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        fwd = row.get("forward", {})
        med = fwd.get("median_ms", {})
        rng = _round_ratio_iqr(fwd.get("samples_ms", {}))
        noise = fwd.get("self_noise")
        noise_s = "–" if noise is None else f"{noise * 100:.1f}%" + (
            f" ({rng[0]:.2f}-{rng[1]:.2f})" if rng else "")
        rep = row.get("optimize", {})
        st = rep.get("status", {})
        repl = (f"{rep.get('module_calls', 0) - st.get('eager', 0)} of {rep.get('module_calls', 0)}"
                + (" (" + ", ".join(f"{n} {k}" for k, n in sorted(st.items()) if k != "eager") + ")"
                   if len(st) > 1 else "")) if rep else "–"  # "covered": calls inside a replaced module
        cfg = row.get("config", {})
        cells = [row.get("model"), row.get("dtype"), row.get("model_class", "–"), row.get("params_m", "–"),
                 "x".join(map(str, cfg.get("input", []))) or "–", _ms(med.get("eager")), _ms(med.get("compile")),
                 _ms(med.get("optimize")), _ms(med.get("import")), noise_s,
                 _ms(row.get("compile_first_call_s")), repl]
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    lms = [r for r in rows if r.get("generate")]
    if lms:
        out += ["", "generate() (greedy, tokens/s: prefill / decode; identical: tokens equal eager's):", ""]
        names = ["eager", "compile", "optimize", "import"]
        head = ["model", "dtype"] + [f"{n} prefill / decode" for n in names] + ["decode self-noise", "identical"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in lms:
            g = row["generate"]
            pre, dec = g.get("prefill_tok_s", {}), g.get("decode_tok_s", {})
            cells = [row["model"], row["dtype"]]
            cells += [f"{pre[n]:.0f} / {dec[n]:.1f}" if n in pre and n in dec else "–" for n in names]
            cells += ["–" if g.get("self_noise") is None else f"{g['self_noise'] * 100:.1f}%", _tokens(row)]
            out.append("| " + " | ".join(cells) + " |")
    why = []
    for row in rows:
        reasons = row.get("optimize", {}).get("eager_reasons", [])
        if reasons:
            why.append(f"- {row['model']} {row['dtype']}: " + "; ".join(f"{n}x {_first_line(r, 120)}"
                                                                      for r, n in reasons[:4]))
    if why:
        out += ["", "Why modules stayed eager (most common reasons, calls):", "", *why]
    errs = [f"- {row['model']} {row['dtype']}, {what}: {_first_line(text)}"
            for row in rows for what, text in row.get("errors", {}).items()]
    bad = [f"- {row['model']} {row['dtype']}, {k}: relative error {o['rel_err']:.2e} (max abs {o['max_abs']:.2e})"
           for row in rows for k, o in row.get("outputs", {}).items() if not o.get("ok")]
    if errs:
        out += ["", "Failures (full text in the run's JSON):", "", *errs]
    if bad:
        out += ["", "Outputs outside tolerance against eager:", "", *bad]
    notes = [f"- {row['model']}: {n}" for row in rows for n in row.get("notes", [])]
    if notes:
        out += ["", *notes]
    return out


def details(results: list[dict]) -> str:
    """How the zoo is run and measured, then per device the newest row of each model and dtype: times,
    generate(), why modules stayed eager, failures."""
    by_device: dict[str, list[tuple[dict, dict]]] = {}
    for res, row in _latest_rows(results):
        by_device.setdefault(_device(res), []).append((res, row))
    out = [COMMANDS,
           "Contenders on copies of one model with the same random weights: eager (metal_accel's import hook off), "
           "whole-model `torch.compile` (inductor, default mode, on the model's forward, so generate() uses it "
           "too), `optimize()` with the library's defaults (shipped cache and torch.compile candidates, no LLM), "
           "and `import metal_accel` alone (its hook's patched classes, on for that contender's calls only). "
           "Outputs are compared with eager's by relative error norm (fp32 1e-4, fp16 1e-2, bf16 3e-2).", ""]
    for dev, pairs in by_device.items():
        runs = list({id(res): res for res, _ in pairs}.values())
        out += [f"#### {dev}", "", *_run_details(runs, [row for _, row in pairs]), ""]
    return "\n".join(out).rstrip() + "\n"
