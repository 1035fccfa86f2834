"""Shared by the attack tests: feed one hostile candidate through the real pipeline (a `dir:`
provider on the CPU backend, a fresh user cache per test) and look for the payload's markers.

A payload proves it ran by creating a file in MARKERS (a temporary directory named in its
source); a test asserts no such file exists afterwards, in the worker or in the caller."""
from __future__ import annotations

from pathlib import Path

import torch

import metal_accel
from toymodels import CHAIN_HOST, Net, chain_candidate


# These tests are about where a candidate's code runs and what it can touch, not its speed: through the kernel
# server on a busy 2-core machine the toy Chain can lose its gate (or the end-to-end check), so a kernel that is
# proven correct is installed whatever its speed.
ANY_SPEED = {"margin": -0.9, "end_to_end": False}
# The optimized model against eager where a proven float32 kernel ran: the fused chain rounds differently from eager's
# op-by-op code (on a 2-core AMD EPYC, 2 of 1024 outputs of the good Chain kernel were 3e-5 apart, 8e-5 relative,
# after the Linear that follows it); a payload that changed results would miss by far more
SAME_RESULT = {"rtol": 1e-4, "atol": 1e-4}


def candidate_dir(tmp_path: Path, text: str, cls: str = "Chain", backend: str = "cpu") -> str:
    """A `dir:` provider spec whose only candidate for CLS is TEXT."""
    folder = tmp_path / "cands" / backend / cls
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "attack.py").write_text(text)
    return f"dir:{tmp_path / 'cands'}"


def kernel_with(extra_top: str = "", extra_body: str = "", includes: str = "", host: str = CHAIN_HOST) -> str:
    """The toy Chain kernel (correct and fast) with attacker code added at namespace scope
    (EXTRA_TOP), at the start of each row (EXTRA_BODY) and extra #include lines."""
    text = chain_candidate(extra=extra_body)
    text = text.replace('extern "C" void chain(', extra_top + '\nextern "C" void chain(', 1)
    if includes:
        text = text.replace("#include <cstdint>", includes + "\n#include <cstdint>", 1)
    return text.replace(CHAIN_HOST, host) if host is not CHAIN_HOST else text


def run_attack(tmp_path: Path, text: str, **optimize_kwargs) -> metal_accel.ModuleReport:
    """optimize() a toy Net with TEXT as the only candidate for its Chain module, then run the optimized
    model twice more (as a user would); the model's output must still equal eager's. Returns the
    Chain module's report."""
    model, x = Net().eval(), torch.randn(4, 256)
    with torch.inference_mode():
        ref = model(x)
    metal_accel.optimize(model, (x,), providers=[candidate_dir(tmp_path, text)], **optimize_kwargs)
    with torch.inference_mode():
        for _ in range(2):
            torch.testing.assert_close(model(x), ref, **SAME_RESULT)
    return next(m for m in metal_accel.explain(model).modules if m.name == "chain")


def markers(directory: Path) -> list[str]:
    """Files a payload left in DIRECTORY (empty when every payload was stopped)."""
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []
