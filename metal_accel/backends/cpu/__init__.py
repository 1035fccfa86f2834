"""The CPU backend: C++ kernels compiled with the system compiler (backend), and their signatures (signature)."""
