"""The shipped kernel library: modules matched by what they compute, kernels proposed, proven and installed."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.library import provider as library_provider
from metal_accel.library import sources as library_sources
from metal_accel.library.match import clear_memo, match_call

transformers = pytest.importorskip("transformers")
from transformers import BertConfig, GPT2Config, LlamaConfig  # noqa: E402
from transformers.activations import NewGELUActivation  # noqa: E402
from transformers.models.bert.modeling_bert import BertIntermediate  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm  # noqa: E402
from transformers.models.t5.modeling_t5 import T5LayerNorm  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "library"


class ScaledNorm(nn.Module):
    """A user's own RMSNorm: other class, other attribute names, same computation as Llama's."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.epsilon = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.epsilon)
        return self.scale * x32.to(dtype)


class SqrtNorm(ScaledNorm):
    """Divides by sqrt instead of multiplying by rsqrt: another computation (rounding differs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.epsilon))


@pytest.fixture(autouse=True)
def _fresh_memo():
    clear_memo()
    yield
    clear_memo()


def _family(module: nn.Module, x: torch.Tensor) -> str | None:
    found = match_call(module.eval(), (x,), {})
    return found.family if found else None


def test_real_classes_match_by_computation():
    x = torch.randn(2, 5, 64)
    llama = LlamaConfig(hidden_size=64, intermediate_size=128)
    assert _family(LlamaRMSNorm(64), x) == "rms_norm"
    assert _family(Qwen2RMSNorm(64), x) == "rms_norm"
    assert _family(T5LayerNorm(64), x) == "rms_norm"  # in float32 T5's norm computes the same
    assert _family(LlamaMLP(llama), x) == "gated_mlp"
    assert _family(GPT2MLP(256, GPT2Config(n_embd=64)), x) == "gpt2_mlp"
    assert _family(NewGELUActivation(), x) == "gelu_tanh"
    assert _family(BertIntermediate(BertConfig(hidden_size=64, intermediate_size=128)), x) == "linear_gelu"
    assert _family(nn.LayerNorm(64), x) == "layer_norm"
    assert _family(nn.Linear(64, 64), x) is None


def test_binding_names_the_modules_own_attributes():
    found = match_call(ScaledNorm(32), (torch.randn(3, 32),), {})
    assert found is not None and found.family == "rms_norm"
    assert "rms_norm(x, module.scale, module.epsilon)" in found.glue()
    tanh = match_call(LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=128,
                                           hidden_act="gelu_pytorch_tanh")), (torch.randn(2, 64),), {})
    assert tanh is not None and tanh.arguments[-1] == ("literal", "gelu_tanh")
    silu = match_call(LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=128)), (torch.randn(2, 64),), {})
    assert silu is not None and silu.arguments[-1] == ("literal", "silu")  # same class, other activation


def test_other_computations_and_dtypes_do_not_match():
    assert _family(SqrtNorm(32), torch.randn(3, 32)) is None
    # in bfloat16 T5's norm multiplies in the weight's dtype, unlike Llama's: no longer the same computation
    xb = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    assert _family(LlamaRMSNorm(64).to(torch.bfloat16), xb) == "rms_norm"
    assert _family(T5LayerNorm(64).to(torch.bfloat16), xb) is None
    assert match_call(LlamaRMSNorm(64), (torch.randn(2, 64),), {"extra": 1}) is None


class PostNormResidual(nn.Module):
    """A user's own BertSelfOutput: other names, the residual add before the norm, no dropout."""

    def __init__(self, inner: int, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(inner, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-6)

    def forward(self, h: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.norm(skip + self.proj(h))


class NormThenAdd(PostNormResidual):
    """The add after the norm: another computation."""

    def forward(self, h: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(h)) + skip


class HandLayerNorm(nn.Module):
    """LayerNorm written out with var and sqrt: not what nn.LayerNorm's kernel computes (its rounding differs)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma, self.beta, self.eps = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim)), 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.gamma + self.beta


def test_layer_norms_match_by_structure():
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    from transformers.models.vit.modeling_vit import ViTLayer
    x = torch.randn(2, 5, 64)
    block = GPT2Block(GPT2Config(n_embd=64, n_head=4))
    for ln in (block.ln_1, block.ln_2, ViTLayer(_vit_config()).layernorm_before):
        found = match_call(ln.eval(), (x,), {})
        assert found is not None and found.family == "layer_norm"
        assert "layer_norm(x, module.weight, module.bias, module.eps)" in found.glue()
    assert _family(nn.LayerNorm(64).to(torch.bfloat16), x.to(torch.bfloat16)) == "layer_norm"
    assert _family(nn.LayerNorm(64, bias=False), x) is None  # one 1-D tensor: no bias to bind
    assert _family(nn.LayerNorm(64, elementwise_affine=False), x) is None
    assert _family(HandLayerNorm(64), x) is None


def _vit_config():
    from transformers import ViTConfig
    return ViTConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4)


def test_residual_layer_norms_take_two_inputs():
    from transformers import RobertaConfig
    from transformers.models.bert.modeling_bert import BertOutput, BertSelfOutput
    from transformers.models.roberta.modeling_roberta import RobertaSelfOutput
    cfg = BertConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4)
    h, r = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    for module, x in ((BertSelfOutput(cfg), h), (BertOutput(cfg), torch.randn(2, 5, 96)),
                      (RobertaSelfOutput(RobertaConfig(hidden_size=64, num_attention_heads=4)), h)):
        found = match_call(module.eval(), (x, r), {})
        assert found is not None and found.family == "linear_add_layer_norm", type(module).__name__
        assert found.arguments == (("tensor", "dense.weight"), ("tensor", "dense.bias"), ("tensor", "LayerNorm.weight"),
                                   ("tensor", "LayerNorm.bias"), ("attr", "LayerNorm.eps"))
        assert "def forward(module, x, residual):\n    return linear_add_layer_norm(x, residual, module.dense.weight" \
            in found.glue()
    own = match_call(PostNormResidual(96, 64).eval(), (torch.randn(3, 96), torch.randn(3, 64)), {})
    assert own is not None and own.family == "linear_add_layer_norm"
    assert own.arguments[-1] == ("attr", "norm.eps") and own.arguments[0] == ("tensor", "proj.weight")
    # near misses: the add after the norm; a residual that broadcasts (the memo keeps the two calls apart);
    # one input where the family takes two; a keyword argument
    assert match_call(NormThenAdd(96, 64).eval(), (torch.randn(3, 96), torch.randn(3, 64)), {}) is None
    bert = BertSelfOutput(cfg).eval()
    assert match_call(bert, (h, torch.randn(1, 5, 64)), {}) is None
    assert match_call(bert, (h, r), {}) is not None
    assert match_call(bert, (h,), {}) is None
    assert match_call(bert, (h,), {"input_tensor": r}) is None


def test_several_inputs_sweep_and_share_rows_keys():
    from metal_accel.core.keys import generic_key
    from metal_accel.core.specs import InputSpec
    from metal_accel.proof.testdata import rows_sweep_specs
    one = InputSpec.of((torch.randn(2, 7, 96),))
    two = InputSpec.of((torch.randn(2, 7, 128), torch.randn(2, 7, 96)))
    assert [[t.shape for t in s.tensor_specs()] for s in rows_sweep_specs(two)] == \
        [[(1, 1, 128), (1, 1, 96)], [(2, 15, 128), (2, 15, 96)]]
    other_rank = InputSpec.of((torch.randn(5, 128), torch.randn(5, 96)))
    assert generic_key("f", two, "cpu") != generic_key("f", other_rank, "cpu")
    same_rank = InputSpec.of((torch.randn(1, 3, 128), torch.randn(1, 3, 96)))
    assert generic_key("f", two, "cpu") == generic_key("f", same_rank, "cpu") != generic_key("f", one, "cpu")
    broadcast = InputSpec.of((torch.randn(2, 7, 128), torch.randn(1, 7, 96)))
    assert generic_key("f", broadcast, "cpu") is None and rows_sweep_specs(broadcast) == []
    assert generic_key("f", InputSpec.of((torch.randn(2, 7, 96),), {"k": torch.randn(2)}), "cpu") is None


@pytest.fixture
def fixture_kernels(monkeypatch, tmp_path):
    """The library reads its kernel files from a copy of tests/fixtures/library."""
    root = tmp_path / "kernels"
    shutil.copytree(FIXTURES, root)
    monkeypatch.setattr(library_sources, "KERNELS", root)
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    library_provider.kernel_file.cache_clear()
    yield root
    library_provider.kernel_file.cache_clear()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm_a = LlamaRMSNorm(96)
        self.norm_b = ScaledNorm(96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_b(self.norm_a(x) + x)


@pytest.mark.needs_cxx
def test_optimize_installs_library_kernels_for_real_and_user_classes(fixture_kernels):
    model = Block().eval()
    with torch.no_grad():
        model.norm_a.weight.normal_()
    x = torch.randn(2, 7, 96)
    with torch.inference_mode():
        want = model(x)
        metal_accel.optimize(model, (x,), backend="cpu", margin=-0.9, end_to_end=False)
        got = model(x)
    rows = {m.name: m for m in metal_accel.explain(model).modules}
    for name in ("norm_a", "norm_b"):
        assert rows[name].status == "kernel", rows[name].reason
        assert rows[name].source == "library:rms_norm"
    torch.testing.assert_close(got, want)


@pytest.mark.needs_cxx
def test_a_wrong_library_kernel_is_rejected(fixture_kernels):
    path = fixture_kernels / "cpu" / "rms_norm.py"
    path.write_text(path.read_text().replace("ss / (float)dim + eps", "ss / (float)dim + 2 * eps"))
    model = nn.Sequential(LlamaRMSNorm(64, eps=1e-2)).eval()
    x = torch.randn(4, 64)
    with torch.inference_mode():
        metal_accel.optimize(model, (x,), backend="cpu", margin=-0.9, end_to_end=False)
    row = next(m for m in metal_accel.explain(model).modules if m.name == "0")
    assert row.status == "eager"
    assert any(r.startswith("library:rms_norm") for r in row.rejected), row.rejected


def test_library_sources_are_trusted_like_shipped_kernels(fixture_kernels, monkeypatch):
    from metal_accel.runtime import native_policy
    monkeypatch.delenv("METAL_ACCEL_TRUST_NATIVE", raising=False)
    library_sources.library_sources.cache_clear()
    try:
        text = (fixture_kernels / "cpu" / "rms_norm.py").read_text()
        source = text.split('SOURCE = r"""', 1)[1].split('"""', 1)[0]
        assert native_policy.is_trusted(source)
        assert not native_policy.is_trusted(source + "\n// changed")
    finally:
        library_sources.library_sources.cache_clear()


IMPORT_ALONE = """
import json, sys, torch
from pathlib import Path
import metal_accel                                  # patches the library's known classes as they are imported
import metal_accel.library.provider as provider, metal_accel.library.sources as sources
sources.KERNELS = Path({kernels!r})                 # the test's kernel files in place of the shipped ones
provider.kernel_file.cache_clear(); sources.library_sources.cache_clear()
from transformers.models.llama.modeling_llama import LlamaRMSNorm
import metal_accel.auto.hook as hook
m = LlamaRMSNorm(512).eval()
with torch.no_grad():
    m.weight.normal_()
x = torch.randn(8, 512)
with torch.inference_mode():
    ys = [m(x) for _ in range(3)]
    other = m(torch.randn(3, 512))  # another number of rows: the proof swept rows, so no new proof
auto = m.__dict__.get("_metal_accel_auto")
patched = [c.__name__ for c in hook.patched_classes()]
hook.deactivate()
with torch.inference_mode():
    ref = m(x)
print(json.dumps({{"hits": auto.hits if auto else 0, "patched": patched,
                  "max_err": max(((y - ref).abs() / (ref.abs() + 1)).max().item() for y in ys)}}))
"""


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_import_alone_runs_library_kernels_on_known_classes(fixture_kernels, isolated_user_cache):
    import json
    import os
    import subprocess
    import sys

    from limits import HANG_S
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(isolated_user_cache), "METAL_ACCEL_LIBRARY": "1"}
    script = IMPORT_ALONE.format(kernels=str(fixture_kernels))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert "LlamaRMSNorm" in res["patched"]
    assert res["hits"] == 4, out.stderr  # proven at the first call, then run from the table
    assert out.stderr.count("proving the library's") == 1, out.stderr
    assert "proving cached kernel" not in out.stderr, out.stderr  # the other row count: the generic verdict, as sealed
    assert res["max_err"] < 1e-5
    # the proof's verdict is in the user cache: a new process runs the kernel without proving it again
    again = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert again.returncode == 0 and "proving" not in again.stderr, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["hits"] == 4


@pytest.mark.needs_cxx
def test_one_proof_serves_every_leading_shape(fixture_kernels):
    """The proof sweeps other leading dimensions (one row, an odd count); then a new batch or a decode step's
    shape installs the kernel without a new proof."""
    model = nn.Sequential(LlamaRMSNorm(96)).eval()
    with torch.inference_mode():
        metal_accel.optimize(model, (torch.randn(2, 7, 96),), backend="cpu", margin=-0.9, end_to_end=False)
    first = next(m for m in metal_accel.explain(model).modules if m.name == "0")
    assert first.status == "kernel" and first.source == "library:rms_norm"
    from metal_accel.store import cache as cache_mod
    entries = [e for e in cache_mod.user_cache().entries("cpu") if e.candidate is not None]
    swept = [v.details.get("sweep", {}).get("shapes") for e in entries for v in e.verdicts.values()]
    assert [[1, 1, 96], [2, 15, 96]] in swept
    for shape in ((1, 1, 96), (5, 3, 96)):
        x = torch.randn(*shape)
        with torch.inference_mode():
            want = model[0](x)
            metal_accel.optimize(model, (x,), backend="cpu", margin=-0.9, end_to_end=False)
            got = model(x)
        row = next(m for m in metal_accel.explain(model).modules if m.name == "0")
        assert row.status == "kernel" and "shape-generic, proven at 2x7x96" in row.source, row.source
        torch.testing.assert_close(got, want)


class BertTail(nn.Module):
    """A BERT layer's attention output followed by a final norm: a two-input call and a plain nn.LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.models.bert.modeling_bert import BertSelfOutput
        self.out = BertSelfOutput(BertConfig(hidden_size=96, intermediate_size=128, num_attention_heads=4))
        self.ln_f = nn.LayerNorm(96)
        with torch.no_grad():
            for p in (self.out.LayerNorm.weight, self.out.LayerNorm.bias, self.ln_f.weight, self.ln_f.bias):
                p.normal_(0.5, 0.3)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.ln_f(self.out(h, residual))


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_the_shipped_layer_norm_kernels_are_proven_for_two_input_calls(monkeypatch):
    """The shipped CPU kernels through the library provider: BertSelfOutput(hidden, residual) gets the fused
    add + LayerNorm, its glue taking both inputs; the proof sweeps both inputs' rows together, so another batch
    and sequence length install it from the shape-generic key."""
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    model = BertTail().eval()
    h, r = torch.randn(2, 7, 96), torch.randn(2, 7, 96)
    with torch.inference_mode():
        want = model(h, r)
        metal_accel.optimize(model, (h, r), backend="cpu", margin=-0.9, end_to_end=False)
        got = model(h, r)
    rows = {m.name: m for m in metal_accel.explain(model).modules}
    assert rows["out"].status == "kernel" and rows["out"].source == "library:linear_add_layer_norm", rows["out"]
    # nn.LayerNorm's own CPU kernel is already one pass: proven (timed only after the proof), installed when faster
    ln_f = rows["ln_f"]
    assert ln_f.kernel_us is not None and not any("incorrect" in r for r in ln_f.rejected), ln_f
    assert ln_f.status == "eager" or ln_f.source == "library:layer_norm"
    torch.testing.assert_close(got, want)
    from metal_accel.store import cache as cache_mod
    swept = [v.details.get("sweep", {}).get("shapes") for e in cache_mod.user_cache().entries("cpu")
             if e.candidate is not None and "linear_add_layer_norm" in e.candidate.origin for v in e.verdicts.values()]
    assert [[1, 1, 96], [2, 15, 96]] in swept
    h2, r2 = torch.randn(3, 4, 96), torch.randn(3, 4, 96)
    with torch.inference_mode():
        want = model(h2, r2)
        metal_accel.optimize(model, (h2, r2), backend="cpu", margin=-0.9, end_to_end=False)
        got = model(h2, r2)
    row = next(m for m in metal_accel.explain(model).modules if m.name == "out")
    assert row.status == "kernel" and "shape-generic, proven at 2x7x96" in row.source, row.source
    torch.testing.assert_close(got, want)


def test_catalog_and_doctor_say_which_kernels_apply_here(capsys, monkeypatch):
    from metal_accel.cli.main import main as cli_main
    from metal_accel.library.catalog import catalog
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    rows = {c.family: c for c in catalog()}
    assert set(rows) >= {"rms_norm", "gated_mlp", "gelu_tanh", "gpt2_mlp", "linear_gelu", "mlp"}
    assert "LlamaRMSNorm" in rows["rms_norm"].classes and "mps" in rows["rms_norm"].backends
    # the routed computations (below modules the library cannot replace) are listed too, with no class
    assert set(rows["rotary"].backends) == {"cpu", "cuda", "mps"} and not rows["rotary"].classes
    assert "cuda" in rows["attention_decode"].backends
    assert cli_main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "library rms_norm" in out and "LlamaRMSNorm" in out and "library rotary" in out


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_the_model_compiled_whole_carries_installed_kernels_as_custom_ops(fixture_kernels):
    """Issue 29 item 4: the library's kernels are custom ops with fake implementations, so the whole model
    compiled around them keeps them in its graph; that variant is proven like the plain one."""
    from metal_accel.runtime.dispatch import eager_forward
    from metal_accel.whole_model import prove_whole_model
    model = Block().eval()
    x = torch.randn(2, 7, 96)
    with torch.inference_mode():
        metal_accel.optimize(model, (x,), backend="cpu", margin=-0.9, end_to_end=False)
    assert all(metal_accel.explain(model).modules[i].status == "kernel" for i in (1, 2))
    torch._dynamo.reset()
    with torch.inference_mode():
        explained = torch._dynamo.explain(eager_forward(model))(x)
    graphs = "\n".join(g.code for g in explained.graphs)
    assert graphs.count("torch.ops.metal_accel.k_") == 2, graphs
    with torch.inference_mode():
        op, why = prove_whole_model(model, (x,), {}, torch.device("cpu"), with_kernels=True)
        assert op is not None and op.with_kernels, why
        from metal_accel.candidates.compile import compiled_graphs
        op((x,), {}, [])
        graphs_after_first = compiled_graphs()
        for _ in range(10):  # the dispatchers' call counters must not make dynamo recompile each call
            op((x,), {}, [])
        assert compiled_graphs() == graphs_after_first


def test_the_library_page_lists_the_kernels_that_ship():
    from metal_accel.library.catalog import markdown_table
    page = (Path(__file__).parent.parent / "docs" / "library.md").read_text()
    assert markdown_table() in page, "docs/library.md: paste library.catalog.markdown_table() into its table"


def _zoo_modules() -> dict[str, nn.Module]:
    from transformers import ViTConfig
    from transformers.models.bert.modeling_bert import BertOutput
    from transformers.models.vit.modeling_vit import ViTMLP
    llama = LlamaConfig(hidden_size=48, intermediate_size=100, num_attention_heads=4, num_key_value_heads=2)
    return {"rms_norm": LlamaRMSNorm(48), "gated_mlp": LlamaMLP(llama), "gelu_tanh": NewGELUActivation(),
            "gpt2_mlp": GPT2MLP(100, GPT2Config(n_embd=48)),
            "linear_gelu": BertIntermediate(BertConfig(hidden_size=48, intermediate_size=100, num_attention_heads=4)),
            "mlp": ViTMLP(ViTConfig(hidden_size=48, intermediate_size=100, num_attention_heads=4)),
            "layer_norm": _affine(nn.LayerNorm(48)),
            "linear_add_layer_norm": BertOutput(BertConfig(hidden_size=48, intermediate_size=100,
                                                           num_attention_heads=4))}


def _affine(ln: nn.LayerNorm) -> nn.LayerNorm:
    with torch.no_grad():  # nn.LayerNorm starts at ones and zeros: give weight and bias values to apply
        ln.weight.normal_(1.0, 0.3)
        ln.bias.normal_(0.0, 0.3)
    return ln


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("family", ["rms_norm", "gated_mlp", "gelu_tanh", "gpt2_mlp", "linear_gelu", "mlp",
                                    "layer_norm", "linear_add_layer_norm"])
def test_every_shipped_metal_kernel_is_proven_through_the_library(family, monkeypatch):
    """The shipped Metal kernels, matched, bound and proven by the library itself on the emulated device."""
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    model = _zoo_modules()[family].eval()
    two = family == "linear_add_layer_norm"  # BertOutput(hidden_states, input_tensor)
    xs = (torch.randn(2, 5, 100), torch.randn(2, 5, 48)) if two else (torch.randn(2, 5, 48),)
    with torch.inference_mode():
        want = model(*xs)
        metal_accel.optimize(model, xs, backend="mps-emu", end_to_end=False)
        got = model(*xs)
    row = next(m for m in metal_accel.explain(model).modules if m.name == type(model).__name__)
    if family in ("layer_norm", "linear_add_layer_norm") and row.status == "eager":
        # seen once in a fresh-check: a special-values draw with a constant row over 2^48, where the kernel's float
        # mean (one ulp off) normalized to +-1 and float64 gives the bias; the proof rejected it and eager ran.
        # Fixed (huge_row; test_library_mps.py::test_layer_norm_rows_where_float32_moments_break_down checks
        # it); kept tolerant of that one rejection until fresh-checks confirm no other cause. Anything else fails.
        assert all("(special inputs)" in r for r in row.rejected), (row.reason, row.rejected)
        torch.testing.assert_close(got, want)
        return
    assert row.status == "kernel" and row.source == f"library:{family}", (row.reason, row.rejected)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_patched_class_without_a_kernel_for_its_backend_stops_asking(fixture_kernels, monkeypatch):
    """import-alone patches NewGELUActivation (it computes gelu_tanh), but the library here has no CPU kernel for
    gelu_tanh: after its first call the module's dispatcher goes straight to the original forward."""
    import metal_accel.auto.hook as hook
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    try:
        hook.activate()
        assert NewGELUActivation in hook.patched_classes()
        act = NewGELUActivation().eval()
        x = torch.randn(4, 8)
        with torch.inference_mode():
            want = 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))
            torch.testing.assert_close(act(x), want)
            act(torch.randn(3, 8))
        disp = act.__dict__["_metal_accel_auto"]
        assert disp.resolver is None and not disp.table
    finally:
        hook.deactivate()
