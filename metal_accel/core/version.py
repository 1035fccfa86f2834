"""The library's version (also in pyproject.toml)."""
VERSION = "0.1.0"
