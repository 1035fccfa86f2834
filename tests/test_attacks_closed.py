"""Attacks found by a red-team pass over the trust layers, each closed: host code that launders a tensor it does
not own past the in-place check, a trigger on a view's storage offset, a bundle entry naming a path, a source
check in quadratic time, and an untrusted kernel's claim to serve every shape taken on trust."""
from __future__ import annotations

import json

import pytest
import torch

import metal_accel
from metal_accel.core.errors import CacheError, SandboxError
from metal_accel.core.specs import InputSpec, call_signature
from metal_accel.sandbox.host import check_host_code
from metal_accel.sandbox.kernel_source import MAX_SOURCE_CHARS, SourceCheckError, check_kernel_source
from metal_accel.store import cache as cache_mod

from test_optimize import candidates
from toymodels import CHAIN_HOST, GOOD, Net

HEAD = 'SOURCE = r"""extern "C" void k(float* x) {}"""\n'

LAUNDERED = {
    "sum of a list holding the input": "def forward(module, x):\n    a = sum([[x]], [])\n    a[0].add_(1)\n    return x\n",
    "sum of the weight": "def forward(module, x):\n    a = sum([[module.scale]], [])\n    a[0].mul_(0)\n    return x\n",
    "tuple concatenation of *inputs": "def forward(module, *inputs):\n    a = inputs + ()\n    a[0].add_(1)\n"
                                      "    return inputs[0]\n",
    "tuple repetition of *inputs": "def forward(module, *inputs):\n    a = inputs * 1\n    a[0].zero_()\n"
                                   "    return inputs[0]\n",
    "relu with inplace by position": "def forward(module, x):\n    return torch.nn.functional.relu(x, True)\n",
    "relu of the weight by position": "def forward(module, x):\n    torch.nn.functional.relu(module.scale, True)\n"
                                      "    return x\n",
    "batch_norm updating running stats": "def forward(module, x):\n    return torch.nn.functional.batch_norm(x, "
                                         "module.running_mean, module.running_var, None, None, True)\n",
    "batch_norm training by keyword": "def forward(module, x):\n    return torch.nn.functional.batch_norm(x, "
                                      "module.running_mean, module.running_var, training=True)\n",
    # a second pass
    "a parameter named like a constant": "x = 0\n\n\ndef forward(module, x):\n    x.fill_(7)\n    return x\n",
    "a local named like a constant": "w = 0\n\n\ndef forward(module, x):\n    w = module.scale\n    w.mul_(0)\n"
                                     "    return x\n",
    "unary plus of the weight": "def forward(module, x):\n    y = +module.scale\n    y.mul_(0)\n    return x\n",
    "embedding renormalizing the weight": "def forward(module, x):\n    return torch.nn.functional.embedding(x, "
                                          "module.scale, None, 0.0)\n",
    "embedding with max_norm by keyword": "def forward(module, x):\n    return F.embedding(x, module.scale, "
                                          "max_norm=1.0)\n",
}


@pytest.mark.parametrize("name", sorted(LAUNDERED))
def test_host_code_cannot_launder_a_tensor_it_does_not_own_into_an_in_place_update(name):
    with pytest.raises(SandboxError, match="in-place|inplace=|training=|max_norm=|rebound"):
        check_host_code(HEAD + LAUNDERED[name])


@pytest.mark.parametrize("body", [
    "    y = x * 2.0\n    return torch.nn.functional.relu(y, True)\n",   # a tensor the function made
    "    return torch.nn.functional.relu(x, False)\n",
    "    return torch.nn.functional.batch_norm(x, module.running_mean, module.running_var, None, None, False)\n",
    "    out = torch.empty_like(x)\n    out.add_(1)\n    return out\n",
    "    return torch.nn.functional.embedding(x, module.scale, None, None)\n",
    "    y = -x\n    y.add_(1)\n    return y\n",
])
def test_host_code_that_changes_only_its_own_tensors_still_passes(body):
    check_host_code(HEAD + "def forward(module, x):\n" + body)


def test_a_view_at_a_storage_offset_is_another_call_signature():
    """Proofs run inputs that start their storage; a call with a view elsewhere in a storage (chunk, split, a
    slice) does not match the proven signature, so eager runs it (host code or a kernel that behaves otherwise at
    an offset, or on a pointer aligned otherwise, was never tried there)."""
    x = torch.randn(4, 8)
    view = torch.randn(64)[8:40].view(4, 8)
    assert call_signature((x,), {}) == InputSpec.of((x,)).signature()
    assert call_signature((view,), {}) != InputSpec.of((x,)).signature()
    assert call_signature(((x, view),), {}) != InputSpec.of(((x, x),)).signature()  # inside containers too


OFFSET_TRIGGER = '''
def forward(module, x):
    out = torch.empty_like(x)
    n = x.shape[-1]
    lib.chain(x.contiguous(), module.scale, out, x.numel() // n, n, module.shift)
    if x.storage_offset() > 0:
        return out * 2.0
    return out
'''


def test_host_code_wrong_only_at_a_storage_offset_never_gives_the_user_a_wrong_answer(tmp_path):
    model = Net().eval()
    x = torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, bad=GOOD.replace(CHAIN_HOST, OFFSET_TRIGGER))],
                         margin=-0.9, end_to_end=False, progress=False)
    ref = Net().eval()
    ref.load_state_dict(model.state_dict())
    view = torch.randn(8 * 256)[256:256 + 4 * 256].view(4, 256)
    with torch.inference_mode():
        torch.testing.assert_close(model.chain(view), ref.chain(view), rtol=1e-4, atol=1e-4)


ROWS_TRIGGER = '''
SHAPE_GENERIC = "rows"


def forward(module, x):
    out = torch.empty_like(x)
    n = x.shape[-1]
    lib.chain(x.contiguous(), module.scale, out, x.numel() // n, n, module.shift)
    if x.shape[0] >= 32:
        return out * 1.01
    return out
'''


def test_an_untrusted_shape_generic_kernel_is_proven_at_each_new_shape(tmp_path):
    """Proven at 4 rows (its sweep tries 1 and 9 too) and wrong from 32 rows on: a later optimize() at 64 rows
    proves it there instead of installing it on its claim."""
    first = Net().eval()
    metal_accel.optimize(first, (torch.randn(4, 256),), margin=-0.9, end_to_end=False, progress=False,
                         providers=[candidates(tmp_path, rows=GOOD.replace(CHAIN_HOST, ROWS_TRIGGER))])
    second, ref = Net().eval(), Net().eval()
    ref.load_state_dict(second.state_dict())
    x64 = torch.randn(64, 256)
    metal_accel.optimize(second, (x64,), margin=-0.9, end_to_end=False, progress=False)
    chain = next(m for m in metal_accel.explain(second).modules if m.name == "chain")
    assert chain.status == "eager" and any("shape-generic" in r and "incorrect" in r for r in chain.rejected), chain
    with torch.inference_mode():
        torch.testing.assert_close(second(x64), ref(x64))


@pytest.mark.parametrize("field,value", [("backend", "../../elsewhere"), ("backend", "cpu/../../x"),
                                         ("key", "../" + "0" * 29), ("key", "0" * 31 + "/")])
def test_a_cache_entry_cannot_name_a_path(field, value, tmp_path):
    doc = {"format_version": cache_mod.FORMAT_VERSION, "key": "0" * 32, "backend": "cpu", "module_class": "m",
           "module_fingerprint": "f", "input_spec": {"args": [], "kwargs": []}, "candidate": None}
    doc[field] = value
    with pytest.raises(CacheError, match="unknown backend|malformed entry key"):
        cache_mod.CacheEntry.from_dict(json.loads(json.dumps(doc)))
    with pytest.raises(CacheError):
        cache_mod.CacheDir(tmp_path, writable=True, name="user").path_for(doc["backend"], doc["key"])


def test_the_source_check_reads_attributes_in_one_pass_and_caps_the_source():
    opener_soup = "[[ a " * 20000  # unclosed openers: each once tried to the end of the text
    check_kernel_source(opener_soup + "\nextern \"C\" void k(float* x) { x[0] = 1; }", "c++")
    with pytest.raises(SourceCheckError, match="constructor"):  # an attribute after them is still read
        check_kernel_source(opener_soup + ";\n[[gnu::constructor]] void f() {}", "c++")
    with pytest.raises(SourceCheckError, match="characters long"):
        check_kernel_source("//" + "x" * MAX_SOURCE_CHARS, "c++")


def test_a_swapped_artifact_with_a_rewritten_build_record_is_not_loaded(tmp_path, monkeypatch):
    """The record beside a compiled library names its sha256; rewriting both to match another library (one that
    passes the binary check: metal_accel built it for a wrong candidate) loaded it with the proven kernel's sealed
    verdict. The record is sealed with this user's key now, and so is a CUDA module beside its seal file."""
    from metal_accel.backends import artifact
    from metal_accel.backends.cuda import backend as cuda_backend
    from metal_accel.sandbox.binary_check import sha256_of
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path / "config"))
    lib = tmp_path / "kernel.so"
    lib.write_bytes(b"the proven kernel")
    rec = {"sha256": sha256_of(lib), "backend": "cpu", "binary_check": "",
           "seal": artifact.attest.seal_artifact(lib.name, sha256_of(lib))}
    artifact.record_path(lib).write_text(json.dumps(rec))
    assert artifact._problem(lib, None, None, recheck=False) is None  # type: ignore[arg-type]
    lib.write_bytes(b"another library")
    artifact.record_path(lib).write_text(json.dumps({**rec, "sha256": sha256_of(lib)}))
    assert "seal" in artifact._problem(lib, None, None, recheck=False)  # type: ignore[arg-type,operator]

    module = tmp_path / "k.cubin"
    module.write_bytes(b"proven module")
    cuda_backend._seal_path(module).write_text(artifact.attest.seal_artifact(module.name, cuda_backend._sha256(b"proven module")))
    assert cuda_backend._sealed(module)
    module.write_bytes(b"another module")
    assert not cuda_backend._sealed(module)


def test_inside_a_users_torch_compile_the_kernel_stays_one_graph_and_never_sees_an_offset(tmp_path):
    """dynamo breaks its graph on `storage_offset()`, so the traced dispatcher keys the call without offsets (one
    graph, the kernel's custom op in it); the op copies an input at an offset to one that starts its storage, so
    host code wrong only at an offset still gives the right answer there."""
    import torch._dynamo
    model = Net().eval()
    x = torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, bad=GOOD.replace(CHAIN_HOST, OFFSET_TRIGGER))],
                         margin=-0.9, end_to_end=False, progress=False)
    assert next(m for m in metal_accel.explain(model).modules if m.name == "chain").status == "kernel"
    ref = Net().eval()
    ref.load_state_dict(model.state_dict())
    with torch.inference_mode():
        explained = torch._dynamo.explain(model.chain)(x)
        assert explained.graph_count == 1 and explained.graph_break_count == 0
        compiled = torch.compile(model.chain, backend="eager", dynamic=False)
        view = torch.randn(8 * 256)[256:256 + 4 * 256].view(4, 256)
        torch.testing.assert_close(compiled(view), ref.chain(view), rtol=1e-4, atol=1e-4)


def test_a_top_level_constant_may_be_set_again_at_top_level():
    """A library kernel file declares SHAPE_GENERIC and its generated glue declares it again: still a constant."""
    check_host_code(HEAD + 'SHAPE_GENERIC = "rows"\nSHAPE_GENERIC = "rows"\n\n\ndef forward(module, x):\n'
                    "    y = x * 2.0\n    return y\n")
