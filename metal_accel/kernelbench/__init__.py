"""The KernelBench-format suite runner behind `metal-accel bench`: loading problems (problems),
one problem end to end (problem), the run over a suite (runner), results (result) and their
reports (report).
"""
