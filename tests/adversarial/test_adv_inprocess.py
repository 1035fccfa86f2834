"""An untrusted kernel never runs in the user's process: whatever it does where it runs (the kernel server),
the caller's FP rounding, thread count, RNG state, inputs and the model's parameters stay as they were.

The main payload is one no source or binary check can see: plain stores through pointers the kernel was
handed (a const parameter, the caller's input, past the end of its output), fired only by a value no proof
trial and no example input holds. In the user's process (METAL_ACCEL_TRUST_NATIVE=1, the opt-in) the same
kernel does change the model, which shows the server is the layer that stops it."""
from __future__ import annotations

import ctypes
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

import metal_accel
from metal_accel.runtime import native_policy
from metal_accel.core.candidate import parse_candidate

from harness import ANY_SPEED, candidate_dir, kernel_with, markers, run_attack
from toymodels import Net

pytestmark = [pytest.mark.needs_cxx, pytest.mark.slow]

TRIGGER = 12345.0  # no random or structured trial holds it, nor the example input
SCRIBBLE = """    if (x[r * n] == 12345.0f) {
      ((float*)s)[0] = 99.0f;              // the module's parameter, handed as const
      ((float*)x)[r * n + 1] = -7.0f;      // the caller's input, handed as const
      OOB
    }
"""
OUT_OF_BOUNDS = "out[rows * n + 64] = 1.0f;    // past the output's end: the caller's heap, were it in-process"


def caller_state(model: torch.nn.Module) -> dict[str, Any]:
    """What an in-process kernel could change and a user would notice."""
    a, b = 1.0, 3.0
    libm = ctypes.CDLL(None)
    return {"fegetround": libm.fegetround(), "python_div": struct.pack("<d", a / b),
            "torch_div": (torch.ones(1) / 3).view(torch.int32).item(),
            "denormal_kept": (torch.tensor([1e-39]) * torch.ones(1)).item() != 0.0,
            "threads": torch.get_num_threads(), "rng": torch.get_rng_state().clone(),
            "params": {k: v.clone() for k, v in model.state_dict().items()}}


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key, value in before.items():
        if key == "params":
            for name, t in value.items():
                assert torch.equal(t, after["params"][name]), f"parameter {name} changed"
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, after[key]), f"{key} changed"
        else:
            assert value == after[key], f"{key} changed: {value!r} -> {after[key]!r}"


def triggered_input() -> torch.Tensor:
    x = torch.randn(4, 256)
    x[:, 0] = TRIGGER
    return x


def optimize_with(tmp_path: Path, text: str) -> tuple[Net, metal_accel.ModuleReport]:
    model = Net().eval()
    metal_accel.optimize(model, (torch.randn(4, 256),), providers=[candidate_dir(tmp_path, text)], **ANY_SPEED)
    return model, next(m for m in metal_accel.explain(model).modules if m.name == "chain")


def test_scribbling_kernel_in_the_server_leaves_the_caller_untouched(tmp_path: Path) -> None:
    text = kernel_with(extra_body=SCRIBBLE.replace("OOB", OUT_OF_BOUNDS))
    model, rep = optimize_with(tmp_path, text)
    assert rep.status == "kernel", rep.reason  # no check can see this payload: the server is what stops it
    assert native_policy.placement(parse_candidate(text, "cpu").source) == native_policy.KERNEL_SERVER
    x = triggered_input()
    kept = x.clone()
    before = caller_state(model)
    with torch.inference_mode():
        for _ in range(3):
            model(x)
    assert_same(before, caller_state(model))
    assert torch.equal(x, kept)


def test_the_same_kernel_trusted_in_process_does_change_the_model(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAL_ACCEL_TRUST_NATIVE", "1")
    text = kernel_with(extra_body=SCRIBBLE.replace("OOB", ""))
    model, rep = optimize_with(tmp_path, text)
    assert rep.status == "kernel", rep.reason
    assert native_policy.placement(parse_candidate(text, "cpu").source) == native_policy.IN_PROCESS
    x = triggered_input()
    with torch.inference_mode():
        model(x)
    assert model.chain.scale[0].item() == 99.0 and x[0, 1].item() == -7.0


FP_AND_FILES = {
    "fesetround": kernel_with(includes="#include <cfenv>", extra_body="    fesetround(FE_TOWARDZERO);\n"),
    "mxcsr": kernel_with(includes="#include <immintrin.h>", extra_body="    _mm_setcsr(_mm_getcsr() | 0xE040);\n"),
    "marker": kernel_with(includes="#include <cstdio>", extra_body=(
        '    { FILE* f = fopen("MARKERS/inprocess", "w"); if (f) fclose(f); }\n')),
}


@pytest.mark.parametrize("name", sorted(FP_AND_FILES))
def test_fp_and_file_payloads_never_reach_the_caller(tmp_path: Path, name: str) -> None:
    marks = tmp_path / "markers"
    marks.mkdir()
    probe = Net()
    before = caller_state(probe)
    del before["rng"]  # run_attack draws its own inputs from it
    run_attack(tmp_path, FP_AND_FILES[name].replace("MARKERS", str(marks)))
    assert_same(before, caller_state(probe))
    assert markers(marks) == []
