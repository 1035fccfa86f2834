"""The tests' only wall-clock limits: guards against a hang, never an expectation of speed.

The suite must pass on a busy 2-core machine, where a cold subprocess that imports torch and compiles
kernels can take minutes. A test asserts on what happened; these bounds only stop a stuck one.
"""
from __future__ import annotations

HANG_S = 1800  # a subprocess (or a wait for one) that has not finished by then is stuck
