"""Untrusted candidates compile and first run in a worker: crashes, hangs and runaway memory are
rejections with a reason, and the user's process goes on."""
from __future__ import annotations

import pytest
import torch

import metal_accel

from test_optimize import candidates, chain_report, run
from toymodels import GOOD, HANG, RUNAWAY_ALLOC, SEGFAULT, TRAP, Net
from limits import HANG_S

# slow: crashing and hanging candidates in worker subprocesses
pytestmark = [pytest.mark.slow, pytest.mark.needs_cxx]


@pytest.mark.parametrize("text, why", [
    (SEGFAULT, "killed by SIGSEGV"),
    (TRAP, "killed by SIGILL"),
    (RUNAWAY_ALLOC, "crashed"),
])
def test_crashing_candidate_is_rejected_and_process_survives(tmp_path, text, why):
    model, x = Net().eval(), torch.randn(4, 256)
    ref = run(model, x)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, bad=text)])
    rep = chain_report(model)
    assert rep.status == "eager"
    assert why in rep.reason, rep.reason
    torch.testing.assert_close(run(model, x), ref, rtol=0, atol=0)
    # the worker was replaced: a good candidate is still proven and installed afterwards
    model2 = Net().eval()
    metal_accel.optimize(model2, (x,), providers=[candidates(tmp_path / "2", good=GOOD)])
    assert chain_report(model2).status == "kernel"


def test_hanging_candidate_times_out(tmp_path):
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, hang=HANG)], timeout_s=20)
    rep = chain_report(model)
    assert rep.status == "eager" and "timed out after 20 s" in rep.reason



def test_shape_generic_claim_is_swept_over_batch_sizes(tmp_path):
    generic = GOOD + "\nSHAPE_GENERIC = True\n"
    four_rows_only = generic.replace("x.numel() // n", "min(x.numel() // n, 4)")
    model, x = Net().eval(), torch.randn(4, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, liar=four_rows_only)])
    rep = chain_report(model)
    # rows 4.. of a 9-row batch unwritten: they hold the output buffer's poison (NaN or huge values)
    assert rep.status == "eager" and "incorrect: trial" in rep.reason, rep.reason
    model = Net().eval()
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path / "2", honest=generic)])
    assert chain_report(model).status == "kernel"
    # without the claim, the exact-shape kernel is judged on its own shape only
    model = Net().eval()
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path / "3", exact=GOOD.replace(
        "x.numel() // n", "min(x.numel() // n, 4)"))])
    assert chain_report(model).status == "kernel"


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="the address-space cap is Linux-only")
def test_worker_memory_cap_grows_with_the_request():
    """A request of a gigabyte of inputs may use several times that (copies, outputs) on top of the fixed
    headroom; without such a request the same allocation is still a runaway, refused."""
    import subprocess
    import sys
    code = """
import torch, metal_accel.proof.worker_main as w
big = (w.MEMORY_HEADROOM + (2 << 30)) // 4  # floats: 2 GiB over the headroom, address space only (never touched)
w._limit_memory("cpu", 1 << 30)
torch.empty(big)
print("fits")
w._limit_memory("cpu", 0)
try:
    torch.empty(big)
except Exception:
    print("refused")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert out.stdout.split() == ["fits", "refused"], out.stderr[-500:]
