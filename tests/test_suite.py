"""`metal-accel bench`: KernelBench-format problems through the pipeline, on the CPU backend (no GPU needed)."""
from __future__ import annotations

import json
import re
import logging
import sys
from pathlib import Path

import pytest
import torch

from metal_accel import blocks
from metal_accel.cli.main import main
from metal_accel.kernelbench.problems import load_problems
from metal_accel.kernelbench.runner import Row, SuiteResult, fit_batch, problem_key, select
from metal_accel.kernelbench.report import markdown

PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale

batch_size = 64
dim = 4096

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return [2.0]
'''

CANDIDATE = '''
SOURCE = r"""
#include <cstdint>
extern "C" void relu_scale(const float* x, float* y, float s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] > 0.0f ? x[i] : (x[i] != x[i] ? x[i] : 0.0f)) * s;
}
"""

def forward(module, x):
    y = torch.empty_like(x)
    lib.relu_scale(x.contiguous(), y, float(module.scale), x.numel())
    return y
'''


@pytest.fixture
def suite_dir(tmp_path: Path) -> tuple[Path, Path]:
    probs = tmp_path / "problems"
    probs.mkdir()
    (probs / "7_ReluScale.py").write_text(PROBLEM)
    cands = tmp_path / "cands" / "cpu"
    cands.mkdir(parents=True)
    (cands / "7_ReluScale.py").write_text(CANDIDATE)
    return probs, tmp_path / "cands"


def test_fit_batch_halves_to_the_cap(suite_dir):
    (p,) = load_problems(suite_dir[0])
    assert fit_batch(p, None) == (64, 64)
    assert fit_batch(p, 0.3) == (64, 16)  # 16 x 4096 floats = 0.26 MB
    assert p.load().batch_size == 16


def test_select_by_key_id_and_glob():
    rows = [type("P", (), {"level": 2, "problem_id": i, "name": n})() for i, n in ((1, "Conv2D_ReLU"), (12, "Gemm_X"))]
    assert [problem_key(p) for p in rows] == ["L2_1_Conv2D_ReLU", "L2_12_Gemm_X"]
    assert select(rows, ["12"]) == rows[1:] and select(rows, ["*Conv*"]) == rows[:1]
    assert select(rows, ["L2_*"]) == rows and select(rows, None) == rows


def test_summary_and_markdown():
    rows = [Row("L2_1_a", 2, 1, "a", attempted=True, status="kernel", candidate_correct=True, vs_eager=2.0, vs_compile=1.5),
            Row("L2_2_b", 2, 2, "b", attempted=True, status="eager", candidate_correct=False, vs_eager=1.0,
                vs_compile=0.5, reason="all 1 candidates rejected; best: incorrect"),
            Row("L2_3_c", 2, 3, "c", attempted=False, status="eager", vs_eager=1.0)]
    res = SuiteResult(rows, {}, None)
    s = res.summary(2)
    assert s["attempted"] == 2 and s["installed"] == 1 and s["correct"] == 1
    assert abs(s["geomean_vs_eager"] - 2 ** 0.5) < 1e-9 and abs(s["geomean_vs_compile"] - 0.75 ** 0.5) < 1e-9
    assert s["fraction_correct_and_1.05x"] == 0.5 and s["installed_slower_than_eager"] == []
    md = markdown(res)
    assert "L2_2_b" in md and "incorrect" in md and "1.41x vs eager" in md
    best = res.best_summary(2)  # every measured problem, attempted or not
    assert best["measured"] == 3 and best["runs"] == {"kernel": 1, "compile": 0, "graph": 0, "eager": 2}
    assert abs(best["geomean_vs_eager"] - 2 ** (1 / 3)) < 1e-9 and best["min_vs_compile"] == 0.5
    assert "chosen best over all 3 measured problems" in md


@pytest.mark.needs_cxx
@pytest.mark.slow
def test_bench_cli_end_to_end_on_cpu(suite_dir, tmp_path, capsys, caplog):
    probs, cands = suite_dir
    out = tmp_path / "out"
    caplog.set_level(logging.NOTSET, logger="metal_accel")  # restored after the test; -vv sets DEBUG
    rc = main(["-vv", "bench", str(probs), "--backend", "cpu", "--provider", f"dir:{cands}", "--no-compile",
               "--budget", "0.2", "--bench-budget", "0.2", "--max-tensor-mb", "0.3", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    data = json.loads((out / "suite.json").read_text())
    (row,) = data["rows"]
    assert row["key"] == "7_ReluScale" and row["batch"] == 16 and row["batch_original"] == 64
    assert row["attempted"] and row["candidate_correct"] is True and row["output_ok"] is True
    assert row["eager_us"] > 0 and row["kernel_us"] > 0 and row["status"] in ("kernel", "eager")
    assert (out / "suite.md").exists() and (out / "suite.partial.jsonl").read_text().strip()
    assert "7_ReluScale" in capsys.readouterr().out
    logged = caplog.text  # -vv: each step's duration, each candidate's proof, each trial batch
    for step in ("model, inputs and an eager reference took", "the pipeline (capture, proofs, speed gates) took",
                 "side-by-side timing took", "made, run and judged in"):
        assert step in logged, step
    assert re.search(r"proof of \d+ trials took", logged)  # 8 or 9 trials, as the plan has structured rows


@pytest.mark.slow
def test_blocks_run_eagerly_and_have_cuda_sources():
    root = Path(__file__).resolve().parent.parent / "kernels_src" / "cuda"
    for name, module, make in blocks.shipped_blocks("cpu"):
        args = make()
        out = module(*args)
        assert out.shape == args[0].shape or isinstance(module, blocks.ConvBnAct), name
        assert (root / f"{type(module).__name__}.py").is_file(), name
    x = torch.randn(4, 8)
    torch.testing.assert_close(blocks.rotate_half(blocks.rotate_half(x)), -x)


def test_mismatch_reason_tells_irreproducible_eager_from_installed_modules():
    from types import SimpleNamespace

    from metal_accel.kernelbench.problem import _mismatch_reason
    from metal_accel.proof.validate import Mismatch

    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)

    x = torch.ones(4)
    report = SimpleNamespace(modules=[SimpleNamespace(name="Model", status="eager"),
                                      SimpleNamespace(name="norm", status="compile")])
    noisy = Noisy()
    assert "eager itself is not reproducible" in _mismatch_reason(noisy, (x,), noisy(x), report, Mismatch("m"))
    plain = torch.nn.Identity()
    reason = _mismatch_reason(plain, (x,), plain(x), report, Mismatch("m"))
    assert reason.startswith("optimized output differs from eager (norm (compile) not eager)")


def test_a_kernel_that_lost_only_to_torch_compile_counts_as_correct():
    from metal_accel.kernelbench.problem import _candidate_correct
    row = Row("L2_1_x", 2, 1, "x", attempted=True, status="compile",
              outpaced=["dir:cands/x.py: 1.30x eager over 500 interleaved pairs"])
    assert _candidate_correct(row) is True
    res = SuiteResult([row], {}, None)
    assert res.summary()["outpaced_by_compile"] == 1
    row.status = "graph"  # the same compile replayed as a CUDA graph
    assert _candidate_correct(row) is True and res.summary()["outpaced_by_compile"] == 1
    row.outpaced = []
    assert _candidate_correct(row) is False


@pytest.mark.slow
def test_a_problem_whose_weights_would_not_fit_is_skipped_not_run(tmp_path, monkeypatch):
    import metal_accel.kernelbench.problem as sp
    import metal_accel.kernelbench.sizes as sizes
    heavy = PROBLEM.replace("self.scale = scale", "self.scale = scale\n        self.proj = nn.Linear(1024, 1024)")
    (tmp_path / "9_Heavy.py").write_text(heavy)
    (p,) = load_problems(tmp_path / "9_Heavy.py")
    assert sp.state_mb(p) == pytest.approx((1024 * 1024 + 1024) * 4 / 1e6)
    assert sp.too_heavy(p, "cpu") is None  # 4 MB of weights: far below a fifth of any machine's memory
    monkeypatch.setattr(sizes, "device_memory_mb", lambda device: 24.0)  # room for 18 MB of copies
    assert sp.too_heavy(p, "cpu", kernels=False) is None  # the model and its float64 reference: 3 copies
    assert "5 copies of them (a kernel candidate runs in a worker)" in sp.too_heavy(p, "cpu", kernels=True)
    twins: list = []
    models: list = []
    instantiate = type(p).instantiate
    monkeypatch.setattr(torch, "compile", lambda m: twins.append(m) or m)
    monkeypatch.setattr(type(p), "instantiate", lambda self, *a: (lambda r: models.append(r[0]) or r)(instantiate(self, *a)))
    (tmp_path / "none").mkdir()
    row = sp.run_problem(p, ["dir:" + str(tmp_path / "none")], backend="cpu", device="cpu")
    assert row.status != "skipped" and row.eager_us is not None  # no kernel may come: no worker, so it fits
    (twin,), (model,) = twins, models  # whole-model compile's twin: its own modules, the model's weights
    assert twin is not model and twin.proj is not model.proj and twin.proj.weight is model.proj.weight
    row = sp.run_problem(p, ["openai"], backend="cpu", device="cpu")
    assert row.status == "skipped" and row.eager_us is None
    assert "parameters and buffers (4 MB) exceed 4 MB: the bench would hold 5 copies" in row.reason


def test_a_problem_too_large_for_the_cap_is_skipped_not_run(tmp_path):
    from metal_accel.kernelbench.problem import run_problem
    big = PROBLEM.replace("batch_size = 64\n", "").replace("torch.randn(batch_size, dim)", "torch.randn(1024, dim)")
    (tmp_path / "8_Big.py").write_text(big)
    (p,) = load_problems(tmp_path / "8_Big.py")
    row = run_problem(p, [], backend="cpu", device="cpu", max_tensor_mb=1.0)
    assert row.status == "skipped" and "17 MB tensor exceeds --max-tensor-mb 1" in row.reason
    assert "no batch_size" in row.reason and row.eager_us is None


def test_suite_result_reads_back_what_it_wrote():
    rows = [Row("L2_1_A", 2, 1, "A", batch=4, attempted=True, status="kernel", eager_us=10.0, compile_us=8.0,
                kernel_us=5.0, vs_eager=2.0, vs_compile=1.6, rejected=["x: slower"]),
            Row("L2_2_B", 2, 2, "B", status="skipped", reason="too large")]
    res = SuiteResult(rows, {"torch": "2.13.0"}, 3.0e12, "metal-accel bench ...")
    again = SuiteResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert again.rows == res.rows and again.dram_bandwidth == res.dram_bandwidth
    assert markdown(again) == markdown(res)


def test_cpu_bench_script_merges_per_problem_runs(tmp_path, monkeypatch):
    """benchmarks/kernelbench_cpu.py --cap: per-problem runs, each with its own cap, merged into one result."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import kernelbench_cpu
    assert kernelbench_cpu.parse_caps(["L1_45=1100", "L2_55=4"]) == {"L1_45": 1100.0, "L2_55": 4.0}
    with pytest.raises(SystemExit, match="expected KEY=MB"):
        kernelbench_cpu.parse_caps(["L1_45"])
    runs = []
    for i, key in enumerate(("L1_45_Pool", "L2_55_Matmul")):
        row = Row(key, int(key[1]), 45 + 10 * i, key[6:], status="compile", eager_us=10.0, compile_us=8.0,
                  kernel_us=7.0 + i, vs_eager=10 / (7 + i), vs_compile=8 / (7 + i))
        (tmp_path / key).mkdir()
        runs.append(tmp_path / key / "suite.json")
        runs[-1].write_text(json.dumps(SuiteResult([row], {"torch": "2.13.0"}, None, f"bench {key}").to_dict()))
    kernelbench_cpu.merge(runs, tmp_path)
    merged = SuiteResult.from_dict(json.loads((tmp_path / "suite.json").read_text()))
    assert [r.key for r in merged.rows] == ["L1_45_Pool", "L2_55_Matmul"]
    assert merged.command == "bench L1_45_Pool ; bench L2_55_Matmul"
    assert merged.best_summary()["measured"] == 2 and "L2_55_Matmul" in (tmp_path / "suite.md").read_text()


def test_cpu_bench_script_records_a_run_made_elsewhere_with_its_machine_and_date(tmp_path, monkeypatch):
    """--from DIR --machine M --date D: a results file for a run copied back from another host (no bench runs)."""
    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    monkeypatch.syspath_prepend(str(bench_dir))
    import kernelbench_cpu
    import results
    row = Row("L1_4_Matvec", 1, 4, "Matvec", status="eager", eager_us=10.0, compile_us=10.2, kernel_us=10.0,
              vs_eager=1.0, vs_compile=1.02)
    (tmp_path / "L1_4").mkdir()
    (tmp_path / "L1_4" / "suite.json").write_text(json.dumps(SuiteResult([row], {"torch": "2.11"}, None, "b").to_dict()))
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(results, "ROOT", tmp_path)
    argv = ["kernelbench_cpu.py", "--keys", "L1_4", "--run", "elsewhere", "--from", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--machine", "a 16-core host", "--date", "2026-01-02"])
    assert kernelbench_cpu.main() == 0
    files = list((tmp_path / "results").rglob("*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text())
    assert doc["machine"] == "a 16-core host" and doc["date"] == "2026-01-02" and "L1_4_Matvec" in files[0].read_text()
    monkeypatch.setattr(sys, "argv", ["kernelbench_cpu.py", "--keys", "L1_4", "--run", "x", "--machine", "m"])
    with pytest.raises(SystemExit):
        kernelbench_cpu.main()


def test_cpu_bandwidth_times_every_function_each_round_and_tables_the_ratios(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import cpu_bandwidth
    calls: list[str] = []
    fns = {n: (lambda *a, n=n: calls.append(n)) for n in ("eager", "torch.compile", "kernel", "read")}
    med = cpu_bandwidth.interleaved(fns, [(1,), (2,)], rounds=8)
    assert set(med) == set(fns) and all(calls.count(n) == 2 + 8 for n in fns)  # two warm-up sets, then 8 rounds
    assert calls[8:12] == ["eager", "torch.compile", "kernel", "read"] and calls[12] == "torch.compile"  # rotating
    row = {"key": "L1_45_x", "batch": 1, "mbytes": 1000.0, "us": {"eager": 300.0, "torch.compile": 100.0,
                                                                  "kernel": 125.0, "read": 90.0},
           "gbs": {"eager": 3.3, "torch.compile": 10.0, "kernel": 8.0, "read": 10.0}}
    assert "| 0.80x | 80% |" in cpu_bandwidth.table([row])
