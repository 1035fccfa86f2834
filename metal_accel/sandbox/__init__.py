"""What stands between untrusted candidate code and the user's process: rules for host code
(host_rules, host_check, host_inplace, host), the static check of kernel sources (kernel_source),
the inspection of compiled libraries (binary_check, binary_allow), and OS confinement (confine).

Pipeline stage: check (before compile and load). Imports only core.
"""
