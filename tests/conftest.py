"""Hardware detection and cache isolation shared by every test."""
from __future__ import annotations

import shutil

import pytest
import torch

HAS_CXX = any(shutil.which(c) for c in ("c++", "g++", "clang++"))
HAS_MPS = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {
        "mps": (HAS_MPS, "needs an Apple GPU (PyTorch MPS)"),
        "cuda": (HAS_CUDA, "needs an NVIDIA GPU"),
        "needs_cxx": (HAS_CXX, "needs a C++ compiler"),
    }
    for item in items:
        for marker, (present, why) in skips.items():
            if marker in item.keywords and not present:
                item.add_marker(pytest.mark.skip(reason=why))


# Tests whose subject is where untrusted native code runs (the kernel server, the attacks) keep the default:
# untrusted CPU kernels in the kernel server. Every other test is about the pipeline's logic, whose speed
# gates were calibrated on in-process kernels (the toy Chain wins several times over in process, by 1.2-1.7x
# through the server on this 2-core machine): they trust native kernels, as METAL_ACCEL_TRUST_NATIVE=1 does.
_DEFAULT_PLACEMENT = ("adversarial", "test_kernel_server.py", "test_confine.py", "test_native_trust.py",
                      "test_arena_and_lib_writes.py")


@pytest.fixture(autouse=True)
def isolated_user_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                        request: pytest.FixtureRequest):
    """Every test gets its own user cache and verdict key; the real ones are never touched."""
    path = tmp_path_factory.mktemp("user_cache")
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(path))
    # the key that seals verdicts (attest.py): per test, never the real user's
    monkeypatch.setenv("METAL_ACCEL_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))
    monkeypatch.delenv("METAL_ACCEL_CACHE_PATH", raising=False)
    monkeypatch.delenv("METAL_ACCEL_DISABLE", raising=False)
    # torch.compile as a candidate costs seconds per module; the tests that are about it turn it on
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "0")
    # likewise the shipped kernel library (a trace per module type to match it): its tests turn it on
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "0")
    if any(part in _DEFAULT_PLACEMENT for part in request.path.parts):
        monkeypatch.delenv("METAL_ACCEL_TRUST_NATIVE", raising=False)
    else:
        monkeypatch.setenv("METAL_ACCEL_TRUST_NATIVE", "1")
    yield path
    # optimize() on an HF model routes its modeling module's rotary function process-wide until restore(); a test
    # that leaves the model optimized must not hand the next test its router
    from metal_accel.library import rotary
    rotary.detach_all()


# `import metal_accel` patched the classes of whatever caches this machine has; tests start clean
# and activate auto-instrumentation themselves (in subprocesses) where they test it.
import metal_accel.auto.hook  # noqa: E402

metal_accel.auto.hook.deactivate()
