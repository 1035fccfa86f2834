"""The shipped library's CUDA kernels (metal_accel/library/kernels/cuda/<family>.py).

Without a GPU: every file is a library kernel file (no forward, the family's host signature, DTYPES), passes the
static checks and compiles for sm_90 (nvcc, NVRTC: each skips where absent); and every host function, run on the
CPU against an emulated `lib` (each kernel's launch checked as the CUDA backend checks it, its grid checked to
cover the work, its effect computed in torch as the kernel computes it), equals the family's reference at every
dtype, 1 row, odd widths and non-contiguous inputs. With a GPU (`cuda`): optimize() proves each family's kernel
on the real transformers classes through the library provider, and rejects a broken variant.
"""
from __future__ import annotations

import inspect
import math
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from limits import HANG_S

from metal_accel.backends.cuda.signature import (
    ArgBinder,
    launch_dims,
    parse_cuda_kernels,
)
from metal_accel.core.candidate import parse_candidate
from metal_accel.library.families import FAMILIES
from metal_accel.sandbox.host import check_host_code, load_forward
from metal_accel.sandbox.kernel_source import check_kernel_source

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "metal_accel" / "library" / "kernels" / "cuda"
FAMILY_NAMES = sorted(FAMILIES)
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
NVCC = shutil.which("nvcc")


def text_of(family: str) -> str:
    return (KERNELS / f"{family}.py").read_text()


def glue(family: str) -> str:
    """A forward that hands its inputs and its module's attributes a..e to the host function (the library generates
    the real one; a family with prepared arguments gets them through prepare(), as the library's glue passes them)."""
    fam = FAMILIES[family]
    inputs = ", ".join(fam.inputs)
    n = len(inspect.signature(fam.reference).parameters) - len(fam.inputs)
    args = [f"module.{chr(97 + i)}" for i in range(n)]
    if fam.prepared:
        return (f'\n\nSHAPE_GENERIC = True\n\n\ndef prepare(module):\n    return {family}_prepare('
                f'{", ".join(args[:fam.prepared])})\n\n\ndef forward(module, {inputs}, *, prepared):\n'
                f'    return {family}({inputs}, prepared, {", ".join(args[fam.prepared:])})\n')
    return (f'\n\nSHAPE_GENERIC = "rows"\n\n\ndef forward(module, {inputs}):\n'
            f'    return {family}({inputs}{"".join(", " + a for a in args)})\n')


def candidate(family: str, text: str | None = None) -> Any:
    return parse_candidate((text or text_of(family)) + glue(family), "cuda", f"library:{family}")


# ---------------------------------------------------------------- the files (no GPU)

def test_every_family_has_a_cuda_kernel_file() -> None:
    # attention_decode and rotary are served below HF's attention modules (library/attention.py, rotary.py), not
    # matched by tracing
    from metal_accel.library.catalog import ROUTED
    routed = {name for name, _ in ROUTED}
    assert sorted(p.stem for p in KERNELS.glob("*.py") if p.stem not in routed) == FAMILY_NAMES


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_kernel_file_format_and_static_checks(family: str) -> None:
    import ast
    text = text_of(family)
    tree = ast.parse(text)
    assert isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant)  # the docstring
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "forward" not in defs  # the library appends the glue
    want = list(inspect.signature(FAMILIES[family].reference).parameters)
    k = FAMILIES[family].prepared
    if k:
        assert [a.arg for a in defs[f"{family}_prepare"].args.args] == want[1:1 + k]
        want = ["x", "prepared"] + want[1 + k:]
    assert [a.arg for a in defs[family].args.args] == want
    cand = candidate(family)
    check_host_code(cand.code)
    check_kernel_source(cand.source, "cuda")
    kernels = parse_cuda_kernels(cand.source)
    launched = {line.split("lib.", 1)[1].split("(", 1)[0] for line in cand.code.splitlines() if "lib." in line}
    assert launched and launched <= set(kernels), launched - set(kernels)
    from metal_accel.library.provider import _declared_dtypes
    assert _declared_dtypes(text) == ("float32", "float16", "bfloat16")


@pytest.mark.parametrize("path", sorted(KERNELS.glob("*.py")), ids=lambda p: p.stem)
def test_every_launched_kernel_is_declared_where_the_backend_finds_it(path: Path) -> None:
    """The backend finds kernels by their written `extern "C" __global__` declarations (a macro that expands
    to them is not seen, and the kernel would never compile on the GPU)."""
    from metal_accel.core.candidate import declared_constant
    text = path.read_text()
    kernels = parse_cuda_kernels(declared_constant(text, "SOURCE"))
    host = text.split('"""', 4)[-1]  # after the docstring and SOURCE
    launched = {line.split("lib.", 1)[1].split("(", 1)[0] for line in host.splitlines() if "lib." in line}
    assert launched and launched <= set(kernels), launched - set(kernels)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_compiles_with_nvcc(family: str, tmp_path: Path) -> None:
    src = tmp_path / "k.cu"
    src.write_text(candidate(family).source)
    proc = subprocess.run([NVCC, "-arch=sm_90", "-ptx", "-std=c++17", "-o", str(tmp_path / "k.ptx"), str(src)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptx = (tmp_path / "k.ptx").read_text()
    assert ".v4." in ptx  # 16-byte vector accesses
    assert ".local" not in ptx  # the register arrays stay in registers


def _nvrtc_ok() -> bool:
    try:
        from metal_accel.backends.cuda.backend import nvrtc_available
        return nvrtc_available()
    except Exception:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-python + nvidia-cuda-nvrtc) not installed")
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_compiles_with_nvrtc(family: str) -> None:
    from metal_accel.backends.cuda.backend import (
        nvrtc_compile,
        nvrtc_options,
        toolkit_include_dirs,
    )
    if not toolkit_include_dirs():
        pytest.skip("CUDA toolkit headers not found")
    assert nvrtc_compile(candidate(family).source, "sm_90", nvrtc_options("sm_90", toolkit_include_dirs()), True)


# ---------------------------------------------------------------- host code against an emulated lib (no GPU)

ROW_PACKS = 8  # NV of rms_norm's SOURCE
LN_ROW_PACKS = 8  # NV of the layer_norm SOURCEs


def act_float(x: torch.Tensor, code: int) -> torch.Tensor:
    """act_f of the SOURCEs, in float32."""
    if code == 0:
        return x / (1.0 + torch.exp(-x))
    if code == 1:
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))
    if code == 2:
        return x * 0.5 * (1.0 + torch.erf(x * 0.70710678118654752440))
    assert code == 3, code
    return torch.where((x > 0) | x.isnan(), x, torch.zeros_like(x))


def conv_act_float(x: torch.Tensor, code: int) -> torch.Tensor:
    """act_f of conv_bn_act's SOURCE, in float32."""
    if code == 1:
        return torch.where((x > 0) | x.isnan(), x, torch.zeros_like(x))
    if code == 2:
        return torch.where(x <= 0, torch.zeros_like(x), torch.where(x >= 6, torch.full_like(x, 6.0), x))
    if code == 3:
        return x * (x + 3.0).clamp(0.0, 6.0) / 6.0
    assert code == 4, code
    return x / (1.0 + torch.exp(-x))


def _emulate(name: str, args: tuple, grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
    if name.startswith("conv_act_"):
        x, y, n, code = args
        assert block == (256, 1, 1) and grid[0] * 512 * (16 // x.element_size()) >= n, (grid, n)
        y.view(-1)[:n] = conv_act_float(x.reshape(-1)[:n].float(), code).to(y.dtype)
    elif name.startswith("conv_bn_act_"):
        y, alpha, beta, n, C, inner, code = args
        assert block == (256, 1, 1) and grid[0] >= 1
        c = (torch.arange(n) // inner) % C
        t = (y.reshape(-1)[:n].float() * alpha[c] + beta[c]).to(y.dtype).float()
        y.view(-1)[:n] = (t if code == 0 else conv_act_float(t, code)).to(y.dtype)
    elif name.startswith("act_mul_"):
        g, u, h, n, code = args
        assert block == (256, 1, 1) and grid[0] * 512 * (16 // g.element_size()) >= n, (grid, n)
        a = act_float(g.reshape(-1)[:n].float(), code).to(g.dtype)
        h.view(-1)[:n] = (a.float() * u.reshape(-1)[:n].float()).to(h.dtype)
    elif name.startswith("act_"):
        x, y, n, code = args
        assert block == (256, 1, 1) and grid[0] * 512 * (16 // x.element_size()) >= n, (grid, n)
        y.view(-1)[:n] = act_float(x.reshape(-1)[:n].float(), code).to(y.dtype)
    elif name.startswith("rms_"):
        if name.startswith("rms_wide"):
            x, w, y, D, eps = args
            rows = grid[0]
            assert block == (1024, 1, 1)
        else:
            x, w, y, rows, D, eps = args
            V = 16 // x.element_size() if name.startswith("rms_vec") else 1
            tpr, rpb = block[0], block[1]
            assert tpr % 32 == 0 and tpr * rpb <= 1024 and grid[0] * rpb >= rows, (grid, block, rows)
            assert D % V == 0 and D // V <= ROW_PACKS * tpr, (D, V, tpr)
            if V > 1:
                for t in (x, w, y):
                    assert t.storage_offset() * t.element_size() % 16 == 0
        xs = x.reshape(-1)[:rows * D].view(rows, D).float()
        inv = torch.rsqrt(xs.pow(2).sum(-1, keepdim=True) / D + eps)
        h = (xs * inv).to(x.dtype).float()
        y.view(-1)[:rows * D] = (w[:D].float() * h).to(y.dtype).reshape(-1)
    elif name.startswith(("ln_", "add_ln_")):
        _emulate_layer_norm(name, args, grid, block)
    else:
        raise AssertionError(name)


def _emulate_layer_norm(name: str, args: tuple, grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
    """ln_* (x, w, b, y) and add_ln_* (h, r, w, b: in place over h) of the layer_norm SOURCEs."""
    add = name.startswith("add_")
    kind = name.split("_")[2 if add else 1]
    if add:
        x, r, w, b = args[:4]
        y = x
    else:
        x, w, b, y = args[:4]
        r = None
    if kind == "wide":
        D, eps = args[4:]
        rows = grid[0]
        assert block == (1024, 1, 1)
    else:
        rows, D, eps = args[4:]
        V = 16 // x.element_size() if kind == "vec" else 1
        tpr, rpb = block[0], block[1]
        assert tpr % 32 == 0 and tpr * rpb <= 512 and grid[0] * rpb >= rows, (grid, block, rows)  # launch bound 512
        assert D % V == 0 and D // V <= LN_ROW_PACKS * tpr, (D, V, tpr)
        for t in (x, w, b, y) + ((r,) if add else ()):
            assert t.storage_offset() % V == 0  # packs of V elements, each aligned to its size
    xs = x.reshape(-1)[:rows * D].view(rows, D).float()
    if add:
        xs = (xs + r.reshape(-1)[:rows * D].view(rows, D).float()).to(x.dtype).float()
    mean = xs.mean(-1, keepdim=True)
    rstd = torch.rsqrt((xs - mean).pow(2).mean(-1, keepdim=True) + eps)
    y.view(-1)[:rows * D] = (w[:D].float() * ((xs - mean) * rstd) + b[:D].float()).to(y.dtype).reshape(-1)


def emulated_lib(source: str) -> SimpleNamespace:
    """Each kernel of SOURCE as a launcher that checks its arguments and launch (as the CUDA backend does, but
    on CPU tensors) and then computes its effect in torch."""
    def launcher(name: str, params: list) -> Callable[..., None]:
        binder = ArgBinder(name, params, device_type="cpu")

        def launch(*args: Any, grid: Any = None, block: Any = None, **kw: Any) -> None:
            assert not kw, kw
            binder.values(args)
            dims = launch_dims(name, grid=grid, block=block)
            if dims is not None:
                _emulate(name, args, dims[0], dims[1])
        return launch
    return SimpleNamespace(**{n: launcher(n, p) for n, p in parse_cuda_kernels(source).items()})


def host(family: str) -> Callable[..., Any]:
    cand = candidate(family)
    forward = load_forward(cand.code, emulated_lib(cand.source))
    k = len(FAMILIES[family].inputs)
    return lambda *a: forward(SimpleNamespace(**{chr(97 + i): v for i, v in enumerate(a[k:])}), *a[:k])


def make_x(shape: tuple[int, ...], dtype: torch.dtype, layout: str = "contiguous") -> torch.Tensor:
    if layout == "contiguous":
        return torch.randn(shape, dtype=dtype)
    if layout == "sliced":  # rows further apart than their width
        return torch.randn(*shape[:-1], shape[-1] + 3, dtype=dtype)[..., :shape[-1]]
    if layout == "offset":  # contiguous, starting one element into its storage (not 16-byte aligned)
        return torch.randn(math.prod(shape) + 1, dtype=dtype)[1:].view(shape)
    return torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype).transpose(-1, -2)  # "transposed"


SHAPES = [((1, 1, 64), "contiguous"), ((2, 7, 64), "contiguous"), ((3, 100), "contiguous"), ((2, 5, 37), "contiguous"),
          ((2, 6, 64), "transposed"), ((3, 40), "sliced"), ((2, 3, 48), "offset")]
DTYPE_TOL = {FP32: 1e-5, FP16: 2e-3, BF16: 1e-2}


def check(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    err = (got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)
    assert err <= DTYPE_TOL[dtype], float(err)


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
@pytest.mark.parametrize("shape, layout", SHAPES)
def test_rms_norm_host(shape: tuple[int, ...], layout: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    fn = host("rms_norm")
    x = make_x(shape, dtype, layout)
    for wdt in {dtype, FP32}:
        w = torch.randn(shape[-1]).to(wdt)
        check(fn(x, w, 1e-6), FAMILIES["rms_norm"].reference(x, w, 1e-6), dtype)


@pytest.mark.parametrize("D, dtype", [(5000, FP32), (40000, FP32), (70000, BF16), (9000, FP16)])
def test_rms_norm_host_wide_rows(D: int, dtype: torch.dtype) -> None:
    """Wide rows: many threads a row, and past the registers the two-pass kernel."""
    torch.manual_seed(0)
    for D_ in (D, D + 1):
        x, w = torch.randn(2, D_, dtype=dtype), torch.randn(D_, dtype=dtype)
        check(host("rms_norm")(x, w, 1e-5), FAMILIES["rms_norm"].reference(x, w, 1e-5), dtype)


def test_rms_norm_host_falls_back_for_other_dtypes() -> None:
    x, w = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(host("rms_norm")(x, w, 1e-6), FAMILIES["rms_norm"].reference(x, w, 1e-6))


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
@pytest.mark.parametrize("shape, layout", SHAPES + [((1, 1), "contiguous"), ((4099,), "contiguous")])
def test_gelu_tanh_host(shape: tuple[int, ...], layout: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = make_x(shape, dtype, layout) * 3
    ref = FAMILIES["gelu_tanh"].reference(x.double()).to(dtype)  # eager rounds each step in half dtypes
    check(host("gelu_tanh")(x), ref if dtype != FP32 else FAMILIES["gelu_tanh"].reference(x), dtype)


def _weights(dtype: torch.dtype, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    return [(torch.randn(s) / math.sqrt(s[-1] if len(s) == 2 else 1)).to(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "gelu", "gelu_new", "relu"])
def test_gated_mlp_host(act: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    for (shape, layout), inter in zip(SHAPES, (100, 37, 64, 129, 50, 8, 33)):
        H = shape[-1]
        x = make_x(shape, dtype, layout)
        g, u, d = _weights(dtype, (inter, H), (inter, H), (H, inter))
        want = FAMILIES["gated_mlp"].reference(x.double(), g.double(), u.double(), d.double(), act).to(dtype)
        got = host("gated_mlp")(x, g, u, d, act)
        assert got.dtype == dtype and got.shape == want.shape
        err = (got.double() - want.double()).norm() / want.double().norm()
        assert err <= 2 * DTYPE_TOL[dtype] + (1e-4 if dtype == FP32 else 0), float(err)


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
def test_gpt2_mlp_linear_gelu_and_mlp_hosts(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    for shape, layout in SHAPES:
        if layout == "transposed":
            continue  # GPT2MLP's x.view(-1, D) needs rows it can view; the others take any layout
        H, inter = shape[-1], 2 * shape[-1] + 3
        x = make_x(shape, dtype, layout)
        cases = []
        fc, fb, pw, pb = _weights(dtype, (H, inter), (inter,), (inter, H), (H,))
        cases.append(("gpt2_mlp", (fc, fb, pw, pb)))
        w, b = _weights(dtype, (inter, H), (inter,))
        cases += [("linear_gelu", (w, b, a)) for a in ("none", "tanh")]
        w1, b1, w2, b2 = _weights(dtype, (inter, H), (inter,), (H, inter), (H,))
        cases += [("mlp", (w1, b1, w2, b2, a)) for a in ("silu", "gelu_tanh", "gelu", "gelu_new", "relu")]
        for family, args in cases:
            ref = FAMILIES[family].reference
            want = ref(x.double(), *[a.double() if isinstance(a, torch.Tensor) else a for a in args]).to(dtype)
            got = host(family)(x, *args)
            assert got.dtype == dtype and got.shape == want.shape, family
            err = (got.double() - want.double()).norm() / want.double().norm()
            assert err <= 2 * DTYPE_TOL[dtype] + (1e-4 if dtype == FP32 else 0), (family, args[-1], float(err))


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
def test_conv_bn_act_host(dtype: torch.dtype) -> None:
    """Every activation, depthwise and plain, NCHW and channels last, with and without conv bias, against the
    family's reference in float64 (folded float32 and the half dtypes' fused BatchNorm alike)."""
    torch.manual_seed(0)
    ref = FAMILIES["conv_bn_act"].reference
    for act in ("relu_", "relu6", "hardswish_", "silu", "none"):
        for groups, bias, channels_last in ((1, False, False), (6, True, True), (1, True, True)):
            x = torch.randn(2, 6, 7, 5, dtype=dtype)
            w = (torch.randn(6, 6 // groups, 3, 3) * 0.3).to(dtype)
            b = torch.randn(6).to(dtype) if bias else None
            if channels_last:
                x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
            g, beta, mean = (1 + 0.3 * torch.randn(6)).to(dtype), torch.randn(6).to(dtype), torch.randn(6).to(dtype)
            var = (torch.rand(6) + 0.3).to(dtype)
            args = (w, b, g, beta, mean, var, 1e-3, (1, 1), (1, 1), (1, 1), groups, act, 0.01)
            want = ref(x.double(), *[a.double() if isinstance(a, torch.Tensor) else a for a in args])
            got = host("conv_bn_act")(x, *args)
            assert got.dtype == dtype and got.shape == want.shape, (act, groups)
            err = (got.double() - want).norm() / want.norm()
            assert err <= 2 * DTYPE_TOL[dtype], (act, groups, bias, channels_last, float(err))


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
@pytest.mark.parametrize("shape, layout", SHAPES)
def test_layer_norm_host(shape: tuple[int, ...], layout: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    fn = host("layer_norm")
    x = make_x(shape, dtype, layout) * 2 + 0.5
    for wdt in {dtype, FP32}:
        w, b = torch.randn(shape[-1]).to(wdt), torch.randn(shape[-1]).to(wdt)
        check(fn(x, w, b, 1e-5), FAMILIES["layer_norm"].reference(x, w, b, 1e-5), dtype)


@pytest.mark.parametrize("D, dtype", [(5000, FP32), (40000, FP32), (70000, BF16), (9000, FP16)])
def test_layer_norm_hosts_wide_rows(D: int, dtype: torch.dtype) -> None:
    """Wide rows: many threads a row, and past the registers the three-pass kernels."""
    torch.manual_seed(0)
    for D_ in (D, D + 1):
        x, w, b = torch.randn(2, D_, dtype=dtype) + 1, torch.randn(D_, dtype=dtype), torch.randn(D_, dtype=dtype)
        check(host("layer_norm")(x, w, b, 1e-5), FAMILIES["layer_norm"].reference(x, w, b, 1e-5), dtype)
        h, r = torch.randn(2, 64, dtype=dtype), torch.randn(2, D_, dtype=dtype)
        dw, db = (torch.randn(D_, 64) / 8).to(dtype), torch.randn(D_).to(dtype)
        want = FAMILIES["linear_add_layer_norm"].reference(h, r, dw, db, w, b, 1e-5)
        check(host("linear_add_layer_norm")(h, r, dw, db, w, b, 1e-5), want, dtype)


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
@pytest.mark.parametrize("shape, layout", SHAPES)
def test_linear_add_layer_norm_host(shape: tuple[int, ...], layout: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    fn = host("linear_add_layer_norm")
    H, inner = shape[-1], 2 * shape[-1] + 3
    x = make_x((*shape[:-1], inner), dtype, layout)
    r = make_x(shape, dtype, layout)
    dw, db = (torch.randn(H, inner) / math.sqrt(inner)).to(dtype), torch.randn(H).to(dtype)
    for wdt in {dtype, FP32}:
        w, b = torch.randn(H).to(wdt), torch.randn(H).to(wdt)
        want = FAMILIES["linear_add_layer_norm"].reference(x, r, dw, db, w, b, 1e-12)
        check(fn(x, r, dw, db, w, b, 1e-12), want, dtype)


def test_layer_norm_hosts_fall_back_for_other_calls() -> None:
    x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((2, 3, 8), (8,), (8,)))
    torch.testing.assert_close(host("layer_norm")(x, w, b, 1e-6), FAMILIES["layer_norm"].reference(x, w, b, 1e-6))
    h, dw, db = torch.randn(2, 3, 8), torch.randn(8, 8), torch.randn(8)
    w32, b32 = w.float(), b.float()
    broadcast = torch.randn(1, 3, 8)  # not one residual row per row of x: the reference in torch
    want = FAMILIES["linear_add_layer_norm"].reference(h, broadcast, dw, db, w32, b32, 1e-6)
    torch.testing.assert_close(host("linear_add_layer_norm")(h, broadcast, dw, db, w32, b32, 1e-6), want)


# ---------------------------------------------------------------- on the GPU: the pipeline proves each family

def _prove(module: torch.nn.Module, x: torch.Tensor | tuple[torch.Tensor, ...], monkeypatch: pytest.MonkeyPatch,
           tmp_path: Path, providers: list[str] | None = None) -> Any:
    import metal_accel
    monkeypatch.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path / f"uc{len(list(tmp_path.iterdir()))}"))
    metal_accel.optimize(module, x if isinstance(x, tuple) else (x,), backend="cuda", providers=providers,
                         compile=False, end_to_end=False, bench_budget_s=0.2, library=providers is None)
    cls = type(module).__name__
    return [m for m in metal_accel.explain(module).modules if m.module_class.endswith(cls)][0]


def _real_modules() -> list[tuple[str, Callable[[], torch.nn.Module], tuple[int, ...]]]:
    transformers = pytest.importorskip("transformers")
    from transformers.activations import NewGELUActivation
    from transformers.models.bert.modeling_bert import BertIntermediate
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    from transformers.models.vit.modeling_vit import ViTMLP
    llama = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_attention_heads=4,
                                     num_key_value_heads=2)
    return [("rms_norm", lambda: LlamaRMSNorm(1000), (2, 7, 1000)),
            ("gated_mlp", lambda: LlamaMLP(llama), (2, 9, 256)),
            ("gelu_tanh", NewGELUActivation, (2, 9, 771)),
            ("gpt2_mlp", lambda: GPT2MLP(1024, transformers.GPT2Config(n_embd=256, n_head=4)), (2, 9, 256)),
            ("linear_gelu", lambda: BertIntermediate(transformers.BertConfig(hidden_size=256, intermediate_size=1024,
                                                                                 num_attention_heads=4)), (2, 9, 256)),
            ("mlp", lambda: ViTMLP(transformers.ViTConfig(hidden_size=256, intermediate_size=1024,
                                                          num_attention_heads=4)), (2, 9, 256)),
            ("conv_bn_act", lambda: _conv_bn_act_block(torch.nn.Hardswish()), (8, 32, 28, 28)),
            ("conv_bn_act", lambda: _conv_bn_act_block(torch.nn.ReLU(inplace=True), groups=32), (8, 32, 28, 28)),
            ("layer_norm", lambda: _affine(torch.nn.LayerNorm(1000)), (2, 7, 1000))]


def _conv_bn_act_block(act: torch.nn.Module, groups: int = 1) -> torch.nn.Module:
    """Sequential(Conv2d, BatchNorm2d, act) as torchvision's Conv2dNormActivation, random BatchNorm statistics."""
    m = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, 1, 1, groups=groups, bias=False),
                            torch.nn.BatchNorm2d(32, eps=1e-3, momentum=0.01), act)
    with torch.no_grad():
        m[1].running_var.uniform_(0.3, 2.0)
        m[1].running_mean.normal_(0.0, 0.5)
        m[1].weight.normal_(1.0, 0.3)
        m[1].bias.normal_(0.0, 0.3)
    return m


def _affine(ln: torch.nn.LayerNorm) -> torch.nn.LayerNorm:
    with torch.no_grad():  # nn.LayerNorm starts at ones and zeros: give weight and bias values to apply
        ln.weight.normal_(1.0, 0.3)
        ln.bias.normal_(0.0, 0.3)
    return ln


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
def test_gpu_library_proves_every_family_on_real_classes(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    for family, make, shape in _real_modules():
        torch.manual_seed(0)
        module = make().to("cuda", dtype).eval()
        x = torch.randn(shape, device="cuda", dtype=dtype)
        rep = _prove(module, x, monkeypatch, tmp_path)
        # proven on the GPU (timed only once correct); slower than eager is allowed (LayerNorm's eager is one op)
        assert rep.kernel_us is not None, (family, rep.reason)
        assert all(": not faster" in r for r in rep.rejected), (family, rep.rejected)


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("rows, D, dtype", [(3, 20000, FP32), (2, 40000, BF16), (1, 70000, FP16)], ids=str)
def test_gpu_layer_norm_rows_wider_than_the_registers(rows: int, D: int, dtype: torch.dtype,
                                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Over 4096 vectors of 16 bytes a row: the three-pass kernel, proven on the GPU like the one-pass one."""
    torch.manual_seed(0)
    module = _affine(torch.nn.LayerNorm(D)).to("cuda", dtype).eval()
    rep = _prove(module, torch.randn(rows, D, device="cuda", dtype=dtype), monkeypatch, tmp_path)
    assert rep.kernel_us is not None and all(": not faster" in r for r in rep.rejected), (rep.reason, rep.rejected)


@pytest.mark.cuda
@pytest.mark.slow
def test_gpu_broken_rms_norm_rejected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    text = text_of("rms_norm").replace("        if (p < P) {\n            const Pack<W, V> g",
                                       "        if (p + 1 < P) {\n            const Pack<W, V> g")
    assert text != text_of("rms_norm")
    case = tmp_path / "cands"
    (case / "cuda").mkdir(parents=True)
    (case / "cuda" / "LlamaRMSNorm.py").write_text(text + "\n\nSHAPE_GENERIC = \"rows\"\n\n\ndef forward(module, x):\n"
                                                   "    return rms_norm(x, module.weight, module.variance_epsilon)\n")
    module = LlamaRMSNorm(512).cuda().eval()
    rep = _prove(module, torch.randn(2, 5, 512, device="cuda"), monkeypatch, tmp_path, [f"dir:{case}"])
    assert rep.status == "eager" and rep.rejected, (rep.status, rep.reason)


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
def test_gpu_library_proves_the_residual_layer_norms(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """BertSelfOutput and BertOutput, called with (hidden_states, input_tensor): the fused add + LayerNorm."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertOutput, BertSelfOutput
    cfg = BertConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12)
    for cls, inner in ((BertSelfOutput, 768), (BertOutput, 3072)):
        torch.manual_seed(0)
        module = cls(cfg)
        _affine(module.LayerNorm)
        module = module.to("cuda", dtype).eval()
        x, r = torch.randn(2, 9, inner, device="cuda", dtype=dtype), torch.randn(2, 9, 768, device="cuda", dtype=dtype)
        rep = _prove(module, (x, r), monkeypatch, tmp_path)
        # proven on the GPU; slower than eager is allowed (a correctness test: docs/library.md has the speed)
        assert rep.kernel_us is not None and all(": not faster" in r for r in rep.rejected), (cls.__name__, rep.reason)


@pytest.mark.cuda
@pytest.mark.slow
def test_gpu_broken_layer_norms_rejected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertSelfOutput
    old = "const float d = (to_f(v[k].v[e]) - mean) * scale;"
    for family, cls in (("layer_norm", "LayerNorm"), ("linear_add_layer_norm", "BertSelfOutput")):
        assert text_of(family).count(old) == 1, family
        text = text_of(family).replace(old, "const float d = (to_f(v[k].v[e]) - 0.5f * mean) * scale;")
        assert text != text_of(family)
        case = tmp_path / f"cands_{family}"
        (case / "cuda").mkdir(parents=True)
        if family == "layer_norm":
            module = _affine(torch.nn.LayerNorm(512)).cuda().eval()
            fwd = glue(family).replace("module.a, module.b, module.c", "module.weight, module.bias, module.eps")
            inputs: Any = torch.randn(2, 5, 512, device="cuda") + 1
        else:
            module = BertSelfOutput(BertConfig(hidden_size=512, num_attention_heads=8)).cuda().eval()
            _affine(module.LayerNorm)
            fwd = glue(family).replace("module.a, module.b, module.c, module.d, module.e",
                                       "module.dense.weight, module.dense.bias, module.LayerNorm.weight, "
                                       "module.LayerNorm.bias, module.LayerNorm.eps")
            inputs = (torch.randn(2, 5, 512, device="cuda"), torch.randn(2, 5, 512, device="cuda") + 1)
        (case / "cuda" / f"{cls}.py").write_text(text + fwd)
        rep = _prove(module, inputs, monkeypatch, tmp_path, [f"dir:{case}"])
        assert rep.status == "eager" and rep.rejected, (family, rep.status, rep.reason)
