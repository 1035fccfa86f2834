"""confine.py: the environment a worker gets, and what a confined process can no longer do (tried in a
subprocess that confines itself and then attempts each forbidden operation)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from metal_accel.sandbox import confine
from limits import HANG_S

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Landlock and seccomp are Linux's")
needs_landlock = pytest.mark.skipif(confine.landlock_abi() < 1, reason="this kernel has no Landlock")
needs_seccomp = pytest.mark.skipif(confine.pyseccomp is None, reason="libseccomp is not installed")

PROBE = textwrap.dedent("""
    import json, os, socket, subprocess, sys, threading
    from pathlib import Path
    import torch
    from metal_accel.sandbox import confine
    scratch, ro, outside, cache, port = sys.argv[1:6]
    layers = confine.apply(Path(scratch), read_only=[Path(ro)])
    out = {"layers": layers}
    def attempt(name, fn):
        try:
            fn()
            out[name] = "allowed"
        except Exception as exc:
            out[name] = f"denied: {type(exc).__name__}"
    attempt("write_scratch", lambda: Path(scratch, "ok").write_text("1"))
    attempt("read_ro", lambda: Path(ro, "data").read_text())
    attempt("write_ro", lambda: Path(ro, "new").write_text("1"))
    attempt("write_outside", lambda: Path(outside, "marker").write_text("1"))
    attempt("write_cache", lambda: Path(cache, "marker").write_text("1"))
    attempt("read_cache", lambda: Path(cache, "secret").read_text())
    attempt("list_home", lambda: os.listdir(os.path.expanduser("~root")))
    attempt("parent_environ", lambda: open(f"/proc/{os.getppid()}/environ").read())
    attempt("connect", lambda: socket.create_connection(("127.0.0.1", int(port)), timeout=2))
    attempt("exec_sh", lambda: subprocess.run(["/bin/sh", "-c", f"echo x > {outside}/sh_marker"], check=True))
    attempt("fork", lambda: os.waitpid(os.fork(), 0) if True else None)
    attempt("signal_parent", lambda: os.kill(os.getppid(), 0))
    attempt("thread", lambda: [t.start() or t.join() for t in [threading.Thread(target=lambda: None)]])
    attempt("torch", lambda: float((torch.randn(300, 300) @ torch.randn(300, 300)).sum()))
    print("RESULT " + json.dumps(out))
""")


def test_scrubbed_environment_keeps_only_what_the_worker_needs(tmp_path):
    parent = {"OPENAI_API_KEY": "sk-secret", "AWS_SECRET_ACCESS_KEY": "x", "MY_VAR": "y", "HOME": "/home/u",
              "PATH": "/home/u/bin:/usr/bin", "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "2", "CXX": "g++",
              "CUDA_VISIBLE_DEVICES": "1", "PYTHONPATH": "/somewhere/else", "LANG": "de_DE.UTF-8"}
    env = confine.scrubbed_environment(tmp_path, parent)
    assert "sk-secret" not in json.dumps(env) and "MY_VAR" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
    assert env["OMP_NUM_THREADS"] == "3" and env["MKL_NUM_THREADS"] == "2" and env["CXX"] == "g++"
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["LANG"] == env["LC_ALL"] == "C"
    assert "PYTHONPATH" not in env  # this checkout is not named there
    assert "/home/u/bin" not in env["PATH"].split(os.pathsep)


def test_sufficient_needs_a_filesystem_or_syscall_layer():
    assert not confine.sufficient(["scratch cwd/HOME/TMPDIR", "rlimits (no core)",
                                   "landlock: not applied (no Landlock)", "seccomp: not applied (no libseccomp)"])
    assert confine.sufficient(["landlock (filesystem, ABI 7)", "seccomp: not applied (no libseccomp)"])
    assert confine.sufficient(["landlock: not applied (no Landlock)", "seccomp"])


def test_describe_names_what_this_machine_supports():
    info = confine.describe()
    assert info["platform"] == sys.platform
    if sys.platform.startswith("linux"):
        assert info["landlock_abi"] == confine.landlock_abi()
        assert info["confined"] == (info["landlock_abi"] > 0 or str(info["seccomp"]).startswith("available"))


@pytest.mark.slow
@linux
@needs_landlock
@needs_seccomp
def test_confined_process_cannot_escape(tmp_path):
    scratch, ro, outside, cache = (tmp_path / n for n in ("scratch", "ro", "outside", "cache"))
    for d in (ro, outside, cache):
        d.mkdir()
    (ro / "data").write_text("readable")
    (cache / "secret").write_text("token")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    proc = subprocess.run([sys.executable, "-c", PROBE, str(scratch), str(ro), str(outside), str(cache), str(port)],
                          capture_output=True, text=True, timeout=HANG_S)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, proc.stderr[-2000:]
    out = json.loads(line[len("RESULT "):])
    assert any(l.startswith("landlock (") for l in out["layers"]) and "seccomp" in out["layers"], out["layers"]
    for allowed in ("write_scratch", "read_ro", "thread", "torch"):
        assert out[allowed] == "allowed", (allowed, out)
    for denied in ("write_ro", "write_outside", "write_cache", "read_cache", "list_home", "parent_environ",
                   "connect", "exec_sh", "fork", "signal_parent"):
        assert out[denied].startswith("denied"), (denied, out)
    with pytest.raises(socket.timeout):
        listener.accept()  # no connection ever arrived
    listener.close()
    assert sorted(p.name for p in outside.iterdir()) == [] and sorted(p.name for p in cache.iterdir()) == ["secret"]


@linux
def test_launcher_runs_the_module_in_its_own_network_namespace(tmp_path):
    (tmp_path / "probe_netns.py").write_text(
        "import os, socket\nprint('NETNS', os.environ.get('METAL_ACCEL_NETNS'))\n"
        "print('IFACES', sorted(n for _, n in socket.if_nameindex()))\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, confine.__file__, "-m", "probe_netns"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-1000:]
    netns = next(l for l in proc.stdout.splitlines() if l.startswith("NETNS"))
    if "not applied" in netns:
        pytest.skip(f"this machine refuses user namespaces: {netns}")  # optional layer, reported as such
    ifaces = next(l for l in proc.stdout.splitlines() if l.startswith("IFACES"))
    assert ifaces == "IFACES ['lo']", ifaces  # only the new namespace's own, down loopback


def test_python_path_keeps_code_dirs_but_never_home(tmp_path, monkeypatch):
    code = tmp_path / "site"
    code.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    kept = confine.python_path_dirs(os.pathsep.join([str(code), str(tmp_path / "home"), str(tmp_path / "missing"), "/"]))
    assert kept == [str(code.resolve())]
    env = confine.scrubbed_environment(tmp_path / "scratch", {"PYTHONPATH": str(code), "NCCL_NVLS_ENABLE": "0",
                                                              "OPENAI_API_KEY": "sk-test"})
    assert env["PYTHONPATH"] == str(code.resolve()) and env["NCCL_NVLS_ENABLE"] == "0"
    assert "OPENAI_API_KEY" not in env
