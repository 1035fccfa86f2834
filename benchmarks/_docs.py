"""Only `machine()` is left here, for benchmarks/models.py; new code imports it from results.py."""
from results import machine

__all__ = ["machine"]
