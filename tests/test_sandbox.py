"""Tests for the host-code sandbox."""
from __future__ import annotations

import math
import textwrap

import pytest
import torch

from metal_accel.core.errors import SandboxError
from metal_accel.sandbox.host import build_namespace, check_host_code, load_forward

GOOD = textwrap.dedent('''
    """RMSNorm followed by a gated projection."""
    SOURCE = r"""
    extern "C" void rmsnorm(const float* x, float* y, int n) {}
    """
    BLOCK = 256
    SHAPE = (1, -2, 3.5, "a", None, True)


    def _launch(x: torch.Tensor, out: torch.Tensor, eps: float = 1e-6) -> None:
        n = x.shape[-1]
        rows = x.numel() // n
        lib.rmsnorm(x, out, n, rows, eps, grid=(rows,), block=(min(BLOCK, n),))


    def forward(module, x: torch.Tensor, *inputs) -> tuple:
        """Host code."""
        x = x.contiguous()
        out = torch.empty_like(x)
        _launch(x, out, module.eps)
        acc: int = 0
        for i in range(len(inputs)):
            acc += inputs[i].numel()
        for i, (a, b) in enumerate(zip(x.shape, out.shape)):
            assert a == b, "shape mismatch"
            if a < 0:
                break
            else:
                continue
        sizes = [d * 2 for d in x.shape if d > 0]
        total = sum(d for d in sizes)
        w = module.gate.weight.t()
        y = F.linear(out, module.weight) if module.weight is not None else out
        z = torch.matmul(y, w.contiguous().to(torch.float32))
        buf = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
        buf[0] = math.sqrt(float(total)) + acc
        q, r = divmod(total, BLOCK)
        scale = -1.0 / math.sqrt(max(1, q + r))
        pass
        return z * scale, buf[:1], x.view(-1, n_last(x))[..., ::2].T.shape


    def n_last(x, *, dim=-1):
        return x.size(dim)
''')


def test_accepts_realistic_host_code() -> None:
    check_host_code(GOOD)


class _Lib:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def rmsnorm(self, x, out, n, rows, eps, grid, block) -> None:
        self.calls.append((n, rows, eps, grid, block))
        out.copy_(x)


class _Gate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(4))


class _Mod(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.eps = 1e-5
        self.weight = torch.nn.Parameter(torch.eye(4))
        self.gate = _Gate()


def test_load_forward_runs() -> None:
    lib = _Lib()
    fwd = load_forward(GOOD, lib)
    x = torch.randn(2, 4)
    z, buf, shape = fwd(_Mod(), x, torch.ones(3))
    assert z.shape == x.shape and torch.isfinite(z).all()
    assert lib.calls == [(4, 2, 1e-5, (2,), (4,))]
    assert buf.shape == (1,) and tuple(shape) == (2, 2)


def _rejects(body: str, construct: str, line: int, top: bool = False) -> SandboxError:
    """Check `body` (inside forward, or at top level) is rejected naming construct and line."""
    if top:
        code = body + "\ndef forward(module, x):\n    return x\n"
    else:
        code = "SOURCE = 'k'\n\ndef forward(module, x):\n" + textwrap.indent(body, "    ") + "\n"
        line += 3  # forward's body starts on line 4
    with pytest.raises(SandboxError) as info:
        check_host_code(code)
    err = info.value
    assert construct in str(err), str(err)
    assert err.lineno == line, str(err)
    assert f"line {line}:" in str(err)
    return err


@pytest.mark.parametrize("body, construct, line", [
    ("import os", "import", 1),
    ("y = 1\nfrom os import path", "from-import", 2),
    ("m = __import__('os')", "__import__", 1),
    ("exec('1')", "exec", 1),
    ("y = eval('1')", "eval", 1),
    ("c = compile('1', 'f', 'exec')", "compile", 1),
    ("f = open('/etc/passwd')", "open", 1),
    ("g = getattr(x, 'shape')", "getattr", 1),
    ("g = globals()", "globals", 1),
    ("c = x.__class__", "dunder attribute", 1),
    ("c = torch._C", "private attribute", 1),
    ("w = torch.load('w.pt')", "torch.load is not an allowed torch function", 1),
    ("torch.save(x, 'w.pt')", "torch.save is not an allowed torch function", 1),
    ("y = torch.ops.aten.add(x, x)", "torch.ops.aten.add is not an allowed torch function", 1),
    ("u = torch.utils", "torch.utils is not an allowed torch function", 1),
    ("y = F.dropout(x)", "torch.nn.functional.dropout is not an allowed torch function", 1),
    ("y = module.forward(x)", "module call", 1),
    ("y = module.gate(x)", "module call", 1),
    ("module.half()", "module call", 1),
    ("module.weight.zero_()", "in-place module update", 1),
    ("p = x.data_ptr()", "data_ptr", 1),
    ("a = x.numpy()", "numpy", 1),
    ("g = x.grad_fn", "grad_fn", 1),
    ("y = x.contiguous().storage()", "storage", 1),
    ("while True:\n    pass", "while loop", 1),
    ("try:\n    pass\nexcept Exception:\n    pass", "try/except", 1),
    ("with x:\n    pass", "with", 1),
    ("f = lambda: 1", "lambda", 1),
    ("class A:\n    pass", "class", 1),
    ("global y", "global", 1),
    ("raise ValueError()", "raise", 1),
    ("del x", "delete", 1),
    ("s = f'{x}'", "f-string", 1),
    ("if (n := 3):\n    pass", "walrus", 1),
    ("def g():\n    return 1", "nested def", 1),
    ("y = x\nreturn undefined_thing", "undefined name", 2),
    ("print(x)", "print", 1),
    ("ok = isinstance(x, int)", "isinstance", 1),
    ("t = type(x)", "type", 1),
    ("m = torch", "bare torch", 1),
    ("k = lib.kernel", "lib attribute", 1),
    ("f = range\ny = f(3)", "call of a value", 2),
    ("range = 3", "rebinding", 1),
    ("module = x", "rebinding", 1),
    ("x.shape = 3", "attribute assignment", 1),
    ("d = {}", "dict literal", 1),
    ("b = b'abc'", "bytes literal", 1),
    ("y = 1\nx(3)", "call of a value", 2),
    ("y = x.shape.__len__()", "dunder attribute", 1),
    ("y = '{0.__class__}'.format(x)", "format", 1),
    ("y = {k for k in x}", "set comprehension", 1),
    ("y = x[0](1)", "call of a value", 1),
    ("y = F.linear(x, **x)", "**kwargs", 1),
    ("y = max([x], key=module.forward)", "key function", 1),
    ("y = module._modules", "private attribute", 1),
    ("y = module.__dict__", "dunder attribute", 1),
    ("y = x.T.__class__", "dunder attribute", 1),
    ("for x.a in range(3):\n    pass", "attribute assignment", 1),
    # what a kernel gaming the harness would reach for: threads, streams, gc/inspect, id-keyed caches
    ("import threading", "import", 1),
    ("import gc", "import", 1),
    ("import inspect", "import", 1),
    ("s = torch.cuda.Stream()", "torch.cuda.Stream is not an allowed torch function", 1),
    ("e = torch.cuda.Event()", "torch.cuda.Event is not an allowed torch function", 1),
    ("k = id(x)", "undefined name", 1),
    ("p = x.untyped_storage()", "untyped_storage", 1),
    ("y = torch.compile(x)", "torch.compile is not an allowed torch function", 1),
])
def test_rejects_in_function(body: str, construct: str, line: int) -> None:
    _rejects(body, construct, line)


@pytest.mark.parametrize("body, construct, line", [
    ("import torch", "import", 1),
    ("X = 1\n@decorate\ndef f():\n    pass", "decorator", 2),
    ("class A:\n    pass", "class", 1),
    ("X = torch.empty(3)", "top-level assignment", 1),
    ("X = [1, 2]", "top-level assignment", 1),
    ("print('hi')", "top-level statement", 1),
    ("for i in range(3):\n    pass", "top-level statement", 1),
    ("def f(x=torch.float32):\n    return x", "default value", 1),
    ("def f(*args):\n    return 1", "*args", 1),
    ("def f(**kw):\n    return 1", "**kwargs", 1),
    ("async def f():\n    return 1", "async def", 1),
    ("def __init__(x):\n    return x", "dunder name", 1),
    ("torch = 1", "rebinding", 1),
    ("def f(x) -> x.__class__:\n    return x", "annotation", 1),
    ("def f(x: g()):\n    return x", "annotation", 1),
])
def test_rejects_at_top_level(body: str, construct: str, line: int) -> None:
    _rejects(body, construct, line, top=True)


def test_forward_required_with_module_first() -> None:
    with pytest.raises(SandboxError, match="missing forward"):
        check_host_code("SOURCE = 'k'\ndef helper(module):\n    return 1\n")
    with pytest.raises(SandboxError, match="first parameter must be `module`") as info:
        check_host_code("SOURCE = 'k'\n\ndef forward(x, module):\n    return x\n")
    assert info.value.lineno == 3


def test_syntax_error_is_sandbox_error() -> None:
    with pytest.raises(SandboxError, match="syntax error"):
        check_host_code("def forward(module:\n")


def test_runtime_proxy_hides_torch_namespace() -> None:
    ns = build_namespace(None)
    assert set(ns) == {"__builtins__", "torch", "F", "math", "lib"}
    for name in ("load", "save", "_C", "ops", "utils", "hub", "library", "cuda", "compile", "jit",
                 "from_file", "Tensor"):
        assert not hasattr(ns["torch"], name), name
    assert not hasattr(ns["F"], "dropout")
    assert not hasattr(ns["math"], "system") and ns["math"].sqrt is math.sqrt
    assert ns["F"].linear is torch.nn.functional.linear
    assert build_namespace(None, zeroed=False)["torch"].empty is torch.empty  # the package's own: plain
    assert not ns["torch"].empty(1000).any()  # any other host code: zeroed (no state from an earlier call)
    assert "open" not in ns["__builtins__"] and "__import__" not in ns["__builtins__"]


def test_runtime_namespace_blocks_what_the_check_would_miss() -> None:
    ns = build_namespace(None)
    code = "def f():\n    return torch.load\n"
    exec(compile(code, "<t>", "exec"), ns)  # bypasses the check on purpose
    with pytest.raises(AttributeError):
        ns["f"]()
    exec(compile("def g():\n    return open\n", "<t>", "exec"), ns)
    with pytest.raises(NameError):
        ns["g"]()


def test_proof_allocations_look_like_stale_memory_never_poison() -> None:
    """Outside a proof call: noise of the dtype (never NaN, never the dtype's maximum); production: plain torch."""
    torch_p = build_namespace(None, proof=True)["torch"]
    x = torch.randn(2, 5, dtype=torch.float16)
    e = torch_p.empty_like(x)
    assert e.dtype == torch.float16 and e.shape == x.shape and torch.isfinite(e).all() and e.abs().sum() > 0
    assert torch.isfinite(torch_p.empty_strided((2, 2), (2, 1))).all()
    i = torch_p.empty(64, dtype=torch.int32)
    assert not (i == torch.iinfo(torch.int32).max).any() and len(set(i.tolist())) > 1
    assert torch.isfinite(torch_p.empty(2, requires_grad=True)).all()
    assert torch.equal(torch_p.zeros(3), torch.zeros(3)) and torch.equal(torch_p.arange(4), torch.arange(4))
    assert build_namespace(None, zeroed=False)["torch"].empty is torch.empty
    assert build_namespace(None, poison=True)["torch"].empty is not torch.empty  # the former name still works


def test_proof_call_fences_every_allocation_with_storage_offset_zero() -> None:
    from metal_accel.proof.trial_buffers import GUARD_BYTES, guard_of, proof_call
    torch_p = build_namespace(None, proof=True)["torch"]
    for fill in ("plain", "noise", "leftover"):
        with proof_call(fill, [torch.full((5,), 7.0)]) as bufs:
            e, z = torch_p.empty(3, 4), torch_p.zeros(2, 3)
        assert e.storage_offset() == 0 and e.untyped_storage().nbytes() == 48 and guard_of(e) is not None
        assert torch.equal(z, torch.zeros(2, 3)) and guard_of(z) is not None
        if fill == "leftover":
            assert (e == 7.0).all()
        assert bufs.violations([e, z]) == ""
        base = guard_of(e).base  # the bytes around e, as a kernel writing out of bounds reaches them
        base[GUARD_BYTES + 48 + 5] += 1  # in the second float past the end
        assert bufs.violations([z, e]) == "wrote outside its output buffer (2 elements after the end of output 1)"
        base[GUARD_BYTES + 48 + 5] -= 1
        base[GUARD_BYTES - 1] += 1
        assert bufs.violations([e]) == "wrote outside its output buffer (1 element before the start of output 0)"


def test_load_forward_proof_reaches_host_code() -> None:
    from metal_accel.proof.trial_buffers import guard_of, proof_call
    code = "SOURCE = ''\ndef forward(module, x):\n    return torch.empty_like(x)\n"
    with proof_call("noise"):
        out = load_forward(code, None, proof=True)(None, torch.zeros(300))
    assert guard_of(out) is not None and (out != 0).sum() > 250
    assert guard_of(load_forward(code, None)(None, torch.zeros(3))) is None


def test_load_forward_rejects_before_running() -> None:
    with pytest.raises(SandboxError, match="import"):
        load_forward("import os\nSOURCE = ''\ndef forward(module):\n    return 1\n", None)


NUMBERED = textwrap.dedent('''
    def forward(module, x):
        y = F.linear(x, module.layers[0].weight)
        for i in range(1, 2):
            y = y * module.layers[i].scale
        return y + module.layers[2][1].bias
''')


class _Scale(torch.nn.Module):
    def __init__(self, s: float) -> None:
        super().__init__()
        self.scale = s


def _numbered() -> torch.nn.Module:
    m = torch.nn.Module()
    m.layers = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), _Scale(2.0),
                                   torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(4, 4)))
    return m.eval()


def test_numbered_children_reachable_by_index() -> None:
    from metal_accel.runtime.ops import ModuleLayout
    module = _numbered()
    layout = ModuleLayout(module)
    fwd = load_forward(NUMBERED, _Lib())
    x = torch.randn(3, 4)
    expect = module.layers[0](x) * 2.0 + module.layers[2][1].bias
    torch.testing.assert_close(fwd(layout.view(layout.gather()), x), expect)


@pytest.mark.parametrize("body, construct", [
    ("y = module.layers[0]._parameters", "private attribute"),
    ("y = module.layers[0].__dict__", "dunder attribute"),
    ("y = module.layers[-1].weight", "weight is not an allowed tensor attribute"),
    ("y = module.layers['0'].weight", "weight is not an allowed tensor attribute"),
    ("y = module.layers[j].weight", "undefined name"),
])
def test_numbered_children_checked_like_attributes(body: str, construct: str) -> None:
    _rejects(body, construct, 1)


def test_numbered_child_index_must_name_a_child_at_run_time() -> None:
    from metal_accel.runtime.ops import ModuleLayout
    layout = ModuleLayout(_numbered())
    view = layout.view(layout.gather())
    for bad in (3, "0", 1.0, -1):
        with pytest.raises(IndexError):
            view.layers[bad]
    with pytest.raises(IndexError):
        view.layers[0][0]  # a Linear has no numbered children
    assert len(view.layers) == 3 and len(view.layers[2]) == 2 and len(view.layers[0]) == 0


_INPLACE_HEAD = "SOURCE = ''\ndef forward(module, x, dim=1):\n    "


@pytest.mark.parametrize("body", [
    "w = module.scale\n    w.mul_(1.0001)\n    return x", "x.add_(0)\n    return x", "x += 0\n    return x",
    "y = x\n    y += 1\n    return y", "y = x.contiguous()\n    y.clamp_(0)\n    return y", "x[0] = 1.0\n    return x",
    "y = x.view(-1)\n    y[0] = 1.0\n    return x", "torch.clamp(x, 0, 1, out=x)\n    return x",
    "return F.relu(x, inplace=True)", "for t in (x, module.scale):\n        t.zero_()\n    return x",
    "y = max(x, module.scale)\n    y.zero_()\n    return x", "y = x.T\n    y.fill_(0)\n    return x",
    "dim += 1\n    return x", "return x.new_empty(3)",
])
def test_in_place_updates_of_what_the_function_did_not_make_are_rejected(body):
    with pytest.raises(SandboxError):
        check_host_code(_INPLACE_HEAD + body + "\n")


@pytest.mark.parametrize("body", [
    "out = torch.empty_like(x)\n    out.fill_(0)\n    out[0] = 1.0\n    out += 1\n    return out",
    "out = torch.zeros(3)\n    out.narrow(0, 0, 1).copy_(x[:1])\n    return out",
    "y = x * 2\n    y += 1\n    y.clamp_(0)\n    return y", "y = module.scale * x\n    y.add_(1)\n    return y",
    "n = x.shape[-1]\n    n //= 2\n    k = 1\n    for s in x.shape:\n        k *= s\n    return x[:n]",
    "y = x.clone()\n    y.mul_(2)\n    return y", "t = F.linear(x, module.scale)\n    t.add_(F.relu(x))\n    return t",
    "o = torch.empty_like(x)\n    torch.clamp(x, 0, 1, out=o)\n    return o",
    "y = torch.matmul(x, x)\n    return F.relu(y, inplace=True)",
])
def test_in_place_updates_of_tensors_the_function_made_are_allowed(body):
    check_host_code(_INPLACE_HEAD + body + "\n")
