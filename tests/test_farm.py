"""The synthesis farm on Ray: device kinds as custom resources, and a run on a local Ray cluster with two
simulated device kinds (proofs on the CPU backend), LLM requests through the farm's gateway to the scripted
local server, one merged bundle that verifies. Skipped where Ray is not installed (the `farm` extra)."""
from __future__ import annotations

import functools
import json
import re
import sys

import pytest

from metal_accel.cli import farm as cli_farm
from metal_accel.cli.main import main
from metal_accel.store.bundle import verify_bundle
from metal_accel.store.cache import CacheDir
from metal_accel.store.manifest import unpack
from metal_accel.synth.budget import Limits
from metal_accel.synth.farm import (LLM_RESOURCE, FarmError, backend_of, cluster_kinds, device_kind, node_resources,
                                    resource_of, run_farm, share, worker_options)
from metal_accel.synth.settings import SynthSettings

from test_synth_loop import fence, llm, poly_candidate  # noqa: F401
from test_synth_problems import PROBLEM

try:
    import ray
except ImportError:
    ray = None
needs_ray = pytest.mark.skipif(ray is None, reason="needs Ray: pip install 'metal-accel[farm]'")
KINDS = ("cpu:sim-a", "cpu:sim-b")


def test_device_kinds_as_ray_resources():
    kind = device_kind("cpu")
    assert kind.startswith("cpu:") and backend_of(kind) == "cpu" and backend_of(resource_of(kind)) == "cpu"
    assert node_resources(["cpu"], llm=True) == {resource_of(kind): 1, LLM_RESOURCE: 1}
    found = cluster_kinds({"CPU": 16.0, "metal_accel:mps:apple-m1": 1.0, "metal_accel:mps:apple-m4": 2.0,
                           LLM_RESOURCE: 1.0, "node:10.0.0.1": 1.0})
    assert found == {"mps:apple-m1": 1, "mps:apple-m4": 2}
    assert share(Limits(tokens=1000, cost_usd=3.0, wall_s=60.0), 3) == Limits(tokens=333, cost_usd=1.0, wall_s=60.0)


def test_the_farm_report_says_which_cap_cut_problems_short(capsys):
    from metal_accel.synth.farm import FarmResult
    result = FarmResult({"cpu:sim-a": 2}, spent=[{"requests": 3}, {"requests": 2}])
    stopped = {"stop_reason": "run token budget reached (3000 spent, 0 reserved, the next request may take 9000)"}
    result.results = [{"problem": "a", "synthesis": [{"stop_reason": ""}], "finished": True, "stopped": ""},
                      {"problem": "b", "synthesis": [stopped, stopped], "finished": False, "stopped": ""},
                      {"problem": "c", "synthesis": [], "finished": False,  # never asked: the cap was reached
                       "stopped": "run time budget reached (330 s of 330 s)"},
                      {"problem": "d", "error": "loading failed"}]
    cli_farm._report(result, sys.stdout)
    err = capsys.readouterr().err
    assert "stopped early (run time budget reached; run token budget reached): 2 problem(s) not finished" in err, err
    assert "each of the 2 workers has its share" in err
    result.results = result.results[:1]
    cli_farm._report(result, sys.stdout)
    assert "stopped early" not in capsys.readouterr().err

def test_each_cuda_worker_gets_a_gpu_of_its_own_where_the_cluster_has_enough(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert node_resources(["cuda", "cpu"]) == {resource_of("cuda:sm90"): 4, resource_of(device_kind("cpu")): 1}
    four_gpus = {"CPU": 64.0, "GPU": 4.0, resource_of("cuda:sm90"): 4.0}
    opts = worker_options("cuda:sm90", four_gpus, cuda_workers=4, problems_at_once=4)
    assert opts["num_gpus"] == 1 and opts["resources"] == {resource_of("cuda:sm90"): 1}
    assert "num_gpus" not in worker_options("cuda:sm90", {**four_gpus, "GPU": 2.0}, 4, 4)  # would never start
    assert "num_gpus" not in worker_options("cpu:sim-a", four_gpus, 4, 4)


def test_farm_node_prints_the_resources(capsys):
    assert main(["farm", "node", "--json", "--llm"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res == node_resources(["cpu"], llm=True)
    assert main(["farm", "node"]) == 0
    assert "ray start --address=" in capsys.readouterr().out


@needs_ray
@pytest.mark.needs_cxx
@pytest.mark.slow
def test_farm_on_a_local_cluster_with_two_device_kinds(llm, tmp_path, monkeypatch, capsys):  # noqa: F811
    server = llm({"gpt-4o": [fence(poly_candidate())]})
    problems = tmp_path / "problems"
    problems.mkdir()
    (problems / "1_poly.py").write_text(PROBLEM)
    (problems / "2_poly_wide.py").write_text(PROBLEM.replace("torch.randn(4, 256)", "torch.randn(8, 256)"))
    # each simulated node has a cache and a verdict key of its own, as separate machines would
    env = {k: {"METAL_ACCEL_USER_CACHE": str(tmp_path / k.replace(":", "-") / "cache"),
               "METAL_ACCEL_CONFIG_DIR": str(tmp_path / k.replace(":", "-") / "config")} for k in KINDS}
    monkeypatch.setattr(cli_farm, "run_farm", functools.partial(run_farm, worker_env=env))
    ray.init(num_cpus=2, resources={resource_of(k): 1 for k in KINDS}, include_dashboard=False,
             log_to_driver=False)
    try:
        with pytest.raises(FarmError, match="no node of kind cuda:sm90"):
            run_farm([], ["openai:gpt-4o"], SynthSettings(), tmp_path / "none.tar.gz", kinds=["cuda:sm90"])
        bundle = tmp_path / "kernels.tar.gz"
        code = main(["synth", str(problems), "--models", "openai:gpt-4o", "--samples", "1", "--rounds", "1",
                     "--no-profile", "--farm", "--bundle", str(bundle)])
    finally:
        ray.shutdown()
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("1_poly", "2_poly_wide"):
        for kind in KINDS:
            assert f"# {name} on {kind}\n" in out, out
    # every problem ran on both kinds; a kernel's speed gate on two workers sharing 2 busy cores is not this
    # test's subject, so it asks for a kernel per problem on at least one kind, not on both
    kernels = int(re.search(r"farm: (\d+) kernels for 4 problem runs on 2 device kinds", out).group(1))
    assert kernels >= 2, out
    assert len(server.requests) == 4  # one answer per problem and kind, each sent by the gateway
    unpacked = unpack(bundle, tmp_path / "unpacked")
    report = verify_bundle(unpacked)
    entries = list(CacheDir(unpacked, writable=False, name="t").entries())
    assert report.clean and len(report.ok) == len(entries) == 2, (report.problems, out)
    assert all(any(v.accepted for v in e.verdicts.values()) for e in entries)
    assert re.search(r"merged [12] bundles", out) and "lock " in out
