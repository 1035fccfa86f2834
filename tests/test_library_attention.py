"""Decode attention (library/attention.py, library/hf_attention.py, kernels/<backend>/attention_decode.py).

Fast: the shape-generic key and sweep over batch and kv length, which calls a kernel may serve (signature), the
kernel files as candidates. Slow (a compile or a proof each): the CPU kernel against HF's sdpa_attention_forward
(GQA 4:1 and 1:1, no mask, bool and additive masks per batch and per head, fully masked rows, kv 1/7/33); the
router and optimize() on a tiny HF Llama, whose greedy generate() gives the same tokens with and without the
kernel; the Metal kernel proven on the MSL emulator; the CUDA kernel compiled with nvcc, and proven on a GPU
where there is one. No test depends on speed: kernels are run directly, or on the emulator (no speed gate).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from metal_accel.backends import get_backend
from metal_accel.core.candidate import parse_candidate
from metal_accel.core.keys import generic_key, kv_generic_spec
from metal_accel.core.specs import InputSpec
from metal_accel.library import attention
from metal_accel.library.attention import SdpaAttention, direct_forward, glue, prove_call, signature
from metal_accel.proof.prove import shape_sweep
from metal_accel.runtime.ops import ModuleLayout
from metal_accel.sandbox.host import load_forward

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "metal_accel" / "library" / "kernels"
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOL = {FP32: 2e-5, FP16: 4e-3, BF16: 3e-2}


def qkv(B: int, hq: int, hkv: int, L: int, D: int, dtype: torch.dtype, device: str = "cpu"):
    return (torch.randn(B, hq, 1, D, dtype=dtype, device=device), torch.randn(B, hkv, L, D, dtype=dtype, device=device),
            torch.randn(B, hkv, L, D, dtype=dtype, device=device))


def masks(B: int, hq: int, L: int, dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor | None]:
    """No mask; bool per batch (one fully masked row where B > 1); bool per head; additive per batch."""
    per_batch = torch.rand(B, 1, 1, L, device=device) < 0.7
    per_batch[:, :, :, 0] = True
    if B > 1:
        per_batch[1] = False  # every position masked: SDPA gives zeros
    per_head = torch.rand(1, hq, 1, L, device=device) < 0.6
    additive = torch.randn(B, 1, 1, L, device=device).to(dtype)
    return [None, per_batch, per_head, additive]


def reference(module: SdpaAttention, q, k, v, m) -> torch.Tensor:
    return attention.sdpa_reference()(module, q, k, v, m, scaling=module.scaling)[0]


def check_against_sdpa(backend_name: str, device: str, dtypes: tuple[torch.dtype, ...]) -> None:
    backend = get_backend(backend_name)
    plain, masked = direct_forward(backend, False), direct_forward(backend, True)
    torch.manual_seed(0)
    for hq, hkv in ((8, 2), (4, 4)):
        module = SdpaAttention(0.125, hq // hkv)
        view = ModuleLayout(module).view([])
        for dtype in dtypes:
            for B, L in ((1, 1), (2, 7), (3, 33)):
                q, k, v = qkv(B, hq, hkv, L, 64, dtype, device)
                for m in masks(B, hq, L, dtype, device):
                    want = reference(module, q, k, v, m)
                    got = plain(view, q, k, v) if m is None else masked(view, q, k, v, m)
                    if m is not None and m.dtype == torch.bool and device == "cuda" and dtype != FP32:
                        # a row with every position masked: zeros from SDPA's math and CPU kernels, the unmasked
                        # attention from CUDA's half-precision kernels (a finite bias, which softmax cancels):
                        # backend-defined, not a value to match. The kernels give zeros there.
                        dead = (~m).all(-1, keepdim=True).expand(B, hq, 1, L).any(-1).transpose(1, 2)  # [B, 1, hq]
                        want = torch.where(dead[..., None], torch.zeros_like(want), want)
                    assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
                    err = (got.float() - want.float()).abs().max().item()
                    assert err <= TOL[dtype] * max(1.0, want.float().abs().max().item()), \
                        (hq, hkv, dtype, B, L, None if m is None else (m.dtype, tuple(m.shape)), err)


# ---------------------------------------------------------------- fast: keys, sweep, signature, files

def test_kv_generic_key_covers_batch_and_length_only() -> None:
    def spec(B: int, L: int, dtype: torch.dtype = FP32, mask: str = "") -> InputSpec:
        q, k, v = qkv(B, 8, 2, L, 16, dtype)
        extra = {"": (), "bool": (torch.ones(B, 1, 1, L, dtype=torch.bool),),
                 "shared": (torch.ones(1, 1, 1, L, dtype=torch.bool),)}[mask]
        return InputSpec.of((q, k, v, *extra), {})
    key = generic_key("fp", spec(2, 40), "cpu", "kv")
    assert key == generic_key("fp", spec(5, 7), "cpu", "kv") == generic_key("fp", spec(2, 41), "cpu", "kv")
    assert key != generic_key("fp", spec(2, 40, BF16), "cpu", "kv")
    assert key != generic_key("fp", spec(2, 40, mask="bool"), "cpu", "kv")
    assert generic_key("fp", spec(2, 40, mask="bool"), "cpu", "kv") != generic_key("fp", spec(2, 40, mask="shared"),
                                                                                    "cpu", "kv")
    assert kv_generic_spec(InputSpec.of((torch.randn(3, 4),), {})) is None
    swept, skipped = shape_sweep(spec(2, 40, mask="bool"), "kv")
    shapes = [[tuple(t.shape) for t in s.tensor_specs()] for s in swept]
    assert not skipped and len(shapes) == 3
    assert shapes[0] == [(1, 8, 1, 16), (1, 2, 1, 16), (1, 2, 1, 16), (1, 1, 1, 1)]
    assert shapes[2] == [(5, 8, 1, 16), (5, 2, 33, 16), (5, 2, 33, 16), (5, 1, 1, 33)]


def test_signature_serves_decode_only() -> None:
    module = SdpaAttention(0.25, 4)
    q, k, v = qkv(2, 8, 2, 9, 16, FP32)
    assert signature(module, q, k, v, None, 0.0, 0.25, {}) is not None
    assert signature(module, q, k, v, torch.ones(2, 1, 1, 9, dtype=torch.bool), 0.0, 0.25, {}) is not None
    prefill = torch.randn(2, 8, 3, 16)
    assert signature(module, prefill, k, v, None, 0.0, 0.25, {}) is None       # prefill: SDPA
    assert signature(module, q, k, v, None, 0.1, 0.25, {}) is None             # dropout
    assert signature(module, q, k, v, None, 0.0, 0.25, {"softcap": 30.0}) is None
    assert signature(module, q, k, v, torch.ones(2, 1, 3, 9, dtype=torch.bool), 0.0, 0.25, {}) is None
    assert signature(module, q, k, v, torch.zeros(2, 1, 1, 9, dtype=torch.float64), 0.0, 0.25, {}) is None
    assert signature(SdpaAttention(0.25, 2), q, k, v, None, 0.0, 0.25, {}) is None  # heads do not group
    with torch.enable_grad():
        assert signature(module, q.requires_grad_(), k, v, None, 0.0, 0.25, {}) is None


@pytest.mark.parametrize("backend", ["cpu", "cuda", "mps"], ids=["cpp-file", "nvrtc-file", "metal-file"])
def test_kernel_files_are_candidates(backend: str) -> None:
    text = (KERNELS / backend / "attention_decode.py").read_text()
    assert "def forward" not in text
    for masked in (False, True):
        cand = parse_candidate(text + glue(masked), "mps-emu" if backend == "mps" else backend, "library:attention")
        assert cand.source
        load_forward(cand.code, lib=None)  # the sandbox accepts the host code


def test_hf_attention_registers_with_sdpa_masks() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    from metal_accel.library import hf_attention
    assert hf_attention.register()
    assert hf_attention.NAME in AttentionInterface._global_mapping
    assert ALL_MASK_ATTENTION_FUNCTIONS[hf_attention.NAME] is ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]


# ---------------------------------------------------------------- CPU (a compile each)

@pytest.mark.slow
@pytest.mark.needs_cxx
def test_cpu_kernel_matches_sdpa() -> None:
    check_against_sdpa("cpu", "cpu", (FP32, BF16))


def tiny_llama(dtype: torch.dtype = FP32):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval().to(dtype)


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_llama_generate_same_tokens_through_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decode step's attention runs the CPU kernel (routed without the speed gate, which a busy machine
    decides): greedy tokens equal sdpa's, with and without padding (bool masks)."""
    from metal_accel.library import hf_attention
    model = tiny_llama()
    ids = torch.randint(0, 96, (2, 6))
    pad = torch.ones_like(ids)
    pad[1, :2] = 0
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=8, do_sample=False)
        want_padded = model.generate(ids, attention_mask=pad, max_new_tokens=8, do_sample=False)
    backend = get_backend("cpu")
    router = hf_attention.router_for(backend)
    forwards = {False: direct_forward(backend, False), True: direct_forward(backend, True)}

    def decide(self, module, query, key, value, mask, sig=None):
        view = ModuleLayout(SdpaAttention(module.scaling, module.num_key_value_groups)).view([])
        run = lambda q, k, v, m: forwards[m is not None](view, q, k, v, *(() if m is None else (m,)))  # noqa: E731
        self.routes[sig] = run
        return run
    monkeypatch.setattr(attention.AttentionRouter, "decide", decide)
    monkeypatch.setattr(router, "proving", True)
    monkeypatch.setattr(router, "routes", {})
    assert hf_attention.register()
    model.set_attn_implementation(hf_attention.NAME)
    hits = router.hits
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=8, do_sample=False)
        got_padded = model.generate(ids, attention_mask=pad, max_new_tokens=8, do_sample=False)
    assert router.hits - hits >= 2 * 2 * 7  # two generates, two layers, every step after the prefill
    assert torch.equal(got, want) and torch.equal(got_padded, want_padded)


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_optimize_attaches_and_restore_detaches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """optimize() switches an sdpa model to the library's attention and proves its decode signature (kept or not by
    this machine's speed gate: not asserted); restore() puts sdpa back; the tokens never change."""
    import metal_accel
    from metal_accel.library import hf_attention
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    model = tiny_llama()
    ids = torch.randint(0, 96, (1, 5))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False)
    metal_accel.optimize(model, (ids,), providers=[], compile=False, end_to_end=False)
    notes = [n for n in metal_accel.explain(model).notes if n.startswith("attention:")]
    assert notes, metal_accel.explain(model).notes
    # switched when the decode kernel won its gate here; else the model is left on sdpa, with the reason
    switched = "-> metal_accel" in notes[0]
    assert switched or notes[0].startswith("attention: sdpa kept ("), notes[0]
    assert model.config._attn_implementation == (hf_attention.NAME if switched else "sdpa")
    with torch.no_grad():
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), want)
    metal_accel.restore(model)
    assert model.config._attn_implementation == "sdpa"


def test_the_library_switch_leaves_attention_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from metal_accel.backends import get_backend
    from metal_accel.library import hf_attention
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "0")
    model = tiny_llama()
    assert hf_attention.attach(model, get_backend("cpu")) == ""
    assert model.config._attn_implementation == "sdpa"


# ---------------------------------------------------------------- Metal on the MSL emulator

@pytest.mark.slow
def test_metal_kernel_proven_on_emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("METAL_ACCEL_BUILD_DIR", str(tmp_path / "build"))
    backend = get_backend("mps-emu")
    torch.manual_seed(0)
    for dtype, hq, hkv, with_mask in ((FP32, 4, 2, False), (BF16, 4, 1, True), (FP16, 2, 2, True)):
        q, k, v = qkv(1, hq, hkv, 9, 16, dtype)
        mask = (torch.rand(1, 1, 1, 9) < 0.7) if with_mask else None
        module = SdpaAttention(0.25, hq // hkv)
        run, rep = prove_call(module, q, k, v, mask, backend)
        assert run is not None and rep.status == "kernel", (rep.reason, rep.rejected)
        assert "speed not measured" in rep.reason
        q2, k2, v2 = qkv(2, hq, hkv, 20, 16, dtype)  # another batch and kv length: the same proof
        m2 = (torch.rand(2, 1, 1, 20) < 0.7) if with_mask else None
        err = (run(q2, k2, v2, m2).float() - reference(module, q2, k2, v2, m2).float()).abs().max().item()
        assert err <= TOL[dtype] * 4, (dtype, err)


# ---------------------------------------------------------------- CUDA

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_kernel_compiles_without_spills(tmp_path: Path) -> None:
    from metal_accel.core.candidate import declared_source
    src = tmp_path / "k.cu"
    src.write_text(declared_source((KERNELS / "cuda" / "attention_decode.py").read_text()) or "")
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "spill stores" in proc.stderr and "0 bytes spill stores" in proc.stderr
    assert all(line.strip().startswith("0 bytes stack") for line in proc.stderr.splitlines() if "spill" in line)


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_cuda_kernel_matches_sdpa_and_is_proven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "cache"))
    check_against_sdpa("cuda", "cuda", (FP32, FP16, BF16))
    q, k, v = qkv(1, 32, 8, 4096, 64, BF16, "cuda")
    run, rep = prove_call(SdpaAttention(0.125, 4), q, k, v, None, get_backend("cuda"))
    assert rep.status in ("kernel", "eager") and not [r for r in rep.rejected if "incorrect" in r], rep.rejected


def test_a_saved_or_copied_model_names_the_attention_it_had(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save(model) after the switch stores sdpa, not metal_accel's name (which a process without it cannot
    resolve); a deep copy runs sdpa too; the switched model itself still routes."""
    import copy
    import io
    from metal_accel.library import hf_attention
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    monkeypatch.setattr(hf_attention, "_prove_decode", lambda *a: ["attention[q 1x4x1x16, kv 64]: kernel 1.50x"])
    model = tiny_llama()
    ids = torch.randint(0, 96, (1, 5))
    with torch.no_grad():
        want = model(ids).logits
    assert "-> metal_accel" in hf_attention.attach(model, get_backend("cpu"))
    assert model.config._attn_implementation == hf_attention.NAME
    buf = io.BytesIO()
    torch.save(model, buf)
    assert b"metal_accel" not in buf.getvalue()
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (loaded, copy.deepcopy(model)):
        assert type(other.config._attn_implementation) is str and other.config._attn_implementation == "sdpa"
        with torch.no_grad():
            torch.testing.assert_close(other(ids).logits, want)
    hf_attention.detach(model)
    assert model.config._attn_implementation == "sdpa"
