"""The emulator's Metal built-in functions against their definitions in the MSL specification (integer
functions of section 6.2 on every width, sinpi/cospi/tanpi, fract on half and bfloat, the fill shuffles with a
modulo, thread_scope), where an earlier emulator computed silently wrong answers: integer builtins promoted narrow types
to int (addsat(uchar 200, uchar 100) was 300), subsat on unsigned saturated to the wrong end, sinpi
multiplied by a rounded pi first (sinpi(8388607) was 0.125), and an int modulo of a fill shuffle was taken
for the emulator's hidden call-site argument."""
from __future__ import annotations

import math

import pytest
import torch

from metal_accel.backends.mps_emu.backend import MpsEmuBackend

pytestmark = [pytest.mark.needs_cxx, pytest.mark.slow,
              pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")]

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"

# each line: (expression on z = 0 read at run time, so nothing folds at compile time; the expected int64)
INTEGER_CASES = [
    ("subsat(uint(z), 1u)", 0),
    ("subsat(uint2(z), uint2(1u)).x", 0),
    ("addsat(uchar(200 + z), uchar(100))", 255),
    ("addsat(char(100 + z), char(100))", 127),
    ("subsat(char(-100 + z), char(100))", -128),
    ("subsat(ushort(z), ushort(5))", 0),
    ("addsat(int(2147483000 + z), 1000)", 2147483647),
    ("subsat(ulong(z), ulong(1))", 0),
    ("rotate(uchar(0x81 + z), uchar(1))", 3),
    ("rotate(ushort(0x8001 + z), ushort(1))", 3),
    ("mulhi(ushort(0xFFFF + z), ushort(0xFFFF))", 0xFFFE),
    ("mulhi(char(-128 + z), char(127))", -64),
    ("mulhi(uint(0xFFFFFFFFu + z), 0xFFFFFFFFu)", 0xFFFFFFFE),
    ("absdiff(int(z - 2147483647 - 1), int(2147483647 + z))", 0xFFFFFFFF),
    ("absdiff(char(-128 + z), char(127))", 255),
    ("madhi(ushort(0xFFFF + z), ushort(0xFFFF), ushort(1))", 0xFFFF),
    ("madsat(int(65536 + z), 65536, 5)", 2147483647),
    ("madsat(uchar(20 + z), uchar(10), uchar(60))", 255),
    ("madsat(char(-20 + z), char(10), char(-3))", -128),
    ("madsat(char(3 + z), char(4), char(-20))", -8),
    ("sizeof(max(uchar(200 + z), uchar(100)))", 1),  # max of two uchars is a uchar
    ("sizeof(absdiff(char(z), char(1)))", 1),
]


@pytest.fixture(scope="module")
def integer_lib():
    body = "\n".join(f"  o[{i}] = long({expr});" for i, (expr, _) in enumerate(INTEGER_CASES))
    return MpsEmuBackend().compile(HEAD + "kernel void ints(device long* o [[buffer(0)]], device const int* in "
                                   "[[buffer(1)]], uint t [[thread_position_in_grid]]) {\n  int z = in[0];\n"
                                   + body + "\n}\n")


def test_integer_functions_compute_in_their_argument_type(integer_lib):
    out = torch.zeros(len(INTEGER_CASES), dtype=torch.int64)
    integer_lib.ints(out, torch.zeros(1, dtype=torch.int32), threads=1)
    wrong = [(expr, got, want) for (expr, want), got in zip(INTEGER_CASES, out.tolist()) if got != want]
    assert not wrong, wrong


def test_sinpi_cospi_tanpi_reduce_the_argument_exactly():
    lib = MpsEmuBackend().compile(HEAD + "kernel void pi(device const float* x [[buffer(0)]], device float* s "
                                  "[[buffer(1)]], device float* c [[buffer(2)]], device float* t [[buffer(3)]], "
                                  "uint i [[thread_position_in_grid]]) { s[i] = precise::sinpi(x[i]); "
                                  "c[i] = cospi(x[i]); t[i] = tanpi(x[i]); }\n")
    x = torch.tensor([0.0, 1.0, -1.0, 0.5, 2.0, 0.25, 1000.25, 4096.5, 100000.5, 8388607.0, 8388607.5, 3.0e7,
                      -2.75, 1.0e-3, 16777215.0, 0.3333333])
    s, c, t = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    lib.pi(x, s, c, t, threads=len(x))
    for i, v in enumerate(x.tolist()):
        r = math.fmod(v, 2.0)  # the exact value of the float argument, reduced in float64
        want_s, want_c = math.sin(math.pi * r), math.cos(math.pi * r)
        assert abs(s[i].item() - want_s) <= 2e-7, (v, s[i].item(), want_s)
        assert abs(c[i].item() - want_c) <= 2e-7, (v, c[i].item(), want_c)
        if v == int(v):  # integers: exact zeros and +-1
            assert s[i].item() == 0 and abs(c[i].item()) == 1 and t[i].item() == 0, v
        elif (v - 0.5) == int(v - 0.5):  # half-integers: cos is exactly +0, tan infinite
            assert c[i].item() == 0 and math.isinf(t[i].item()), (v, c[i].item(), t[i].item())
        else:
            assert math.isclose(t[i].item(), math.tan(math.pi * r), rel_tol=1e-6), v


@pytest.mark.parametrize("dtype, name", [(torch.float16, "half"), (torch.bfloat16, "bfloat")])
def test_fract_stays_below_one_in_narrow_types(dtype, name):
    lib = MpsEmuBackend().compile(HEAD + f"kernel void fr(device const {name}* x [[buffer(0)]], device {name}* o "
                                  "[[buffer(1)]], uint i [[thread_position_in_grid]]) { o[i] = fract(x[i]); }\n")
    x = torch.tensor([-1e-4, -1e-6, -0.0, 0.25, -3.5, 7.0], dtype=dtype)
    out = torch.empty_like(x)
    lib.fr(x, out, threads=len(x))
    largest_below_one = 1 - torch.finfo(dtype).eps / 2
    assert out[:2].float().tolist() == [largest_below_one] * 2
    assert out[2:].float().tolist() == [0.0, 0.25, 0.5, 0.0]


@pytest.mark.parametrize("args", ["ushort(1), ushort(8)", "1, 8", "d, m", "1u, 8u", "ud, um"])
def test_fill_shuffles_take_a_modulo_of_any_integer_type(args):
    lib = MpsEmuBackend().compile(HEAD + "kernel void k(device const float* a [[buffer(0)]], device float* o "
                                  "[[buffer(1)]], uint i [[thread_position_in_grid]]) { int d = 1, m = 8; "
                                  "uint ud = 1, um = 8; o[i] = simd_shuffle_and_fill_up(a[i], -1.0f, "
                                  f"{args}); }}\n")
    a, out = torch.arange(32.0), torch.zeros(32)
    lib.k(a, out, threads=32, group_size=32)
    assert out.tolist() == [-1.0 if lane % 8 == 0 else float(lane - 1) for lane in range(32)]


def test_thread_scope_enumerators_are_unscoped_as_in_metal():
    lib = MpsEmuBackend().compile(HEAD + "kernel void k(device const float* x [[buffer(0)]], device float* o "
                                  "[[buffer(1)]], uint i [[thread_position_in_grid]]) { o[i] = x[i]; "
                                  "atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, thread_scope_device); "
                                  "atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst, "
                                  "thread_scope::thread_scope_threadgroup); }\n")
    x, out = torch.randn(40), torch.zeros(40)
    lib.k(x, out, threads=40)
    assert torch.equal(out, x)


def test_program_scope_constant_vectors_matrices_and_structs_of_them():
    # constant data of vector or matrix type is initialized at compile time, as in Metal (vector and matrix
    # constructors of constants are constant expressions); the emulator's vectors once needed a dynamic
    # initializer, which the binary check refuses, so such a source did not load
    lib = MpsEmuBackend().compile(HEAD + """
constant float4 kCtor = float4(0.25f, 0.5f, 1.0f, 2.0f);
constant float4 kBraces = { 0.25f, 0.5f, 1.0f, 2.0f };
constexpr constant float3 kLuma = float3(0.299f, 0.587f, 0.114f);
constant short2 kPairs[2] = { short2(1, 2), short2(3, 4) };
constant float2x2 kRot = float2x2(0.0f, 1.0f, -1.0f, 0.0f);
constant half4 kHalf = half4(1.5h);
constant bfloat2 kBf = bfloat2(0.5f, -2.0f);
struct Coeffs { float2 scale; int n; };
constant Coeffs kCoeffs = { float2(0.5f, 4.0f), 3 };
kernel void k(device const float4* x [[buffer(0)]], device float* o [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  constexpr float2 local = float2(0.125f, 8.0f);
  float4 v = x[i];
  float2 r = kRot * v.xy;
  o[i] = dot(v, kCtor) + dot(v, kBraces) + dot(v.xyz, kLuma) + float(kPairs[1].y) * v.w + r.x + r.y
       + float(kHalf.z) + float(kBf.y) + kCoeffs.scale.y * float(kCoeffs.n) + local.x * local.y;
}
""")
    x = torch.randn(37, 4)
    out = torch.empty(37)
    lib.k(x, out, threads=37)
    c = torch.tensor([0.25, 0.5, 1.0, 2.0])
    rot = x[:, 1] * -1.0 + x[:, 0] * 1.0  # float2x2(columns (0, 1), (-1, 0)) * (x, y) = (-y, x)
    want = (2 * (x @ c) + x[:, :3] @ torch.tensor([0.299, 0.587, 0.114]) + 4 * x[:, 3] + rot
            + 1.5 - 2.0 + 12.0 + 1.0)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call, want", [
    ("quad_shuffle_and_fill_down(a[i], -1.0f, 1)", lambda lane: -1.0 if lane % 4 == 3 else float(lane + 1)),
    ("quad_shuffle_and_fill_up(a[i], -1.0f, 1u)", lambda lane: -1.0 if lane % 4 == 0 else float(lane - 1)),
    ("quad_shuffle_and_fill_down(a[i], -1.0f, 1, 2)", lambda lane: -1.0 if lane % 2 == 1 else float(lane + 1)),
])
def test_quad_fill_shuffles_work_within_each_quad(call, want):
    lib = MpsEmuBackend().compile(HEAD + "kernel void k(device const float* a [[buffer(0)]], device float* o "
                                  f"[[buffer(1)]], uint i [[thread_position_in_grid]]) {{ o[i] = {call}; }}\n")
    a, out = torch.arange(32.0), torch.zeros(32)
    lib.k(a, out, threads=32, group_size=32)
    assert out.tolist() == [want(lane) for lane in range(32)]


def test_refract_follows_snells_law_and_gives_zero_on_total_reflection():
    lib = MpsEmuBackend().compile(HEAD + "kernel void k(device const float3* i [[buffer(0)]], device const float3* n "
                                  "[[buffer(1)]], device float3* o [[buffer(2)]], uint t [[thread_position_in_grid]]) "
                                  "{ o[t] = refract(i[t], n[t], 0.66f); }\n")
    inc = torch.nn.functional.normalize(torch.randn(16, 3), dim=1)
    nrm = torch.nn.functional.normalize(torch.randn(16, 3), dim=1)
    pad = lambda t: torch.cat([t, torch.zeros(len(t), 1)], 1).contiguous()  # float3 is 16 bytes in a buffer
    out = torch.zeros(16, 4)
    lib.k(pad(inc), pad(nrm), out, threads=16)
    d = (inc * nrm).sum(1, keepdim=True).double()
    k = 1 - 0.66 ** 2 * (1 - d * d)
    want = torch.where(k < 0, torch.zeros(()), 0.66 * inc.double() - (0.66 * d + k.clamp(min=0).sqrt()) * nrm.double())
    torch.testing.assert_close(out[:, :3].double(), want, rtol=1e-5, atol=1e-6)
    out2 = torch.zeros(1, 4)  # grazing incidence from the denser side with eta > 1: total reflection
    lib2 = MpsEmuBackend().compile(HEAD + "kernel void k(device float3* o [[buffer(0)]], uint t "
                                   "[[thread_position_in_grid]]) { o[t] = refract(float3(0.8f, -0.6f, 0.0f), "
                                   "float3(0.0f, 1.0f, 0.0f), 1.5f); }\n")
    lib2.k(out2, threads=1)
    assert out2[0, :3].tolist() == [0.0, 0.0, 0.0]
