"""METAL_ACCEL_RECORD on modules called with keyword arguments (issue 30, deliver 8): every argument
is recorded, and a call that cannot be replayed is reported and skipped, never raised."""
from __future__ import annotations

import json

import torch
from torch import nn

from metal_accel.auto import record


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        return x * self.w * mask


def test_keyword_arguments_are_recorded_and_a_call_that_cannot_be_replayed_is_skipped():
    m = Masked()
    record.start_recording()
    try:
        with torch.no_grad():
            m(torch.randn(2, 8), mask=torch.ones(2, 8))
    finally:
        record.stop_recording()
    (rec,) = [r for r in record.recorded_calls() if r.class_path.endswith("Masked")]
    assert [k for k, _ in rec.input_spec.kwargs] == ["mask"]

    # a recording without the keyword (as older versions wrote them): reported, not a TypeError
    path = next(p for p in record.recorded_dir().glob("*.json"))
    doc = json.loads(path.read_text())
    doc["input_spec"]["kwargs"] = []
    path.write_text(json.dumps(doc))
    (out,) = record.synthesize_recorded([], top=1, backend="cpu")
    assert isinstance(out[1], str) and out[1].startswith("skipped: cannot replay") and "TypeError" in out[1]


class Wide(nn.Module):
    """A module whose weights (4 MB) dwarf its configuration, with a small index table it needs as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(1024, 1024)
        self.register_buffer("order", torch.arange(1024).flip(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)[..., self.order]


def test_recording_keeps_specs_not_weights_and_works_out_each_spec_once(monkeypatch):
    """Issue 30: recording an HF Llama wrote 22 MB of pickled modules and slowed the forward 2x. A recording
    keeps the module's skeleton (weights on the meta device, small buffers kept), and the call's spec is
    computed once per (module, signature), not once per call."""
    made = []
    real_of = record.InputSpec.of
    monkeypatch.setattr(record.InputSpec, "of", lambda *a, **k: made.append(1) or real_of(*a, **k))
    m = Wide().eval()
    record.start_recording()
    try:
        with torch.no_grad():
            for _ in range(5):
                m(torch.randn(2, 1024))
    finally:
        record.stop_recording()
    assert len(made) == 2  # Wide and its Linear, once each, over five calls
    (rec,) = [r for r in record.recorded_calls() if r.class_path.endswith("Wide")]
    size = (record.recorded_dir() / "modules" / rec.module_file).stat().st_size
    assert size < 64 * 1024, size  # the 4 MB of weights are not in it
    copy = record.load_recorded_module(rec)
    assert not any(t.is_meta for t in list(copy.parameters()) + list(copy.buffers()))
    assert torch.equal(copy.order, m.order)  # a small buffer's values are what the forward needs
    assert copy(torch.randn(3, 1024)).shape == (3, 1024)
