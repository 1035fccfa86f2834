"""Every CPU candidate for KernelBench (benchmarks/candidates/cpu) passes the static checks, compiles,
and passes the pipeline's whole proof against its problem's eager Model at a small batch.

Speed is not asserted here (a timed unit test on a shared machine proves nothing); the figures are
in docs/benchmarks.md, from benchmarks/kernelbench_cpu.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from metal_accel.backends.cpu_signature import parse_extern_c
from metal_accel.candidate import parse_candidate
from metal_accel.cli import main
from metal_accel.sandbox import check_host_code
from metal_accel.source_check import check_kernel_source

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = sorted((ROOT / "benchmarks" / "candidates" / "cpu").glob("*.py"))
KERNELBENCH = ROOT.parent / "shared" / "kernelbench" / "problems.jsonl"


def test_there_are_cpu_candidates():
    assert len(CANDIDATES) >= 10


@pytest.mark.parametrize("path", CANDIDATES, ids=lambda p: p.stem)
def test_static_checks(path):
    cand = parse_candidate(path.read_text(), "cpu", str(path))
    check_host_code(cand.code)
    check_kernel_source(cand.source, "c++")
    kernels = parse_extern_c(cand.source)
    launched = {line.split("lib.", 1)[1].split("(", 1)[0] for line in cand.code.splitlines() if "lib." in line}
    assert launched and launched <= set(kernels), f"host code launches {launched - set(kernels)}"


@pytest.mark.needs_cxx
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.skipif(not KERNELBENCH.is_file(), reason="the shared KernelBench problem list is not present")
def test_every_cpu_candidate_is_proven_correct_on_its_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / "cache"))
    keys = [p.stem for p in CANDIDATES]
    out = tmp_path / "out"
    rc = main(["bench", str(KERNELBENCH), "--backend", "cpu", "--provider", f"dir:{ROOT / 'benchmarks' / 'candidates'}",
               "--problems", *keys, "--attempted-only", "--max-tensor-mb", "2", "--no-compile",
               "--budget", "0.05", "--bench-budget", "0.05", "--out", str(out), "--no-progress"])
    assert rc == 0
    rows = {r["key"]: r for r in json.loads((out / "suite.json").read_text())["rows"]}
    assert sorted(rows) == sorted(keys)
    wrong = {k: r["reason"] for k, r in rows.items() if r["candidate_correct"] is not True or not r["output_ok"]}
    assert not wrong, wrong
