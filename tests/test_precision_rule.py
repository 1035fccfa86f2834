"""The proof's precision follows the user's PyTorch flags: a float32 result computed with TF32 passes only
where eager itself may use TF32 for the module's ops; `precision="compile"` takes torch.compile's own check."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from metal_accel.core import config
from metal_accel.core.specs import InputSpec
from metal_accel.proof import precision
from metal_accel.proof.compare import TOLERANCES, Mismatch, compare_output
from metal_accel.proof.precision import CONV, MATMUL, PrecisionRule, recorded_call, rule_for
from metal_accel.proof.validate import validate

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


@pytest.fixture
def flags(monkeypatch):
    """The flags as they were, put back after; a CUDA device taken as TF32-capable (no GPU here)."""
    monkeypatch.setattr(precision, "tf32_capable", lambda device: True)
    saved = (torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision(),
             torch.backends.mkldnn.conv.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)
    yield
    torch.backends.cudnn.allow_tf32 = saved[0]
    torch.set_float32_matmul_precision(saved[1])
    torch.backends.mkldnn.conv.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision = saved[2:]


def tf32(t: torch.Tensor) -> torch.Tensor:
    """T rounded to TF32 (10 mantissa bits of float32's 23: the low 13 masked, rounded to nearest)."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def test_flags_change_the_tolerance(flags):
    f32 = TOLERANCES[torch.float32]
    torch.backends.cudnn.allow_tf32 = True
    tf32_tol = rule_for({(CUDA, CONV)}).tolerance(torch.float32)
    assert tf32_tol.rtol > 50 * f32.rtol and tf32_tol.norm > 100 * f32.norm
    assert rule_for({(CUDA, CONV)}).tolerance(torch.float16) == TOLERANCES[torch.float16]  # float32 outputs only
    assert rule_for({(CUDA, MATMUL)}).tolerance(torch.float32) == f32  # matmuls: "highest" by default
    torch.backends.cudnn.allow_tf32 = False
    assert rule_for({(CUDA, CONV)}).tolerance(torch.float32) == f32
    torch.set_float32_matmul_precision("high")
    assert rule_for({(CUDA, MATMUL)}).tolerance(torch.float32) == tf32_tol
    assert rule_for(set()).tolerance(torch.float32) == f32  # no such op ran: nothing to allow
    torch.set_float32_matmul_precision("medium")  # bfloat16 inside: looser still
    assert rule_for({(CUDA, MATMUL)}).tolerance(torch.float32).rtol > tf32_tol.rtol
    torch.set_float32_matmul_precision("highest")
    torch.backends.mkldnn.conv.fp32_precision = "bf16"  # oneDNN on the CPU has its own flag
    assert rule_for({(CPU, CONV)}).tolerance(torch.float32).rtol > tf32_tol.rtol
    assert "mkldnn.conv" in rule_for({(CPU, CONV)}).describe()


def test_the_ops_eager_runs_are_recorded():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    with torch.inference_mode():
        _, ops = recorded_call(model, (torch.randn(2, 3, 8, 8),), {})
        assert ops == {(CPU, CONV), (CPU, MATMUL)}
        _, ops = recorded_call(lambda a, b: torch.relu(a @ b), (torch.randn(4, 4), torch.randn(4, 4)), {})
        assert ops == {(CPU, MATMUL)}
        _, ops = recorded_call(lambda a: a.double() @ a.double(), (torch.randn(4, 4),), {})
        assert ops == set()  # float64 matmuls: no flag lowers them


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(x))


def proof_of_tf32_candidate(model: Conv) -> tuple[bool, str, dict]:
    """validate() of a candidate that computes the convolution on TF32-rounded input and weight."""
    def candidate(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(nn.functional.conv2d(tf32(x), tf32(model.conv.weight), model.conv.bias))

    def ref64(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(nn.functional.conv2d(x, model.conv.weight.double(), model.conv.bias.double()))
    spec = InputSpec.of((torch.randn(4, 8, 16, 16),), {})
    with torch.inference_mode():
        result = validate(model, candidate, spec, device="cpu", reference64=ref64, dists=("normal", "uniform"),
                          seed=1)
    return result.ok, result.reason, result.details


def test_tf32_result_passes_only_where_eager_may_use_tf32(flags):
    model = Conv().eval()
    ok, reason, _ = proof_of_tf32_candidate(model)
    assert not ok and "outside tolerance" in reason and "float32's tolerance" in reason
    torch.backends.mkldnn.conv.fp32_precision = "tf32"  # the user lets eager's CPU convolutions use TF32
    ok, reason, details = proof_of_tf32_candidate(model)
    assert ok, reason
    assert "convolution may use TF32" in details["precision"]


def test_compile_rule_is_named_and_judges_by_torch_compiles_check():
    model = Conv().eval()
    with config.using(config.current().with_(precision="compile")):
        ok, reason, _ = proof_of_tf32_candidate(model)
    # eager (float32 here) is ~1e-8 off float64 in RMS; TF32's error is far beyond 2x that + 1e-5
    assert not ok and "precision rule 'compile'" in reason and "RMS error" in reason
    with config.using(config.current().with_(precision="compile")):
        with torch.inference_mode():
            result = validate(model, model, InputSpec.of((torch.randn(4, 8, 16, 16),), {}), device="cpu",
                              dists=("normal",), seed=1)
    assert result.ok and result.details["precision"].startswith("compile")
    out, ref = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.00005])
    compare_output(out, ref, "o", rule=PrecisionRule("compile"))  # allclose at 1e-4
    with pytest.raises(Mismatch):
        compare_output(out, ref, "o")  # float32's eager tolerance: 1.7e-5 relative is too far


def test_compile_rule_rms_against_float64():
    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(4096, generator=gen, dtype=torch.float64)
    eager = (exact + 1e-3 * torch.randn(4096, generator=gen, dtype=torch.float64)).float()
    close = (exact + 1.5e-3 * torch.randn(4096, generator=gen, dtype=torch.float64)).float()
    far = (exact + 5e-3 * torch.randn(4096, generator=gen, dtype=torch.float64)).float()
    compile_rule = PrecisionRule("compile")
    compare_output(close, eager, "o", exact, rule=compile_rule)  # RMS error within 2x eager's
    with pytest.raises(Mismatch, match="RMS error"):
        compare_output(far, eager, "o", exact, rule=compile_rule)
    with pytest.raises(Mismatch, match="float64 reference"):
        compare_output(close, eager, "o", rule=compile_rule)


def test_special_values_eager_got_wrong_pass_where_float64_agrees():
    # eager's vectorized float32 GELU gave NaN at +Inf (inf * erf) and Inf at 3.4e38 (an intermediate
    # overflows) on a Xeon's vector path; float64, and inductor's code, give Inf and 3.4e38. Other CPUs' paths
    # (this AMD EPYC's) get both right, so eager's breakdown is written here as it was seen
    x = torch.tensor([float("inf"), 3.4e38, 1.0, -2.0] * 8)
    exact = nn.functional.gelu(x.double())
    better = exact.float()
    eager = better.clone()
    eager[0::4], eager[1::4] = float("nan"), float("inf")
    with pytest.raises(Mismatch, match="positions"):
        compare_output(better, eager, "o")
    compare_output(better, eager, "o", exact)  # the float64 reference sides with the candidate
    worse = better.clone()
    worse[2] = float("nan")  # a NaN where eager and float64 agree on a number
    with pytest.raises(Mismatch, match="does not side with the candidate"):
        compare_output(worse, eager, "o", exact)


def test_disputed_special_values_are_judged_as_finite_elements_are():
    # eager's bf16 GEMM summed one row in an order that met Inf - Inf (NaN); the candidate's float32 sum of
    # terms that cancel (+-8.5e37 * w) kept the row finite but lost the small terms between them, as any
    # float32 sum does: within atol of the exact value at the output's scale, as a finite element would be
    exact = torch.tensor([-1e-30, 3.0e36, -2.0e36, 5.0e35], dtype=torch.float64)
    eager = torch.full((4,), float("nan"), dtype=torch.bfloat16)
    candidate = torch.tensor([-0.14, 3.0e36, -2.0e36, 5.0e35], dtype=torch.bfloat16)
    compare_output(candidate, eager, "o", exact)
    off = candidate.clone()
    off[1] = 3.3e36  # 10% off an element that sets the scale
    with pytest.raises(Mismatch, match="does not side with the candidate at 1 of 4"):
        compare_output(off, eager, "o", exact)


def test_a_candidate_inf_passes_where_the_exact_value_overflows_the_dtype():
    exact = torch.tensor([4.0e38, 1.0, -5.0e38, 2.0], dtype=torch.float64)  # beyond float32's 3.4e38
    eager = torch.tensor([float("nan"), 1.0, float("nan"), 2.0])
    compare_output(torch.tensor([float("inf"), 1.0, float("-inf"), 2.0]), eager, "o", exact)
    with pytest.raises(Mismatch, match="does not side"):  # the wrong sign
        compare_output(torch.tensor([float("-inf"), 1.0, float("-inf"), 2.0]), eager, "o", exact)
