"""Production calls of kernels that are not the package's own, checked against eager at random.

The proof, the soak and the speed gate see a kernel's first calls; a native kernel can keep state in the kernel
server's own memory (its stack, its heap) and go wrong only after more calls than those, or tell production
from the proof by something they never showed it (docs/security.md, "What remains"). So, as the speed gate does
with its timed calls, production calls of such a kernel are also run eager and compared by the proof's rule:
its first FIRST_CHECKED calls in this process, then calls drawn at random from a secret seed (the kernel cannot
know which). A mismatch raises Mismatch: the dispatcher returns eager's output and switches the kernel off.

How often: each call with probability min(1/every, BUDGET x (the kernel's time per call) / (a check's time)),
both times measured here, so checks cost at most about BUDGET of the time the kernel itself takes, and a kernel
gone wrong serves about 1/probability wrong calls before it is caught (a cheap check: `every`; one that needs
the float64 fallback, on an ill-conditioned module, costs more and runs less often).

A kernel caught here is remembered in the user cache (`revoked/<op name>`, an empty file): in a later process
its first call raises at once (eager's answer, the kernel off) instead of serving wrong calls until a check lands.
The list only ever switches kernels off; `metal-accel cache clear` or deleting the file gives one back.

METAL_ACCEL_SPOT_CHECK_EVERY=N sets `every` (0: no production checks); anything else keeps DEFAULT_EVERY.
"""
from __future__ import annotations

import os
import random
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils import _pytree

from ..core import config
from ..proof.compare import Mismatch
from ..proof.precision import PrecisionRule
from ..proof.validate import compare_or_float64, default_rule
from .ops import KernelOp

ENV = "METAL_ACCEL_SPOT_CHECK_EVERY"
DEFAULT_EVERY = 64
FIRST_CHECKED = 2   # a kernel that tells production from the proof at once is caught on its first call
BUDGET = 0.05       # checks may cost about this fraction of the kernel's own time
_SMOOTH = 0.05      # weight of a new time in the running means

clock = time.perf_counter

__all__ = ["ENV", "Mismatch", "check", "clock", "due", "every", "reference64", "revoke", "revoked"]


def every() -> int:
    """At most one call in this many is checked after the first ones, on average; 0: none."""
    text = os.environ.get(ENV, "").strip()
    return int(text) if text.isdigit() and len(text) < 10 else DEFAULT_EVERY


REVOKED_DIR = "revoked"
_NAME = re.compile(r"[A-Za-z0-9_]{1,200}")


def _revoked_path(name: str) -> str | None:
    return os.path.join(config.current().user_cache, REVOKED_DIR, name) if _NAME.fullmatch(name) else None


def revoked(name: str) -> bool:
    """Whether a production check of this user's caught kernel NAME (an op name) before."""
    path = _revoked_path(name)
    return path is not None and os.path.lexists(path)


def revoke(name: str) -> None:
    """Remember that kernel NAME was caught (best effort: a cache that cannot be written only loses the memory)."""
    path = _revoked_path(name)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600))
    except OSError:
        pass


@dataclass
class _Kernel:
    calls: int = 0
    revoked: bool = False
    call_s: float = 0.0    # running mean of the kernel's time per call
    check_s: float = 0.0   # running mean of a check's time (eager, comparison)


class _Schedule:
    """Which calls are checked: per kernel, the first FIRST_CHECKED, then each with a probability within budget."""

    def __init__(self) -> None:
        self._rng = random.Random(secrets.randbits(64))
        self._kernels: dict[str, _Kernel] = {}
        self._lock = threading.Lock()

    def due(self, name: str, rate: int, call_s: float) -> bool:
        with self._lock:
            k = self._kernels.setdefault(name, _Kernel())
            k.calls += 1
            if k.calls == 1:
                k.revoked = revoked(name)
            k.call_s = call_s if k.calls == 1 else k.call_s + _SMOOTH * (call_s - k.call_s)
            if k.calls <= FIRST_CHECKED or k.revoked:
                return True
            p = 1.0 / rate if k.check_s <= 0 else min(1.0 / rate, BUDGET * k.call_s / k.check_s)
            return self._rng.random() < p

    def is_revoked(self, name: str) -> bool:
        with self._lock:
            k = self._kernels.get(name)
            return k is not None and k.revoked

    def checked(self, name: str, check_s: float) -> None:
        with self._lock:
            k = self._kernels.setdefault(name, _Kernel())
            k.check_s = check_s if k.check_s <= 0 else k.check_s + _SMOOTH * (check_s - k.check_s)


_schedule = _Schedule()


_PLAIN = (torch.Tensor, int, float, bool, str, complex, type(None), torch.dtype, torch.device)


def due(op: Any, started: float, args: tuple, kwargs: dict) -> bool:
    """Whether this production call of OP, which started at clock() STARTED and has returned, is checked against
    eager: a kernel's op (runtime/ops.KernelOp) whose host code is not the package's own (`protect` on; the
    package's is reviewed), at random; never a call with an argument eager may change other than a tensor (a
    cache object that eager's forward appends to would be appended to twice)."""
    if not isinstance(op, KernelOp) or not op._protect:
        return False
    rate = every()
    return rate > 0 and _schedule.due(op.name, rate, clock() - started) \
        and all(isinstance(leaf, _PLAIN) for leaf in _pytree.tree_leaves((args, kwargs)))


def check(name: str, out: Any, eager: Callable[[], Any], reference64: Callable[[], tuple | None]) -> None:
    """Raise Mismatch unless kernel NAME's OUT matches EAGER()'s by the proof's rule (the float64 reference,
    REFERENCE64's outputs, asked only where the plain comparison fails)."""
    if _schedule.is_revoked(name):
        raise Mismatch(f"kernel {name} gave a wrong answer in an earlier process's production check (remembered in "
                       f"the user cache, {REVOKED_DIR}/{name})")
    started = clock()
    try:
        _compare(name, out, eager(), reference64)
    except Mismatch:
        revoke(name)
        raise
    finally:
        _schedule.checked(name, clock() - started)


def _compare(name: str, out: Any, eager_out: Any, reference64: Callable[[], tuple | None]) -> None:
    rule = default_rule()
    ks, es = _pytree.tree_leaves(out), _pytree.tree_leaves(eager_out)
    if len(ks) != len(es):
        raise Mismatch(f"kernel {name} in production: {len(ks)} outputs, eager returns {len(es)}")
    for i, (k, e) in enumerate(zip(ks, es)):
        if e is None or not hasattr(e, "dtype"):
            if k is not e and k != e:
                raise Mismatch(f"kernel {name} in production, output {i}: {k!r} where eager returns {e!r}")
            continue
        if not rule.compile and _clearly_within(k, e, rule):
            continue
        compare_or_float64(k, e, f"kernel {name} in production (spot check), output {i}", reference64, i, rule)


def _clearly_within(k: Any, e: torch.Tensor, rule: PrecisionRule) -> bool:
    """True only where the proof's comparison surely passes: same kind, all finite, and every element and the
    error norm within half the tolerance (a few operations, no float64 copies); False sends the pair to it."""
    if type(k) is not torch.Tensor or type(e) is not torch.Tensor or k.shape != e.shape or k.dtype != e.dtype \
            or k.device != e.device:
        return False
    if torch.equal(k, e):
        return True
    if not e.is_floating_point() or not e.numel():
        return False
    tol = rule.tolerance(e.dtype)
    kf, ef = k.detach().float(), e.detach().float()
    if not (torch.isfinite(kf).all() and torch.isfinite(ef).all()):
        return False
    mag = ef.abs()
    err = kf.sub(ef).abs_()
    allowed = mag.mul(tol.rtol / 2).add_(tol.atol / 2 * max(mag.mean().item(), 1e-30))
    return bool((err <= allowed).all()) and err.norm().item() <= tol.norm / 2 * ef.norm().item()


def reference64(original: Callable[..., Any], args: tuple, kwargs: dict) -> Callable[[], tuple | None]:
    """The float64 outputs of ORIGINAL (a module's bound forward) on the call's inputs, as the proof computes
    them, when asked; None for a forward that is not a module's."""
    def run() -> tuple | None:
        module = getattr(original, "__self__", None)
        if not isinstance(module, nn.Module):
            return None
        from ..proof.prove import float64_reference
        from ..proof.validate import to_float64
        try:
            out = float64_reference(module, original)(*to_float64(args), **to_float64(kwargs))
        except Exception:  # an op with no float64 kernel: the plain comparison stands
            return None
        return tuple(_pytree.tree_leaves(out))
    return run
