"""`metal-accel bench` measures honestly: balanced call order, its own noise stated, the tensor cap enforced
for problems the meta device cannot run, and what runs in the whole captured subtree (issue 27, deliverable 6)."""
from __future__ import annotations

import json
from collections import Counter
from itertools import pairwise, permutations
from pathlib import Path

import pytest
import torch

import metal_accel.kernelbench.problem as kp
from metal_accel.kernelbench import sizes
from metal_accel.kernelbench.problems import load_problems
from metal_accel.kernelbench.report import markdown
from metal_accel.kernelbench.result import Row, SuiteResult, call_counts
from metal_accel.kernelbench.timing import interleave
from metal_accel.proof.rotation import (
    Contender,
    balanced_calls,
    balanced_sequence,
    time_blocks,
)
from metal_accel.report import COVERED, ModuleReport

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kernelbench"

# forward reads a value: the meta device cannot run it, the CPU can
NOT_ON_META = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * float(x.abs().max().item() > 0)

{batch}
def get_inputs():
    return [torch.randn({rows}, 1024)]

def get_init_inputs():
    return []
'''


def _problem(tmp_path: Path, name: str, code: str):
    (tmp_path / f"{name}.py").write_text(code)
    (p,) = load_problems(tmp_path / f"{name}.py")
    return p


def _pairs(calls: list[str]) -> Counter:
    return Counter((a, b) for a, b in pairwise(calls) if a != b)


# ---------------------------------------------------------------- order

@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_one_round_takes_every_ordered_pair_once(n):
    seq = balanced_sequence(n)
    closed = seq + seq[:1]  # the next round's first call closes the round
    assert sorted(pairwise(closed)) == sorted(permutations(range(n), 2))


def test_each_contender_runs_right_after_each_other_equally_often():
    calls: list[str] = []
    names = ("eager", "eager_again", "optimized", "compile")
    fns = {n: (lambda *a, n=n: calls.append(n)) for n in names}
    times = interleave(fns, [(1,), (2,), (3,)], lambda: None, None, budget_s=0.0, min_samples=30)
    timed = calls[2 * len(names):]  # after the two warm-up calls of each
    pairs = _pairs(timed)
    assert set(pairs) == set(permutations(names, 2))  # the optimized model also runs right after compile, ...
    assert max(pairs.values()) - min(pairs.values()) <= 1, pairs  # ... as often as right after eager
    assert len({len(t) for t in times.values()}) == 1 and min(map(len, times.values())) >= 30
    assert all(Counter(timed)[n] == len(times[n]) for n in names)


@pytest.mark.parametrize("n,samples", [(2, 5), (3, 6), (4, 7), (5, 1)])
def test_whole_rounds_give_every_contender_the_same_number_of_calls(n, samples):
    calls = balanced_calls([f"c{i}" for i in range(n)], samples)
    counts = Counter(calls)
    assert len(set(counts.values())) == 1 and min(counts.values()) >= samples
    pairs = _pairs(calls + calls[:1])  # closed onto the next round
    assert set(pairs) == set(permutations(counts, 2)) and len(set(pairs.values())) == 1


def test_blocks_run_enter_and_leave_outside_the_timed_span_and_sync_each_block():
    log: list[str] = []
    cs = [Contender("a", lambda: log.append("a")), Contender("b", lambda: log.append("b"),
                                                             lambda: log.append("on"), lambda: log.append("off"))]
    times = time_blocks(cs, 3, 4, lambda: log.append("sync"))
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4}
    assert log[:5] == ["sync", "a", "a", "a", "sync"]
    assert log[5:11] == ["on", "sync", "b", "b", "b", "sync"] and log[11] == "off"


@pytest.mark.slow
def test_the_bench_times_eager_against_a_second_copy_of_itself_in_the_same_rounds(monkeypatch):
    seen: list[dict] = []
    real = kp.interleave
    monkeypatch.setattr(kp, "interleave", lambda fns, *a, **k: seen.append(dict(fns)) or real(fns, *a, **k))
    (p,) = load_problems(FIXTURES / "level1" / "1_ReLU.py")
    row = kp.run_problem(p, [], backend="cpu", device="cpu", with_compile=False, budget_s=0.05)
    (fns,) = seen
    assert list(fns) == ["eager", "eager_again", "optimized"]
    # eager is the model as the user had it, called directly (no wrapper the optimized model does not pay)
    eager, again, optimized = fns.values()
    assert type(eager) is type(again) is type(optimized) and len({id(eager), id(again), id(optimized)}) == 3
    assert "forward" not in vars(eager) and "forward" not in vars(again)
    assert row.eager_again_us > 0 and row.self_noise is not None and 0 <= row.self_noise < 10
    assert row.self_noise == pytest.approx(abs(1 - row.eager_again_us / row.eager_us))
    assert row.samples >= 10
    res = SuiteResult([row], {}, None)
    noise = res.best_summary()["self_noise"]
    assert noise["problems"] == 1 and noise["median"] == noise["max"] == row.self_noise
    md = markdown(res)
    assert "self-noise (eager timed against a second copy of itself" in md
    assert f"| {100 * row.self_noise:.1f}% |" in md  # the row's own noise column


# ---------------------------------------------------------------- the final check's precision rule

LINEAR = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 64)

    def forward(self, x):
        return self.fc(x)

def get_inputs():
    return [torch.randn(32, 256)]

def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("precision", ["eager", "compile"])
def test_the_final_check_of_the_optimized_output_uses_the_runs_precision_rule(tmp_path, monkeypatch, precision):
    """The bench's own check of the optimized model judges by the rule the proof used: the run's precision
    setting and eager's reduced-precision flags for the ops it ran (here oneDNN's bf16 float32 matmuls),
    not float32's default."""
    rules: list = []
    real = kp.spot_check
    monkeypatch.setattr(kp, "spot_check", lambda sets, ref64=None, rule=None: rules.append(rule)
                        or real(sets, ref64, rule))
    if precision == "compile":
        monkeypatch.setenv("METAL_ACCEL_PRECISION", "compile")
    p = _problem(tmp_path, "3_Linear", LINEAR)
    saved = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        row = kp.run_problem(p, [], backend="cpu", device="cpu", with_compile=False, budget_s=0.0)
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = saved
    (rule,) = rules
    assert row.output_ok, row.reason
    if precision == "compile":
        assert rule.compile
    else:
        assert rule.name == "eager" and ("cpu", "matmul", "bf16") == rule.reduced[0][:3], rule


# ---------------------------------------------------------------- the cap

def test_the_cap_is_enforced_for_a_problem_the_meta_device_cannot_run(tmp_path):
    # 1536 x 1024 floats: a 6 MB input, no batch_size to shrink
    p = _problem(tmp_path, "5_NotOnMeta", NOT_ON_META.format(batch="", rows=1536))
    with pytest.raises(RuntimeError, match="meta"):
        sizes._on_meta(p)
    assert sizes.largest_tensor_mb(p) == pytest.approx(1536 * 1024 * 4 / 1e6)  # measured for real instead
    row = kp.run_problem(p, [], backend="cpu", device="cpu", max_tensor_mb=2.0, with_compile=False)
    assert row.status == "skipped" and row.eager_us is None
    assert "a 6 MB tensor exceeds --max-tensor-mb 2" in row.reason and "no batch_size" in row.reason


@pytest.mark.slow
def test_the_batch_is_halved_under_the_cap_for_a_problem_the_meta_device_cannot_run(tmp_path):
    p = _problem(tmp_path, "6_NotOnMetaBatched", NOT_ON_META.format(batch="batch_size = 1536\n", rows="batch_size"))
    assert kp.fit_batch(p, 2.0) == (1536, 384)  # 384 x 1024 floats: 1.6 MB
    row = kp.run_problem(p, [], backend="cpu", device="cpu", max_tensor_mb=2.0, with_compile=False, budget_s=0.05)
    assert row.status != "skipped" and row.batch == 384 and row.eager_us > 0


def test_a_problem_whose_sizes_cannot_be_measured_is_skipped_under_a_cap_with_the_reason(tmp_path):
    code = NOT_ON_META.format(batch="", rows=8).replace("return x *", "raise RuntimeError('needs a GPU')\n        return x *")
    p = _problem(tmp_path, "7_Unmeasurable", code)
    row = kp.run_problem(p, [], backend="cpu", device="cpu", max_tensor_mb=2.0, with_compile=False)
    assert row.status == "skipped" and "cannot be enforced" in row.reason and "needs a GPU" in row.reason


def test_the_weight_check_builds_on_the_cpu_a_model_the_meta_device_cannot_build(tmp_path, monkeypatch):
    code = NOT_ON_META.format(batch="", rows=8).replace(
        "class Model(nn.Module):\n", "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.w = nn.Parameter(torch.randn(1024, 1024))\n        self.top = float(self.w.detach().abs().max())\n\n")
    p = _problem(tmp_path, "8_HeavyNotOnMeta", code)
    assert sizes.state_mb(p) == pytest.approx(1024 * 1024 * 4 / 1e6)
    monkeypatch.setattr(sizes, "device_memory_mb", lambda device: 24.0)  # room for 18 MB of copies
    row = kp.run_problem(p, ["openai"], backend="cpu", device="cpu")  # a kernel may come: 5 copies of 4 MB
    assert row.status == "skipped" and "parameters and buffers (4 MB) exceed 4 MB" in row.reason


# ---------------------------------------------------------------- what runs

def test_a_row_counts_what_runs_in_the_whole_subtree(monkeypatch):
    (p,) = load_problems(FIXTURES / "level3" / "1_Tiny_MLP.py")
    row = kp.run_problem(p, [], backend="cpu", device="cpu", with_compile=False, budget_s=0.05)
    assert row.status == "eager" and row.calls["eager"] >= 6 and sum(row.calls.values()) == row.calls["eager"]

    real = kp.explain

    def mixed(model):  # the root stays eager while 2 of its calls run torch.compile, one inside another
        rep = real(model)
        leaves = [m for m in rep.modules if m.name != "Model"]
        leaves[0].status, leaves[1].status, leaves[2].reason = "compile", "compile", COVERED
        return rep

    monkeypatch.setattr(kp, "explain", mixed)
    row = kp.run_problem(p, [], backend="cpu", device="cpu", with_compile=False, budget_s=0.05)
    total = sum(row.calls.values())
    assert row.status == "eager" and row.calls["compile"] == 2 and row.calls["covered"] == 1
    assert row.calls["eager"] == total - 3
    res = SuiteResult([row], {}, None)
    doc = json.loads(json.dumps(res.to_dict()))
    assert doc["rows"][0]["calls"] == row.calls and doc["best"]["all"]["calls"]["compile"] == 2
    assert SuiteResult.from_dict(doc).rows[0].calls == row.calls
    md = markdown(res)
    assert f"| {total} calls: 2 compile, {total - 3} eager, 1 covered |" in md
    assert f"the captured calls of the measured models: {total} calls: 2 compile" in md


def test_call_counts_sort_every_report_entry():
    mods = [ModuleReport("Model", "m.Model", "", "eager", ""), ModuleReport("a", "L", "", "graph", ""),
            ModuleReport("a.b", "L", "", "eager", COVERED), ModuleReport("c", "L", "", "kernel", "")]
    assert call_counts(mods) == {"kernel": 1, "compile": 0, "graph": 1, "eager": 1, "covered": 1}
    assert Row("k", None, None, "k").calls == {}  # rows of older results read back without counts
