"""The Metal launchers refuse a protected tensor bound where a kernel writes (red-team pass 3): the written
buffers come from the kernel's signature, read as Metal's compiler reads it (preprocessed when it has
directives), and a kernel whose signature is not read counts as writing every buffer. Runs on any machine:
the launch is a stand-in, the check is the Metal backend's own."""
from __future__ import annotations

import pytest
import torch

from metal_accel.backends.mps import backend as mps_backend
from metal_accel.backends.mps.library import MpsKernel
from metal_accel.backends.mps.written import written_buffers
from metal_accel.backends.protected import ProtectedTensors
from metal_accel.core.errors import KernelLaunchError

SRC = """#include <metal_stdlib>
using namespace metal;
kernel void scale(device const float* w [[buffer(0)]], device float* out [[buffer(1)]],
                  device float* const sneaky [[buffer(2)]], constant uint& n [[buffer(3)]],
                  uint i [[thread_position_in_grid]]) {
    if (i < n) { out[i] = w[i] * 2.0f; sneaky[i] = 0.0f; }
}
"""

# `const` defined away: the text says const, Metal's compiler sees a written pointer
HIDDEN = """#include <metal_stdlib>
using namespace metal;
#define const
kernel void zero(device const float* w [[buffer(0)]], device float* out [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) { w[i] = 0.0f; out[i] = 1.0f; }
"""


def _kernel(source: str, name: str, ran: list) -> MpsKernel:
    k = MpsKernel(name, 1024, 32, "cpu", lambda args, grid, group, casts: ran.append(args))
    k.written = written_buffers(source).get(name)
    return k


def test_written_buffers_reads_the_signature() -> None:
    assert written_buffers(SRC) == {"scale": frozenset({1, 2})}  # T* const is written through


def test_written_buffers_preprocesses_like_metal() -> None:
    assert written_buffers(HIDDEN)["zero"] == frozenset({0, 1})


def test_unread_signature_counts_every_buffer_as_written() -> None:
    assert written_buffers("kernel void broken(") == {}
    ran: list = []
    k = _kernel("kernel void broken(", "broken", ran)
    w = torch.ones(8)
    with ProtectedTensors([w], []), pytest.raises(KernelLaunchError, match="shares memory"):
        k(w, torch.empty(8), threads=8)
    assert not ran


@pytest.mark.parametrize("slot", [1, 2])
def test_protected_weight_refused_where_written(slot: int) -> None:
    ran: list = []
    k = _kernel(SRC, "scale", ran)
    w, out, scratch = torch.ones(8), torch.empty(8), torch.empty(8)
    args = [w, out, scratch, 8]
    args[slot] = w[2:]  # a view of the weight: any byte of its storage counts
    with ProtectedTensors([w], []), pytest.raises(KernelLaunchError, match=f"argument {slot}"):
        k(*args, threads=8)
    assert not ran


def test_protected_weight_read_through_const_is_allowed() -> None:
    ran: list = []
    k = _kernel(SRC, "scale", ran)
    w = torch.ones(8)
    with ProtectedTensors([w], []):
        k(w, torch.empty(8), torch.empty(8), 8, threads=8)
    assert len(ran) == 1


def test_hidden_const_refused() -> None:
    ran: list = []
    k = _kernel(HIDDEN, "zero", ran)
    x = torch.ones(8)
    with ProtectedTensors([], [x]), pytest.raises(KernelLaunchError):
        k(x, torch.empty(8), threads=8)
    assert not ran


class _FakeLauncher:
    name = "fake"

    def __init__(self) -> None:
        self.ran: list = []

    def build(self, key: str, source: str, device_type: str) -> dict[str, MpsKernel]:
        return {"scale": MpsKernel("scale", 1024, 32, "cpu", lambda *a: self.ran.append(a))}


def test_backend_compile_sets_written(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeLauncher()
    monkeypatch.setattr(mps_backend, "launcher", lambda: fake)
    monkeypatch.setattr(mps_backend, "_libraries", {})
    lib = mps_backend.MpsBackend().compile(SRC)
    assert lib.scale.written == frozenset({1, 2})
    w = torch.ones(8)
    with ProtectedTensors([w], []), pytest.raises(KernelLaunchError):
        lib.scale(torch.ones(8), torch.empty(8), w, 8, threads=8)
    assert not fake.ran


def test_emulator_launcher_counts_const_pointer_as_written() -> None:
    """The emulator's in-process launcher (a trusted candidate's, or METAL_ACCEL_TRUST_NATIVE=1) used to read
    `device float* const` as read-only: a protected weight bound there was written."""
    from metal_accel.backends import get_backend
    be = get_backend("mps-emu")
    if not be.is_available():
        pytest.skip("no C++ compiler for the MSL emulator")
    lib = be.compile(SRC)
    w = torch.ones(8)
    with ProtectedTensors([w], []), pytest.raises(KernelLaunchError, match="argument 2"):
        lib.scale(torch.ones(8), torch.empty(8), w, 8, threads=8)
    assert torch.equal(w, torch.ones(8))
