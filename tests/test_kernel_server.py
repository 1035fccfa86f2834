"""The kernel server: untrusted native kernels called in a confined process of their own (kernel_server.py),
and the policy that decides which kernels run there (native_policy.py).

The tests of this file share one user cache (so one server, started once: about 5 s on a busy machine)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from metal_accel.runtime import kernel_server, native_policy
from metal_accel.backends import get_backend
from metal_accel.backends.cpu.backend import CpuLibrary
from metal_accel.backends.mps_emu.backend import MpsEmuBackend
from metal_accel.core.candidate import parse_candidate
from metal_accel.core.errors import KernelLaunchError, MetalAccelError
from metal_accel.runtime.kernel_server import KernelServerError, RemoteLibrary
from toymodels import GOOD
from limits import HANG_S

pytestmark = pytest.mark.needs_cxx

CHAIN = parse_candidate(GOOD, "cpu").source
TRICKS = r"""
#include <cstdint>
extern "C" void poke(const float* x, float* out, int64_t n, int64_t mode) {
  if (mode == 1) { volatile float* p = nullptr; *p = 1.0f; }   // crash
  if (mode == 2) { for (volatile int64_t i = 0; ; ++i) {} }    // hang
  ((float*)x)[0] = 42.0f;                                     // a write through a const pointer
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + 1.0f;
}
extern "C" void twice(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 2.0f * x[i];
}
"""
EMU = """#include <metal_stdlib>
using namespace metal;
kernel void scale(device float* out [[buffer(1)]], device const float* in [[buffer(0)]],
                  constant float& s [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    out[i] = in[i] * s;
}
"""


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernel_server_cache")


@pytest.fixture(autouse=True)
def one_cache(shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(shared_cache))
    monkeypatch.delenv("METAL_ACCEL_TRUST_NATIVE", raising=False)
    return shared_cache


def chain_args(rows: int = 4, n: int = 256) -> tuple:
    return torch.randn(rows, n), torch.linspace(0.5, 1.5, n), torch.empty(rows, n), rows, n, 0.125


@pytest.mark.slow
def test_remote_chain_is_bit_identical_to_in_process() -> None:
    cpu = get_backend("cpu")
    here, there = cpu.compile(CHAIN), RemoteLibrary(cpu, CHAIN)
    assert there.kernel_names == ("chain",)
    for rows, n in ((4, 256), (3, 1000), (64, 1024)):
        x, s, out, *rest = chain_args(rows, n)
        mine = torch.full_like(out, float("nan"))
        here.chain(x, s, out, *rest)
        there.chain(x, s, mine, *rest)
        assert torch.equal(out, mine)


def test_remote_checks_arguments_like_the_backend() -> None:
    there = RemoteLibrary(get_backend("cpu"), CHAIN)
    x, s, out, rows, n, shift = chain_args()
    with pytest.raises(KernelLaunchError, match="takes 6 arguments, got 5"):
        there.chain(x, s, out, rows, n)
    with pytest.raises(KernelLaunchError, match="not contiguous"):
        there.chain(x.t(), s, out, rows, n, shift)
    with pytest.raises(KernelLaunchError, match="dtype"):
        there.chain(x.double(), s, out, rows, n, shift)


@pytest.mark.slow
@pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")
def test_remote_emulator_kernel_matches_in_process() -> None:
    emu = get_backend("mps-emu")
    here, there = emu.compile(EMU), RemoteLibrary(emu, EMU)
    x = torch.randn(1000)
    a, b = torch.empty(1000), torch.full((1000,), float("nan"))
    here.scale(x, a, 1.5)
    there.scale(x, b, 1.5)
    assert torch.equal(a, b) and torch.equal(b, x * 1.5)
    with pytest.raises(KernelLaunchError, match="pass a Python float"):
        there.scale(x, b, 2)


def test_a_remote_emulator_kernel_out_of_bounds_is_reported_with_its_line() -> None:
    emu = get_backend("mps-emu")
    there = RemoteLibrary(emu, EMU)
    x, out = torch.randn(100), torch.empty(90)
    with pytest.raises(KernelLaunchError, match=r"out-of-bounds write .*line 5.*out \(argument 1\)"):
        there.scale(x, out, 1.5, threads=100)


def test_writes_to_const_parameters_are_not_copied_back() -> None:
    there = RemoteLibrary(get_backend("cpu"), TRICKS)
    x, out = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    there.poke(x, out, 8, 0)
    assert x[0].item() == 0.0  # the kernel wrote 42 into its copy only
    assert out[0].item() == 43.0 and torch.equal(out[1:], x[1:] + 1)


def test_overlapping_arguments_share_memory_as_in_process() -> None:
    cpu = get_backend("cpu")
    here, there = cpu.compile(TRICKS), RemoteLibrary(cpu, TRICKS)
    a = torch.arange(16, dtype=torch.float32)
    b = a.clone()
    here.twice(a[:12], a[4:], 12)   # overlapping: in place, reading what it already wrote
    there.twice(b[:12], b[4:], 12)
    assert torch.equal(a, b)


@pytest.mark.slow
def test_crash_raises_and_the_next_call_gets_a_fresh_server() -> None:
    there = RemoteLibrary(get_backend("cpu"), TRICKS)
    x, out = torch.ones(8), torch.zeros(8)
    there.poke(x, out, 8, 0)
    first = kernel_server.server_process()
    assert first is not None
    with pytest.raises(KernelServerError, match="crashed the kernel server .*SIGSEGV"):
        there.poke(x, out, 8, 1)
    out.zero_()
    there.poke(x, out, 8, 0)  # reloaded in a new server
    assert out.tolist() == [43.0] + [2.0] * 7
    second = kernel_server.server_process()
    assert second is not None and second.pid != first.pid


@pytest.mark.slow
def test_hang_hits_the_time_limit() -> None:
    there = RemoteLibrary(get_backend("cpu"), TRICKS)
    there.time_limit_s = 2.0  # the kernel never returns: any limit is hit
    x, out = torch.ones(8), torch.zeros(8)
    with pytest.raises(KernelServerError, match="did not finish within 2 s"):
        there.poke(x, out, 8, 2)
    there.time_limit_s = None
    there.poke(x, out, 8, 0)
    assert out.tolist() == [43.0] + [2.0] * 7


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd")
def test_no_arena_or_descriptor_leak_over_many_calls() -> None:
    there = RemoteLibrary(get_backend("cpu"), CHAIN)
    big = chain_args(256, 4096)  # 4 MB tensors: the arena grows once
    there.chain(*big)
    fds, capacity = _open_fds(), kernel_server._server.capacity
    for i in range(300):
        there.chain(*(chain_args(4, 256) if i % 2 else big))
    assert _open_fds() == fds
    assert kernel_server._server.capacity == capacity
    assert len(kernel_server._plans) <= 257


@pytest.mark.slow
def test_server_dies_with_its_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from metal_accel.backends import get_backend
        from metal_accel.runtime.kernel_server import RemoteLibrary, server_process
        from toymodels import GOOD
        from metal_accel.core.candidate import parse_candidate
        RemoteLibrary(get_backend("cpu"), parse_candidate(GOOD, "cpu").source)
        print(server_process().pid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S)
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and \
            "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2:3]:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.mark.slow
def test_refused_without_confinement(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_server.stop_server()
    monkeypatch.setattr(kernel_server.confine, "sufficient", lambda layers: False)
    monkeypatch.delenv("METAL_ACCEL_UNCONFINED", raising=False)
    with pytest.raises(KernelServerError, match="refused to run untrusted native kernels.*METAL_ACCEL_UNCONFINED=1"):
        RemoteLibrary(get_backend("cpu"), CHAIN)
    assert kernel_server.server_process() is None


# ---------------------------------------------------------------- policy

@pytest.mark.slow
def test_policy_untrusted_kernels_go_to_the_server() -> None:
    lib = native_policy.runtime_library(get_backend("cpu"), CHAIN)
    assert isinstance(lib, RemoteLibrary)
    assert native_policy.placement(CHAIN) == native_policy.KERNEL_SERVER


def test_policy_shipped_and_opted_in_kernels_run_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    from metal_accel.core import config
    shipped = json.loads(next(config.shipped_cache_dir().glob("cpu/*.json")).read_text())["candidate"]["source"]
    assert native_policy.is_trusted(shipped) and not native_policy.is_trusted(CHAIN)
    assert isinstance(native_policy.runtime_library(get_backend("cpu"), shipped), CpuLibrary)
    monkeypatch.setenv("METAL_ACCEL_TRUST_NATIVE", "1")
    assert isinstance(native_policy.runtime_library(get_backend("cpu"), CHAIN), CpuLibrary)
    assert native_policy.placement(CHAIN) == native_policy.IN_PROCESS


def test_policy_leaves_device_code_in_process() -> None:
    class Device:
        name = "cuda"

        def compile(self, source: str) -> str:
            return "loaded here"
    assert native_policy.runtime_library(Device(), "__global__ void k() {}") == "loaded here"


@pytest.mark.slow
def test_a_failing_remote_kernel_is_switched_off_and_the_module_runs_eager(tmp_path: Path) -> None:
    """Production: the dispatcher drops a kernel whose server call fails and reruns eager."""
    import metal_accel
    from toymodels import Net, chain_candidate
    crash = chain_candidate(extra="    if (x[r * n] == 12345.0f) { volatile float* p = nullptr; p[r] = 1.0f; }\n")
    folder = tmp_path / "cands" / "cpu" / "Chain"
    folder.mkdir(parents=True)
    (folder / "c.py").write_text(crash)
    model = Net().eval()
    # installed whatever its speed on this (possibly busy) machine: the test is about the failure path
    metal_accel.optimize(model, (torch.randn(4, 256),), providers=[f"dir:{tmp_path / 'cands'}"], margin=-0.9,
                         end_to_end=False)
    assert next(m for m in metal_accel.explain(model).modules if m.name == "chain").status == "kernel"
    x = torch.randn(4, 256)
    x[0, 0] = 12345.0  # no trial holds this value: the kernel crashes its server here; this process goes on
    with torch.inference_mode():
        out = model(x)
        with metal_accel.eager():
            ref = model(x)
    torch.testing.assert_close(out, ref)
    assert any("crashed the kernel server" in why for why in model.chain.forward.failures.values())
