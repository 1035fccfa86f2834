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
