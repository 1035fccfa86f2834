"""Fresh test inputs drawn from an InputSpec: new tensors every trial, never the example tensors."""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.utils import _pytree

from ..core.keys import row_inputs
from ..core.specs import InputSpec, TensorSpec

DISTRIBUTIONS = ("normal", "uniform", "large", "negative", "small")
SPECIAL = "special"  # zeros, negatives, large magnitudes, NaN, +-Inf and denormals among normal values
STRUCTURED = "structured"  # rows (along the last dimension) of ROW_KINDS among normal ones: see _structure
# what real inputs hold and random ones never do: zero-padded rows (16 or more zeros at the start, or at the
# end, or all zeros), all-equal rows, ramps, few repeated values, 0/1 masks, rows at the dtype's extremes
# (integers: the ends of the observed range; floats: scaled down by 2**(maxexp/4). Scaled up, a row would set
# the scale of compare.py's tolerance for the whole output and hide errors in every other row: EXTREMES)
EXTREMES = "extremes"  # normal values scaled by 2**(maxexp/4) (float32: 4.3e9; a square stays finite)
ROW_KINDS = ("padded", "constant", "ramp", "repeated", "mask", "extremes")
PAD = 16  # zeros a padded row starts with, at least


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
    if dist == EXTREMES:
        scale = 2.0 ** _extreme_exponent(dtype)
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


def _row_kinds(rows: int, gen: torch.Generator) -> list[str]:
    """The kinds of ROWS rows, cyclic: "padded" always among them, the others drawn at random where
    fewer rows than kinds, in a random order."""
    others = [ROW_KINDS[1:][i] for i in torch.randperm(len(ROW_KINDS) - 1, generator=gen)]
    chosen = ["padded", *others][:max(1, min(rows, len(ROW_KINDS)))]
    return [chosen[i] for i in torch.randperm(len(chosen), generator=gen)]


def _structure(t: torch.Tensor, spec: TensorSpec, gen: torch.Generator) -> None:
    """Overwrite rows of contiguous T (drawn normal) in place with ROW_KINDS, each kind on every k-th row."""
    if t.dim() == 0 or not t.numel():
        return
    rows = t.view(-1, t.shape[-1])
    kinds = _row_kinds(rows.shape[0], gen)
    with torch.inference_mode(torch.is_inference_mode_enabled()):
        for j, kind in enumerate(kinds):
            view = rows[j::len(kinds)]
            if t.dtype == torch.bool:
                _bool_rows(view, kind, gen)
            elif t.dtype.is_floating_point:
                _float_rows(view, kind, gen)
            else:
                lo, hi = spec.value_range if spec.value_range else (0, 16)
                _int_rows(view, kind, int(lo), int(hi), gen)


def _pad(view: torch.Tensor, gen: torch.Generator, value: float | int | bool) -> None:
    """VALUE in the first PAD elements of some rows, a longer prefix of others, the end of others, all of
    the rest (in turns; a single row gets exactly PAD at its start)."""
    n = view.shape[-1]
    longer = min(n, PAD + int(torch.randint(0, max(1, n - PAD), (1,), generator=gen)))
    view[0::4, :PAD] = value
    view[1::4, :longer] = value
    view[2::4, max(0, n - longer):] = value
    view[3::4] = value


def _float_rows(view: torch.Tensor, kind: str, gen: torch.Generator) -> None:
    r, n = view.shape
    if kind == "padded":
        _pad(view, gen, 0.0)
    elif kind == "constant":  # quarters: a row's sum is exact in any order, so its mean and variance are too
        c = torch.randint(1, 13, (r, 1), generator=gen).double() / 4 * (torch.randint(0, 2, (r, 1), generator=gen) * 2 - 1)
        view.copy_(c.expand(r, n))
    elif kind == "ramp":
        a = torch.randn(r, 1, generator=gen, dtype=torch.float64)
        span = (1 + 2 * torch.randn(r, 1, generator=gen, dtype=torch.float64).abs()) * (
            torch.randint(0, 2, (r, 1), generator=gen) * 2 - 1)
        view.copy_(a + span * torch.linspace(0, 1, n, dtype=torch.float64))
    elif kind == "repeated":  # multiples of 1/2 around zero: few distinct values, each many times
        view.mul_(1.5).round_().div_(2)
    elif kind == "mask":
        view.gt_(0)
    else:
        view.mul_(2.0 ** -_extreme_exponent(view.dtype))


def _extreme_exponent(dtype: torch.dtype) -> int:
    return math.frexp(torch.finfo(dtype).max)[1] // 4


def _int_rows(view: torch.Tensor, kind: str, lo: int, hi: int, gen: torch.Generator) -> None:
    r, n = view.shape
    if kind == "padded":
        _pad(view, gen, 0 if lo <= 0 <= hi else lo)
    elif kind == "constant":
        view.copy_(torch.randint(lo, hi + 1, (r, 1), generator=gen).expand(r, n))
    elif kind == "ramp":
        view.copy_(torch.linspace(lo, hi, n, dtype=torch.float64).round().expand(r, n))
    elif kind == "repeated":
        view.sub_(lo).remainder_(3).add_(lo).clamp_(max=hi)
    elif kind == "mask":
        a, b = (0, 1) if lo <= 0 and 1 <= hi else (lo, hi)
        view.copy_(torch.where(view.remainder(2) == 0, a, b))
    else:
        view.copy_(torch.where(view.remainder(2) == 0, lo, hi))


def _bool_rows(view: torch.Tensor, kind: str, gen: torch.Generator) -> None:
    if kind == "padded":
        _pad(view, gen, False)
    elif kind in ("constant", "extremes"):
        view.copy_((torch.rand(view.shape[0], 1, generator=gen) < 0.5).expand_as(view))


def make_tensor(spec: TensorSpec, dist: str, gen: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """A new tensor with the spec's shape, dtype and strides, values from `dist` (STRUCTURED: normal values,
    then rows of ROW_KINDS)."""
    out = _make_tensor(spec, dist, gen, device)
    if dist == STRUCTURED and out.numel():
        if spec.contiguous:
            _structure(out, spec, gen)
        else:
            logical = out.contiguous()
            _structure(logical, spec, gen)
            try:
                out.copy_(logical)
            except RuntimeError:  # overlapping layout (a stride of 0): the drawn normal values stay
                pass
    return out


def _make_tensor(spec: TensorSpec, dist: str, gen: torch.Generator, device: torch.device | str) -> torch.Tensor:
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
    """Positional and keyword arguments matching `spec` (containers rebuilt), tensors freshly drawn."""
    return spec.build(lambda s: make_tensor(s, dist, gen, device))


def like_example(args: tuple, kwargs: dict[str, Any], gen: torch.Generator) -> tuple[tuple, dict[str, Any]]:
    """A second draw like a call's own example (a whole model's inputs, where a module's trials draw from
    its spec): each floating tensor normal with the example's mean and spread, each int32/int64 tensor
    (token ids) within its observed range as every trial draws it, containers walked; tensors of other
    dtypes (boolean masks) and every other value as they are."""
    def draw(t: torch.Tensor) -> torch.Tensor:
        if t.numel() == 0 or not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
            return t
        fresh = make_tensor(TensorSpec.of(t), "normal", gen, t.device)
        if not t.is_floating_point():
            return fresh
        f = t.float()[torch.isfinite(t)]  # NaN or Inf in the example set no scale
        mean = float(f.mean()) if f.numel() else 0.0
        std = max(float(f.std()) if f.numel() > 1 else 0.0, 1e-3)
        return fresh * std + mean  # dense layouts keep their strides
    return _pytree.tree_map_only(torch.Tensor, draw, (tuple(args), dict(kwargs)))


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(reversed(stride))


def rows_sweep_specs(spec: InputSpec) -> list[InputSpec]:
    """Variants of SPEC with its inputs' leading dimensions (all but the last) changed together, for kernels
    that treat their inputs as rows of their last dimension (SHAPE_GENERIC = "rows", the library's): a single
    row (a decode step's shape) and an odd number of rows in the next-to-last dimension. Calls that are not
    rows of their inputs (keys.row_inputs: one input, or several of the same leading dimensions) get none."""
    tensors = row_inputs(spec)
    if tensors is None or len(tensors[0].shape) < 2:
        return []
    lead = tensors[0].shape[:-1]
    leads = {(1,) * len(lead), (*lead[:-1], 2 * lead[-1] + 1)} - {lead}

    def variant(new: tuple[int, ...]) -> InputSpec:
        def resize(s: TensorSpec) -> TensorSpec:
            shape = (*new, s.shape[-1])
            return TensorSpec(shape, s.dtype, _contiguous(shape), s.device, s.value_range)
        return spec.map_tensors(resize)
    return [variant(new) for new in sorted(leads)]


def kv_sweep_specs(spec: InputSpec) -> list[InputSpec]:
    """Variants of an attention call's SPEC (query [B, Hq, q, D], key/value [B, Hkv, L, D], mask [B or 1, .., L])
    with the batch and the kv length changed, for kernels proven for any of them (SHAPE_GENERIC = "kv"):
    one sequence over a single cached position, a short odd cache, and a larger odd batch over a longer one.
    A mask's batch dimension follows the batch where it equals it; its kv dimension always follows L."""
    tensors = spec.tensor_specs()
    if len(tensors) not in (3, 4) or any(len(t.shape) != 4 for t in tensors):
        return []
    batch, length = tensors[0].shape[0], tensors[1].shape[2]
    out = []
    for new_b, new_l in ((1, 1), (batch, 7), (2 * batch + 1, 33)):
        if (new_b, new_l) == (batch, length):
            continue
        index = iter(range(len(tensors)))

        def resize(s: TensorSpec, new_b: int = new_b, new_l: int = new_l) -> TensorSpec:
            i = next(index)
            shape = list(s.shape)
            shape[0] = new_b if shape[0] == batch else shape[0]
            if i in (1, 2):
                shape[2] = new_l
            elif i == 3 and shape[3] == length:
                shape[3] = new_l
            return TensorSpec(tuple(shape), s.dtype, _contiguous(tuple(shape)), s.device, s.value_range)
        out.append(spec.map_tensors(resize))
    return out


def rope_sweep_specs(spec: InputSpec) -> list[InputSpec]:
    """Variants of a rotary-embedding call's SPEC (q [B, Hq, S, D], k [B, Hkv, S, D], cos/sin [B or 1, S, D]) with
    the batch and the sequence length changed, for kernels proven for any of them (SHAPE_GENERIC = "rope"): one
    decode position, and a larger odd batch over an odd length, each tensor in its own layout's order of
    dimensions (a transposed q stays transposed: strides of the same permutation, densely packed); and the call's
    shapes in the other of HF's two layouts of q and k (contiguous [B, H, S, D], or stored as [B, S, H, D]), so
    one proof serves both."""
    tensors = spec.tensor_specs()
    if len(tensors) != 4 or [len(t.shape) for t in tensors] != [4, 4, 3, 3]:
        return []
    batch, length = tensors[0].shape[0], tensors[0].shape[2]
    index = iter(range(4))

    def other_layout(s: TensorSpec) -> TensorSpec:
        if next(index) >= 2:
            return s
        b, h, q, d = s.shape
        stride = _contiguous(s.shape) if not s.contiguous else (q * h * d, d, h * d, 1)
        return TensorSpec(s.shape, s.dtype, stride, s.device, s.value_range)
    out = [spec.map_tensors(other_layout)] if length > 1 else []
    for new_b, new_s in ((batch, 1), (2 * batch + 1, 2 * length + 1)):
        if (new_b, new_s) == (batch, length):
            continue
        index = iter(range(len(tensors)))

        def resize(s: TensorSpec, new_b: int = new_b, new_s: int = new_s) -> TensorSpec:
            i = next(index)
            shape = list(s.shape)
            shape[0] = new_b if shape[0] == batch else shape[0]
            seq = 2 if i < 2 else 1
            shape[seq] = new_s if shape[seq] == length else shape[seq]
            return TensorSpec(tuple(shape), s.dtype, _same_order(s, tuple(shape)), s.device, s.value_range)
        out.append(spec.map_tensors(resize))
    return out


def _same_order(s: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides for SHAPE with S's dimensions in S's memory order (outermost first by stride)."""
    order = sorted(range(len(shape)), key=lambda d: (-s.stride[d], d)) if s.stride else list(range(len(shape)))
    stride = [0] * len(shape)
    step = 1
    for d in reversed(order):
        stride[d] = step
        step *= max(shape[d], 1)
    return tuple(stride)


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
        def resize(s: TensorSpec, new: int = new) -> TensorSpec:
            if not s.shape or s.shape[0] != lead:
                return s
            shape = (new, *s.shape[1:])
            stride, step = [], 1
            for size in reversed(shape):
                stride.append(step)
                step *= max(size, 1)
            return TensorSpec(shape, s.dtype, tuple(reversed(stride)), s.device, s.value_range)
        out.append(spec.map_tensors(resize))
    return out
