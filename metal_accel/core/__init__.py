"""Core types every stage shares: errors, configuration, call specs and keys, candidates, the
provider interface (what a candidate source is given and returns), and text redaction.

Imports nothing else from metal_accel: every other subpackage builds on this one.
"""
