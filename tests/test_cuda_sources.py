"""Every CUDA candidate and shipped kernel source passes the static checks and compiles for sm_90.

No GPU needed: nvcc (`-arch=sm_90 -cubin`) and NVRTC (cuda-python + nvidia-cuda-nvrtc) compile
without one, so a kernel that does not compile never reaches the device. Each compiler's test
skips cleanly where that compiler is absent.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from metal_accel.backends.cuda.signature import parse_cuda_kernels
from metal_accel.core.candidate import parse_candidate
from metal_accel.sandbox.host import check_host_code
from metal_accel.sandbox.kernel_source import check_kernel_source
from limits import HANG_S

# slow: static checks and nvcc/NVRTC compiles of every CUDA benchmark candidate
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "benchmarks" / "candidates" / "cuda").glob("*.py")) + \
    sorted((ROOT / "kernels_src" / "cuda").glob("*.py"))
NVCC = shutil.which("nvcc")


def _nvrtc_ok() -> bool:
    try:
        from metal_accel.backends.cuda.backend import nvrtc_available
        return nvrtc_available()
    except Exception:
        return False


def _load(path: Path):
    return parse_candidate(path.read_text(), "cuda", str(path))


def test_there_are_cuda_sources():
    assert len(SOURCES) >= 10


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_static_checks(path):
    cand = _load(path)
    check_host_code(cand.code)
    check_kernel_source(cand.source, "cuda")
    kernels = parse_cuda_kernels(cand.source)
    assert kernels, "no extern \"C\" __global__ kernel"
    for name in kernels:  # every kernel the host code launches exists
        pass
    launched = {line.split("lib.", 1)[1].split("(", 1)[0] for line in cand.code.splitlines() if "lib." in line}
    assert launched <= set(kernels), f"host code launches {launched - set(kernels)} which SOURCE does not define"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_compiles_with_nvcc(path, tmp_path):
    cand = _load(path)
    src = tmp_path / "k.cu"
    src.write_text(cand.source)
    proc = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-std=c++17", "-o", str(tmp_path / "k.cubin"), str(src)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-python + nvidia-cuda-nvrtc) not installed")
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_compiles_with_nvrtc(path):
    from metal_accel.backends.cuda.backend import nvrtc_compile, nvrtc_options, toolkit_include_dirs
    cand = _load(path)
    if not toolkit_include_dirs() and "#include <cuda" in cand.source:
        pytest.skip("CUDA toolkit headers not found")
    image = nvrtc_compile(cand.source, "sm_90", nvrtc_options("sm_90", toolkit_include_dirs()), True)
    assert len(image) > 0


def test_bandwidth_benchmark_names_existing_kernels():
    """benchmarks/cuda_bandwidth.py runs on the GPU only; here: every kernel it names exists."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("cuda_bandwidth", ROOT / "benchmarks" / "cuda_bandwidth.py")
    bw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bw)
    for key in bw.LEVEL1:
        assert (bw.CANDIDATES / f"{key}.py").is_file(), key
    for name in bw.BLOCKS:
        assert (bw.BLOCK_SOURCES / f"{name}.py").is_file(), name
    assert bw.nbytes((torch.zeros(3, 4), torch.zeros(2, dtype=torch.float16), 1.0)) == 52
