"""Model zoo: real architectures built from their configs with random weights, run as users run them.

    python benchmarks/models.py --device cpu                       # every zoo model, fp32, CPU sizes
    python benchmarks/models.py --device cuda --dtype fp32,bf16,fp16 --out docs/results/models
    python benchmarks/models.py --device mps --dtype fp32,fp16
    python benchmarks/models.py --device cpu --models llama,resnet50 --rounds 6

Needs the `bench` extra (transformers, torchvision, timm); nothing is downloaded (HF_HUB_OFFLINE=1):
every model is constructed from a config object. Each model runs in its own subprocess with a fresh
user cache, so optimize() starts cold (shipped cache and torch.compile candidates, no LLM: the
library's defaults) and one model's failure or time-out is recorded without stopping the others.

Per model and dtype, four contenders on copies of one model with the same weights:
- eager: the model with metal_accel's import hook off (also timed a second time, as `eager_again`,
  whose ratio to `eager` is the self-noise of the measurement);
- compile: the whole model's forward under torch.compile (inductor, default mode);
- optimize: metal_accel.optimize(model, example_inputs), cold, with its wall time (and a second,
  warm optimize() of another copy on the cache the first one filled);
- import: `import metal_accel` alone (the hook's patched classes, on for this contender's calls only).
Forward latency: blocks of back-to-back calls with one device synchronization at the end, contenders
in a balanced order so each follows each other equally often (metal_accel/proof/rotation.py: whole
rounds of N * (N - 1) blocks, at least --rounds of each contender); medians.
Decoder LMs also run generate() (greedy, fixed prompt, N new tokens, EOS off): prefill tokens/s from
a 1-token generate(), decode tokens/s from the rest, and the tokens compared with eager's.
Writes DIR/<device>-<date>-<time>.json: command, machine, date, versions, settings and one row per
model and dtype (benchmarks/render_models.py turns them into the table of docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from metal_accel.proof.rotation import Contender

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "docs" / "results" / "models"
LMS = ("llama", "llama8", "qwen2", "mistral", "gpt2")
ZOO = ("llama", "qwen2", "mistral", "gpt2", "bert", "t5_encoder", "vit", "resnet50", "mobilenet_v3")
EXTRA = ("llama8",)   # on request only: Llama with twice the layers (optimize()'s time on a deeper model)
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# relative error norm ||out - eager|| / ||eager|| accepted per dtype (compiled and fused code reorders sums)
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}
CONTENDERS = ("eager", "eager_again", "compile", "optimize", "import")


# ---------------------------------------------------------------- the zoo

@dataclass
class Built:
    model: Any
    args: tuple
    kwargs: dict
    kind: str                   # "lm" (generate() too), "encoder", "vision"
    config: dict                # what a reader needs: widths, layers, input shape
    notes: list[str] = field(default_factory=list)


def _lm_input(vocab: int, batch: int, seq: int, device: str) -> Any:
    import torch
    gen = torch.Generator().manual_seed(1)
    return torch.randint(3, vocab, (batch, seq), generator=gen).to(device)


def _sizes(gpu: bool, cpu: dict, big: dict) -> dict:
    return big if gpu else cpu


def build(name: str, device: str, gpu: bool) -> Built:
    """Model NAME at the size a user would run on this kind of device, random weights, eval mode."""
    import torch
    import transformers as tf
    torch.manual_seed(0)
    batch, seq = (4, 512) if gpu else (1, 128)
    with torch.device(device):
        if name in ("llama", "llama8"):  # GPU: Llama 3.2 1B's widths, 4 (llama8: 8) of its 16 layers
            deep = 2 if name == "llama8" else 1
            s = _sizes(gpu, dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2 * deep,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=32000),
                       dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4 * deep, num_attention_heads=32,
                            num_key_value_heads=8, vocab_size=128256))
            model = tf.LlamaForCausalLM(tf.LlamaConfig(**s))
        elif name == "qwen2":  # GPU: Qwen2.5 1.5B's widths, 4 of its 28 layers
            s = _sizes(gpu, dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=32000),
                       dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=4, num_attention_heads=12,
                            num_key_value_heads=2, vocab_size=151936))
            model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**s))
        elif name == "mistral":  # GPU: Mistral 7B's head layout at 2048 wide, 4 layers
            s = _sizes(gpu, dict(hidden_size=256, intermediate_size=896, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=1, vocab_size=32000),
                       dict(hidden_size=2048, intermediate_size=7168, num_hidden_layers=4, num_attention_heads=16,
                            num_key_value_heads=4, vocab_size=32000))
            model = tf.MistralForCausalLM(tf.MistralConfig(**s))
        elif name == "gpt2":  # GPU: GPT-2 XL's head size at 2048 wide, 4 layers
            s = _sizes(gpu, dict(n_embd=256, n_layer=2, n_head=4), dict(n_embd=2048, n_layer=4, n_head=16))
            model = tf.GPT2LMHeadModel(tf.GPT2Config(**s))
            s["vocab_size"] = model.config.vocab_size
        elif name == "bert":  # GPU: BERT-large, 8 of its 24 layers
            s = _sizes(gpu, dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024),
                       dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, intermediate_size=4096))
            model = tf.BertModel(tf.BertConfig(**s))
            s["vocab_size"] = model.config.vocab_size
        elif name == "t5_encoder":  # GPU: Flan-T5-XL's encoder widths, 4 of its 24 layers
            s = _sizes(gpu, dict(d_model=256, d_ff=640, d_kv=64, num_layers=2, num_heads=4,
                                 feed_forward_proj="gated-gelu"),
                       dict(d_model=2048, d_ff=5120, d_kv=64, num_layers=4, num_heads=32,
                            feed_forward_proj="gated-gelu"))
            model = tf.T5EncoderModel(tf.T5Config(**s))
            s["vocab_size"] = model.config.vocab_size
        elif name == "vit":  # CPU: ViT-Tiny widths; GPU: ViT-Large widths, 8 of its 24 layers
            s = _sizes(gpu, dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768),
                       dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, intermediate_size=4096))
            model = tf.ViTForImageClassification(tf.ViTConfig(image_size=224, patch_size=16, num_labels=1000, **s))
            return _vision(model, name, s, 32 if gpu else 1, device)
        elif name in ("resnet50", "mobilenet_v3"):
            return _torchvision(name, 64 if gpu else 1, device)
        else:
            raise SystemExit(f"unknown model {name!r}; the zoo: {', '.join(ZOO)}")
    ids = _lm_input(s["vocab_size"], batch, seq, device)
    kind = "lm" if name in LMS else "encoder"
    return Built(model.eval(), (ids,), {}, kind, {**s, "input": [batch, seq]})


def _vision(model: Any, name: str, cfg: dict, batch: int, device: str, notes: list[str] | None = None) -> Built:
    import torch
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 224, 224, generator=gen, device="cpu").to(device)
    return Built(model.eval(), (x,), {}, "vision", {**cfg, "input": [batch, 3, 224, 224]}, notes or [])


def _torchvision(name: str, batch: int, device: str) -> Built:
    """torchvision's ResNet-50 / MobileNetV3-Large; transformers' own ResNet-50 / MobileNetV2 where
    torchvision does not import beside this torch."""
    import torch
    try:
        import torchvision.models as tvm
        with torch.device(device):
            model = tvm.resnet50(weights=None) if name == "resnet50" else tvm.mobilenet_v3_large(weights=None)
        return _vision(model, name, {"impl": f"torchvision {tvm.__name__}"}, batch, device)
    except ImportError as exc:
        import transformers as tf
        with torch.device(device):
            if name == "resnet50":
                model = tf.ResNetForImageClassification(tf.ResNetConfig())  # its defaults are ResNet-50
            else:
                model = tf.MobileNetV2ForImageClassification(tf.MobileNetV2Config())
        note = f"torchvision unavailable ({exc}): transformers' {type(model).__name__} instead"
        return _vision(model, name, {"impl": type(model).__name__}, batch, device, [note])


# ---------------------------------------------------------------- timing

def sync_fn(device: str) -> Callable[[], None]:
    import torch
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    if device.startswith("mps"):
        return torch.mps.synchronize
    return lambda: None


def main_tensor(out: Any) -> Any:
    import torch
    if isinstance(out, torch.Tensor):
        return out
    for attr in ("logits", "last_hidden_state"):
        if getattr(out, attr, None) is not None:
            return getattr(out, attr)
    if isinstance(out, (tuple, list)):
        return next(o for o in out if isinstance(o, torch.Tensor))
    raise TypeError(f"no output tensor in {type(out).__name__}")


def output_tolerance(model: Any, args: tuple, kwargs: dict, ref: Any, dtype_name: str, row: dict) -> float:
    """The relative error norm an output may differ from eager's by. float32: 1e-4, or twice eager's own error
    against the model run in float64 where that is more: on a GPU eager itself runs cuDNN convolutions in TF32
    (PyTorch's default, torch.backends.cudnn.allow_tf32), so a conv net's fp32 outputs differ from float64 by
    about 2e-4 whoever computes them, and 1e-4 from eager's would flag every correct alternative."""
    import copy

    import torch
    base = TOLERANCE[dtype_name]
    if dtype_name != "fp32":
        return base
    try:
        exact = copy.deepcopy(model).double()
        cast = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        ref64 = exact(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
        del exact
        own = compare(ref, ref64)["rel_err"]
    except Exception as exc:  # no float64 run of this model: the fixed tolerance
        row["notes"].append(f"no float64 reference: {_err(exc)}")
        return base
    row["eager_vs_float64"] = own
    row["tolerance_rel_err"] = max(base, 2 * own)
    return row["tolerance_rel_err"]


def compare(out: Any, ref: Any) -> dict:
    import torch
    a, b = main_tensor(out).double(), main_tensor(ref).double()
    finite = bool(torch.isfinite(a).all())
    rel = float((a - b).norm() / b.norm().clamp_min(1e-30)) if finite else float("inf")
    return {"rel_err": rel, "max_abs": float((a - b).abs().max()) if finite else float("inf"), "finite": finite}


# ---------------------------------------------------------------- one model, in its own process

def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def _report_summary(model: Any) -> dict:
    import collections

    import metal_accel
    from metal_accel.report import COVERED
    rep = metal_accel.explain(model)
    status = collections.Counter("covered" if m.reason == COVERED else m.status for m in rep.modules)
    reasons = collections.Counter(m.reason[:200] for m in rep.modules if m.status == "eager" and m.reason != COVERED)
    replaced = [f"{m.name} ({m.module_class.rsplit('.', 1)[-1]}): {m.status}"
                + (f" {m.speedup:.2f}x" if m.speedup else "") for m in rep.modules if m.status != "eager"]
    library = collections.Counter(m.source.split(" ", 1)[0] for m in rep.modules
                                  if m.status != "eager" and "library:" in (m.source or ""))
    return {"module_calls": len(rep.modules), "status": dict(status), "replaced": replaced[:40],
            "library_kernels": dict(library),  # shipped library kernels installed, by family (issue 29)
            "eager_reasons": [[r, n] for r, n in reasons.most_common(8)], "notes": list(rep.notes)[:10],
            "backend": rep.backend, "end_to_end": rep.end_to_end,
            # where optimize()'s time went (issue 27 item 5): stages, and the module decisions by kind of proof
            "stage_s": {k: round(v, 2) for k, v in rep.stage_s.items()},
            "module_s": {k: round(v, 2) for k, v in rep.module_s.items()},
            "slowest_modules": [[m.name, m.status, round(m.elapsed_s, 2)]
                                for m in sorted(rep.modules, key=lambda m: -m.elapsed_s)[:8]]}


def _generate_ids(model: Any, prompt: Any, new: int) -> Any:
    return model.generate(prompt, max_new_tokens=new, do_sample=False, pad_token_id=0)


def run_child(name: str, device: str, dtype_name: str, rounds: int, gen_rounds: int, new_tokens: int,
              block_s: float) -> dict:
    """Everything measured for one model and dtype (errors recorded, not raised)."""
    import metal_accel  # first, as a user would: its import hook sees transformers' and torchvision's imports
    from metal_accel.auto import hook
    from metal_accel.proof.rotation import Contender, time_blocks
    _log_progress()
    import torch
    import transformers  # noqa: F401  (imported under the hook)
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pass

    hook_was_active = hook.is_active()
    hook.deactivate()  # eager, compile and optimize() run with it off; `import` turns it on for its calls
    gpu = device.startswith(("cuda", "mps"))
    dtype = getattr(torch, DTYPES[dtype_name])
    sync = sync_fn(device)
    row: dict[str, Any] = {"model": name, "device": device, "dtype": dtype_name, "errors": {}}
    b = build(name, device, gpu)
    model = b.model.to(dtype)
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in b.args)
    row.update(kind=b.kind, config=b.config, notes=list(b.notes), model_class=type(model).__name__,
               params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 2))

    def fwd(m: Any) -> Callable[[], Any]:
        return lambda: m(*args, **b.kwargs)

    models = {"eager": model, "compile": copy.deepcopy(model), "optimize": copy.deepcopy(model),
              "import": copy.deepcopy(model)}
    models["compile"].forward = torch.compile(models["compile"].forward)

    # optimize(), cold (fresh user cache); the warm run is another process on the cache this one fills (run_warm)
    t0 = time.perf_counter()
    try:
        metal_accel.optimize(models["optimize"], args, b.kwargs or None, workload=workload_of(b, args))
        row["optimize_s"] = time.perf_counter() - t0
        row["optimize"] = _report_summary(models["optimize"])
    except Exception as exc:
        row["optimize_s"] = time.perf_counter() - t0
        row["errors"]["optimize"] = _err(exc) + "\n" + traceback.format_exc()[-3000:]
        metal_accel.restore(models["optimize"])
        models.pop("optimize")

    def hook_on() -> None:
        hook.activate()

    contenders = [Contender("eager", fwd(model)), Contender("eager_again", fwd(model))]
    with torch.inference_mode():
        ref = model(*args, **b.kwargs)
        tolerance = output_tolerance(model, args, b.kwargs, ref, dtype_name, row)
        sync()
        t0 = time.perf_counter()
        try:
            out = models["compile"](*args, **b.kwargs)
            sync()
            row["compile_first_call_s"] = time.perf_counter() - t0
            row.setdefault("outputs", {})["compile"] = compare(out, ref)
            contenders.append(Contender("compile", fwd(models["compile"])))
        except Exception as exc:
            row["errors"]["compile"] = _err(exc)
            models.pop("compile")
        for key in ("optimize", "import"):
            if key not in models:
                continue
            on, off = (hook_on, hook.deactivate) if key == "import" else (lambda: None, lambda: None)
            on()
            try:
                out = models[key](*args, **b.kwargs)
                row.setdefault("outputs", {})[key] = compare(out, ref)
                if key == "import":
                    used = {type(m) for m in models[key].modules()}  # patched classes this model uses
                    row["import_patched_classes"] = sorted(f"{c.__module__}.{c.__qualname__}"
                                                           for c in hook.patched_classes() if c in used)
                contenders.append(Contender(key, fwd(models[key]), on, off))
            except Exception as exc:
                row["errors"][key] = _err(exc)
                models.pop(key)
            finally:
                off()
        row["import_hook_active_at_import"] = hook_was_active
        for name_out, cmp in row.get("outputs", {}).items():
            cmp["ok"] = cmp["finite"] and cmp["rel_err"] <= tolerance
        # warm-up and calibration: every contender a few calls, then blocks of about block_s seconds
        for c in contenders:
            c.enter()
            try:
                for _ in range(2):
                    c.call()
                sync()
            finally:
                c.leave()
        one = min(time_blocks(contenders[:1], 1, 3, sync)["eager"])
        per_block = max(1, min(200, round(block_s / max(one, 1e-6))))
        samples = time_blocks(contenders, per_block, rounds, sync)
    row["forward"] = _forward_summary(samples, per_block)
    if b.kind == "lm":
        row["generate"] = _generate(models, contenders, args[0], new_tokens, gen_rounds, sync, row)
    return row


WORKLOAD_TOKENS = 8


def _log_progress() -> None:
    """metal_accel's progress lines (one per decided call, stage times) into the child's log."""
    import logging
    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.WARNING)
    logging.getLogger("metal_accel").setLevel(logging.INFO)


def workload_of(b: Built, args: tuple) -> Callable[[Any], Any] | None:
    """What optimize() is told the application runs (docs/usage.md): for an LM, a short generate() from the
    prompt the benchmark uses, so its decode steps are captured and timed end to end; else None."""
    if b.kind != "lm":
        return None
    prompt = args[0][:1, :32]

    def generate(m: Any) -> Any:
        return m.generate(prompt, max_new_tokens=WORKLOAD_TOKENS, min_new_tokens=WORKLOAD_TOKENS, do_sample=False,
                          pad_token_id=0)
    return generate


def run_warm(name: str, device: str, dtype_name: str) -> dict:
    """optimize() in a new process on the user cache the cold run filled, as a user's next start would run it:
    its wall time, the first forward after it (where a whole-model compile it installs compiles), and that
    forward's output against eager's."""
    import metal_accel
    from metal_accel.auto import hook
    import torch
    _log_progress()
    hook.deactivate()
    dtype = getattr(torch, DTYPES[dtype_name])
    b = build(name, device, device.startswith(("cuda", "mps")))
    model = b.model.to(dtype)
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in b.args)
    sync = sync_fn(device)
    with torch.inference_mode():
        ref = model(*args, **b.kwargs)
        tolerance = output_tolerance(model, args, b.kwargs, ref, dtype_name, {"notes": []})
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    metal_accel.optimize(model, args, b.kwargs or None, workload=workload_of(b, args))
    out["optimize_warm_s"] = time.perf_counter() - t0
    warm_rep = metal_accel.explain(model)
    out["warm_stage_s"] = {k: round(v, 2) for k, v in warm_rep.stage_s.items()}
    out["warm_module_s"] = {k: round(v, 2) for k, v in warm_rep.module_s.items()}
    e2e = warm_rep.end_to_end or {}
    out["warm_end_to_end"] = {k: e2e.get(k) for k in ("cached", "outcome", "dropped")}
    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        got = model(*args, **b.kwargs)
        sync()
        out["warm_first_call_s"] = time.perf_counter() - t0
        cmp = compare(got, ref)
        cmp["ok"] = cmp["finite"] and cmp["rel_err"] <= tolerance
        out["warm_output"] = cmp
    return out


def _forward_summary(samples: dict[str, list[float]], per_block: int) -> dict:
    med = {k: statistics.median(v) for k, v in samples.items()}
    eager = med["eager"]
    self_ratios = [a / b for a, b in zip(samples["eager"], samples["eager_again"])]
    out = {"calls_per_block": per_block, "rounds": len(samples["eager"]),
           "median_ms": {k: v * 1e3 for k, v in med.items()},
           "samples_ms": {k: [round(x * 1e3, 4) for x in v] for k, v in samples.items()},
           # eager timed against itself: how far apart two identical contenders land in this run
           "self_noise": abs(1 - med["eager_again"] / eager),
           "self_ratio_range": [min(self_ratios), max(self_ratios)]}
    out["speedup_vs_eager"] = {k: eager / v for k, v in med.items() if k not in ("eager", "eager_again")}
    if "compile" in med and "optimize" in med:
        out["optimize_vs_compile"] = med["compile"] / med["optimize"]
    return out


def _generate(models: dict, contenders: list[Contender], ids: Any, new: int, rounds: int,
              sync: Callable[[], None], row: dict) -> dict:
    """Prefill and decode tokens/s of each contender's generate(), and whether its tokens match eager's."""
    import torch

    from metal_accel.proof.rotation import balanced_calls
    prompt = ids[:1, :32]
    res: dict[str, Any] = {"prompt_tokens": int(prompt.shape[1]), "new_tokens": new, "rounds": rounds}
    gens = list(contenders)  # eager_again: generate()'s self-noise too
    models = {**models, "eager_again": models["eager"]}
    for m in models.values():
        m.generation_config.eos_token_id = None  # always NEW tokens: random weights may emit EOS anywhere
    tokens: dict[str, Any] = {}
    first: dict[str, float] = {}
    with torch.inference_mode():
        for c in list(gens):
            c.enter()
            try:
                t0 = time.perf_counter()
                tokens[c.name] = _generate_ids(models[c.name], prompt, new)
                sync()
                first[c.name] = time.perf_counter() - t0  # includes torch.compile's compiles for `compile`
            except Exception as exc:
                row["errors"][f"generate_{c.name}"] = _err(exc)
                gens.remove(c)
            finally:
                c.leave()
        prefill: dict[str, list[float]] = {c.name: [] for c in gens}
        full: dict[str, list[float]] = {c.name: [] for c in gens}
        for c in balanced_calls(gens, rounds):
            c.enter()
            try:
                for n, store in ((1, prefill), (new, full)):
                    sync()
                    t0 = time.perf_counter()
                    _generate_ids(models[c.name], prompt, n)
                    sync()
                    store[c.name].append(time.perf_counter() - t0)
            finally:
                c.leave()
    ptoks = prompt.numel()
    res["first_call_s"] = first
    res["samples_s"] = {"prefill": prefill, "full": full}
    res["prefill_tok_s"] = {k: ptoks / statistics.median(v) for k, v in prefill.items()}
    res["decode_tok_s"] = {k: (new - 1) / max(statistics.median(full[k]) - statistics.median(prefill[k]), 1e-9)
                           for k in full}
    res["tokens_identical"] = {k: bool(torch.equal(v, tokens["eager"])) for k, v in tokens.items()
                               if k not in ("eager", "eager_again")}
    # decode time per round (its generate() minus its 1-token generate()), compared within each round
    decode = {k: [f - p for f, p in zip(full[k], prefill[k])] for k in full}
    if "eager" in decode:
        res["decode_vs_eager"] = {k: statistics.median(e / d for e, d in zip(decode["eager"], v) if d > 0)
                                  for k, v in decode.items() if k not in ("eager", "eager_again")}
        if "eager_again" in decode:
            ratios = [e / d for e, d in zip(decode["eager"], decode["eager_again"]) if d > 0]
            res["self_noise"] = abs(1 - statistics.median(ratios))
            res["self_ratio_range"] = [min(ratios), max(ratios)]
    return res


# ---------------------------------------------------------------- the driver

def machine(device: str) -> str:
    import torch
    try:
        sys.path.insert(0, str(HERE))
        from results import machine as cpu_machine  # the words every CPU run uses
        text = cpu_machine()
    except Exception:
        text = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}, " \
               f"Python {platform.python_version()}, torch {torch.__version__}"
    if device.startswith("cuda") and torch.cuda.is_available():
        text = f"{torch.cuda.get_device_name()}; {text}"
    elif device.startswith("mps"):
        text = f"Apple GPU (MPS); {text}"
    return text


def versions() -> dict:
    import importlib.metadata as md
    out = {}
    for pkg in ("torch", "transformers", "torchvision", "timm", "metal-accel"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    out["metal_accel_commit"] = _commit()
    return out


def _commit() -> str | None:
    """The metal_accel commit measured: a checkout's HEAD (+ "-dirty" where its package has local edits), or
    the COMMIT file beside an exported tree (`git archive` into a folder put first on PYTHONPATH)."""
    import importlib.util
    spec = importlib.util.find_spec("metal_accel")
    src = Path(spec.origin).parent.parent if spec and spec.origin else ROOT
    if (src / "COMMIT").exists():
        return (src / "COMMIT").read_text().strip()
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, text=True,
                              capture_output=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "metal_accel"], cwd=src, text=True,
                               capture_output=True).stdout.strip()
    except OSError:
        return None
    return (head + ("-dirty" if dirty else "")) or None


def check_device(device: str, dtypes: list[str]) -> None:
    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    if device.startswith("mps") and not torch.backends.mps.is_available():
        raise SystemExit("--device mps: torch sees no MPS device")
    if device.startswith("mps") and "bf16" in dtypes and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise SystemExit("bf16 on MPS needs macOS 14 or newer")


def run_one(name: str, dtype: str, a: argparse.Namespace, log_dir: Path) -> dict:
    """One model and dtype in a subprocess with a fresh user cache; a crash or time-out becomes the row."""
    with tempfile.TemporaryDirectory(prefix="ma_zoo_") as tmp:
        out = Path(tmp) / "row.json"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
               "METAL_ACCEL_USER_CACHE": str(Path(tmp) / "user_cache"), "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--device", a.device, "--dtype", dtype,
               "--rounds", str(a.rounds), "--gen-rounds", str(a.gen_rounds), "--new-tokens", str(a.new_tokens),
               "--block-s", str(a.block_s), "--row-out", str(out)]
        log = log_dir / f"{name}-{dtype}.log"
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            try:
                rc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=a.model_timeout).returncode
            except subprocess.TimeoutExpired:
                rc = None
        wall = time.perf_counter() - t0
        if out.exists():
            row = json.loads(out.read_text())
        else:
            tail = log.read_text(errors="replace")[-3000:]
            why = f"timed out after {a.model_timeout} s" if rc is None else f"exit code {rc}"
            row = {"model": name, "device": a.device, "dtype": dtype, "errors": {"run": f"{why}\n{tail}"}}
        row["wall_s"] = wall
        if "optimize" in row and not row.get("errors", {}).get("optimize"):
            warm = Path(tmp) / "warm.json"
            with open(log, "a") as fh:
                try:
                    subprocess.run(cmd[:-2] + ["--warm", "--row-out", str(warm)], env=env, stdout=fh,
                                   stderr=subprocess.STDOUT, timeout=a.model_timeout)
                except subprocess.TimeoutExpired:
                    pass
            if warm.exists():
                row.update(json.loads(warm.read_text()))
            else:
                row.setdefault("errors", {})["optimize_warm"] = "the warm run wrote nothing: " + \
                    log.read_text(errors="replace")[-1500:]
        return row


def summary_line(row: dict) -> str:
    f = row.get("forward", {}).get("speedup_vs_eager", {})
    g = row.get("generate", {})
    bits = [f"{row['model']:<13} {row['dtype']}"]
    bits += [f"{k} {v:.2f}x" for k, v in f.items()]
    if "self_noise" in row.get("forward", {}):
        bits.append(f"noise {row['forward']['self_noise'] * 100:.1f}%")
    if "optimize_s" in row:
        bits.append(f"optimize() {row['optimize_s']:.1f} s")
    if g.get("decode_vs_eager"):
        bits.append("decode " + ", ".join(f"{k} {v:.2f}x" for k, v in g["decode_vs_eager"].items()))
    if row.get("errors"):
        bits.append("errors: " + ", ".join(row["errors"]))
    return "  ".join(bits) + f"  ({row.get('wall_s', 0):.0f} s)"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    p.add_argument("--dtype", default="fp32", help="comma-separated: fp32, bf16, fp16")
    p.add_argument("--models", default=",".join(ZOO), help="comma-separated, from: " + ", ".join(ZOO))
    p.add_argument("--rounds", type=int, default=10, help="forward samples of each contender, at least (whole balanced rounds: 12 for 5 contenders)")
    p.add_argument("--gen-rounds", type=int, default=4, help="generate() samples of each contender, at least (whole balanced rounds)")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--block-s", type=float, default=None, help="seconds per block of calls (default 0.2 CPU, 0.05 GPU)")
    p.add_argument("--model-timeout", type=float, default=1800.0, help="seconds one model and dtype may take")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the JSON results")
    p.add_argument("--run-name", help="the results file's name (default DEVICE-DATE-TIME)")
    p.add_argument("--notes", help="markdown prose about the run, kept in its results")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--row-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.block_s is None:
        a.block_s = 0.2 if a.device == "cpu" else 0.05
    dtypes = [d.strip() for d in a.dtype.split(",") if d.strip()]
    if bad := [d for d in dtypes if d not in DTYPES]:
        raise SystemExit(f"unknown dtype {bad}; use {', '.join(DTYPES)}")
    if a.child and a.warm:
        a.row_out.write_text(json.dumps(run_warm(a.child, a.device, dtypes[0]), indent=1, default=str))
        return
    if a.child:
        row = run_child(a.child, a.device, dtypes[0], a.rounds, a.gen_rounds, a.new_tokens, a.block_s)
        a.row_out.write_text(json.dumps(row, indent=1, default=str))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    check_device(a.device, dtypes)
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    if bad := [n for n in names if n not in ZOO + EXTRA]:
        raise SystemExit(f"unknown model {bad}; the zoo: {', '.join(ZOO + EXTRA)}")
    now = datetime.datetime.now()
    a.out.mkdir(parents=True, exist_ok=True)
    dev = a.device.split(":")[0]
    path = a.out / f"{a.run_name or f'{dev}-{now:%Y-%m-%d-%H%M%S}'}.json"
    log_dir = Path(tempfile.mkdtemp(prefix="ma_zoo_logs_"))
    result = {"command": "python benchmarks/models.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(a.device), "date": now.isoformat(timespec="seconds"), "device": a.device,
              "versions": versions(), "torch": None, "settings": {
                  "rounds": a.rounds, "gen_rounds": a.gen_rounds, "new_tokens": a.new_tokens, "block_s": a.block_s,
                  "tolerance_rel_err": TOLERANCE, "contenders": list(CONTENDERS)}, "rows": []}
    result["torch"] = result["versions"]["torch"]
    if a.notes:
        result["notes"] = a.notes
    print(f"zoo: {len(names)} models x {dtypes} on {a.device}; logs in {log_dir}; results -> {path}", flush=True)
    for dtype in dtypes:
        for name in names:
            row = run_one(name, dtype, a, log_dir)
            result["rows"].append(row)
            path.write_text(json.dumps(result, indent=1, default=str) + "\n")
            print(summary_line(row), flush=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
