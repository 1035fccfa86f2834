"""A proof makes, runs and judges its trials a batch at a time, so large inputs are never all alive at once."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.proof import prove as prove_mod
from metal_accel.proof.prove import streamed_proof
from metal_accel.core.specs import InputSpec
from metal_accel.proof.validate import Judge, run_and_judge, run_trial, spec_bytes, trial_batches, trial_plan

from test_optimize import candidates
from test_perturbed_proof import NORM, FreshNorm, report

# slow: full proofs of large inputs
pytestmark = pytest.mark.slow

SPEC = InputSpec.of((torch.randn(32, 32),))  # 4 KiB a trial


def test_batches_hold_at_most_max_bytes_and_one_trial_at_least():
    assert spec_bytes(SPEC) == 32 * 32 * 4
    plan = trial_plan(SPEC)
    assert len(plan) == 8  # five distributions, special values, extremes, structured rows (32 rows: every kind)
    assert [len(b) for b in trial_batches(plan, "cpu", copies=True, max_bytes=2 * 4096 + 100)] == [2, 2, 2, 2]
    assert [len(b) for b in trial_batches(plan, "cpu", copies=True, max_bytes=1)] == [1] * 8
    assert [len(b) for b in trial_batches(plan, "cpu", copies=True, max_bytes=1 << 30)] == [8]
    assert [t.dist for b in trial_batches(plan, "cpu", copies=True, max_bytes=1) for t in b] == [d for _, d in plan]


def test_references_get_private_copies_only_where_the_candidate_shares_the_process():
    shared = next(trial_batches(trial_plan(SPEC), "cpu", copies=False, max_bytes=1))[0]
    assert shared.ref_args[0] is shared.args[0]
    private = next(trial_batches(trial_plan(SPEC), "cpu", copies=True, max_bytes=1))[0]
    assert private.ref_args[0].data_ptr() != private.args[0].data_ptr()
    assert torch.equal(private.ref_args[0], private.args[0])


def test_each_batch_is_freed_before_the_next_is_made():
    module = nn.Tanh()
    alive: list[weakref.ref] = []
    calls = []

    def run(batch):
        gc.collect()
        calls.append(sum(r() is not None for r in alive))  # inputs of earlier batches still alive
        alive.extend(weakref.ref(a) for t in batch for a in t.args)
        return [run_trial(module, t.args, t.kwargs, [], repeat=(i == 0)) for i, t in enumerate(batch)]

    with torch.inference_mode():
        result = streamed_proof(trial_plan(SPEC), torch.device("cpu"), run, module, module.forward, [], copies=False,
                                max_bytes=1)
    assert result.ok and result.trials == 8, result
    assert calls == [0] * 8


def test_a_wrong_candidate_stops_at_its_first_batch():
    module = nn.Tanh()
    calls = []

    def run(batch):
        calls.append(len(batch))
        return [run_trial(torch.sigmoid, t.args, t.kwargs, []) for t in batch]

    with torch.inference_mode():
        result = run_and_judge(trial_batches(trial_plan(SPEC), "cpu", copies=False, max_bytes=1), run,
                               Judge(module.forward))
    assert not result.ok and result.trials == 0 and "outside tolerance" in result.reason
    assert calls == [1]
    failed = run_and_judge(trial_batches(trial_plan(SPEC), "cpu", copies=False, max_bytes=1),
                           lambda batch: "compile error: boom", Judge(module.forward))
    assert failed == "compile error: boom"


@pytest.mark.needs_cxx
def test_an_isolated_proof_sends_one_worker_request_per_batch(tmp_path, monkeypatch):
    """The worker gets the trials a batch at a time (here one each), the perturbed round included."""
    monkeypatch.setenv("METAL_ACCEL_COMPILE", "0")
    monkeypatch.setattr(prove_mod, "TRIAL_BATCH_BYTES", 1)
    sent: list[int] = []
    worker = prove_mod.shared_worker()
    real = worker.request

    def counted(req: dict, timeout: float) -> dict:
        if "trials" in req:  # proof requests (the speed gate's soak sends input sets instead)
            sent.append(len(req["trials"]))
        return real(req, timeout)
    monkeypatch.setattr(worker, "request", counted)
    model = FreshNorm().eval()
    x = torch.randn(512, 256)
    metal_accel.optimize(model, (x,), providers=[candidates(tmp_path, "FreshNorm", norm=NORM)], progress=False)
    rep = report(model)
    assert rep.status == "kernel" or "x eager" in rep.reason, rep  # proven; the speed gate decided
    assert sent == [1] * 10, rep  # eight trials at the module's own state, two with random state


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_large_inputs_are_drawn_in_their_own_precision_from_the_secret_seed(device):
    """On a GPU drawn there; on the CPU in parts, each from its own generator, by parallel threads."""
    from metal_accel.core.specs import TensorSpec
    from metal_accel.proof.testdata import DEVICE_FILL_NUMEL, HOST_PART_NUMEL, make_tensor
    numel = DEVICE_FILL_NUMEL if device == "cuda" else 2 * HOST_PART_NUMEL + 1024  # parts: two whole, one short
    spec = TensorSpec.of(torch.empty(numel // 1024, 1024))

    def draw(dist: str, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return make_tensor(TensorSpec.of(torch.empty(spec.shape, dtype=dtype)), dist,
                           torch.Generator().manual_seed(seed), device)
    normal = draw("normal", 1)
    assert normal.device.type == device and normal.shape == spec.shape and normal.dtype == torch.float32
    assert abs(normal.mean().item()) < 0.01 and abs(normal.std().item() - 1) < 0.01
    assert torch.equal(normal, draw("normal", 1)) and not torch.equal(normal, draw("normal", 2))
    flat = normal.flatten()
    if device == "cpu":  # every part its own stream: no part repeats another
        assert not torch.equal(flat[:1024], flat[HOST_PART_NUMEL:HOST_PART_NUMEL + 1024])
        assert abs(flat[-1024:].std().item() - 1) < 0.1  # the short last part is drawn too
    assert (draw("negative", 1) <= 0).all() and draw("uniform", 1).abs().max() <= 1
    assert draw("normal", 1, torch.float64).dtype == torch.float64
    with torch.inference_mode():  # as in a proof: the drawing threads write inference tensors too
        assert torch.equal(draw("normal", 1), normal)
    special = draw("special", 1)
    assert torch.isnan(special).any() and torch.isinf(special).any() and (special == 1e4).any()
    assert 0.05 < (~torch.isfinite(special)).float().mean().item() * 12 / 3 < 0.2  # about 1/8 special values


def test_shape_generic_sweep_leaves_out_batches_larger_than_the_call_and_a_trial_batch():
    def spec(*shape: int) -> InputSpec:
        return InputSpec.of((torch.empty(shape, device="meta"),))
    small, skipped = prove_mod.shape_sweep(spec(4, 256))
    assert [prove_mod.lead_size(s) for s in small] == [2, 9] and skipped == []
    # a 1 GiB call at batch 1: batch 3 (3 GiB) would be a second, larger proof; nothing smaller exists
    kept, skipped = prove_mod.shape_sweep(spec(1, 64, 2048, 2048))
    assert kept == [] and [prove_mod.lead_size(s) for s in skipped] == [3]
    # 128 MiB at batch 2: batch 1 is kept, batch 5 (320 MiB) is over one trial batch (256 MiB)
    kept, skipped = prove_mod.shape_sweep(spec(2, 16, 1024, 1024))
    assert [prove_mod.lead_size(s) for s in kept] == [1] and [prove_mod.lead_size(s) for s in skipped] == [5]
    assert all(spec_bytes(s) <= prove_mod.sweep_limit(spec(2, 16, 1024, 1024)) for s in kept)
