"""The CUDA backend: CUDA C++ compiled with NVRTC (nvrtc), launched through the driver (backend)."""
