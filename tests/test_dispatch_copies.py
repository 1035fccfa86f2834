"""Optimized modules copied, pickled and moved: a copy runs on its own weights, a saved model loads as plain eager,
and weights that changed dtype or device since the proof run eager (fast tier: the "kernels" are torch code)."""
from __future__ import annotations

import copy
import io
import itertools
import pickle

import torch
from torch import nn

from metal_accel.auto import hook
from metal_accel.core.specs import InputSpec, OutputSpec, call_signature
from metal_accel.report import OptimizeReport
from metal_accel.runtime.dispatch import dispatcher_of, install
from metal_accel.runtime.ops import KernelOp, ModuleLayout

_names = itertools.count()


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8))
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x * self.weight)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(x) + 1


class Calls:
    """A stand-in kernel (torch code on the weights it is handed), counting its calls: `host` is a plain function,
    as the host code of a real kernel is (copies share it)."""

    def __init__(self) -> None:
        self.n = 0

        def host(module, x):
            self.n += 1
            return x * module.weight
        self.host = host


def kernel_op(module: nn.Module, x: torch.Tensor, host) -> KernelOp:
    with torch.no_grad():
        out = module(x)
    return KernelOp(f"test_copy_{next(_names)}", host, InputSpec.of((x,), {}), OutputSpec.of(out),
                    ModuleLayout(module), "cpu")


class BoundOp:
    """An op bound to one module instance, as a torch.compile of it or a CUDA graph of its tensors is."""

    def __init__(self, module: nn.Module) -> None:
        self.name, self.module, self.n = "bound", module, 0

    def __call__(self, args, kwargs, state):
        self.n += 1
        return args[0] * self.module.weight


def optimized() -> tuple[Model, torch.Tensor, Calls]:
    model, x, host = Model().eval(), torch.randn(4, 8), Calls()
    install(model.scale, call_signature((x,), {}), kernel_op(model.scale, x, host.host))
    return model, x, host


def test_a_deep_copy_runs_its_kernels_on_its_own_weights():
    model, x, host = optimized()
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.scale.weight.mul_(3)
        out = twin(x)
    assert dispatcher_of(twin.scale) is not dispatcher_of(model.scale) and dispatcher_of(twin.scale).table
    torch.testing.assert_close(out, x * model.scale.weight * 3 + 1)
    assert host.n == 1  # the copy's kernel ran (host code is shared; the weights are the copy's)


def test_a_deep_copy_leaves_ops_bound_to_the_original_behind():
    model, x = Model().eval(), torch.randn(4, 8)
    sig = call_signature((x,), {})
    op = BoundOp(model.scale)
    install(model.scale, sig, op)
    install(model, ("never",), BoundOp(model.scale))
    dispatcher_of(model).fallback = lambda args, kwargs, state: torch.zeros(1)  # the whole model, compiled
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.scale.weight.mul_(3)
        out = twin(x)
    torch.testing.assert_close(out, x * model.scale.weight * 3 + 1)  # eager, on the copy's weights
    assert op.n == 0 and not dispatcher_of(twin.scale).table and dispatcher_of(twin).fallback is None
    with torch.no_grad():
        assert model(x).shape == (1,)  # the original keeps its own


def test_a_deep_copy_in_training_mode_runs_eager():
    model, x, host = optimized()
    twin = copy.deepcopy(model).train()
    with torch.no_grad():
        out = twin(x)
    assert host.n == 0 and (out == 1).sum() > 0  # dropout ran: eager's training-mode forward


def test_a_saved_model_loads_as_its_eager_self_without_metal_accel_objects():
    model, x, host = optimized()
    object.__setattr__(model, "_metal_accel_report", OptimizeReport("cpu", "cpu"))
    data = pickle.dumps(model)
    assert b"metal_accel." not in data  # no object of the library: loads where it is not installed
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert dispatcher_of(loaded.scale) is None and loaded.__dict__.get("_metal_accel_report") is None
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    assert host.n == 1  # only the original's call


def test_a_report_survives_a_deep_copy():
    report = OptimizeReport("cpu", "cpu", notes=["kept"])
    assert copy.deepcopy(report).notes == ["kept"]


def test_weights_moved_to_another_dtype_run_eager():
    model, x, host = optimized()
    model.double()
    with torch.no_grad():
        out = model(x.double())
        assert out.dtype == torch.float64
        # same input signature, weights of another dtype: the kernel was proven for float32 weights
        model.float().scale.weight.data = model.scale.weight.data.double()
        model.scale(x)
    assert host.n == 0


def test_an_auto_dispatcher_is_not_copied_nor_pickled():
    module, x = Scale().eval(), torch.randn(4, 8)
    disp = hook._auto_dispatcher(module, type(module).forward)
    disp.resolver = lambda args, kwargs: None
    twin = copy.deepcopy(module)
    assert twin.__dict__[hook._AUTO_ATTR] is None
    for _ in range(40):  # the original settles: its own forward goes back on it, the copy is untouched
        disp.run_checked((x,), {})
    assert "forward" in module.__dict__ and "forward" not in twin.__dict__
    assert hook._AUTO_ATTR in module.__dict__ and pickle.loads(pickle.dumps(module)).__dict__[hook._AUTO_ATTR] is None



class Counted(nn.Module):
    """An integer buffer is its first state tensor: `model.double()` leaves it as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(1, dtype=torch.long))
        self.inner = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_the_dtype_watched_is_a_floating_tensors():
    module, x, host = Counted().eval(), torch.randn(4, 8), Calls()
    assert ModuleLayout(module).tensor_slots[0] == ("", "steps")
    install(module, call_signature((x,), {}), kernel_op(module, x, lambda m, x: host.host(m.inner, x)))
    with torch.no_grad():
        module(x)
        assert host.n == 1
        module.double()
        assert module(x).dtype == torch.float64  # eager: float32 input, float64 weights
    assert host.n == 1 and module.steps.dtype == torch.long


def _renamed(self, x):
    return x * self.weight


class Renamed(nn.Module):
    """Its forward is a function of another name."""

    forward = _renamed

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8))


def test_a_forward_of_another_name_loads_too():
    module, x, host = Renamed().eval(), torch.randn(4, 8), Calls()
    install(module, call_signature((x,), {}), kernel_op(module, x, host.host))
    loaded = pickle.loads(pickle.dumps(module))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), x * module.weight)
