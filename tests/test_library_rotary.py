"""The library's rotary embeddings (library/rotary.py): HF's apply_rotary_pos_emb routed to proven kernels."""
from __future__ import annotations

import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.backends import get_backend
from metal_accel.core import config
from metal_accel.core.keys import generic_key
from metal_accel.core.specs import InputSpec
from metal_accel.library import rotary, routing
from metal_accel.library.provider import kernel_file
from metal_accel.proof.testdata import rope_sweep_specs
from limits import HANG_S

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

LLAMA = "transformers.models.llama.modeling_llama.apply_rotary_pos_emb"


def hf_inputs(B: int = 2, S: int = 5, Hq: int = 4, Hkv: int = 2, D: int = 16, dtype: torch.dtype = torch.float32,
              cos_batch: int = 1) -> tuple[torch.Tensor, ...]:
    """q and k as HF's attention makes them (views of a projection, transposed), cos and sin as its rotary module."""
    q = torch.randn(B, S, Hq, D, dtype=dtype).transpose(1, 2)
    k = torch.randn(B, S, Hkv, D, dtype=dtype).transpose(1, 2)
    return q, k, torch.randn(cos_batch, S, D, dtype=dtype), torch.randn(cos_batch, S, D, dtype=dtype)


@pytest.fixture
def library_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")


def test_signature_serves_hfs_form_only():
    q, k, c, s = hf_inputs()
    assert rotary.signature(q, k, c, s, 1) is not None
    assert rotary.signature(q, k, c, s, 2) is None  # another broadcast of cos
    assert rotary.signature(q, k, c.double(), s.double(), 1) is None  # mixed dtypes
    assert rotary.signature(q[..., :15], k[..., :15], c[..., :15], s[..., :15], 1) is None  # odd head size
    assert rotary.signature(q.requires_grad_(), k, c, s, 1) is None  # autograd records: the model's function
    with torch.no_grad():
        assert rotary.signature(q, k, c, s, 1) is not None
    # the route key tells a transposed q from a contiguous one and a per-sequence cos from a broadcast one
    assert rotary.signature(*hf_inputs(cos_batch=2), 1) != rotary.signature(*hf_inputs(), 1)
    assert rotary.signature(q.contiguous(), k, c, s, 1) != rotary.signature(q.detach(), k, c, s, 1)


def test_one_generic_key_serves_every_batch_and_length_and_the_sweep_keeps_the_layout():
    key = lambda *t: generic_key("f" * 64, InputSpec.of(t, {}), "cpu", "rope")  # noqa: E731
    assert key(*hf_inputs(B=2, S=5)) == key(*hf_inputs(B=3, S=2)) == key(*hf_inputs(B=1, S=300))
    # a decode step (one position) is decided apart from prefill, for every batch
    assert key(*hf_inputs(B=3, S=1)) == key(*hf_inputs(B=1, S=1)) != key(*hf_inputs(B=3, S=2))
    assert key(*hf_inputs(D=32)) != key(*hf_inputs(D=16))
    assert key(*hf_inputs(Hq=8)) != key(*hf_inputs(Hq=4))
    assert key(*hf_inputs(dtype=torch.bfloat16)) != key(*hf_inputs())
    spec = InputSpec.of(hf_inputs(B=2, S=5), {})
    variants = rope_sweep_specs(spec)
    assert [(v.tensor_specs()[0].shape[0], v.tensor_specs()[0].shape[2]) for v in variants] == [(2, 5), (2, 1), (5, 11)]
    assert variants[0].tensor_specs()[0].contiguous and variants[0].tensor_specs()[1].contiguous  # the other layout
    for v in variants[1:]:
        q = v.tensor_specs()[0]
        assert q.stride[1] == q.shape[3] and q.stride[2] == q.shape[1] * q.shape[3]  # still stored as [B, S, H, D]
    for v in variants:
        one = v.tensor_specs()[0].shape[2] == 1
        assert (key(*(torch.empty_strided(t.shape, t.stride) for t in v.tensor_specs())) == key(*hf_inputs())) != one


def prove(inputs: tuple[torch.Tensor, ...], text: str | None = None, monkeypatch: pytest.MonkeyPatch | None = None,
          backend: str = "cpu"):
    """The pipeline's decision for Llama's function on INPUTS on BACKEND, installed whatever its speed
    (these tests are about correctness; docs/library.md has the speed)."""
    if text is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(routing, "kernel_file", lambda backend, family: (text, None))
    with config.using(config.current().with_(margin=-0.9)):
        return rotary.prove_module_call(rotary.RotaryApply(LLAMA), inputs, rotary.RotaryProvider(), "rotary",
                                        get_backend(backend))


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cos_batch", [1, 2])
def test_the_cpu_kernel_is_proven_for_llamas_function(dtype, cos_batch):
    inputs = hf_inputs(dtype=dtype, cos_batch=cos_batch)
    op, rep = prove(inputs)
    assert op is not None and rep.status == "kernel", (rep.reason, rep.rejected)
    fresh = hf_inputs(B=3, S=9, dtype=dtype, cos_batch=cos_batch and 3 if cos_batch > 1 else 1)
    got = rotary.run_op(op, fresh)
    want = modeling_llama.apply_rotary_pos_emb(*fresh)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-5 if dtype == torch.float32 else 0, atol=1e-5 if dtype ==
                                   torch.float32 else 0)


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cos_batch", [1, 2])
def test_the_cuda_kernel_is_proven_for_llamas_function_on_the_gpu(dtype, cos_batch):
    on_gpu = lambda ts: tuple(t.cuda() for t in ts)  # noqa: E731  (transposed views stay views: .cuda() keeps strides)
    op, rep = prove(on_gpu(hf_inputs(B=2, S=7, Hq=8, Hkv=2, D=64, dtype=dtype, cos_batch=cos_batch)), backend="cuda")
    assert op is not None and rep.status == "kernel", (rep.reason, rep.rejected)
    for B, S in ((3, 11), (4, 1)):  # another prefill and a decode step, served by the same kernel
        fresh = on_gpu(hf_inputs(B=B, S=S, Hq=8, Hkv=2, D=64, dtype=dtype, cos_batch=B if cos_batch > 1 else 1))
        got = rotary.run_op(op, fresh)
        want = modeling_llama.apply_rotary_pos_emb(*fresh)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype and g.is_cuda
            torch.testing.assert_close(g, w, rtol=1e-5 if dtype == torch.float32 else 0,
                                       atol=1e-5 if dtype == torch.float32 else 0)


@pytest.mark.cuda
@pytest.mark.slow
def test_a_broken_cuda_kernel_is_rejected_on_the_gpu(monkeypatch: pytest.MonkeyPatch):
    text = cuda_text()
    old = "-x2"
    assert old in text, "the broken variant below needs the rotation's negation"
    inputs = tuple(t.cuda() for t in hf_inputs(D=64))
    op, rep = prove(inputs, text.replace(old, "x2", 1), monkeypatch, "cuda")
    assert op is None and rep.status == "eager" and "incorrect" in " ".join(rep.rejected), rep.rejected


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("backend, old, new", [
    ("cpu", "b2 = mul(-x2,", "b2 = mul(x2,"),
    ("mps-emu", "b1 = float(T(-x2 *", "b1 = float(T(x2 *"),
    ("mps-emu", "const uint pos = i % S, head = (i / S) % H", "const uint pos = i % S, head = (i / S) % 1"),
    ("mps-emu", "const bool is_q = row < rq;", "const bool is_q = row <= rq;"),
])
def test_a_broken_kernel_is_rejected(monkeypatch: pytest.MonkeyPatch, backend: str, old: str, new: str):
    text = (kernel_file(backend, rotary.FAMILY) or ("",))[0]
    assert text.count(old) == 1
    op, rep = prove(hf_inputs(), text.replace(old, new), monkeypatch, backend)
    assert op is None and rep.status == "eager" and "incorrect" in " ".join(rep.rejected), rep.rejected


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_metal_kernel_is_proven_on_the_emulator(dtype):
    op, rep = prove(hf_inputs(B=2, S=3, Hq=2, Hkv=1, D=8, dtype=dtype, cos_batch=2), backend="mps-emu")
    assert op is not None and rep.status == "kernel" and "speed not measured" in rep.reason, (rep.reason, rep.rejected)


def tiny_llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_optimize_routes_the_models_rotary_calls_and_restore_puts_the_function_back(library_on):
    torch.manual_seed(0)
    model, ids = tiny_llama(), torch.randint(0, 128, (1, 12))
    function = modeling_llama.apply_rotary_pos_emb
    with torch.inference_mode():
        ref = model(ids).logits
    metal_accel.optimize(model, (ids,), margin=-0.9, compile=False, end_to_end=False)
    router = modeling_llama.apply_rotary_pos_emb
    assert isinstance(router, rotary.RotaryRouter) and router.function == LLAMA
    assert any(n.startswith("rotary: ") and LLAMA in n for n in metal_accel.explain(model).notes)
    with torch.inference_mode():
        out = model(ids).logits
        assert router.hits >= 2, router.reports  # one call per layer
        decided = [n for n in metal_accel.explain(model).notes if n.startswith(rotary.DECISION)]
        assert len(decided) == 1 and "rotary[q 1x4x12x16" in decided[0] and ": kernel: " in decided[0], decided
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        # a call of another form goes to the model's own function
        q, k, c, s = hf_inputs()
        torch.testing.assert_close(router(q, k, c.unsqueeze(1), s.unsqueeze(1), unsqueeze_dim=2)[0],
                                   function(q, k, c.unsqueeze(1), s.unsqueeze(1), unsqueeze_dim=2)[0])
    metal_accel.restore(model)
    assert modeling_llama.apply_rotary_pos_emb is function


def test_functions_of_another_form_are_never_routed(library_on):
    # GPT-J's apply_rotary_pos_emb(tensor, sin, cos) rotates one tensor: a router in its place crashed the model
    from transformers.models.gptj import modeling_gptj
    assert rotary.hf_form(modeling_llama.apply_rotary_pos_emb)
    assert not rotary.hf_form(modeling_gptj.apply_rotary_pos_emb)
    assert not rotary.hf_form(lambda q, k, cos, sin: (q, k))  # no unsqueeze_dim: not HF's
    assert not rotary.hf_form(lambda q, k, cos, sin, extra, unsqueeze_dim=1: (q, k))  # a fifth required one
    cfg = transformers.GPTJConfig(n_embd=64, n_layer=1, n_head=4, rotary_dim=8, vocab_size=128, n_positions=64)
    model = transformers.GPTJForCausalLM(cfg).eval()
    before = modeling_gptj.apply_rotary_pos_emb
    assert rotary.attach(model, get_backend("cpu")) == ""
    assert modeling_gptj.apply_rotary_pos_emb is before


def test_the_router_calls_the_function_as_the_model_called_it(monkeypatch: pytest.MonkeyPatch):
    seen = []

    def own(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        seen.append((position_ids, unsqueeze_dim))
        return q, k

    monkeypatch.setattr(rotary, "original", lambda name: own)
    router = rotary.RotaryRouter("m.apply_rotary_pos_emb", get_backend("cpu"))
    q, k, c, s = hf_inputs()
    router(q, k, c, s, None, 2)  # positional extras: the function's
    router(q=q, k=k, cos=c, sin=s)  # by name: the function's
    router(q, k, c.unsqueeze(1), s.unsqueeze(1), unsqueeze_dim=2)  # no kernel serves it
    assert seen == [(None, 2), (None, 1), (None, 2)] and not router.routes


def test_the_library_off_leaves_the_function_alone(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "0")
    model = tiny_llama()
    before = modeling_llama.apply_rotary_pos_emb
    assert rotary.attach(model, get_backend("cpu")) == ""
    assert modeling_llama.apply_rotary_pos_emb is before


# ---------------------------------------------------------------- the CUDA file (no GPU here)

def cuda_text() -> str:
    return (kernel_file("cuda", rotary.FAMILY) or ("",))[0]


def test_every_rotary_file_passes_the_static_checks():
    from metal_accel.backends.cuda.signature import parse_cuda_kernels
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.sandbox.host import check_host_code
    from metal_accel.sandbox.kernel_source import check_kernel_source
    for backend in ("cpu", "cuda", "mps"):
        cand = parse_candidate((kernel_file(backend, rotary.FAMILY) or ("",))[0] + rotary.GLUE, backend, "library:rotary")
        check_host_code(cand.code)
        check_kernel_source(cand.source, {"cpu": "c++", "cuda": "cuda", "mps": "msl"}[backend])
    kernels = parse_cuda_kernels(parse_candidate(cuda_text() + rotary.GLUE, "cuda", "t").source)
    assert set(kernels) == {"rotary_f32", "rotary_f16", "rotary_bf16"}  # written out: the backend finds them so


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_cuda_kernel_compiles_for_sm90_without_fused_multiply_adds(tmp_path):
    from metal_accel.core.candidate import parse_candidate
    src = tmp_path / "k.cu"
    src.write_text(parse_candidate(cuda_text() + rotary.GLUE, "cuda", "t").source)
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-std=c++17", "-o", str(tmp_path / "k.ptx"), str(src)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptx = (tmp_path / "k.ptx").read_text()
    assert "fma." not in ptx and ".local" not in ptx  # eager's rounding: products rounded before the add


def emulated_cuda_lib() -> SimpleNamespace:
    """The CUDA kernels' contract in torch: q and k read in the layout each flag names (0: [B, H, S, D], 1: stored as
    [B, S, H, D]), cos/sin rows at cb, products rounded to the dtype before the add (torch's mul and add do that)."""
    def launch(q, k, c, s, oq, ok, B, Hq, Hk, S, D, lq, lk, cb, grid=None, block=None):
        assert block == (256,) and grid[0] >= 1
        assert all(t.is_contiguous() for t in (q, k, c, s, oq, ok))  # what the launcher takes
        C = c.as_strided((B, S, D), (cb, D, 1), c.storage_offset()).unsqueeze(1)
        Sn = s.as_strided((B, S, D), (cb, D, 1), s.storage_offset()).unsqueeze(1)
        half = D // 2
        for x, y, H, layout in ((q, oq, Hq, lq), (k, ok, Hk, lk)):
            shape = (B, S, H, D) if layout else (B, H, S, D)
            X = x.reshape(shape).transpose(1, 2) if layout else x.reshape(shape)
            Y = y.view(shape).transpose(1, 2) if layout else y.view(shape)
            Y.copy_(X * C + torch.cat((-X[..., half:], X[..., :half]), dim=-1) * Sn)
    return SimpleNamespace(rotary_f32=launch, rotary_f16=launch, rotary_bf16=launch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["hf", "contiguous", "sliced"])
@pytest.mark.parametrize("cos_batch", [1, 3])
def test_the_cuda_host_code_passes_the_strides_the_kernel_reads(dtype, layout, cos_batch):
    from metal_accel.sandbox.host import load_forward
    forward = load_forward(cuda_text() + rotary.GLUE, emulated_cuda_lib())
    q, k, c, s = hf_inputs(B=3, S=5, dtype=dtype, cos_batch=cos_batch)
    if layout == "contiguous":
        q, k = q.contiguous(), k.contiguous()
    elif layout == "sliced":  # rows further apart than their width: copied, then the output in eager's layout
        q = torch.randn(3, 4, 5, 20, dtype=dtype)[..., :16]
    got = forward(SimpleNamespace(unsqueeze_dim=1), q, k, c, s)
    want = modeling_llama.apply_rotary_pos_emb(q, k, c, s)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0)


SLOW_ROPE = '''
import time
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as _llama


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    time.sleep(0.002)  # a function much slower than any kernel computing the same values
    return _llama(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
'''


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_the_speed_gate_times_the_kernel_against_the_models_function(tmp_path, monkeypatch):
    """The wrapper is proven in eval mode: a dispatcher runs no kernel for a module in training mode, so a
    wrapper left in nn.Module's default mode had its gate time the function against itself (about 1.0x)."""
    (tmp_path / "slow_rope.py").write_text(SLOW_ROPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    wrapper = rotary.RotaryApply("slow_rope.apply_rotary_pos_emb")
    assert wrapper.training  # nn.Module's default: prove_module_call must not time it so
    op, rep = rotary.prove_module_call(wrapper, hf_inputs(), rotary.RotaryProvider(), "rotary", get_backend("cpu"))
    assert op is not None and rep.status == "kernel", (rep.reason, rep.rejected)
    assert rep.speedup is not None and rep.speedup > 3, rep.reason  # 2 ms of sleep against a kernel of microseconds


REEXPORT = '''
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # a modeling file reusing Llama's


class Holder(nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)
'''


def test_a_function_imported_from_another_modeling_file_is_routed_where_it_is_called(tmp_path, monkeypatch):
    (tmp_path / "reexport_rope.py").write_text(REEXPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    import reexport_rope
    function = reexport_rope.apply_rotary_pos_emb
    model = nn.Sequential(reexport_rope.Holder())
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    try:
        assert "reexport_rope.apply_rotary_pos_emb" in rotary.attach(model, get_backend("cpu"))
        assert isinstance(reexport_rope.apply_rotary_pos_emb, rotary.RotaryRouter)
        assert modeling_llama.apply_rotary_pos_emb is function  # Llama's own module is not this model's
        assert rotary.original("reexport_rope.apply_rotary_pos_emb") is function
    finally:
        rotary.detach(model)
    assert reexport_rope.apply_rotary_pos_emb is function
    # a function someone else put there meanwhile is left in place
    rotary.attach(model, get_backend("cpu"))
    reexport_rope.apply_rotary_pos_emb = other = lambda *a, **k: None  # noqa: E731
    rotary.detach(model)
    assert reexport_rope.apply_rotary_pos_emb is other


def test_a_dtype_no_kernel_serves_goes_to_the_function_without_a_proof():
    router = rotary.RotaryRouter(LLAMA, get_backend("cpu"))
    q, k, c, s = hf_inputs(dtype=torch.float64)  # the float64 runs of a whole-model check
    with torch.no_grad():
        got = router(q, k, c, s)
    want = modeling_llama.apply_rotary_pos_emb(q, k, c, s)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert router.reports == [] and list(router.routes.values()) == [None] and router.hits == 0


def test_a_router_hands_its_kernel_views_that_start_their_storage():
    """q, k and v split from one fused projection are views at a storage offset, a layout no proof tried: the
    router's call copies them first (the kernel may load aligned vectors from its pointers)."""
    from metal_accel.library.routing import run_op
    seen: list[tuple[int, ...]] = []

    def op(args, kwargs, state):
        seen.append(tuple(a.storage_offset() for a in args if isinstance(a, torch.Tensor)))
        return args[0] + args[1]
    fused = torch.randn(2, 3 * 8, 16)
    q, k, v = fused.split(8, dim=1)
    assert k.storage_offset() > 0
    torch.testing.assert_close(run_op(op, (q, k, 2)), q + k, rtol=0, atol=0)
    assert seen == [(0, 0)]
    plain = torch.randn(2, 8, 16)
    assert run_op(op, (plain, plain, 2)) is not None and seen[-1] == (0, 0)
