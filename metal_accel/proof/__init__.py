"""Proving a candidate on this device: the proof driver (prove), trials against eager and a float64
reference (validate, compare, testdata, trial_buffers, perturb), the confined worker that runs a
candidate first (worker), the speed gate's calls replayed there (soak) and the speed gate (speed).

Pipeline stages: prove -> time. Its verdicts go to the store.
"""
