"""KernelBench-format problems (file, directory, JSON lines) and the `metal-accel synth` command."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from metal_accel.cli.main import main
from metal_accel.core.keys import module_fingerprint
from metal_accel.kernelbench.problems import ProblemError, load_problems

from llm_server import ScriptedLLM
from test_synth_loop import SECRET, fence, poly_candidate

# KernelBench-format problems written for these tests: one .py per problem, and the same code as rows of
# a JSON-lines problem list (the format of KernelBench's own list)
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kernelbench"
KERNELBENCH = FIXTURES / "problems.jsonl"
PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Sixteen dependent multiply-adds."""

    def __init__(self, a: float, b: float):
        super().__init__()
        self.a = a
        self.b = b

    def forward(self, x):
        y = x
        for _ in range(16):
            y = y * self.a + self.b
        return y


def get_inputs():
    return [torch.randn(4, 256)]


def get_init_inputs():
    return [1.01, 0.1]
'''


def test_problem_from_a_file(tmp_path):
    path = tmp_path / "poly.py"
    path.write_text(PROBLEM)
    (problem,) = load_problems(path)
    model, inputs = problem.instantiate()
    assert type(model).__name__ == "Model" and inputs[0].shape == (4, 256) and model.a == 1.01
    assert "for _ in range(16)" in inspect.getsource(type(model))
    module_fingerprint(model)  # the source is available, so the module can get a kernel


def test_problems_from_a_directory_and_json_lines(tmp_path):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "1_poly.py").write_text(PROBLEM)
    (tmp_path / "level1" / "2_poly.py").write_text(PROBLEM.replace("16", "8"))
    assert [p.name for p in load_problems(tmp_path)] == ["1_poly", "2_poly"]
    rows = [{"level": 1, "problem_id": i, "name": f"poly_{i}", "file": f"level1/{i}_poly.py",
             "code": PROBLEM.replace("16", str(i))} for i in (3, 4)]
    jsonl = tmp_path / "problems.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems = load_problems(jsonl)
    assert [(p.name, p.level, p.problem_id) for p in problems] == [("poly_3", 1, 3), ("poly_4", 1, 4)]
    model, _ = problems[1].instantiate()
    assert "range(4)" in inspect.getsource(type(model))  # source of code that never was a file
    assert [p.name for p in load_problems(jsonl, ids=[4])] == ["poly_4"]
    assert load_problems(jsonl, levels=[2]) == []
    assert module_fingerprint(model) == module_fingerprint(problems[1].instantiate()[0])  # stable module name


def test_broken_problems_are_reported(tmp_path):
    (tmp_path / "bad.py").write_text("import torch\nclass Model: pass\n")
    with pytest.raises(ProblemError, match="does not define get_inputs, get_init_inputs"):
        load_problems(tmp_path / "bad.py")[0].instantiate()
    with pytest.raises(ProblemError, match="no problem file"):
        load_problems(tmp_path / "missing.py")


def test_kernelbench_problem_list():
    problems = load_problems(KERNELBENCH)
    assert len(problems) == 4 and {p.level for p in problems} == {1, 2, 3}
    relu = [p for p in load_problems(KERNELBENCH, levels=[1], names=["ReLU"])]
    assert [p.name for p in relu] == ["ReLU"] and relu[0].load().Model
    assert [p.name for p in load_problems(KERNELBENCH, levels=[2, 3])] == ["Linear_GELU_Scale", "Tiny_MLP"]
    for problem in problems:
        model, inputs = problem.instantiate()
        model(*inputs)
    # a row's code is its file's: loaded either way, the module (and so its cache keys) is the same
    by_file = {p.name.split("_", 1)[1]: p for p in load_problems(FIXTURES)}
    for problem in problems:
        assert by_file[problem.name].code == problem.code
        assert module_fingerprint(problem.instantiate()[0]) == module_fingerprint(by_file[problem.name].instantiate()[0])


def test_synth_command_without_models(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("METAL_ACCEL_MODELS", raising=False)
    (tmp_path / "p.py").write_text(PROBLEM)
    assert main(["synth", str(tmp_path / "p.py")]) == 2
    assert "no LLM is configured" in capsys.readouterr().err


@pytest.mark.needs_cxx
@pytest.mark.slow
def test_synth_command_on_a_problem(monkeypatch, tmp_path, capsys):
    (tmp_path / "poly.py").write_text(PROBLEM)
    with ScriptedLLM({"gpt-4o": [fence(poly_candidate())]}) as server:
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        code = main(["synth", str(tmp_path), "--models", "openai:gpt-4o", "--samples", "1", "--rounds", "1",
                     "--no-profile"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "# poly" in out and "kernel" in out and "synth Model: 1 answer, 1 evaluated, best" in out
    assert "1 kernels for 1 problems; 1 requests, 1500 tokens, $0.0075" in out
    assert SECRET not in out
    assert len(server.requests) == 1
