"""Kernel caches: entries and verdicts (cache), the on-disk index (index), clearing (clear), sealed
verdicts (attest), hash-pinned bundles (bundle), and re-keying emulator-proven entries for the real
device (retarget).

Pipeline stages: cache lookup (after key) and store (after time).
"""
