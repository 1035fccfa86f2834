"""The demo model (metal_accel.demo) and the shipped CPU kernel candidates written for it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from metal_accel import demo

KERNELS = Path(__file__).resolve().parent.parent / "kernels_src" / "cpu"


def test_build_is_deterministic():
    a, b, c = demo.build_demo_model(0), demo.build_demo_model(0), demo.build_demo_model(1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert all(t.dtype == torch.float32 for t in sa.values())
    assert not a.training


def test_forward_shapes_and_inputs():
    model = demo.build_demo_model()
    (ids,) = demo.demo_inputs()
    assert ids.dtype == torch.int64 and ids.shape == (demo.DEFAULT_BATCH, demo.DEFAULT_SEQ)
    assert torch.equal(ids, demo.demo_inputs()[0])
    with torch.no_grad():
        logits = model(ids)
    assert logits.shape == (*ids.shape, demo.DEFAULT_CONFIG["vocab"]) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_attention_is_causal():
    model = demo.build_demo_model()
    (ids,) = demo.demo_inputs(batch=1, seq=16)
    changed = ids.clone()
    changed[0, 10] = (changed[0, 10] + 1) % demo.DEFAULT_CONFIG["vocab"]
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.equal(a[:, 10:], b[:, 10:])


def test_rmsnorm_formula():
    norm = demo.RMSNorm(8)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 9.0))
    x = torch.randn(3, 8)
    ref = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), ref)


def _module(name: str, model: demo.TinyLlama) -> torch.nn.Module:
    block = model.blocks[0]
    return {"RMSNorm": block.norm1, "MLP": block.mlp, "Attention": block.attn, "DecoderBlock": block}[name]


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("name", ["RMSNorm", "MLP", "Attention", "DecoderBlock"])
def test_kernel_candidates_match_eager(name):
    """Each candidate passes the source and host checks, compiles, and matches eager closely on
    several shapes (few rows, padded panels, batches) and magnitudes; every output is written."""
    from metal_accel.backends.cpu.backend import CpuBackend
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.runtime.ops import ModuleLayout
    from metal_accel.proof.prove import kernels_only
    from metal_accel.sandbox.host import check_host_code, load_forward
    from metal_accel.sandbox.kernel_source import check_kernel_source

    backend = CpuBackend()
    cand = parse_candidate((KERNELS / f"{name}.py").read_text(), "cpu")
    check_host_code(cand.code)
    check_kernel_source(cand.source, "c++")
    forward = load_forward(cand.code, kernels_only(backend.compile(cand.source)), poison=True)
    gen = torch.Generator().manual_seed(0)
    for config in ({}, {"dim": 96, "hidden": 200, "n_heads": 3, "max_seq": 40}):
        module = _module(name, demo.build_demo_model(seed=1, **config))
        layout = ModuleLayout(module)
        view = layout.view(layout.gather())
        dim = module.weight.shape[0] if name == "RMSNorm" else 96 if config else demo.DEFAULT_CONFIG["dim"]
        for batch, seq in ((1, 32), (1, 1), (3, 5), (2, 17), (1, 40)):
            for scale in (1.0, 64.0, 1e-3):
                x = torch.randn(batch, seq, dim, generator=gen) * scale
                with torch.no_grad():
                    ref = module(x)
                out = forward(view, x.clone())
                assert out.shape == ref.shape and out.dtype == ref.dtype
                assert not torch.isnan(out).any(), "unwritten (poisoned) output elements"
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                assert err <= 1e-5, f"{name} {config} {(batch, seq)} x{scale}: relative error {err:.2e}"
