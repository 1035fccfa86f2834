"""SIMD-group matrix fragments through `thread_elements()` (MLX's steel GEMM and attention `BaseMMAFrag`):
each lane owns 2 elements of an 8x8 matrix at its place in Apple's layout, writes to them reach the next
multiply or store of the matrix, and a lane that is inactive there gives NaN instead of a lucky value. Also a
call to a helper that reaches SIMD-group functions through a qualified name with template arguments
(`MMATile<T, 1, 1>::MMAFrag_t::mma(...)`), which the translator once cut at the `>`."""
from __future__ import annotations

import pytest
import torch

from metal_accel.backends.mps_emu.backend import MpsEmuBackend
from metal_accel.backends.mps_emu.msl_translate import translate_unit

no_compiler = pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

template <typename T> struct Frag {
  typedef simdgroup_matrix<T, 8, 8> mat_type;
  typedef vec<T, 2> frag_type;
  METAL_FUNC static constexpr short2 get_coord(ushort lane) {
    const short qid = lane / 4;
    return short2{short((qid & 2) * 2 + (lane % 2) * 2), short((qid & 4) + ((lane / 2) % 4))};
  }
  METAL_FUNC static void mma(thread frag_type& D, thread frag_type& A, thread frag_type& B, thread frag_type& C) {
    mat_type D_mat, A_mat, B_mat, C_mat;
    reinterpret_cast<thread frag_type&>(A_mat.thread_elements()) = A;
    reinterpret_cast<thread frag_type&>(B_mat.thread_elements()) = B;
    reinterpret_cast<thread frag_type&>(C_mat.thread_elements()) = C;
    simdgroup_multiply_accumulate(D_mat, A_mat, B_mat, C_mat);
    D = reinterpret_cast<thread frag_type&>(D_mat.thread_elements());
  }
};
template <typename T, int R, int C> struct Tile {
  using MMAFrag_t = Frag<T>;
  typename Frag<T>::frag_type frags[R * C];
};

// C (8 x 8) = A (8 x K) @ B (K x 8), K a multiple of 8, fragments only
template <typename T>
[[kernel]] void frag_matmul(device const T* A [[buffer(0)]], device const T* B [[buffer(1)]], device T* C [[buffer(2)]],
                            constant int& K [[buffer(3)]], ushort lane [[thread_index_in_simdgroup]]) {
  const short2 rc = Frag<float>::get_coord(lane);
  Tile<float, 1, 1> acc, a, b;
  acc.frags[0] = 0.0f;
  for (int k = 0; k < K; k += 8) {
    a.frags[0] = float2(A[rc.y * K + k + rc.x], A[rc.y * K + k + rc.x + 1]);
    b.frags[0] = float2(B[(k + rc.y) * 8 + rc.x], B[(k + rc.y) * 8 + rc.x + 1]);
    Tile<float, 1, 1>::MMAFrag_t::mma(acc.frags[0], a.frags[0], b.frags[0], acc.frags[0]);
  }
  C[rc.y * 8 + rc.x] = T(acc.frags[0][0]);
  C[rc.y * 8 + rc.x + 1] = T(acc.frags[0][1]);
}
template [[host_name("frag_matmul_f32")]] [[kernel]] decltype(frag_matmul<float>) frag_matmul<float>;
template [[host_name("frag_matmul_f16")]] [[kernel]] decltype(frag_matmul<half>) frag_matmul<half>;

// each lane writes its own number into its elements; the store shows where each lane's elements are
kernel void lane_owners(device float* out [[buffer(0)]], ushort lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m;
  m.thread_elements()[0] = float(lane);
  m.thread_elements()[1] = float(lane) + 0.5f;
  simdgroup_store(m, out);
}

// a loaded matrix read back through the fragments: out[lane] = the lane's two elements
kernel void loaded_fragments(device const float* in [[buffer(0)]], device float2* out [[buffer(1)]],
                             ushort lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m;
  simdgroup_load(m, in);
  thread const auto& e = m.thread_elements();
  out[lane] = float2(e[0], e[1]);
}

// only lane 5 changes its elements of a loaded matrix; the others keep theirs
kernel void one_lane_writes(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                            ushort lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m;
  simdgroup_load(m, in);
  if (lane == 5) {
    m.thread_elements()[1] = -1.0f;
  }
  simdgroup_float8x8 r;
  simdgroup_multiply(r, m, simdgroup_float8x8(1.0f));
  simdgroup_store(r, out);
}
"""


@pytest.fixture(scope="module")
def lib():
    return MpsEmuBackend().compile(SOURCE)


def _apple_layout() -> list[tuple[int, int]]:
    """(row, first column) of each lane's two elements in Apple's 8x8 layout."""
    cells = []
    for lane in range(32):
        qid = lane // 4
        cells.append(((qid & 4) + (lane // 2) % 4, (qid & 2) * 2 + (lane % 2) * 2))
    return cells


@pytest.mark.slow
@pytest.mark.needs_cxx
@no_compiler
@pytest.mark.parametrize("dtype,name,tol", [(torch.float32, "frag_matmul_f32", 1e-5),
                                            (torch.float16, "frag_matmul_f16", 1e-2)])
@pytest.mark.parametrize("k", [8, 24])
def test_fragment_matmul_matches_torch(lib, dtype, name, tol, k):
    a, b = torch.randn(8, k).to(dtype), torch.randn(k, 8).to(dtype)
    c = torch.full((8, 8), float("nan")).to(dtype)
    getattr(lib, name)(a, b, c, k, threads=32, group_size=32, arg_casts={3: "int32"})
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=tol, rtol=tol)


@pytest.mark.slow
@pytest.mark.needs_cxx
@no_compiler
def test_fragment_elements_follow_apple_layout(lib):
    out = torch.full((8, 8), float("nan"))
    lib.lane_owners(out, threads=32, group_size=32)
    want = torch.empty(8, 8)
    for lane, (r, c) in enumerate(_apple_layout()):
        want[r, c], want[r, c + 1] = lane, lane + 0.5
    torch.testing.assert_close(out, want)


@pytest.mark.slow
@pytest.mark.needs_cxx
@no_compiler
def test_loaded_matrix_reads_back_through_fragments(lib):
    m = torch.randn(8, 8)
    out = torch.empty(32, 2)
    lib.loaded_fragments(m, out, threads=32, group_size=32)
    want = torch.tensor([[m[r, c], m[r, c + 1]] for r, c in _apple_layout()])
    torch.testing.assert_close(out, want)


@pytest.mark.slow
@pytest.mark.needs_cxx
@no_compiler
def test_a_divergent_fragment_write_changes_only_that_lanes_element(lib):
    m = torch.randn(8, 8)
    out = torch.empty(8, 8)
    lib.one_lane_writes(m, out, threads=32, group_size=32)
    r, c = _apple_layout()[5]
    want = m.clone()
    want[r, c + 1] = -1.0
    torch.testing.assert_close(out, want)


@pytest.mark.slow
@pytest.mark.needs_cxx
@no_compiler
def test_an_inactive_lane_contributes_nan_not_a_lucky_value(lib):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    c = torch.zeros(8, 8)
    lib.frag_matmul_f32(a, b, c, 8, threads=16, group_size=16, arg_casts={3: "int32"})  # lanes 16..31 do not exist
    assert torch.isnan(c).any()


def test_qualified_helper_call_with_template_arguments_records_its_line_whole():
    src = r"""
#include <metal_stdlib>
using namespace metal;
template <typename T> struct Inner { static T reduce(T v) { return simd_sum(v); } };
template <typename T, int N> struct Outer { using Inner_t = Inner<T>; };
kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = Outer<float, 2>::Inner_t::reduce(x[i]);
}
"""
    body, _ = translate_unit(src)
    assert "(ma_rt::SiteGuard(__LINE__), Outer<float, 2>::Inner_t::reduce(" in body.replace("  ", " ")
