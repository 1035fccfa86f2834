"""Production calls of a kernel that is not the package's own are checked against eager at random (red-team
pass 3: a native kernel kept a call counter in the kernel server's own stack, exact through the proof, the soak
and the speed gate, wrong after N production calls). Fast tier: the "kernel" is torch code that goes wrong after
a number of calls, as such a kernel does; the dispatcher and the check are the real ones."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from metal_accel.core.specs import InputSpec, OutputSpec, call_signature
from metal_accel.runtime import spot_check
from metal_accel.runtime.dispatch import dispatcher_of, install
from metal_accel.runtime.ops import KernelOp, ModuleLayout

_names = itertools.count()


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class Drifting:
    """Exact for SAFE calls, then off by 1%: the state a stateful kernel keeps, here in plain sight."""

    def __init__(self, safe: int) -> None:
        self.n, self.safe = 0, safe

    def __call__(self, module, x):
        self.n += 1
        return x * module.weight * (1.0 if self.n <= self.safe else 1.01)


def _installed(safe: int, protect: bool = True) -> tuple[Scale, Drifting, torch.Tensor]:
    m, x = Scale().eval(), torch.randn(4, 16)
    host = Drifting(safe)
    with torch.no_grad():
        out = m(x)
    op = KernelOp(f"test_spot_{next(_names)}", host, InputSpec.of((x,), {}), OutputSpec.of(out), ModuleLayout(m),
                  "cpu", protect)
    install(m, call_signature((x,), {}), op)
    return m, host, x


def test_a_kernel_that_drifts_in_production_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spot_check.ENV, "8")
    monkeypatch.setattr(spot_check, "BUDGET", 1e9)  # this stand-in kernel takes microseconds: no cost cap here
    m, host, x = _installed(safe=50)
    want = x * m.weight
    wrong = 0
    with torch.inference_mode():
        for _ in range(400):
            wrong += not torch.allclose(m(x), want, rtol=1e-6, atol=0)
    assert dispatcher_of(m).failures, "the drifting kernel was never caught"
    assert "spot check" in next(iter(dispatcher_of(m).failures.values()))
    assert host.n < 400          # switched off: eager from then on
    assert wrong < 120           # about 8 wrong calls on average; a geometric tail, bounded loosely


def test_first_calls_are_always_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spot_check.ENV, "1000000")  # the random draw would almost never fire
    m, host, x = _installed(safe=0)  # wrong from the first production call (it told production from the proof)
    with torch.inference_mode():
        out = m(x)
    assert torch.equal(out, x * m.weight)  # eager's answer, not the kernel's
    assert dispatcher_of(m).failures


@pytest.mark.parametrize("every, protect", [("1", False), ("0", True)],
                         ids=["package's own host code (reviewed)", "METAL_ACCEL_SPOT_CHECK_EVERY=0"])
def test_no_check_runs_for_the_package_s_own_host_code_or_with_checks_off(
        monkeypatch: pytest.MonkeyPatch, every: str, protect: bool) -> None:
    monkeypatch.setenv(spot_check.ENV, every)
    m, host, x = _installed(safe=0, protect=protect)  # a kernel wrong from its first call: no eager call catches it
    with torch.inference_mode():
        for _ in range(5):
            m(x)
    assert host.n == 5 and not dispatcher_of(m).failures


def test_honest_kernel_keeps_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spot_check.ENV, "1")
    m, host, x = _installed(safe=10 ** 9)
    with torch.inference_mode():
        for _ in range(50):
            m(x)
    assert host.n == 50 and not dispatcher_of(m).failures


def test_checks_stay_within_their_time_budget() -> None:
    s = spot_check._Schedule()
    assert s.due("k", 64, 1e-6) and s.due("k", 64, 1e-6)  # the first calls, always
    s.checked("k", 1.0)  # a check costs a million times the kernel's call
    assert sum(s.due("k", 64, 1e-6) for _ in range(20000)) <= 3
    s2 = spot_check._Schedule()
    s2.checked("k", 1e-6)  # a check as cheap as the call: one in `every`
    n = sum(s2.due("k", 64, 1e-6) for _ in range(20000))
    assert 150 < n < 500


@pytest.mark.parametrize("text", ["", "x", "-1", "12345678901"])
def test_unreadable_setting_keeps_the_default(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(spot_check.ENV, text)
    assert spot_check.every() == spot_check.DEFAULT_EVERY


def test_fast_comparison_accepts_only_what_the_proof_would() -> None:
    from metal_accel.proof.compare import compare_output
    from metal_accel.proof.precision import FLOAT32_DEFAULT
    e = torch.randn(1000)
    for k, fast in ((e.clone(), True), (e * (1 + 1e-7), True), (e * 1.01, False), (e + 1e-3, False),
                    (torch.where(e > 2, float("nan"), e), False)):
        got = spot_check._clearly_within(k, e, FLOAT32_DEFAULT)
        assert got == fast
        if got:
            compare_output(k, e, "fast", rule=FLOAT32_DEFAULT)  # the proof's comparison passes too


def test_a_call_with_an_object_eager_may_change_is_not_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager's forward appending to a cache object passed in would append twice if replayed."""
    monkeypatch.setenv(spot_check.ENV, "1")
    m, _, x = _installed(safe=0)
    op = dispatcher_of(m).table[call_signature((x,), {})]

    class Cache:
        pass
    assert not spot_check.due(op, spot_check.clock(), (x, Cache()), {})
    assert spot_check.due(op, spot_check.clock(), (x, [x, 3]), {"mask": None})


def test_a_caught_kernel_is_off_in_later_processes(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path))
    monkeypatch.setenv(spot_check.ENV, "1000000")
    m, host, x = _installed(safe=0)
    name = next(iter(dispatcher_of(m).table.values())).name
    with torch.inference_mode():
        m(x)
    assert spot_check.revoked(name)  # remembered in the user cache
    # a later process: same kernel, exact on its first calls, would go wrong only later
    monkeypatch.setattr(spot_check, "_schedule", spot_check._Schedule())
    m2, host2, _ = _installed(safe=10 ** 9)
    name2 = next(iter(dispatcher_of(m2).table.values())).name
    spot_check.revoke(name2)
    with torch.inference_mode():
        m2(x)
    assert dispatcher_of(m2).failures and "earlier process" in next(iter(dispatcher_of(m2).failures.values()))
    assert not spot_check.revoked("../escape") and not (tmp_path.parent / "escape").exists()
