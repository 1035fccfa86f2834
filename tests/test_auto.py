"""Zero-code use: `import metal_accel` alone runs cached kernels; recording; re-validation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import metal_accel
from metal_accel.store import cache as cache_mod

from test_optimize import candidates, chain_report
from toymodels import GOOD, Net
from limits import HANG_S

# slow: cold subprocesses that import metal_accel, some with torch.compile
pytestmark = [pytest.mark.slow, pytest.mark.needs_cxx]
HERE = Path(__file__).parent

USE = """
import sys, json, torch
sys.path.insert(0, {here!r})
{first}
x = torch.randn(4, 256)
m = Net().eval()
with torch.inference_mode():
    y = m(x)
auto = m.chain.__dict__.get("_metal_accel_auto")
import metal_accel.auto.hook as hook
patched = [c.__name__ for c in hook.patched_classes()]
hook.deactivate()
with torch.inference_mode():
    ref = m(x)
print(json.dumps({{"hits": auto.hits if auto else 0, "patched": patched,
                  "max_err": ((y - ref).abs() / (ref.abs() + 1)).max().item()}}))
"""


def run_script(cache: Path, first: str, **env: str) -> dict:
    script = USE.format(here=str(HERE), first=first)
    full_env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(cache), **env}
    out = subprocess.run([sys.executable, "-c", script], env=full_env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def cached_chain(tmp_path, isolated_user_cache) -> Path:
    model = Net().eval()
    metal_accel.optimize(model, (torch.randn(4, 256),), providers=[candidates(tmp_path, good=GOOD)])
    assert chain_report(model).status == "kernel"
    return isolated_user_cache


@pytest.mark.parametrize("first", [
    "import metal_accel\nfrom toymodels import Net",   # patched lazily, when toymodels is imported
    "from toymodels import Net\nimport metal_accel",   # patched at once
])
def test_import_alone_runs_cached_kernels(cached_chain, first):
    res = run_script(cached_chain, first)
    assert res["patched"] == ["Chain"]
    assert res["hits"] == 1
    # within the pipeline's float32 tolerance (validate.TOLERANCES: rtol 1e-4); the fused kernel's
    # contracted multiply-adds round differently from eager's separate ops over three rounds
    assert res["max_err"] < 1e-4


def test_disable_turns_it_off(cached_chain):
    res = run_script(cached_chain, "import metal_accel\nfrom toymodels import Net", METAL_ACCEL_DISABLE="1")
    assert res["patched"] == [] and res["hits"] == 0


def test_changed_class_source_is_not_patched(cached_chain):
    index = cached_chain / "index.json"
    data = json.loads(index.read_text())
    for rec in data["entries"].values():
        rec["class_source_sha"] = "0" * 64  # as if the library's class changed since caching
    index.write_text(json.dumps(data))
    res = run_script(cached_chain, "import metal_accel\nfrom toymodels import Net")
    assert res["patched"] == [] and res["hits"] == 0


def _make_foreign(cache: Path) -> None:
    """Rewrite the verdicts as if they had been measured on another device."""
    for path in (cache / "cpu").glob("*.json"):
        data = json.loads(path.read_text())
        if not data.get("candidate"):
            continue
        verdicts = {}
        for v in data["verdicts"].values():
            v["env"]["device_name"] = "Some Other CPU"
            env = metal_accel.backends.Environment.from_dict(v["env"])
            verdicts[env.id] = v
        data["verdicts"] = verdicts
        path.write_text(json.dumps(data))


def test_foreign_verdict_is_proven_here_on_first_use(cached_chain):
    _make_foreign(cached_chain)
    res = run_script(cached_chain, "import metal_accel\nfrom toymodels import Net")
    assert res["hits"] == 1
    env = metal_accel.get_backend("cpu").environment()
    entries = [e for e in cache_mod.user_cache().entries("cpu") if e.candidate is not None]
    assert entries and all(e.verdict_for(env) is not None and e.verdict_for(env).accepted for e in entries)
    assert all(len(e.verdicts) == 2 for e in entries)  # the other device's verdict is kept


def test_foreign_verdict_is_not_run_when_revalidation_is_left_to_optimize(cached_chain):
    _make_foreign(cached_chain)
    res = run_script(cached_chain, "import metal_accel\nfrom toymodels import Net",
                     METAL_ACCEL_REVALIDATE="optimize")
    assert res["hits"] == 0
    env = metal_accel.get_backend("cpu").environment()
    assert all(e.verdict_for(env) is None for e in cache_mod.user_cache().entries("cpu"))


def test_recording_then_offline_listing(tmp_path, isolated_user_cache):
    script = (f"import sys, torch\nsys.path.insert(0, {str(HERE)!r})\nimport metal_accel\n"
              "from toymodels import Net\nm = Net().eval()\n"
              "with torch.inference_mode():\n    for _ in range(3): m(torch.randn(2, 256))\n")
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(isolated_user_cache), "METAL_ACCEL_RECORD": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    from metal_accel.auto.record import load_recorded_module, recorded_calls
    recs = {r.class_path.rsplit(".", 1)[-1]: r for r in recorded_calls()}
    assert set(recs) == {"Net", "Chain", "Linear"}
    assert recs["Chain"].calls == 3 and recs["Chain"].input_spec.describe() == "float32[2,256]"
    assert recs["Net"].total_s >= recs["Chain"].total_s  # inclusive times: the parent is hotter
    module = load_recorded_module(recs["Chain"])
    assert type(module).__name__ == "Chain"


def test_recorded_calls_are_synthesized_offline_then_run_by_import(tmp_path, isolated_user_cache):
    script = (f"import sys, torch\nsys.path.insert(0, {str(HERE)!r})\nimport metal_accel\n"
              "from toymodels import Net\nm = Net().eval()\n"
              "with torch.inference_mode():\n    m(torch.randn(4, 256))\n")
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(isolated_user_cache), "METAL_ACCEL_RECORD": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    from metal_accel.auto.record import synthesize_recorded
    results = synthesize_recorded([candidates(tmp_path, good=GOOD)], top=5, progress=False)
    chain = [rep for rec, rep in results if rec.class_path.endswith(".Chain")]
    assert chain and chain[0].modules[0].status == "kernel"
    res = run_script(isolated_user_cache, "import metal_accel\nfrom toymodels import Net")
    assert res["hits"] == 1  # the next ordinary run picks the kernel up with no code change


COMPILED_USE = """
import sys, json, torch
sys.path.insert(0, {here!r})
import metal_accel
from test_compile_candidate import LongChain
m = LongChain().eval()
x = torch.randn(64, 1024)
with torch.inference_mode():
    y = m(x)
    y = m(x)
auto = m.__dict__.get("_metal_accel_auto")
import metal_accel.auto.hook as hook
hook.deactivate()
with torch.inference_mode():
    ref = m(x)
print(json.dumps({{"hits": auto.hits if auto else 0, "failures": auto.failures if auto else {{}},
                  "ops": [type(o).__name__ for o in (auto.table.values() if auto else [])],
                  "max_err": (y - ref).abs().max().item()}}))
"""


def test_import_alone_leaves_a_cached_torch_compile_verdict_to_optimize(isolated_user_cache, monkeypatch):
    """A torch.compile verdict is not a kernel `import metal_accel` may run: compiling on the first call of
    whatever module of that class and shape comes along would stall a path the user never optimized."""
    from test_compile_candidate import LongChain
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "1")
    model = LongChain().eval()
    metal_accel.optimize(model, (torch.randn(64, 1024),), progress=False)
    assert metal_accel.explain(model).modules[0].status == "compile"
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(isolated_user_cache)}
    script = COMPILED_USE.format(here=str(HERE)).replace(
        "hook.deactivate()", "patched = [c.__name__ for c in hook.patched_classes()]\nhook.deactivate()").replace(
        '"max_err":', '"patched": patched, "max_err":')
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["patched"] == [] and res["ops"] == [] and res["hits"] == 0, (res, out.stderr[-2000:])
    assert res["max_err"] == 0.0


USER_COMPILES = """
import sys, json, torch
sys.path.insert(0, {here!r})
import metal_accel
from toymodels import Net
m = Net().eval()
x = torch.randn(4, 256)
with torch.inference_mode():
    y = torch.compile(m)(x)
import metal_accel.auto.hook as hook
hook.deactivate()
with torch.inference_mode():
    ref = m(x)
print(json.dumps({{"max_err": ((y - ref).abs() / (ref.abs() + 1)).max().item()}}))
"""


def test_user_torch_compile_of_a_patched_class_runs(cached_chain):
    """torch.compile of a model whose classes import-time instrumentation patched traces the eager code."""
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(cached_chain)}
    out = subprocess.run([sys.executable, "-c", USER_COMPILES.format(here=str(HERE))], env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["max_err"] < 1e-4


def test_user_torch_compile_over_a_cached_torch_compile_verdict(isolated_user_cache, monkeypatch):
    from test_compile_candidate import LongChain
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "1")
    model = LongChain().eval()
    metal_accel.optimize(model, (torch.randn(64, 1024),), progress=False)
    assert metal_accel.explain(model).modules[0].status == "compile"
    script = USER_COMPILES.replace("from toymodels import Net", "from test_compile_candidate import LongChain as Net")
    script = script.replace("torch.randn(4, 256)", "torch.randn(64, 1024)")
    env = {**os.environ, "METAL_ACCEL_USER_CACHE": str(isolated_user_cache)}
    out = subprocess.run([sys.executable, "-c", script.format(here=str(HERE))], env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["max_err"] < 1e-4
