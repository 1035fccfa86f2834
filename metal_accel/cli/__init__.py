"""The `metal-accel` command line: one module per command group."""
from .main import main

__all__ = ["main"]
