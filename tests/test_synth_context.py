"""The right context in a prompt (issue 30, deliver 3): references by what a module computes, never by
class name; inductor's code trimmed to its kernels and the function calling them; eager time measured;
eval mode, tolerances, special inputs and device facts."""
from __future__ import annotations

import os

import torch
from torch import nn

from metal_accel.core.keys import class_path, entry_key, module_fingerprint
from metal_accel.core.provider import SynthesisRequest
from metal_accel.core.specs import InputSpec, OutputSpec
from metal_accel.kernelbench.problems import Problem
from metal_accel.synth import prompts
from metal_accel.synth.facts import device_facts, op_multiset, proof_facts, signature, trim_inductor
from metal_accel.synth.loop import SynthesisLoop
from metal_accel.synth.memo import AnswerCache, stored_signature
from metal_accel.synth.settings import SynthSettings

from test_synth_prompts import _store

RELU = """import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0
def get_inputs():
    return [torch.randn(8, 64)]
def get_init_inputs():
    return []
"""
SOFTMAX = RELU.replace("torch.relu(x) * 2.0", "torch.softmax(x, dim=-1)")
RELU_AGAIN = RELU.replace("torch.relu(x) * 2.0", "(torch.relu(x)) * 2.0  # written another way")


def problem(code: str, name: str) -> tuple[nn.Module, SynthesisRequest]:
    model, inputs = Problem(name, code, f"{name}.py").instantiate("cpu")
    with torch.no_grad():
        out = model(*inputs)
    req = SynthesisRequest(model, class_path(type(model)), "Model", module_fingerprint(model),
                           InputSpec.of(tuple(inputs), {}), OutputSpec.of(out), "cpu", "c++", eager_us=552152.0)
    return model, req


def loop(**kw) -> SynthesisLoop:
    return SynthesisLoop(["openai:gpt-4o"], SynthSettings(progress=False, **kw), client_factory=lambda m, s: None)


def test_an_unrelated_model_is_never_a_reference_and_the_same_computation_is():
    relu, relu_req = problem(RELU, "relu")
    _store(relu, relu_req.input_spec, "cpu", "c++", relu_req.output_spec)
    key = entry_key(relu_req.fingerprint, relu_req.input_spec, "cpu")
    loop(profile=False).prompt_for(relu_req, AnswerCache("cpu", key))  # synthesizing it saved its signature
    assert stored_signature("cpu", key)

    _, softmax_req = problem(SOFTMAX, "softmax")  # also a class named Model, another computation
    text = loop(profile=False).prompt_for(softmax_req).user
    assert "Reference kernels" not in text

    _, again_req = problem(RELU_AGAIN, "relu_again")  # another source, the same ops
    assert again_req.fingerprint != relu_req.fingerprint
    text = loop(profile=False).prompt_for(again_req).user
    assert "## Reference kernels" in text and "a cached module that runs the same ops" in text


def test_signatures_follow_the_ops_not_the_sizes():
    a = nn.Sequential(nn.Linear(8, 16), nn.GELU()).eval()
    b = nn.Sequential(nn.Linear(32, 4), nn.GELU()).eval()
    c = nn.Sequential(nn.Linear(8, 16), nn.ReLU()).eval()
    sa, sb, sc = (InputSpec.of((torch.randn(4, n),), {}) for n in (8, 32, 8))
    ops = op_multiset(a, sa, "cpu")
    assert any("linear" in k or "addmm" in k for k in ops) and any("gelu" in k for k in ops)
    assert signature(ops, sa) == signature(op_multiset(b, sb, "cpu"), sb)
    assert signature(ops, sa) != signature(op_multiset(c, sc, "cpu"), sc)
    assert signature({}, sa) == ""


INDUCTOR = '''# AOT ID: ['0_inference']
from ctypes import c_void_p, c_long, c_int
import torch
from torch._inductor.async_compile import AsyncCompile
aten = torch.ops.aten
''' + "\n".join(f"empty_strided_{i} = torch._C._dynamo.guards._empty_strided_{i}" for i in range(600)) + '''
async_compile = AsyncCompile()

cpp_fused_gelu_native_layer_norm_0 = async_compile.cpp_pybinding(['float*', 'const float*'], r\'\'\'
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(float* in_out_ptr0, const float* in_ptr0)
{
    in_out_ptr0[0] = in_ptr0[0];
}
\'\'\')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def call(self, args):
        arg0_1, arg1_1 = args
        args.clear()
        assert_size_stride(arg1_1, (16, ), (1, ), 'input')
        buf0 = empty_strided_cpu((4, 16), (16, 1), torch.float32)
        extern_kernels.addmm(arg1_1, arg0_1, arg0_1, alpha=1, beta=1, out=buf0)
        del arg0_1
        cpp_fused_gelu_native_layer_norm_0(buf0, arg1_1)
        return (buf0, )

runner = Runner(partitions=[])
call = runner.call


def get_args():
    from torch._dynamo.testing import rand_strided
    return []
'''


def test_inductor_code_is_trimmed_to_the_kernels_and_their_caller():
    assert len(INDUCTOR) > prompts.MAX_COMPILED_CODE  # cut at the start, the caller would be lost
    text = trim_inductor(INDUCTOR)
    assert 'extern "C"  void  kernel(float* in_out_ptr0' in text and "cpp_fused_gelu_native_layer_norm_0(buf0" in text
    assert "extern_kernels.addmm" in text and "def call(self, args):" in text
    assert "import" not in text and "empty_strided_599" not in text and "get_args" not in text
    assert "assert_size_stride" not in text and "del arg0_1" not in text
    _, req = problem(RELU, "relu")
    req.compile_us, req.compiled_code = 10.0, INDUCTOR
    prompt = prompts.task_prompt(req, device="cpu")
    assert "def call(self, args):" in prompt and "empty_strided_599" not in prompt


def test_eager_time_is_measured_not_one_capture_sample():
    _, req = problem(RELU, "relu")
    text = loop(profile=True, references=False).prompt_for(req).user
    eager = float(text.split("## Eager time\n")[1].split(" µs")[0])
    assert eager < 552152.0 / 10 and "median of" in text  # the capture outlier is gone
    _, req = problem(RELU, "relu")
    req.eager_us, req.eager_benchmarked = 123.4, True  # the benchmark's (the torch.compile candidate's) stays
    assert "123.4 µs per call (the benchmark's median)" in loop(profile=True, references=False).prompt_for(req).user


def test_mode_tolerances_special_inputs_and_device_facts_are_in_the_prompt():
    model, req = problem(RELU, "relu")
    text = loop(profile=False, references=False).prompt_for(req).user
    assert "eval mode" in text and "1e-05·mean|ref|" in text and "NaN" in text and "structured" in text
    assert f"{os.cpu_count()} logical cores" in text
    model.train()
    assert "training mode" in proof_facts(model, req.input_spec, [torch.float32])
    assert "cores" in device_facts("cpu")
