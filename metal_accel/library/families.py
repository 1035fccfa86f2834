"""The computations the shipped kernel library serves, each with a reference written here in torch.

A family is one computation with one host-function signature, `family(*inputs, *arguments)` (inputs: the call's
tensor arguments, usually x alone; a fused residual add takes x and residual): the kernel files
(library/kernels/<backend>/<family>.py) implement it, and a module belongs to it when some binding of its
tensors and attributes to the arguments makes the reference trace to the same ATen computation as the
module's own forward (library/match.py). Bindings are proposed from the module's tensors by shape (which
2-D weight is the down projection), and from its plain float attributes (which one is eps): a few
candidates each, every one checked by tracing, so nothing is matched by a class or attribute name.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..core.keys import module_config

# one argument of the host function after x: ("tensor", path) | ("attr", path) | ("literal", value)
Arg = tuple[str, Any]


@dataclass(frozen=True)
class Family:
    name: str
    summary: str
    reference: Callable[..., torch.Tensor]            # reference(*inputs, *arguments), plain torch
    bindings: Callable[[nn.Module, dict[str, torch.Tensor]], Iterator[tuple[Arg, ...]]]
    # the first PREPARED arguments are constants of the module: the kernel file's `<name>_prepare(*them)` turns
    # them into derived tensors once per module state (the candidate's prepare(), core/candidate.py), and the
    # host function gets that tuple in their place
    prepared: int = 0
    # the generated candidate's SHAPE_GENERIC: "rows" (any leading dimensions of x) or True (any batch size)
    shape_generic: Any = "rows"
    inputs: tuple[str, ...] = ("x",)                  # the call's positional tensor arguments, in order


def module_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of MODULE by its dotted path (what a binding names)."""
    out: dict[str, torch.Tensor] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        for store in (sub._parameters, sub._buffers):
            for name, t in store.items():
                if t is not None:
                    out.setdefault(f"{path}.{name}" if path else name, t)
    return out


def _float_attrs(module: nn.Module) -> list[str]:
    return [k for k, v in module_config(module).items() if type(v) is float]


def attribute(module: nn.Module, path: str) -> Any:
    """The plain attribute at dotted PATH ("eps", "1.eps": a submodule's), as module_config gives it."""
    owner, _, name = path.rpartition(".")
    return module_config(module.get_submodule(owner))[name]


def _float_attrs_deep(module: nn.Module) -> list[str]:
    """Every plain float attribute of MODULE and its submodules by dotted path (a child norm's eps)."""
    return [f"{path}.{k}" if path else k for path, sub in module.named_modules(remove_duplicate=False)
            for k in _float_attrs(sub)]


# -- references (the semantics each kernel must reproduce; docs/library.md states them too) ----------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (weight.shape[0],), weight, bias, eps)


def linear_add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                          ln_weight: torch.Tensor, ln_bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(F.linear(x, weight, bias) + residual, (ln_weight.shape[0],), ln_weight, ln_bias, eps)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "gelu": F.gelu,
    "gelu_new": gelu_tanh,  # the tanh approximation written out (T5's gated-gelu): same math, eager's own ops
    "relu": F.relu,
}


def gated_mlp(x: torch.Tensor, gate_weight: torch.Tensor, up_weight: torch.Tensor, down_weight: torch.Tensor,
              act: str) -> torch.Tensor:
    return F.linear(ACTIVATIONS[act](F.linear(x, gate_weight)) * F.linear(x, up_weight), down_weight)


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


def gpt2_mlp(x: torch.Tensor, fc_weight: torch.Tensor, fc_bias: torch.Tensor, proj_weight: torch.Tensor,
             proj_bias: torch.Tensor) -> torch.Tensor:
    h = torch.addmm(fc_bias, x.view(-1, x.shape[-1]), fc_weight).view(*x.shape[:-1], -1)
    h = gelu_tanh(h)
    return torch.addmm(proj_bias, h.view(-1, h.shape[-1]), proj_weight).view(*x.shape[:-1], -1)


def mlp(x: torch.Tensor, fc1_weight: torch.Tensor, fc1_bias: torch.Tensor, fc2_weight: torch.Tensor,
        fc2_bias: torch.Tensor, act: str) -> torch.Tensor:
    return F.linear(ACTIVATIONS[act](F.linear(x, fc1_weight, fc1_bias)), fc2_weight, fc2_bias)


CONV_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # the most common first (one trace each)
    "relu_": lambda t: F.relu(t, inplace=True),
    "hardswish_": lambda t: F.hardswish(t, inplace=True),
    "none": lambda t: t,
    "silu_": lambda t: F.silu(t, inplace=True),
    "relu6_": lambda t: F.hardtanh(t, 0.0, 6.0, inplace=True),
    "relu": F.relu,
    "hardswish": F.hardswish,
    "silu": F.silu,
    "relu6": lambda t: F.hardtanh(t, 0.0, 6.0),
}


def conv_bn_act(x: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, bn_weight: torch.Tensor,
                bn_bias: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor, eps: float,
                stride: Any, padding: Any, dilation: Any, groups: int, act: str, momentum: float) -> torch.Tensor:
    """Conv2d, BatchNorm2d on its running statistics (eval mode: MOMENTUM only appears in the call), activation
    (a name of CONV_ACTIVATIONS; a trailing _ runs it in place, as torchvision's inplace=True does)."""
    h = F.conv2d(x, conv_weight, conv_bias, stride, padding, dilation, groups)
    h = F.batch_norm(h, running_mean, running_var, bn_weight, bn_bias, False, momentum, eps)
    return CONV_ACTIVATIONS[act](h)


# -- bindings -----------------------------------------------------------------------------------------------

def _rms_norm_bindings(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    if len(tensors) != 1:
        return
    (path, weight), = tensors.items()
    if weight.dim() != 1:
        return
    for attr in _float_attrs(module):
        yield ("tensor", path), ("attr", attr)


def _layer_norm_bindings(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    if len(tensors) != 2 or any(t.dim() != 1 for t in tensors.values()):
        return
    a, b = tensors
    if tensors[a].shape != tensors[b].shape:
        return
    for eps in _float_attrs_deep(module):
        for weight, bias in ((a, b), (b, a)):
            yield ("tensor", weight), ("tensor", bias), ("attr", eps)


def _linear_add_layer_norm_bindings(module: nn.Module,
                                    tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    mats = [p for p, t in tensors.items() if t.dim() == 2]
    vecs = [p for p, t in tensors.items() if t.dim() == 1]
    if len(tensors) != 4 or len(mats) != 1 or len(vecs) != 3:
        return
    w = mats[0]
    out = tensors[w].shape[0]
    if any(tensors[v].shape[0] != out for v in vecs):
        return
    for eps in _float_attrs_deep(module):
        for b, lw, lb in itertools.permutations(vecs):
            yield ("tensor", w), ("tensor", b), ("tensor", lw), ("tensor", lb), ("attr", eps)


def _gated_mlp_bindings(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    if len(tensors) != 3 or any(t.dim() != 2 for t in tensors.values()):
        return
    for gate, up, down in itertools.permutations(tensors):
        g, u, d = tensors[gate], tensors[up], tensors[down]
        if g.shape != u.shape or d.shape != (g.shape[1], g.shape[0]):
            continue
        for act in ACTIVATIONS:
            yield ("tensor", gate), ("tensor", up), ("tensor", down), ("literal", act)


def _gelu_tanh_bindings(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    if not tensors:
        yield ()


def _linear_gelu_bindings(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    if len(tensors) != 2:
        return
    by_dim = {t.dim(): p for p, t in tensors.items()}
    if set(by_dim) != {1, 2} or tensors[by_dim[2]].shape[0] != tensors[by_dim[1]].shape[0]:
        return
    for approximate in ("none", "tanh"):
        yield ("tensor", by_dim[2]), ("tensor", by_dim[1]), ("literal", approximate)


def _gpt2_mlp_bindings(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    if len(tensors) != 4:
        return
    mats = [p for p, t in tensors.items() if t.dim() == 2]
    vecs = [p for p, t in tensors.items() if t.dim() == 1]
    if len(mats) != 2 or len(vecs) != 2:
        return
    for fc_w, proj_w in itertools.permutations(mats):
        for fc_b, proj_b in itertools.permutations(vecs):
            a, b = tensors[fc_w], tensors[proj_w]
            if a.shape[1] == b.shape[0] and tensors[fc_b].shape[0] == a.shape[1] \
                    and tensors[proj_b].shape[0] == b.shape[1]:
                yield ("tensor", fc_w), ("tensor", fc_b), ("tensor", proj_w), ("tensor", proj_b)


def _mlp_bindings(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    mats = [p for p, t in tensors.items() if t.dim() == 2]
    vecs = [p for p, t in tensors.items() if t.dim() == 1]
    if len(tensors) != 4 or len(mats) != 2 or len(vecs) != 2:
        return
    for w1, w2 in itertools.permutations(mats):
        for b1, b2 in itertools.permutations(vecs):
            a, b = tensors[w1], tensors[w2]
            if a.shape == (b.shape[1], b.shape[0]) and tensors[b1].shape[0] == a.shape[0] \
                    and tensors[b2].shape[0] == b.shape[0]:
                for act in ACTIVATIONS:
                    yield ("tensor", w1), ("tensor", b1), ("tensor", w2), ("tensor", b2), ("literal", act)


def _conv_bn_act_bindings(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[Arg, ...]]:
    """The one 4-D tensor is the conv weight; its submodule may hold a 1-D bias of out_channels; one other
    submodule holds the norm: two 1-D parameters (weight, bias in either order) and two 1-D float buffers (the
    running statistics, in either order) of out_channels, besides a 0-D counter. eps and momentum are the norm
    submodule's floats in either role (momentum None is eager's 0.0); the conv's geometry is read from its
    submodule as nn.Conv2d names it. Every proposal is only kept when the traces agree."""
    weights = [p for p, t in tensors.items() if t.dim() == 4]
    if len(weights) != 1 or not tensors[weights[0]].is_floating_point():
        return
    conv_path = weights[0].rpartition(".")[0]
    out_channels = tensors[weights[0]].shape[0]
    rest = {p: t for p, t in tensors.items() if p != weights[0] and t.dim() > 0}
    if any(t.dim() != 1 or t.shape[0] != out_channels for t in rest.values()):
        return
    conv_bias = [p for p in rest if p.rpartition(".")[0] == conv_path]
    norm_paths = {p.rpartition(".")[0] for p in rest if p not in conv_bias}
    if len(conv_bias) > 1 or len(norm_paths) != 1:
        return
    norm_path = norm_paths.pop()
    norm = module.get_submodule(norm_path)
    prefix = f"{norm_path}." if norm_path else ""
    params = [prefix + n for n, t in norm._parameters.items() if t is not None]
    stats = [prefix + n for n, t in norm._buffers.items() if t is not None and t.dim() == 1]
    if len(params) != 2 or len(stats) != 2 or len(params) + len(stats) + len(conv_bias) != len(rest):
        return
    conv = module.get_submodule(conv_path)
    geometry = module_config(conv)
    if not all(k in geometry for k in ("stride", "padding", "dilation", "groups")):
        return
    at = f"{conv_path}." if conv_path else ""
    floats = [prefix + k for k in _float_attrs(norm)]
    momentum_none = module_config(norm).get("momentum", 0) is None
    bias: Arg = ("tensor", conv_bias[0]) if conv_bias else ("literal", None)
    for act in CONV_ACTIVATIONS:
        for eps in floats:
            momenta: list[Arg] = [("attr", f) for f in floats if f != eps] + ([("literal", 0.0)] if momentum_none else [])
            for momentum in momenta:
                for w, b in itertools.permutations(params):
                    for mean, var in itertools.permutations(stats):
                        yield (("tensor", weights[0]), bias, ("tensor", w), ("tensor", b), ("tensor", mean),
                               ("tensor", var), ("attr", eps), ("attr", at + "stride"), ("attr", at + "padding"),
                               ("attr", at + "dilation"), ("attr", at + "groups"), ("literal", act), momentum)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("rms_norm", "RMSNorm computed in float32, weight applied in the input's dtype (Llama, Qwen2, Mistral)",
           rms_norm, _rms_norm_bindings),
    Family("layer_norm", "LayerNorm over the last dim with weight and bias, as nn.LayerNorm (BERT, GPT-2, ViT)",
           layer_norm, _layer_norm_bindings),
    Family("linear_add_layer_norm", "LayerNorm(Linear(x) + residual): the GEMM in torch, add + LayerNorm fused "
           "(BERT's and RoBERTa's SelfOutput and Output)", linear_add_layer_norm, _linear_add_layer_norm_bindings,
           inputs=("x", "residual")),
    Family("gated_mlp", "down(act(gate(x)) * up(x)) without biases, act SiLU or GELU (Llama, Qwen2, Mistral MLPs; T5 gated-gelu)",
           gated_mlp, _gated_mlp_bindings),
    Family("gelu_tanh", "GELU, tanh approximation written out (GPT-2's NewGELUActivation)", gelu_tanh,
           _gelu_tanh_bindings),
    Family("gpt2_mlp", "GEMM + bias, GELU (tanh), GEMM + bias with [in, out] weights (GPT-2's MLP)", gpt2_mlp,
           _gpt2_mlp_bindings),
    Family("mlp", "Linear, activation (GELU, tanh GELU, ReLU, SiLU), Linear, with biases (ViT, CLIP, timm Mlp)",
           mlp, _mlp_bindings),
    Family("linear_gelu", "Linear then GELU (BERT's and ViT's intermediate layers)", linear_gelu,
           _linear_gelu_bindings),
    Family("conv_bn_act", "Conv2d, eval-mode BatchNorm2d, activation (ReLU, ReLU6, Hardswish, SiLU or none): "
           "torchvision's Conv2dNormActivation (MobileNetV3, EfficientNet, RegNet)", conv_bn_act,
           _conv_bn_act_bindings, prepared=7, shape_generic=True),
)}
