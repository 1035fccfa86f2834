"""Two holes a red-team pass found (.scratch/redteam2, a03 and a01's lib route), closed:

- the kernel server's arena: a kernel kept a call counter in the arena's unused tail (1 MiB at least, reused,
  never checked), exact through the proof, the soak and the speed gate, wrong after N production calls. Now the
  arena holds the call's pages, what the last call left outside this call's regions is zeroed, and any byte a
  kernel writes outside its arguments stops the server and fails the call;
- host code passing a tensor it does not own (a module weight, an input, a view of one) where a kernel writes
  (a non-const pointer parameter of lib.<kernel>): the kernel server copied the kernel's writes back into it,
  an in-process kernel wrote it directly. Now the launchers refuse it while KernelOp runs host code.
"""
from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import pytest
import torch

import metal_accel
from metal_accel.backends import get_backend
from metal_accel.backends.cpu.signature import parse_extern_c
from metal_accel.backends.cuda.signature import ArgBinder, parse_cuda_kernels
from metal_accel.backends.mps_emu.backend import MpsEmuBackend
from metal_accel.backends.protected import ProtectedTensors
from metal_accel.core.errors import KernelLaunchError
from metal_accel.runtime import kernel_server
from metal_accel.runtime.kernel_server import KernelServerError, RemoteLibrary

from test_optimize import candidates
from toymodels import CHAIN_HOST, GOOD, Net, chain_candidate

pytestmark = pytest.mark.needs_cxx

ARENA_TRICKS = r"""
#include <cstdint>
static uintptr_t end_of(const float* x, const float* out, int64_t n) {
  uintptr_t a = (uintptr_t)(x + n), b = (uintptr_t)(out + n);
  return a > b ? a : b;
}
// a call counter in the last 8 bytes of the page its last argument ends in (n = 100: not a page boundary)
extern "C" void count_calls(const float* x, float* out, int64_t n) {
  volatile uint64_t* counter = (volatile uint64_t*)(((end_of(x, out, n) + 4095) & ~(uintptr_t)4095) - 8);
  uint64_t k = *counter + 1;
  *counter = k;
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + (float)k;
}
// one byte just past the end of argument WHICH (0: x, 1: out): the gap before the next region, or the tail
extern "C" void poke_past(const float* x, float* out, int64_t n, int64_t which) {
  ((volatile char*)(which ? (const float*)out : x) + 4 * n)[0] = 1;
  for (int64_t i = 0; i < n; ++i) out[i] = x[i];
}
// one byte OFFSET bytes past the start of out
extern "C" void poke_at(const float* x, float* out, int64_t n, int64_t offset) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i];
  ((volatile char*)out)[offset] = 1;
}
// how many of the K floats past its last argument are not zero (what an earlier call could have left there)
extern "C" void peek(const float* x, float* out, int64_t n, int64_t k) {
  const float* past = (const float*)end_of(x, out, n);
  float nonzero = 0.0f;
  for (int64_t i = 0; i < k; ++i) nonzero += past[i] != 0.0f;
  for (int64_t i = 0; i < n; ++i) out[i] = x[i];
  out[0] = nonzero;
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
    """Where ARENA_TRICKS is built, once for the module (each test gets a user cache of its own: conftest)."""
    return tmp_path_factory.mktemp("arena_cache")


@pytest.fixture(scope="module")
def tricks(shared_cache: Path) -> RemoteLibrary:
    """ARENA_TRICKS in the kernel server."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("METAL_ACCEL_USER_CACHE", str(shared_cache))
        return RemoteLibrary(get_backend("cpu"), ARENA_TRICKS)


@pytest.fixture(scope="module")
def here(shared_cache: Path) -> Any:
    """ARENA_TRICKS in this process."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("METAL_ACCEL_USER_CACHE", str(shared_cache))
        return get_backend("cpu").compile(ARENA_TRICKS)


# ---------------------------------------------------------------- the arena


def test_a_kernel_keeping_a_counter_in_the_arena_is_stopped(tricks: RemoteLibrary) -> None:
    x, out = torch.zeros(100), torch.empty(100)
    with pytest.raises(KernelServerError, match="outside its arguments"):
        tricks.count_calls(x, out, 100)
    tricks.twice(x + 1, out, 100)  # a fresh server
    assert torch.equal(out, torch.full((100,), 2.0))


@pytest.mark.parametrize("which", [0, 1])
def test_a_byte_written_past_an_argument_is_caught(tricks: RemoteLibrary, which: int) -> None:
    """100 floats end 16 bytes into a 64-byte line: past the first region lies a gap, past the last the tail."""
    x, out = torch.randn(100), torch.empty(100)
    with pytest.raises(KernelServerError, match="outside its arguments"):
        tricks.poke_past(x, out, 100, which)


def test_a_call_never_sees_what_an_earlier_call_left_in_the_arena(tricks: RemoteLibrary) -> None:
    big = torch.ones(1 << 16)
    tricks.twice(big, torch.empty_like(big), big.numel())  # 512 KiB of non-zero data in the arena
    out = torch.empty(16)
    tricks.peek(torch.ones(16), out, 16, 60000)  # 240 KB past its own arguments: where the big call's were
    assert out[0].item() == 0.0 and torch.equal(out[1:], torch.ones(15))


def test_the_arena_holds_the_pages_recent_calls_need(tricks: RemoteLibrary) -> None:
    big = torch.ones(1 << 18)
    tricks.twice(big, torch.empty_like(big), big.numel())
    server = kernel_server._server
    assert server is not None and server.size == 2 * big.nbytes and server.capacity >= kernel_server.MAPPING_MIN
    x, out = torch.ones(100), torch.empty(100)
    for _ in range(2 * kernel_server.SHRINK_WINDOW):
        tricks.twice(x, out, 100)
    assert server.size == mmap.PAGESIZE  # 800 bytes: one page a kernel can reach, no spare megabyte
    assert torch.equal(out, 2 * x)


def test_past_the_calls_pages_the_arena_traps(tricks: RemoteLibrary) -> None:
    """a03's kernel kept its counter 1 MiB past the arena's start: memory of the server's own once the arena
    fits the call. There the mapping goes on, past the file's end: the write kills the server."""
    x, out = torch.zeros(100), torch.empty(100)
    tricks.twice(x, out, 100)
    with pytest.raises(KernelServerError, match="crashed the kernel server .*SIGBUS"):
        tricks.poke_at(x, out, 100, 1 << 20)  # 1 MiB past out: out of the file, in the mapping


def test_honest_calls_alternating_layouts_match_in_process(tricks: RemoteLibrary, here: Any) -> None:
    for i in range(40):
        n = (100, 70000, 3, 4096)[i % 4]
        x = torch.randn(n)
        mine, theirs = torch.empty(n), torch.full((n,), float("nan"))
        here.twice(x, mine, n)
        tricks.twice(x, theirs, n)
        assert torch.equal(mine, theirs)
    a = torch.arange(16, dtype=torch.float32)
    b = a.clone()
    here.twice(a[:12], a[4:], 12)  # overlapping arguments share one region
    tricks.twice(b[:12], b[4:], 12)
    assert torch.equal(a, b)


COUNTER_IN_PRODUCTION = chain_candidate(extra=r"""
    if (r == 0) {  /* packed back to back: the kernel server. A counter past its last argument, as a03 kept one */
      uintptr_t a = (uintptr_t)x, b = (uintptr_t)s, c = (uintptr_t)out, na = rows * n * 4, nb = n * 4;
      uintptr_t lo = a < b ? a : b; lo = lo < c ? lo : c;
      uintptr_t hi = a + na; hi = hi > b + nb ? hi : b + nb; hi = hi > c + na ? hi : c + na;
      uintptr_t page_end = (hi + 4095) & ~(uintptr_t)4095;
      if (hi - lo < 2 * na + nb + 1024 && page_end - hi >= 8) {
        volatile uint64_t* counter = (volatile uint64_t*)(page_end - 8);
        *counter = *counter + 1;
        if (*counter > 100000) shift += 1.0f;
      }
    }
""")


@pytest.mark.slow
def test_a_kernel_counting_its_production_calls_is_never_installed(tmp_path: Path) -> None:
    model, ref = Net().eval(), Net().eval()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, counter=COUNTER_IN_PRODUCTION)], margin=-0.9,
                         end_to_end=False, progress=False)
    chain = next(m for m in metal_accel.explain(model).modules if m.name == "chain")
    assert chain.status == "eager", chain
    assert any("outside its arguments" in r for r in chain.rejected), chain.rejected
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref(x))


# ---------------------------------------------------------------- writes into tensors host code does not own


@pytest.mark.parametrize("where", ["in-process", "kernel server"])
def test_a_protected_tensor_is_refused_where_the_kernel_writes(tricks: RemoteLibrary, here: Any, where: str) -> None:
    lib = here if where == "in-process" else tricks
    weight, x = torch.linspace(0.5, 1.5, 64), torch.randn(4, 64)
    keep_w, keep_x = weight.clone(), x.clone()
    fresh = torch.ones(64)
    with ProtectedTensors([weight], (x,)):
        for target, n in ((weight, 64), (weight[8:], 56), (x, 64), (x.view(-1)[64:], 64), (x[1], 64)):
            with pytest.raises(KernelLaunchError, match=r"argument 1 \(float\* y\).*shares memory"):
                lib.twice(fresh, target, n)
        out = torch.empty(64)
        lib.twice(weight, out, 64)  # read through a const pointer: allowed
        lib.twice(x[0], out, 64)
    assert torch.equal(weight, keep_w) and torch.equal(x, keep_x)
    assert torch.equal(out, 2 * x[0])
    lib.twice(fresh, weight, 64)  # outside a protected call (the library used directly): as before
    assert torch.equal(weight, torch.full((64,), 2.0))


@pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")
def test_a_protected_tensor_is_refused_by_the_emulators_launchers() -> None:
    emu = get_backend("mps-emu")
    weight, fresh = torch.randn(32), torch.randn(32)
    keep = weight.clone()
    for lib in (emu.compile(EMU), RemoteLibrary(emu, EMU)):
        with ProtectedTensors([weight], ()):
            with pytest.raises(KernelLaunchError, match=r"argument 1 .*shares memory"):
                lib.scale(fresh, weight, 2.0)  # buffer 1 is `device float* out`
            out = torch.empty(32)
            lib.scale(weight, out, 2.0)  # buffer 0 is const
        assert torch.equal(out, 2 * weight)
    assert torch.equal(weight, keep)


def test_the_cuda_binder_refuses_a_protected_tensor_where_the_kernel_writes() -> None:
    src = 'extern "C" __global__ void k(const float* x, float* y, float* const z, int n) {}'
    name, params = next(iter(parse_cuda_kernels(src).items()))
    binder = ArgBinder(name, params, device_type="cpu")
    weight, fresh = torch.randn(8), torch.randn(8)
    with ProtectedTensors([weight], ()):
        binder.values([weight, fresh, torch.empty(8), 8])
        for i in (1, 2):
            args = [fresh, torch.empty(8), torch.empty(8), 8]
            args[i] = weight
            with pytest.raises(KernelLaunchError, match=f"argument {i} .*shares memory"):
                binder.values(args)


def test_a_const_pointer_is_one_to_const_data_not_a_const_pointer() -> None:
    params = parse_extern_c('extern "C" void k(const float* a, float const* b, float* const c, const float* const d, '
                            "const int64_t n) {}")["k"]
    assert [p.is_const for p in params] == [True, True, False, True, True]
    cuda = parse_cuda_kernels('extern "C" __global__ void k(const float* a, float* const c) {}')["k"]
    assert [p.is_const for p in cuda] == [True, False]


WEIGHT_AS_OUTPUT = '''
def forward(module, x):
    out = torch.empty_like(x)
    n = x.shape[-1]
    if x.reshape(-1)[0].item() == 12345.0:
        lib.chain(x[:1].contiguous(), module.scale, module.scale, 1, n, module.shift)
    lib.chain(x.contiguous(), module.scale, out, x.numel() // n, n, module.shift)
    return out
'''
INPUT_AS_OUTPUT = '''
def forward(module, x):
    n = x.shape[-1]
    if x.reshape(-1)[0].item() == 12345.0:
        lib.chain(x, module.scale, x, x.numel() // n, n, module.shift)
        return x * 1.0
    out = torch.empty_like(x)
    lib.chain(x.contiguous(), module.scale, out, x.numel() // n, n, module.shift)
    return out
'''


@pytest.mark.slow
@pytest.mark.parametrize("host", ["weight", "input"])
@pytest.mark.parametrize("trusted", [False, True], ids=["kernel server", "in-process"])
def test_host_code_cannot_make_a_kernel_write_a_weight_or_an_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  host: str, trusted: bool) -> None:
    if trusted:
        monkeypatch.setenv("METAL_ACCEL_TRUST_NATIVE", "1")
    code = GOOD.replace(CHAIN_HOST, WEIGHT_AS_OUTPUT if host == "weight" else INPUT_AS_OUTPUT)
    model, ref = Net().eval(), Net().eval()
    ref.load_state_dict(model.state_dict())
    metal_accel.optimize(model, (torch.randn(4, 256),), providers=[candidates(tmp_path, sneaky=code)], margin=-0.9,
                         end_to_end=False, progress=False)
    chain = next(m for m in metal_accel.explain(model).modules if m.name == "chain")
    assert chain.status == "kernel", chain  # the proof never tries the trigger
    x = torch.randn(4, 256)
    x[0, 0] = 12345.0
    keep = x.clone()
    with torch.inference_mode():
        out = model(x)
        want = ref(keep)
    assert torch.equal(x, keep) and torch.equal(model.chain.scale, ref.chain.scale)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert any("shares memory" in why for why in model.chain.forward.failures.values())
