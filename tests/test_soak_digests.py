"""The soak's digests of repeated calls: compared on the device, equal to the host hash where it matters."""
from __future__ import annotations

import torch

from metal_accel.proof.soak import judge_soak
from metal_accel.proof.worker import RepeatDigests, output_digest
from metal_accel.proof.worker_main import _soak


def test_a_repeat_with_the_same_bits_gets_its_first_calls_digest():
    x = torch.tensor([1.0, float("nan"), -0.0, 3.5])
    memo = RepeatDigests()
    first = memo.digest(0, (x,))
    assert first == output_digest((x,))
    assert memo.digest(0, (x.clone(),)) == first


def test_any_other_bit_gets_the_host_hash_of_what_was_returned():
    x = torch.tensor([1.0, 2.0, 0.0])
    memo = RepeatDigests()
    first = memo.digest(0, (x,))
    for other in (torch.tensor([1.0, 2.0, -0.0]),          # -0.0: other bits, equal as numbers
                  torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64),
                  torch.tensor([[1.0, 2.0, 0.0]]),
                  torch.tensor([1.0, 2.0, 1e-45])):
        got = memo.digest(0, (other,))
        assert got != first and got == output_digest((other,)), other
    assert memo.digest(0, (x,)) == first                    # the first call's outputs stay the reference


def test_input_sets_are_kept_apart():
    memo = RepeatDigests()
    a, b = torch.zeros(3), torch.ones(3)
    da, db = memo.digest(0, (a,)), memo.digest(1, (b,))
    assert da != db and memo.digest(1, (b.clone(),)) == db and memo.digest(0, (b,)) == db


def test_a_kernel_that_answers_otherwise_on_a_later_call_is_caught_by_the_soak():
    calls = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x * 2 + (len(calls) == 7)                    # the 7th call is off by one

    x = torch.randn(4, 8)
    req = {"sets": [([x], {})], "order": [0], "calls": 10, "min_calls": 10, "budget_s": 60.0, "sample": [0]}
    reply = _soak(req, forward, [], torch.device("cpu"), lambda: None)
    assert reply["calls"] == 10 and len(set(reply["digests"])) == 2, reply["digests"]
    why = judge_soak(reply, [((x,), {})], [(x * 2,)], None, 10)
    assert "call 6 gave other outputs than call 0" in why, why
