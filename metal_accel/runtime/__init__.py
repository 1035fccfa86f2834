"""Running installed kernels: torch custom ops (ops), the per-module dispatcher that picks a kernel
or eager for each call (dispatch), capturing the calls of a model (capture), guarding the user's
model state (model_state), and the sandboxed kernel server that runs untrusted native kernels out of
process (kernel_server, native_policy).

Pipeline stages: capture -> ... -> install -> dispatch.
"""
