"""Host code that is not the package's own gets zeroed memory from torch.empty and its kind (red-team pass 3: host
code kept a call counter in the block the allocator handed back, call after call, and turned wrong after N calls
with no native code at all); a proof's "plain" fill shows the same zeros, its other fills stay stale-looking."""
from __future__ import annotations

import torch

from metal_accel.proof.trial_buffers import proof_call
from metal_accel.sandbox.host import load_forward

COUNTER = '''
def forward(module, x):
    s = torch.empty(4096, dtype=torch.float64)
    seen = s[100].item()
    s[100] = 7.0
    t = torch.empty_like(x)
    u = torch.empty_strided((64,), (1,), dtype=torch.float32)
    return x * 0.0 + seen + t.abs().sum() + u.abs().sum()
'''


def test_untrusted_host_code_sees_no_earlier_call_in_its_allocations() -> None:
    forward = load_forward(COUNTER, lib=None)  # the default: not the package's own
    x = torch.ones(32)
    seen = {forward(None, x)[0].item() for _ in range(200)}
    assert seen == {0.0}


def test_proof_plain_fill_is_zeros_like_production() -> None:
    forward = load_forward(COUNTER, lib=None, proof=True)
    x = torch.ones(32)
    with proof_call("plain", [x]):
        assert forward(None, x)[0].item() == 0.0
    with proof_call("noise", [x]):
        assert forward(None, x)[0].item() != 0.0  # an unwritten output still shows in a proof


def test_package_own_host_code_gets_plain_memory(monkeypatch) -> None:
    calls = []
    real = torch.Tensor.zero_

    def spy(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.numel())
        return real(t)
    monkeypatch.setattr(torch.Tensor, "zero_", spy)
    load_forward(COUNTER, lib=None, zeroed=False)(None, torch.ones(32))
    assert not calls  # no memset on the package's own kernels' path
    load_forward(COUNTER, lib=None)(None, torch.ones(32))
    assert sorted(calls) == [32, 64, 4096]
