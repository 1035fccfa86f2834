"""Which candidates are the package's own (library/trusted.py, native_policy.runs_in_process): decided from the
candidate's code against what the library proposes for the call, never from a kernel source alone nor from an
origin a cache entry states."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from metal_accel.backends import get_backend
from metal_accel.core.candidate import parse_candidate
from metal_accel.core.keys import class_path
from metal_accel.core.provider import SynthesisRequest
from metal_accel.core.specs import InputSpec, OutputSpec
from metal_accel.library.provider import LibraryProvider
from metal_accel.library.trusted import is_library_candidate
from metal_accel.runtime.native_policy import is_trusted, runs_in_process

FOREIGN_HOST = '''

def forward(module, x):
    out = torch.empty_like(x)
    lib.layer_norm_f32(x.contiguous(), module.weight, module.bias, out, x.numel() * 4)
    return out
'''


def library_candidate(module: nn.Module, x: torch.Tensor):
    spec = InputSpec.of((x,), {})
    request = SynthesisRequest(module, class_path(type(module)), type(module).__name__, "", spec,
                               OutputSpec((), True), "cpu", "cpp")
    (proposal,) = LibraryProvider().propose(request)
    return parse_candidate(proposal.text, "cpu", proposal.origin), spec


@pytest.fixture
def norm():
    return nn.LayerNorm(64).eval(), torch.randn(8, 64)


def test_the_librarys_own_candidate_for_the_call_runs_in_process(norm):
    module, x = norm
    cand, spec = library_candidate(module, x)
    assert is_library_candidate(cand, module, spec, "cpu")
    assert runs_in_process(cand, module, spec, get_backend("cpu"))


def test_a_reviewed_kernel_source_driven_by_other_host_code_runs_in_the_kernel_server(norm):
    module, x = norm
    cand, spec = library_candidate(module, x)
    head = cand.code[: cand.code.index('"""', cand.code.index('SOURCE = r"""') + 13) + 3]
    foreign = parse_candidate(head + FOREIGN_HOST, "cpu", cand.origin)  # the same origin, claimed
    assert foreign.source == cand.source and is_trusted(foreign.source)
    assert not is_library_candidate(foreign, module, spec, "cpu")
    assert not runs_in_process(foreign, module, spec, get_backend("cpu"))


def test_a_library_file_with_appended_code_is_not_the_librarys(norm):
    """A cache entry may say origin "library:<family>" and start with the library's file: what it appends (a
    second forward, a shape-generic claim) makes it someone else's kernel."""
    module, x = norm
    cand, spec = library_candidate(module, x)
    spoofed = parse_candidate(cand.code + '\n\nSHAPE_GENERIC = "rows"\n' + FOREIGN_HOST, "cpu", cand.origin)
    assert spoofed.code.startswith(cand.code[:200])
    assert not is_library_candidate(spoofed, module, spec, "cpu")


def test_the_librarys_candidate_for_another_module_is_not_trusted_for_this_one(norm):
    module, x = norm
    cand, spec = library_candidate(module, x)
    assert not is_library_candidate(cand, nn.ReLU().eval(), spec, "cpu")
    assert not is_library_candidate(cand, module, None, "cpu")
