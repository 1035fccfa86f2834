"""What host code may name: the whitelists the sandbox checks against and exposes.

One table per kind of name (torch and math functions, tensor methods and attributes, builtins),
plus the names host code may never use or rebind. `sandbox_check` enforces them on the AST,
`sandbox` builds the namespace from them, and the synthesis prompts quote them.
"""
from __future__ import annotations

import builtins
from typing import Any

_CREATION = ("empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
             "full", "full_like", "arange")
_TORCH_MATH = ("matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "cat", "stack", "where", "exp",
               "tanh", "sigmoid", "softmax", "sum", "mean", "amax", "maximum", "minimum", "clamp",
               "transpose", "permute", "reshape", "flatten", "narrow", "split", "chunk",
               "conv1d", "conv2d", "conv3d")
_DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8",
           "bool", "float", "half", "long", "int")
_FUNCTIONAL = ("linear", "relu", "gelu", "silu", "softmax", "scaled_dot_product_attention", "pad",
               "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool2d",
               "embedding", "group_norm", "layer_norm", "batch_norm", "conv1d", "conv2d", "conv3d",
               "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")

_MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")

TORCH_ALLOWED: frozenset[str] = frozenset(
    [f"torch.{n}" for n in _CREATION + _TORCH_MATH + _DTYPES + _MEMORY_FORMATS + ("Size",)]
    + [f"torch.nn.functional.{n}" for n in _FUNCTIONAL])

MATH_ALLOWED: frozenset[str] = frozenset(
    f"math.{n}" for n in ("sqrt", "exp", "log", "log2", "ceil", "floor", "prod", "gcd", "isqrt",
                          "pi", "e", "inf", "tanh", "erf", "cos", "sin", "pow"))

# no new_empty/new_zeros/...: allocations go through torch.*, which a proof fences and fills (trial_buffers.py);
# in-place methods (names ending in _) only on tensors the function made (sandbox_inplace.py)
TENSOR_METHODS: frozenset[str] = frozenset((
    "contiguous", "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t",
    "unsqueeze", "squeeze", "flatten", "unflatten", "expand", "expand_as", "narrow", "select",
    "split", "chunk", "unbind", "size", "stride", "dim", "numel", "element_size", "is_contiguous",
    "storage_offset", "clone", "to", "float", "half", "bfloat16", "double", "int", "long", "bool",
    "type_as", "fill_", "zero_", "copy_", "add",
    "sub", "mul", "div", "add_", "mul_", "matmul", "mm", "bmm", "sum", "mean", "amax", "amin",
    "max", "min", "exp", "neg", "sqrt", "rsqrt", "abs", "clamp", "clamp_", "softmax", "masked_fill",
    "index_select", "gather", "repeat", "item", "tolist",
    # harmless extras common in LLM host code
    "sigmoid", "tanh", "relu", "pow", "is_floating_point",
))

TENSOR_ATTRS: frozenset[str] = frozenset(("shape", "dtype", "device", "ndim", "T", "mT", "itemsize"))

BUILTINS_ALLOWED: dict[str, Any] = {n: getattr(builtins, n) for n in (
    "range", "len", "min", "max", "abs", "int", "float", "bool", "tuple", "list", "enumerate", "zip",
    "sum", "divmod", "round")}

FORBIDDEN_NAMES: frozenset[str] = frozenset((
    "exec", "eval", "compile", "open", "getattr", "setattr", "delattr", "globals", "locals", "vars",
    "__import__", "input", "breakpoint", "type", "object", "super", "print", "isinstance"))

GLOBAL_ROOTS = ("torch", "F", "math", "lib")  # the globals host code reaches only through an attribute
