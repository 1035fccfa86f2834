"""The library's conv_bn_act family (Conv2d, eval-mode BatchNorm2d, activation) and the candidate's prepare().

Matching runs on hand-built Sequential(Conv2d, BatchNorm2d, act) modules (always) and on torchvision's
Conv2dNormActivation blocks of mobilenet_v3_small and timm's ConvNormAct (skipped without them); near misses (train mode,
conv-act-bn order, reflect padding) must not match. prepare() runs once per module state. The CPU kernels are
proven through optimize() with the library on (fp32, bf16; NCHW, channels last, depthwise, conv bias), the Metal
ones on the MSL emulator; a broken fold must be rejected. The CUDA file's checks are in test_library_cuda.py.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import metal_accel
from metal_accel.core.errors import SandboxError
from metal_accel.library import provider as library_provider
from metal_accel.library import sources as library_sources
from metal_accel.library.match import clear_memo, match_call
from metal_accel.sandbox.host import check_host_code, load_forward

ACTS = {"relu_": lambda: nn.ReLU(inplace=True), "relu": nn.ReLU, "relu6_": lambda: nn.ReLU6(inplace=True),
        "hardswish": nn.Hardswish, "silu_": lambda: nn.SiLU(inplace=True), "none": None}


def block(cin: int = 8, cout: int = 12, act: str = "relu_", *, k: int = 3, stride: int = 1, groups: int = 1,
          bias: bool = False, momentum: float | None = 0.01, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Sequential(Conv2d, BatchNorm2d[, act]) as torchvision's Conv2dNormActivation builds it, with random
    BatchNorm statistics and affine parameters (fresh ones are an identity map a kernel could ignore)."""
    make = ACTS[act]
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=bias),
              nn.BatchNorm2d(cout, eps=1e-3, momentum=momentum)] + ([make()] if make is not None else [])
    return randomize(nn.Sequential(*layers)).eval().to(dtype)


def randomize(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):  # timm's BatchNormAct2d too
                m.running_var.uniform_(0.3, 2.0)
                m.running_mean.normal_(0.0, 0.5)
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_(0.0, 0.3)
    return model


@pytest.fixture(autouse=True)
def _fresh_memo():
    clear_memo()
    yield
    clear_memo()


def family_of(module: nn.Module, x: torch.Tensor) -> tuple[str, str] | None:
    found = match_call(module, (x,), {})
    return None if found is None else (found.family, found.arguments[11][1])


# ---------------------------------------------------------------- matching (fast)

@pytest.mark.parametrize("act", list(ACTS))
def test_sequential_conv_bn_act_matches_each_activation(act):
    assert family_of(block(act=act), torch.randn(2, 8, 9, 9)) == ("conv_bn_act", act)


def test_bias_depthwise_stride_and_momentum_none_match():
    m = block(12, 12, "hardswish", groups=12, stride=2, bias=True, momentum=None)
    found = match_call(m, (torch.randn(2, 12, 9, 9),), {})
    assert found is not None and found.family == "conv_bn_act"
    glue = found.glue()
    assert "module[0].bias" in glue and "module[0].groups" in glue and "0.0)" in glue
    assert "def prepare(module):" in glue and "def forward(module, x, *, prepared):" in glue
    assert "SHAPE_GENERIC = True" in glue


def test_near_misses_do_not_match():
    x = torch.randn(2, 8, 9, 9)
    assert match_call(block().train(), (x,), {}) is None  # batch statistics, not the running ones
    reordered = block()
    reordered = nn.Sequential(reordered[0], reordered[2], reordered[1]).eval()  # conv, act, bn
    assert match_call(reordered, (x,), {}) is None
    reflect = block()
    reflect[0].padding_mode = "reflect"  # a pad op before the convolution
    assert match_call(reflect, (x,), {}) is None
    two_norms = nn.Sequential(nn.Conv2d(8, 12, 3), nn.BatchNorm2d(12), nn.BatchNorm2d(12)).eval()
    assert match_call(two_norms, (x,), {}) is None


def test_a_class_of_its_own_matches_and_containers_are_not_learned(isolated_user_cache):
    from metal_accel.blocks import ConvBnAct
    from metal_accel.library.known import known_classes
    assert family_of(ConvBnAct(8, 16).eval(), torch.randn(1, 8, 6, 6)) == ("conv_bn_act", "silu")
    assert family_of(block(), torch.randn(1, 8, 6, 6)) == ("conv_bn_act", "relu_")
    known = known_classes()
    assert known.get("metal_accel.blocks.ConvBnAct") == "conv_bn_act"
    assert "torch.nn.modules.container.Sequential" not in known


def test_torchvision_mobilenet_v3_blocks_match():
    tv = pytest.importorskip("torchvision")
    from torchvision.ops.misc import Conv2dNormActivation
    model = randomize(tv.models.mobilenet_v3_small()).eval()
    seen: dict[str, int] = {}
    calls: list[tuple[nn.Module, torch.Tensor]] = []
    hooks = [m.register_forward_pre_hook(lambda mod, a: calls.append((mod, a[0])))
             for m in model.modules() if isinstance(m, Conv2dNormActivation)]
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    for h in hooks:
        h.remove()
    assert len(calls) > 30
    for mod, x in calls:
        found = family_of(mod, x)
        assert found is not None, mod
        seen[found[1]] = seen.get(found[1], 0) + 1
    assert set(seen) == {"hardswish_", "relu_", "none"}, seen
    for act, want in (("silu_", nn.SiLU), ("relu6_", nn.ReLU6)):  # EfficientNet's and MobileNetV2's
        m = randomize(Conv2dNormActivation(8, 16, 3, activation_layer=want)).eval()
        assert family_of(m, torch.randn(1, 8, 7, 7)) == ("conv_bn_act", act)


# ---------------------------------------------------------------- prepare() (fast)

PREPARED = '''SOURCE = ""


def prepare(module):
    return module.w * 2.0, module.b + 1.0


def forward(module, x, *, prepared):
    w, b = prepared
    return x * w + b
'''


def test_prepare_runs_once_per_state_and_again_when_it_changes():
    from types import SimpleNamespace
    fwd = load_forward(PREPARED, lib=None)
    view = SimpleNamespace(w=torch.ones(3), b=torch.zeros(3))
    x = torch.ones(3)
    for _ in range(3):
        torch.testing.assert_close(fwd(view, x), torch.full((3,), 3.0))
    assert fwd.prepares == 1
    view.w.mul_(2.0)  # in place: a new version
    torch.testing.assert_close(fwd(view, x), torch.full((3,), 5.0))
    view.b = torch.ones(3)  # reassigned: another tensor
    torch.testing.assert_close(fwd(view, x), torch.full((3,), 6.0))
    assert fwd.prepares == 3


def test_prepare_in_a_proof_catches_a_call_that_writes_into_its_tensors():
    from types import SimpleNamespace
    bad = PREPARED.replace("    return x * w + b", "    lib.touch(w)\n    return x * w + b")
    fwd = load_forward(bad, lib=SimpleNamespace(touch=lambda t: t.add_(1.0)), proof=True)
    with pytest.raises(RuntimeError, match="prepare"):
        fwd(SimpleNamespace(w=torch.ones(3), b=torch.zeros(3)), torch.ones(3))


@pytest.mark.parametrize("code", [
    PREPARED.replace("def prepare(module):", "def prepare(module, extra):"),
    PREPARED.replace("def forward(module, x, *, prepared):\n    w, b = prepared", "def forward(module, x):\n    w, b = 1, 2"),
    PREPARED.replace("    return module.w * 2.0, module.b + 1.0", "    module.w.mul_(2.0)\n    return module.w, module.b"),
])
def test_prepare_is_host_code_checked_like_forward(code):
    with pytest.raises(SandboxError):
        check_host_code(code)


# ---------------------------------------------------------------- proofs through optimize() with the library

@pytest.fixture
def library_on(monkeypatch, tmp_path):
    monkeypatch.setenv("METAL_ACCEL_LIBRARY", "1")
    library_provider.kernel_file.cache_clear()
    yield tmp_path
    library_provider.kernel_file.cache_clear()


def optimized(model: nn.Module, x: torch.Tensor, backend: str) -> tuple[metal_accel.ModuleReport, torch.Tensor]:
    """optimize() MODEL on X with the library (installed whatever its speed); (its row, eager's output)."""
    with torch.inference_mode():
        want = model(x).clone()
        metal_accel.optimize(model, (x,), backend=backend, margin=-0.9, end_to_end=False, compile=False,
                             bench_budget_s=0.1, progress=False)
    rows = [m for m in metal_accel.explain(model).modules if m.name == type(model).__name__]
    return rows[0], want


SPEED_ONLY = ("not faster", "within noise", "unreliable timing")  # proof/speed.py's verdicts on a correct kernel


def assert_library_kernel(model: nn.Module, x: torch.Tensor, backend: str = "cpu") -> None:
    """The library kernel passed the proof: installed (then its output is checked here too), or rejected on speed
    alone (a busy 2-core machine says nothing about speed)."""
    row, want = optimized(model, x, backend)
    if row.status != "kernel":
        assert row.rejected and all(r.startswith("library:conv_bn_act: ") and r.split(": ", 1)[1].startswith(SPEED_ONLY)
                                    for r in row.rejected), (row.reason, row.rejected)
        return
    assert row.source == "library:conv_bn_act", row.source
    with torch.inference_mode():
        got = model(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {torch.float32: (1e-4, 1e-5)}.get(x.dtype, (2e-2, 2e-2))
    torch.testing.assert_close(got.float(), want.float(), rtol=tol[0], atol=tol[1])


CPU_CASES = [  # (act, dtype, groups, bias, channels_last)
    ("relu_", torch.float32, 1, False, False), ("hardswish", torch.float32, 1, True, False),
    ("silu_", torch.float32, 12, False, True), ("relu6_", torch.float32, 1, False, True),
    ("none", torch.float32, 1, False, False),
    ("relu_", torch.bfloat16, 1, False, False), ("hardswish", torch.bfloat16, 12, True, False),
    ("silu_", torch.bfloat16, 1, False, True), ("none", torch.bfloat16, 1, False, False),
]


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("act, dtype, groups, bias, channels_last", CPU_CASES)
def test_cpu_kernel_proven_through_the_library(library_on, act, dtype, groups, bias, channels_last):
    torch.manual_seed(0)
    model = block(12, 12, act, groups=groups, bias=bias, dtype=dtype)
    x = torch.randn(2, 12, 11, 11).to(dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    assert_library_kernel(model, x)


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_cpu_broken_fold_is_rejected(library_on, monkeypatch, tmp_path):
    import shutil
    root = tmp_path / "kernels"
    shutil.copytree(library_sources.KERNELS, root)
    path = root / "cpu" / "conv_bn_act.py"
    text = path.read_text()
    broken = text.replace("shift = bn_bias.double() - running_mean.double() * scale",
                          "shift = bn_bias.double() - running_mean.double()")
    assert broken != text
    path.write_text(broken)
    monkeypatch.setattr(library_sources, "KERNELS", root)
    library_provider.kernel_file.cache_clear()
    row, _ = optimized(block(), torch.randn(2, 8, 9, 9), "cpu")
    assert row.status == "eager" and any(r.startswith("library:conv_bn_act: incorrect") for r in row.rejected), \
        row.rejected


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_cpu_torchvision_blocks_fp32_within_eager_error(library_on):
    """Real Conv2dNormActivation blocks (random init, random BatchNorm statistics): proven, and the installed
    kernels' outputs close to eager's (the fold rounds differently: not bit-equal)."""
    tv = pytest.importorskip("torchvision")
    from torchvision.ops.misc import Conv2dNormActivation
    torch.manual_seed(0)
    norm = lambda c: nn.BatchNorm2d(c, eps=1e-3, momentum=0.01)  # noqa: E731  (MobileNetV3's)
    for act in (nn.Hardswish, nn.ReLU, None):
        m = randomize(Conv2dNormActivation(16, 24, 3, stride=2, norm_layer=norm, activation_layer=act)).eval()
        assert_library_kernel(m, torch.randn(2, 16, 20, 20))
    assert tv is not None


@pytest.mark.slow
@pytest.mark.needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_metal_kernel_proven_on_the_emulator(library_on, dtype):
    torch.manual_seed(0)
    for act, groups, channels_last in (("hardswish", 1, False), ("relu_", 12, True), ("none", 1, False)):
        model = block(12, 12, act, groups=groups, dtype=dtype)
        x = torch.randn(2, 12, 9, 9).to(dtype)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.to(memory_format=torch.channels_last)
        row, want = optimized(model, x, "mps-emu")
        assert row.status == "kernel" and row.source == "library:conv_bn_act", (row.reason, row.rejected)
        assert "speed not measured" in row.reason


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_the_kernel_follows_the_modules_parameters():
    """The library's CPU kernel and glue as an installed op runs them (one module view while the state tensors are
    the same objects): the folded weights are made once, and again when the module's state changes, in place
    (load_state_dict, an optimizer step) or by reassignment."""
    from metal_accel.backends import get_backend
    from metal_accel.core.candidate import parse_candidate
    from metal_accel.runtime.ops import ModuleLayout
    torch.manual_seed(0)
    model, other = block(8, 8, "relu_"), block(8, 8, "relu_")
    x = torch.randn(2, 8, 9, 9)
    text, _ = library_provider.kernel_file("cpu", "conv_bn_act")
    cand = parse_candidate(text + match_call(model, (x,), {}).glue(), "cpu", "library:conv_bn_act")
    fwd = load_forward(cand.code, get_backend("cpu").compile(cand.source))
    layout = ModuleLayout(model)
    view = layout.view(layout.gather())
    with torch.no_grad():
        want = model(x)
        for _ in range(3):
            torch.testing.assert_close(fwd(view, x), want, rtol=1e-4, atol=1e-5)
        assert fwd.prepares == 1
        model.load_state_dict(other.state_dict())  # copies in place: the same tensors, new versions
        torch.testing.assert_close(fwd(view, x), other(x), rtol=1e-4, atol=1e-5)
        model[1].running_var = torch.rand(8) + 0.5  # reassigned: a new view, as the op builds one
        other[1].running_var = model[1].running_var.clone()
        torch.testing.assert_close(fwd(layout.view(layout.gather()), x), other(x), rtol=1e-4, atol=1e-5)
    assert fwd.prepares == 3


def test_prepare_holds_no_tensor_of_the_module():
    """A prepared value that is the module's own tensor is looked up per call, not held: freeing the module frees
    the memo's entry."""
    import gc
    import weakref
    from types import SimpleNamespace
    code = PREPARED.replace("    return module.w * 2.0, module.b + 1.0", "    return module.w, module.b + 1.0")
    fwd = load_forward(code, lib=None)
    view = SimpleNamespace(w=torch.ones(3), b=torch.zeros(3))
    torch.testing.assert_close(fwd(view, torch.ones(3)), torch.full((3,), 2.0))
    torch.testing.assert_close(fwd(view, torch.ones(3)), torch.full((3,), 2.0))
    assert fwd.prepares == 1
    gone = weakref.ref(view.w)
    del view
    gc.collect()
    assert gone() is None and not fwd._entries


def test_timm_conv_norm_act_matches():
    """timm's ConvNormAct: its BatchNormAct2d applies the activation itself; the trace is the same computation."""
    pytest.importorskip("timm")
    from timm.layers import ConvNormAct
    x = torch.randn(2, 8, 9, 9)
    for act, want in (("relu", "relu_"), ("silu", "silu_"), ("hard_swish", "hardswish_")):
        assert family_of(randomize(ConvNormAct(8, 16, 3, act_layer=act)).eval(), x) == ("conv_bn_act", want)
    assert family_of(ConvNormAct(8, 16, 3, apply_act=False).eval(), x) == ("conv_bn_act", "none")
