"""Fresh test inputs drawn from an InputSpec: new tensors every trial, never the example tensors."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .specs import InputSpec, ScalarSpec, TensorSpec

DISTRIBUTIONS = ("normal", "uniform", "large", "negative", "small")
SPECIAL = "special"  # zeros, negatives, large magnitudes, NaN, +-Inf and denormals among normal values


def _storage_numel(spec: TensorSpec) -> int:
    if any(s == 0 for s in spec.shape):
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(spec.shape, spec.stride))


def _fill(n: int, dtype: torch.dtype, spec: TensorSpec, dist: str, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(n, generator=gen) < 0.5
    if not dtype.is_floating_point:
        lo, hi = spec.value_range if spec.value_range else (0, 16)
        return torch.randint(lo, hi + 1, (n,), generator=gen, dtype=torch.int64).to(dtype)
    if dist == "uniform":
        base = torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1
    else:
        base = torch.randn(n, generator=gen, dtype=torch.float64)
    out = _shaped(base, dist, dtype)
    if dist == SPECIAL and n:
        _sprinkle_special(out, gen)
    return out


def _shaped(base: torch.Tensor, dist: str, dtype: torch.dtype) -> torch.Tensor:
    """DIST's values as DTYPE, from BASE (standard normal, or uniform in [-1, 1]; overwritten)."""
    if dist == "negative":
        base.abs_().neg_()
    scale = {"large": 64.0, "small": 1e-3}.get(dist, 1.0)
    if dtype in (torch.float16, torch.bfloat16):
        scale = min(scale, 16.0)
    return base.mul_(scale).to(dtype)


def _special_values(dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    return torch.tensor([0.0, -0.0, float("nan"), float("inf"), float("-inf"), info.tiny / 4,
                         -info.tiny / 4, info.max / 4, -info.max / 4, 1e4, -1e4, -1.0], dtype=dtype)


def _sprinkle_special(out: torch.Tensor, gen: torch.Generator) -> None:
    """Overwrite about 1/8 of the elements with special values, at random positions."""
    specials = _special_values(out.dtype)
    n = out.numel()
    count = max(1, n // 8)
    where = torch.randperm(n, generator=gen)[:count]
    out[where] = specials[torch.randint(0, len(specials), (count,), generator=gen)]


DEVICE_FILL_NUMEL = 1 << 24  # CUDA tensors this large are drawn on the GPU, seeded from the secret generator
HOST_PART_NUMEL = 1 << 22    # CPU tensors this large are drawn in parts of this size, in parallel threads


def _fill_large(n: int, dtype: torch.dtype, dist: str, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """`_fill` for large floating tensors, in the tensor's own precision when that is float32 or wider, each
    generator seeded from the secret one: on a GPU drawn there (seconds for gigabytes, where the host takes
    minutes); on the CPU in parts drawn by parallel threads (one float64 stream took minutes for 4 GB)."""
    def seed() -> int:
        return int(torch.randint(0, 2**62, (1,), generator=gen))

    inference = torch.is_inference_mode_enabled()  # thread-local: the pool's threads take the caller's

    def draw(part: torch.Tensor, part_seed: int) -> torch.Generator:
        g = torch.Generator(device).manual_seed(part_seed)
        with torch.inference_mode(inference):
            if dist == "uniform":
                part.uniform_(-1, 1, generator=g)
            else:
                part.normal_(generator=g)
        return g
    base = torch.empty(n, dtype=torch.float64 if dtype == torch.float64 else torch.float32, device=device)
    if device.type == "cpu":
        parts = base.split(HOST_PART_NUMEL)
        seeds = [seed() for _ in parts]
        with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
            list(pool.map(draw, parts, seeds))
        dgen = torch.Generator().manual_seed(seed())
    else:
        dgen = draw(base, seed())
    out = _shaped(base, dist, dtype)
    if dist == SPECIAL:  # about 1/8 of the elements (positions drawn with replacement)
        specials = _special_values(dtype).to(device)
        count = max(1, n // 8)
        where = torch.randint(0, n, (count,), generator=dgen, device=device)
        out[where] = specials[torch.randint(0, len(specials), (count,), generator=dgen, device=device)]
    return out


def make_tensor(spec: TensorSpec, dist: str, gen: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """A new tensor with the spec's shape, dtype and strides, values from `dist`."""
    dtype = spec.torch_dtype
    n = _storage_numel(spec)
    device = torch.device(device)
    large = {"cuda": DEVICE_FILL_NUMEL, "cpu": HOST_PART_NUMEL}.get(device.type)
    if dtype.is_floating_point and large is not None and n >= large:
        flat = _fill_large(n, dtype, dist, gen, device)
    else:
        flat = _fill(n, dtype, spec, dist, gen).to(device)
    if spec.contiguous:
        return flat.view(spec.shape) if n else torch.empty(spec.shape, dtype=dtype, device=device)
    return flat.as_strided(spec.shape, spec.stride)


def make_inputs(spec: InputSpec, dist: str, gen: torch.Generator, device: torch.device | str
                ) -> tuple[tuple, dict[str, Any]]:
    """Positional and keyword arguments matching `spec`, tensors freshly drawn."""
    def one(s: TensorSpec | ScalarSpec) -> Any:
        if isinstance(s, TensorSpec):
            return make_tensor(s, dist, gen, device)
        return s.value
    return tuple(one(a) for a in spec.args), {k: one(s) for k, s in spec.kwargs}


def sweep_specs(spec: InputSpec) -> list[InputSpec]:
    """Variants of `spec` with the leading (batch) dimension changed, for shape-generic kernels.

    Every tensor whose first dimension equals the first tensor's changes together; strides are
    recomputed contiguous. Values of scalar arguments stay as they are.
    """
    tensors = spec.tensor_specs()
    if not tensors or not tensors[0].shape:
        return []
    lead = tensors[0].shape[0]
    out = []
    for new in sorted({max(1, lead // 2), lead * 2 + 1} - {lead}):
        def resize(s: TensorSpec | ScalarSpec) -> TensorSpec | ScalarSpec:
            if not isinstance(s, TensorSpec) or not s.shape or s.shape[0] != lead:
                return s
            shape = (new, *s.shape[1:])
            stride, step = [], 1
            for size in reversed(shape):
                stride.append(step)
                step *= max(size, 1)
            return TensorSpec(shape, s.dtype, tuple(reversed(stride)), s.device, s.value_range)
        out.append(InputSpec(tuple(resize(a) for a in spec.args), tuple((k, resize(v)) for k, v in spec.kwargs)))
    return out
