"""Calls with containers: tuple/dict/None arguments and keyword arguments, tuples with None and
ModelOutput-like results. What is keyed, what keeps a call eager, and the op that takes flat tensors."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.utils import _pytree

import metal_accel
from metal_accel.candidates.compile import CompiledOp
from metal_accel.core.keys import entry_key
from metal_accel.core.specs import (
    InputSpec,
    OutputSpec,
    StructSpec,
    UnsupportedCall,
    call_signature,
)
from metal_accel.proof.worker import Worker
from metal_accel.runtime.capture import capture
from metal_accel.runtime.dispatch import install, uninstall
from metal_accel.runtime.ops import kernel_op


@dataclass
class Result:
    """A ModelOutput-like result: a dataclass registered as a pytree node, fields as keys."""

    hidden: torch.Tensor
    weights: torch.Tensor | None = None


def _result_flatten(r: Result) -> tuple[list, list[str]]:
    keys = [k for k in ("hidden", "weights") if getattr(r, k) is not None]  # as ModelOutput: None fields absent
    return [getattr(r, k) for k in keys], keys


_pytree.register_pytree_node(Result, _result_flatten, lambda values, keys: Result(**dict(zip(keys, values))))


class Rotary(nn.Module):
    """(x, (cos, sin), mask=None) -> (y, None): the shape of an attention call."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x, position_embeddings, attention_mask=None, cache=None, use_cache=False):
        cos, sin = position_embeddings
        y = (x * cos + x.flip(-1) * sin) * self.scale
        if attention_mask is not None:
            y = y.masked_fill(~attention_mask, 0.0)
        return y, None


class Block(nn.Module):
    """A parent of Rotary returning a Result: structure on both sides of the call."""

    def __init__(self) -> None:
        super().__init__()
        self.rot = Rotary()

    def forward(self, x, pe: dict, cache=None):
        y, _ = self.rot(x, (pe["cos"], pe["sin"]), cache=cache)
        return Result(hidden=torch.tanh(y) + x)


class Cache:
    """An object a module updates: no pytree, never keyed."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def update(self, t: torch.Tensor) -> None:
        self.seen.append(t)


class Appender(nn.Module):
    def forward(self, x, history: list):
        history.append(x)  # changes its argument: no replacement can do that
        return x * 2


def _pe(n: int = 8) -> dict:
    return {"cos": torch.randn(n), "sin": torch.randn(n)}


def test_spec_keys_structure_none_and_values():
    x, cos, sin = torch.randn(2, 8), torch.randn(8), torch.randn(8)
    mask = torch.rand(2, 8) > 0.5
    plain = InputSpec.of((x, (cos, sin)), {"attention_mask": None, "use_cache": False})
    masked = InputSpec.of((x, (cos, sin)), {"attention_mask": mask, "use_cache": False})
    listed = InputSpec.of((x, [cos, sin]), {"attention_mask": None, "use_cache": False})
    cached = InputSpec.of((x, (cos, sin)), {"attention_mask": None, "use_cache": True})
    assert len({plain.key, masked.key, listed.key, cached.key}) == 4  # None-ness, container type, values
    assert isinstance(plain.args[1], StructSpec) and plain.structured
    assert plain.describe() == "float32[2,8], (float32[8], float32[8]), attention_mask=None, use_cache=False"
    for spec, (a, k) in ((plain, ((x, (cos, sin)), {"attention_mask": None, "use_cache": False})),
                         (listed, ((x, [cos, sin]), {"attention_mask": None, "use_cache": False}))):
        assert spec.signature() == call_signature(a, k)
        again = InputSpec.from_dict(spec.to_dict())  # what a cache entry stores
        assert again == spec and again.key == spec.key and again.signature() == spec.signature()
        assert [t.shape for t in spec.flat_tensors(a, k)] == [(2, 8), (8,), (8,)]
        built = spec.build(lambda t: torch.zeros(t.shape))
        assert call_signature(*built) == spec.signature()
    assert call_signature((x, (cos, sin)), {"attention_mask": mask, "use_cache": False}) != plain.signature()
    # a plain call keeps the key it had: existing caches still hit
    assert InputSpec.of((x, 3, (1, 2)), {"dim": -1}).to_dict()["args"][2] == {"tensor": False, "value": [1, 2]}


def test_output_spec_rebuilds_the_container():
    x, w = torch.randn(2, 8), torch.randn(2, 2)
    out = OutputSpec.of((x, None))
    assert out.tree is not None and [t.shape for t in out.tensors] == [(2, 8)]
    y = out.rebuild([x])
    assert type(y) is tuple and y[0] is x and y[1] is None
    res = OutputSpec.from_dict(OutputSpec.of(Result(x, w)).to_dict())  # the class found again by its path
    r = res.rebuild([x, w])
    assert type(r) is Result and r.hidden is x and r.weights is w
    assert OutputSpec.of(x).tree is None and OutputSpec.of((x, w)).tree is None  # plain outputs as before
    with pytest.raises(UnsupportedCall, match="not a tensor, None"):
        OutputSpec.of((x, 3))
    with pytest.raises(UnsupportedCall, match="Cache"):
        OutputSpec.of({"y": x, "cache": Cache()})


def test_capture_keys_structured_calls_and_keeps_mutated_ones_eager():
    block, x = Block().eval(), torch.randn(2, 8)
    calls = {c.name: c for c in capture(block, (x, _pe()))}
    assert calls["Block"].replaceable and calls["rot"].replaceable, {n: c.unsupported for n, c in calls.items()}
    assert calls["Block"].output_spec.tree.kind.endswith("Result")
    assert calls["rot"].spec.describe() == "float32[2,8], (float32[8], float32[8]), cache=None"
    assert calls["rot"].calls == 1  # one record per signature, not one per tuple object

    calls = {c.name: c for c in capture(block, (x, _pe()), {"cache": Cache()})}
    for name in ("Block", "rot"):
        assert not calls[name].replaceable and "argument cache of type Cache" in calls[name].unsupported

    calls = capture(Appender(), (x, []))
    assert "argument #1 is a container the module changes" in calls[0].unsupported


class _Passthrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_op_takes_flat_tensors_and_rebuilds_outputs():
    rot, x, mask = Rotary().eval(), torch.randn(2, 8), torch.rand(2, 8) > 0.3
    pe = (torch.randn(8), torch.randn(8))
    with torch.inference_mode():
        ref = rot(x, pe, attention_mask=mask)
    spec, out_spec = InputSpec.of((x, pe), {"attention_mask": mask}), OutputSpec.of(ref)
    seen = []

    def host(module, x, position_embeddings, attention_mask=None):  # host code gets the structure back
        seen.append((type(position_embeddings), attention_mask is None))
        cos, sin = position_embeddings
        y = (x * cos + x.flip(-1) * sin) * module.scale
        return y.masked_fill(~attention_mask, 0.0), None

    op = kernel_op(entry_key("f" * 64, spec, "cpu"), "structured", lambda: host, spec, out_spec, rot, "cpu")
    install(rot, spec.signature(), op)
    try:
        with torch.inference_mode():
            got = rot(x, pe, attention_mask=mask)
            other = rot(x, pe)  # attention_mask=None: another signature, eager
            with _Passthrough():  # under a mode the registered op itself runs, on the flat tensors
                real = rot(x, pe, attention_mask=mask)
        disp = rot.__dict__["forward"]
        assert disp.hits == 2 and disp.misses == 1
        for y in (got, real):
            assert type(y) is tuple and y[1] is None
            torch.testing.assert_close(y[0], ref[0])
        assert other[1] is None
        assert seen == [(tuple, False), (tuple, False)]
    finally:
        uninstall(rot)


def test_optimize_decides_structured_modules_with_torch_compile():
    block, x, pe = Block().eval(), torch.randn(4, 8), _pe()
    with torch.inference_mode():
        ref = block(x, pe)
    metal_accel.optimize(block, (x, pe), compile=True, end_to_end=False)
    report = {m.name: m for m in metal_accel.explain(block).modules}
    for name in ("Block", "rot"):
        m = report[name]
        assert m.compile_us is not None, (name, m.reason)  # torch.compile was proven and timed, whatever won
        assert "not a tensor" not in m.reason
    with torch.inference_mode():
        got = block(x, pe)
    assert type(got) is Result and got.weights is None
    torch.testing.assert_close(got.hidden, ref.hidden)
    metal_accel.restore(block)


# --- real transformers classes, small configs, random weights ----------------------------------------------


def _llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval(), torch.randint(0, 128, (2, 16))


def test_llama_without_cache_reaches_layers_attention_and_model():
    model, ids = _llama()
    with torch.inference_mode():
        ref = model(ids, use_cache=False).logits
    metal_accel.optimize(model, (ids,), {"use_cache": False}, compile=False, end_to_end=False)
    report = {m.name: m for m in metal_accel.explain(model).modules}
    for name in ("LlamaForCausalLM", "model", "model.layers.0", "model.layers.1", "model.layers.0.self_attn"):
        m = report[name]
        assert "not a tensor" not in m.reason and m.spec != "?", (name, m.reason)
    assert "position_embeddings=(float32[1,16,16], float32[1,16,16])" in report["model.layers.0"].spec
    assert "cache=None" in report["model.layers.0.self_attn"].spec
    assert sum(1 for m in report.values() if m.module_class.endswith("LlamaDecoderLayer")) == 2  # one record each
    with torch.inference_mode():
        assert torch.equal(model(ids, use_cache=False).logits, ref)
    metal_accel.restore(model)


def test_llama_with_cache_keeps_cached_calls_eager_and_decides_their_children():
    model, ids = _llama()
    with torch.inference_mode():
        ref = model(ids, use_cache=True).logits
    metal_accel.optimize(model, (ids,), {"use_cache": True}, compile=False, end_to_end=False)
    report = {m.name: m for m in metal_accel.explain(model).modules}
    for name in ("model.layers.0", "model.layers.0.self_attn"):
        assert report[name].status == "eager" and "of type DynamicCache" in report[name].reason, report[name].reason
    assert "DynamicCache" in report["LlamaForCausalLM"].reason  # its output holds the cache
    for name in ("model.layers.0.mlp", "model.layers.0.self_attn.q_proj", "model.layers.0.input_layernorm"):
        assert "DynamicCache" not in report[name].reason and report[name].spec != "?"
    with torch.inference_mode():
        assert torch.equal(model(ids, use_cache=True).logits, ref)
    metal_accel.restore(model)


def test_llama_decoder_layer_runs_compiled_on_its_real_arguments():
    model, ids = _llama()
    with torch.inference_mode():
        ref = model(ids, use_cache=False).logits
    calls = {c.name: c for c in capture(model, (ids,), {"use_cache": False})}
    layer = calls["model.layers.0"]
    op = CompiledOp(layer.module, "compile_structured_test")  # what an accepted torch.compile installs
    install(layer.module, layer.spec.signature(), op)
    try:
        with torch.inference_mode():
            got = model(ids, use_cache=False).logits
        assert layer.module.__dict__["forward"].hits == 1
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    finally:
        uninstall(layer.module)


def test_bert_attention_tuple_with_none_is_replaceable():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
                                  vocab_size=128, max_position_embeddings=64)
    model, ids = transformers.BertModel(cfg).eval(), torch.randint(0, 128, (2, 16))
    calls = {c.name: c for c in capture(model, (ids,))}
    assert calls["BertModel"].replaceable, calls["BertModel"].unsupported  # a ModelOutput
    attn = [c for n, c in calls.items() if n.endswith("attention")]
    assert attn and all(c.replaceable for c in attn), [(c.name, c.unsupported) for c in attn]


# --- a kernel for a structured call, proven in the confined worker -----------------------------------------


class Rope(nn.Module):
    """(x, (cos, sin)) -> (y, None), three rounds of a rotary-like step: an attention-shaped call whose kernel
    takes tensors from inside a tuple and returns a tuple with None."""

    def __init__(self, n: int = 64) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x, position_embeddings, attention_mask=None):
        cos, sin = position_embeddings
        for _ in range(3):
            x = (x * cos + sin) * self.scale
        return x, None


class RopeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rope = Rope()

    def forward(self, x, cos, sin):
        y, _ = self.rope(x, (cos, sin))
        return y


ROPE_KERNEL = '''
SOURCE = r"""
#include <cstdint>
extern "C" void rope(const float* x, const float* c, const float* s, const float* scale, float* out,
                     int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      float v = x[r * n + i];
      for (int k = 0; k < 3; ++k) {
        float t = v * c[r * n + i];
        t = t + s[r * n + i];
        v = t * scale[i];
      }
      out[r * n + i] = v;
    }
  }
}
"""
def forward(module, x, position_embeddings, attention_mask=None):
    cos, sin = position_embeddings
    out = torch.empty_like(x)
    n = x.shape[-1]
    lib.rope(x.contiguous(), cos.contiguous(), sin.contiguous(), module.scale, out, x.numel() // n, n)
    return out, None
'''


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_kernel_of_a_structured_call_is_proven_and_soaked_in_the_worker(tmp_path, monkeypatch):
    """The worker gets the tensors inside the call's tuple on its device, runs the trials and the speed gate's
    calls, and reads the tuple with None that the kernel returns; only then does the gate time it here."""
    if not metal_accel.get_backend("cpu").is_available():
        pytest.skip("no C++ compiler")
    folder = tmp_path / "cands" / "cpu" / "Rope"
    folder.mkdir(parents=True)
    (folder / "fused.py").write_text(ROPE_KERNEL)
    requests: list[dict] = []
    real = Worker.request
    monkeypatch.setattr(Worker, "request", lambda self, req, *a, **k: requests.append(req) or real(self, req, *a, **k))
    model, x, cos, sin = RopeNet().eval(), torch.randn(16, 64), torch.randn(16, 64), torch.randn(16, 64)
    with torch.inference_mode():
        ref = model(x, cos, sin)
    metal_accel.optimize(model, (x, cos, sin), providers=[f"dir:{tmp_path / 'cands'}"], end_to_end=False)
    rep = next(m for m in metal_accel.explain(model).modules if m.name == "rope")
    kinds = [r.get("kind", "trials") for r in requests]
    assert "trials" in kinds and "soak" in kinds, kinds  # proven in the worker, and soaked there
    pe = requests[0]["trials"][0]["args"][1]
    assert type(pe) is tuple and all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in pe)
    assert rep.status == "kernel" or "not faster" in rep.reason, rep.reason
    assert "worker" not in rep.reason and "soak" not in rep.reason, rep.reason
    with torch.inference_mode():
        torch.testing.assert_close(model(x, cos, sin), ref)
    metal_accel.restore(model)


ROPE_CUDA_KERNEL = '''
SOURCE = r"""
extern "C" __global__ void rope(const float* x, const float* c, const float* s, const float* scale, float* out,
                                long long total, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < total) {
        float v = x[i];
        for (int k = 0; k < 3; ++k) {
            float t = __fmul_rn(v, c[i]);
            t = __fadd_rn(t, s[i]);
            v = __fmul_rn(t, scale[i % n]);
        }
        out[i] = v;
    }
}
"""
def forward(module, x, position_embeddings, attention_mask=None):
    cos, sin = position_embeddings
    out = torch.empty_like(x)
    lib.rope(x.contiguous(), cos.contiguous(), sin.contiguous(), module.scale, out, x.numel(), x.shape[-1],
             threads=x.numel(), group_size=256)
    return out, None
'''


@pytest.mark.slow
@pytest.mark.cuda
def test_gpu_kernel_of_a_structured_call_gets_its_tuples_tensors_on_the_gpu_in_the_worker(tmp_path, monkeypatch):
    from metal_accel.backends.cuda import backend as cb
    if not cb.nvrtc_available():
        pytest.skip("NVRTC not installed")
    folder = tmp_path / "cands" / "cuda" / "Rope"
    folder.mkdir(parents=True)
    (folder / "fused.py").write_text(ROPE_CUDA_KERNEL)
    requests: list[dict] = []
    real = Worker.request
    monkeypatch.setattr(Worker, "request", lambda self, req, *a, **k: requests.append(req) or real(self, req, *a, **k))
    model = RopeNet().cuda().eval()
    x, cos, sin = (torch.randn(16, 64, device="cuda") for _ in range(3))
    with torch.inference_mode():
        ref = model(x, cos, sin)
    metal_accel.optimize(model, (x, cos, sin), backend="cuda", providers=[f"dir:{tmp_path / 'cands'}"],
                         end_to_end=False, progress=False)
    rep = next(m for m in metal_accel.explain(model).modules if m.name == "rope")
    kinds = [r.get("kind", "trials") for r in requests]
    assert "trials" in kinds and "soak" in kinds, (kinds, rep.reason)
    pe = requests[0]["trials"][0]["args"][1]  # crosses the pipe on the CPU; the worker moves it to the GPU
    assert type(pe) is tuple and all(t.device.type == "cpu" for t in pe)
    assert rep.status in ("kernel", "graph") or "not faster" in rep.reason, rep.reason
    assert "worker" not in rep.reason and "soak" not in rep.reason, rep.reason
    with torch.inference_mode():
        torch.testing.assert_close(model(x, cos, sin), ref)
    metal_accel.restore(model)


def test_nested_tensors_are_never_keyed_and_keep_their_calls_eager():
    nested = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(5, 4)])
    with pytest.raises(UnsupportedCall, match="nested tensor"):
        InputSpec.of((nested,), {})
    first, second = call_signature((nested,), {}), call_signature((nested,), {})
    assert first == second and first != call_signature((torch.nested.nested_tensor([torch.randn(3, 4)]),), {})


def test_a_transformer_encoder_whose_fast_path_makes_nested_tensors_is_optimized_and_stays_exact():
    # torch's TransformerEncoder, in eval mode with a padding mask, turns its activations into a nested tensor
    # that its layers receive: capture and every dispatcher must take them (they raised on .shape)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.randn(2, 12, 32)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[:, -4:] = True
    with torch.inference_mode():
        want = model(x, src_key_padding_mask=mask)
    metal_accel.optimize(model, (x,), {"src_key_padding_mask": mask}, progress=False)
    with torch.inference_mode():
        got = model(x, src_key_padding_mask=mask)
        unmasked = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    with torch.inference_mode(), metal_accel.eager():
        torch.testing.assert_close(unmasked, model(x), rtol=1e-5, atol=1e-5)
