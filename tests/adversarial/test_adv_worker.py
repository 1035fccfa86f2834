"""The worker as a sandbox: what code running where a kernel runs can reach (nothing of the user's),
and the soak: a kernel that misbehaves only on the speed gate's inputs is rejected in the worker, before
the user's process runs it."""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import metal_accel
from metal_accel.core import config
from metal_accel.sandbox import confine
from metal_accel.proof import worker

from harness import ANY_SPEED, SAME_RESULT, candidate_dir, kernel_with
from toymodels import Net
from limits import HANG_S

# slow: each test proves a kernel in a confined worker subprocess
pytestmark = [pytest.mark.slow, pytest.mark.needs_cxx,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux worker's confinement")]
confined_here = pytest.mark.skipif(confine.landlock_abi() < 1 or confine.pyseccomp is None,
                                   reason="this machine lacks Landlock or libseccomp")

# values no random or structured proof trial holds; the caller's example input starts with them
MAGIC = "x[0] == 1234.5f && x[1] == -0.0078125f"


def example_input() -> torch.Tensor:
    x = torch.randn(4, 256)
    x[0, 0], x[0, 1] = 1234.5, -0.0078125
    return x


def optimize_chain(tmp_path: Path, text: str, **kwargs) -> tuple[metal_accel.ModuleReport, torch.Tensor, torch.Tensor]:
    model, x = Net().eval(), example_input()
    with torch.inference_mode():
        ref = model(x)
    metal_accel.optimize(model, (x,), providers=[candidate_dir(tmp_path, text)], **kwargs)
    with torch.inference_mode():
        out = model(x)
    return next(m for m in metal_accel.explain(model).modules if m.name == "chain"), out, ref


@confined_here
def test_worker_environment_holds_no_secret_and_scratch_goes_away(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("MY_PRIVATE_SETTING", "private")
    w = worker.Worker()
    try:
        w._start("cpu", "cpu", 120)
        environ = Path(f"/proc/{w.pid}/environ").read_bytes().decode(errors="replace")
        scratch = w._scratch
        assert scratch is not None and scratch.is_dir()
        assert "sk-test-not-a-real-key" not in environ and "MY_PRIVATE_SETTING" not in environ
        assert f"HOME={scratch}" in environ.split("\0")
        assert f"METAL_ACCEL_USER_CACHE={scratch / 'user-cache'}" in environ.split("\0")  # never the user's
        assert f"METAL_ACCEL_BUILD_DIR={config.build_dir()}" in environ.split("\0")  # read-only to it
        assert any(l.startswith("landlock (") for l in w.layers) and "seccomp" in w.layers, w.layers
    finally:
        w.close()
    assert not scratch.exists()


@confined_here
def test_code_in_the_worker_reaches_nothing_of_the_user(tmp_path):
    user_cache, build = config.user_cache_dir(), config.build_dir()
    build.mkdir(parents=True, exist_ok=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cmd, env = worker.launch("cpu", "cpu", scratch, module="worker_probe")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    env["PROBE_TARGETS"] = json.dumps({"user_cache": str(user_cache), "tmp": str(tmp_path), "build_dir": str(build),
                                       "port": listener.getsockname()[1]})
    proc = subprocess.run(cmd, env=env, cwd=scratch, capture_output=True, timeout=HANG_S, stdin=subprocess.DEVNULL)
    frames, data = [], proc.stdout
    while len(data) >= 8:
        size = int.from_bytes(data[:8], "little")
        frames.append(torch.load(io.BytesIO(data[8:8 + size]), weights_only=True))
        data = data[8 + size:]
    assert len(frames) == 2, proc.stderr[-2000:]
    layers, out = frames[0]["layers"], json.loads(frames[1]["probe"])
    assert any(l.startswith("landlock (") for l in layers) and "seccomp" in layers, layers
    assert "PROBE_TARGETS" in out["environ"] and not any("KEY" in k or "TOKEN" in k for k in out["environ"])
    assert out["read_build_dir"] == "allowed", out
    for denied in ("write_user_cache", "write_tmp", "write_build_dir", "connect", "spawn_sh"):
        assert out[denied].startswith("denied"), (denied, out[denied])
    with pytest.raises(socket.timeout):
        listener.accept()  # no connection arrived
    listener.close()
    assert not (user_cache / "worker_marker").exists() and not (build / "worker_marker").exists()
    assert not list(tmp_path.glob("*marker"))


SEGFAULT_ON_EXAMPLE = kernel_with(extra_body=f"    if ({MAGIC}) {{ volatile float* p = nullptr; p[r] = 1.0f; }}\n")
WRONG_ON_EXAMPLE = kernel_with(extra_body=f"    if ({MAGIC}) {{ for (int64_t i = 0; i < n; ++i) out[r * n + i] = 7.0f; continue; }}\n")
HANG_ON_EXAMPLE = kernel_with(extra_body=f"    if ({MAGIC}) {{ for (volatile int s = 0; s >= 0; s = s + 1 - 1) {{}} }}\n")


@pytest.mark.parametrize("text, why", [
    (SEGFAULT_ON_EXAMPLE, "killed by SIGSEGV"),
    (WRONG_ON_EXAMPLE, "wrong result"),
])
def test_kernel_bad_only_on_the_callers_values_is_rejected_in_the_soak(tmp_path, text, why):
    """The proof's inputs never hold the example's values; the speed gate's do. The soak runs the gate's
    calls in the worker first, so the user's process survives and never installs the kernel."""
    rep, out, ref = optimize_chain(tmp_path, text)
    assert rep.status == "eager", rep.reason
    assert "soak" in rep.reason and why in rep.reason, rep.reason
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.slow
def test_kernel_hanging_only_on_the_callers_values_times_out_in_the_soak(tmp_path):
    # the limit covers the proof too (worker start, compile, trials), which must finish within it to reach the soak
    rep, out, ref = optimize_chain(tmp_path, HANG_ON_EXAMPLE, timeout_s=60)
    assert rep.status == "eager" and "soak" in rep.reason and "timed out after 60 s" in rep.reason, rep.reason
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_good_kernel_passes_the_soak(tmp_path):
    rep, out, ref = optimize_chain(tmp_path, kernel_with(), **ANY_SPEED)
    assert rep.status == "kernel", rep.reason
    torch.testing.assert_close(out, ref, **SAME_RESULT)


def test_rejected_kernel_is_never_loaded_in_the_users_process(tmp_path):
    rep, _, _ = optimize_chain(tmp_path, SEGFAULT_ON_EXAMPLE)
    assert rep.status == "eager"
    maps = Path("/proc/self/maps").read_text()
    assert str(config.build_dir()) not in maps
