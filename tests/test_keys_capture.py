"""Keys and capture: what a kernel is specialized on, and which calls may get one."""
from __future__ import annotations

import torch
from torch import nn

from metal_accel.runtime.capture import MAX_COMPOSITE_MODULES, capture
from metal_accel.core.keys import entry_key, module_fingerprint
from metal_accel.core.specs import InputSpec, OutputSpec, call_signature

from toymodels import Chain, Net


def test_fingerprint_is_stable_across_instances_and_weights():
    a, b = Chain(256), Chain(256)
    with torch.no_grad():
        b.scale.mul_(3)
    assert module_fingerprint(a) == module_fingerprint(b)


def test_fingerprint_changes_with_config_shapes_mode_and_children():
    base = module_fingerprint(Chain(256))
    c = Chain(256)
    c.shift = 0.5
    assert module_fingerprint(c) != base
    assert module_fingerprint(Chain(128)) != base
    assert module_fingerprint(Chain(256).train(False)) != base  # `training` is part of the config
    n1, n2 = Net(256), Net(256)
    n2.chain.shift = 0.0
    assert module_fingerprint(n1) != module_fingerprint(n2)


def test_input_spec_key_tracks_shape_dtype_strides_and_scalars():
    x = torch.randn(4, 8)
    keys = {InputSpec.of((x,)).key, InputSpec.of((x.double(),)).key, InputSpec.of((torch.randn(4, 9),)).key,
            InputSpec.of((x.t(),)).key, InputSpec.of((x, 1)).key, InputSpec.of((x, 2)).key,
            InputSpec.of((x,), {"dim": 1}).key}
    assert len(keys) == 7
    assert InputSpec.of((x,)).key == InputSpec.of((torch.zeros(4, 8),)).key  # values are not part of the key


def test_runtime_signature_matches_spec_signature():
    x, ids = torch.randn(2, 3), torch.tensor([3, 7])
    spec = InputSpec.of((x, ids, 0.5, (1, 2)), {"dim": -1})
    assert spec.signature() == call_signature((x, ids, 0.5, (1, 2)), {"dim": -1})
    assert InputSpec.from_dict(spec.to_dict()) == spec
    assert spec.args[1].value_range == (3, 7)


def test_entry_key_depends_on_backend():
    spec = InputSpec.of((torch.randn(2, 2),))
    assert entry_key("f" * 64, spec, "cpu") != entry_key("f" * 64, spec, "mps")


def test_output_spec():
    assert OutputSpec.of(torch.zeros(2)).single
    out = OutputSpec.of((torch.zeros(2), torch.zeros(3, dtype=torch.int64)))
    assert not out.single and out.tensors[1].dtype == "int64"
    assert OutputSpec.from_dict(out.to_dict()) == out


class Big(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(MAX_COMPOSITE_MODULES + 1))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x, {"not": "a tensor"}


def test_capture_records_calls_hottest_first_and_marks_unsupported():
    model = Net(64)
    calls = capture(model, (torch.randn(3, 64),))
    names = [c.name for c in calls]
    assert set(names) == {"Net", "chain", "proj"} and names[0] == "Net"
    chain = next(c for c in calls if c.name == "chain")
    assert chain.replaceable and chain.calls == 1 and chain.eager_s > 0  # one timed run by default
    assert chain.spec.describe() == "float32[3,64]"

    calls = {c.name: c for c in capture(Big(), (torch.randn(2, 4),))}
    assert "composite of" in calls["Big"].compile_only  # too large for a prompt (and its output is no tensor)
    assert not calls["layers.0"].compile_only
    assert calls["layers.0"].replaceable


def test_capture_rejects_non_tensor_outputs_and_user_hooks():
    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return {"y": self.lin(x), "step": 1}  # a dict of tensors is replaceable; a number among outputs is not

    model = Wrap()
    model.lin.register_forward_hook(lambda m, a, o: None)
    calls = {c.name: c for c in capture(model, (torch.randn(2, 4),))}
    assert "not a tensor" in calls["Wrap"].unsupported
    assert "hooks" in calls["lin"].unsupported
    assert not model.lin._forward_pre_hooks and len(model.lin._forward_hooks) == 1  # ours removed, theirs kept
