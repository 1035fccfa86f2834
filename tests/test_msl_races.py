"""The MSL emulator's execution semantics: SIMD-groups in lockstep, the race detector, bounds and
division checks (include/msl_emu/shadow.h, backends/mps_emu/msl_instrument.py). A kernel that is right
on an Apple GPU gives its answer; one whose result depends on the order of threads, or that reaches
outside its memory, fails with a KernelLaunchError naming the kernel, the variable and the line.
All kernels live in one source, so that one compilation serves the file."""
from __future__ import annotations

import re

import pytest
import torch

from metal_accel.backends import get_backend
from metal_accel.backends.mps_emu.backend import MpsEmuBackend
from metal_accel.core.errors import KernelLaunchError

# (slow: each test compiles an instrumented kernel library, 1.5-5 s on 2 cores; the fast tier stays under 2 minutes)
pytestmark = [pytest.mark.slow, pytest.mark.needs_cxx, pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")]

SRC = r"""#include <metal_stdlib>
using namespace metal;

// one SIMD-group, no barrier between steps: right on the GPU, whose 32 lanes advance together
kernel void warp_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                     uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float buf[32];
    buf[lane] = x[lane];
    for (uint s = 16; s > 0; s >>= 1) {
        if (lane < s) buf[lane] += buf[lane + s];
    }
    if (lane == 0) out[0] = buf[0];
}

// the classic unrolled tail: every lane runs every step, lower lanes read what higher lanes write
kernel void warp_unrolled(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                          uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float buf[64];
    buf[lane] = x[lane];
    buf[lane + 32] = x[lane + 32];
    simdgroup_barrier(mem_flags::mem_threadgroup);
    buf[lane] += buf[lane + 32];
    buf[lane] += buf[lane + 16];
    buf[lane] += buf[lane + 8];
    buf[lane] += buf[lane + 4];
    buf[lane] += buf[lane + 2];
    buf[lane] += buf[lane + 1];
    if (lane == 0) out[0] = buf[0];
}

// lanes move data up by one within a statement: all loads of a step come before its stores
kernel void shift_up(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float buf[33];
    buf[lane] = float(lane);
    buf[lane + 1] = buf[lane];
    out[lane] = buf[lane + 1];
}

// the same reduction over 64 threads (two SIMD-groups) without barriers: wrong on the GPU
kernel void cross_simd_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                           uint t [[thread_index_in_threadgroup]]) {
    threadgroup float buf[64];
    buf[t] = x[t];
    for (uint s = 32; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
    }
    if (t == 0) out[0] = buf[0];
}

// a tree reduction with a barrier per step (BARRIER_AT names the step whose barrier is kept out)
kernel void tree_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                     constant uint& skip [[buffer(2)]],
                     uint t [[thread_index_in_threadgroup]], uint g [[threadgroup_position_in_grid]],
                     uint n [[threads_per_threadgroup]]) {
    threadgroup float buf[256];
    buf[t] = x[g * n + t];
    if (skip != 1) threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = n / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        if (skip != s) threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[g] = buf[0];
}

// reading another SIMD-group's slot before the barrier that publishes it
kernel void early_read(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                       uint t [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float part[8];
    float v = simd_sum(x[t]);
    if (lane == 0) part[sg] = v;
    float total = 0.0f;
    if (t == 0) { for (uint k = 0; k < 2; ++k) total += part[k]; out[0] = total; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

// softmax of one row per threadgroup: simd reductions, partials through threadgroup memory
kernel void softmax_rows(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                         constant uint& n [[buffer(2)]],
                         uint row [[threadgroup_position_in_grid]], uint t [[thread_index_in_threadgroup]],
                         uint nt [[threads_per_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float part[32];
    device const float* r = x + row * n;
    float m = -INFINITY;
    for (uint i = t; i < n; i += nt) m = max(m, r[i]);
    m = simd_max(m);
    if (lane == 0) part[sg] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    m = -INFINITY;
    for (uint k = 0; k < nsg; ++k) m = max(m, part[k]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float s = 0.0f;
    for (uint i = t; i < n; i += nt) s += exp(r[i] - m);
    s = simd_sum(s);
    if (lane == 0) part[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    s = 0.0f;
    for (uint k = 0; k < nsg; ++k) s += part[k];
    for (uint i = t; i < n; i += nt) y[row * n + i] = exp(r[i] - m) / s;
}

// thread i writes element i % 32: every threadgroup writes the same 32 elements, with different values
kernel void overlap(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i % 32] = float(i);
}

// every thread writes the same value to one element: the order does not matter
kernel void same_value(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[0] = 5.0f;
}

// threadgroup 1 reads what threadgroup 0 writes
kernel void cross_group_read(device float* buf [[buffer(0)]], uint i [[thread_position_in_grid]],
                             uint g [[threadgroup_position_in_grid]]) {
    if (g == 0) buf[i] = 1.0f;
    else buf[i] = buf[i - 32] + 1.0f;
}

kernel void count(device atomic_int* c [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

kernel void past_end(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
    out[i] = x[i + 1];
}

kernel void tg_past_end(device float* out [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
    threadgroup float buf[32];
    threadgroup float* p = buf;
    p[t + 1] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[t] = buf[t];
}

// writes two elements before the start of a private array
kernel void private_before(device float* out [[buffer(0)]], constant int& k [[buffer(1)]],
                           uint i [[thread_position_in_grid]]) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    acc[k - 2] = 1.0f;
    out[i] = acc[0];
}

kernel void divide(device int* out [[buffer(0)]], constant int& d [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    out[i] = int(i) / d + int(i) % d;
}
"""


@pytest.fixture(scope="module")
def lib():
    return get_backend("mps-emu").compile(SRC)


def _error(fn, *args, **kw) -> str:
    with pytest.raises(KernelLaunchError) as e:
        fn(*args, **kw)
    return str(e.value)


def _line(needle: str) -> int:
    return next(i for i, ln in enumerate(SRC.split("\n"), 1) if needle in ln)


def test_lanes_of_a_simd_group_advance_together(lib):
    x = torch.randn(64)
    out = torch.zeros(1)
    lib.warp_sum(x[:32].contiguous(), out, threads=32, group_size=32)
    torch.testing.assert_close(out[0], x[:32].sum(), rtol=1e-5, atol=1e-5)
    lib.warp_unrolled(x, out, threads=32, group_size=32)
    torch.testing.assert_close(out[0], x.sum(), rtol=1e-5, atol=1e-5)


def test_loads_of_a_step_come_before_its_stores(lib):
    out = torch.zeros(32)
    lib.shift_up(out, threads=32, group_size=32)
    assert out.tolist() == [float(i) for i in range(32)]


def test_reduction_across_simd_groups_without_barrier_is_a_race(lib):
    msg = _error(lib.cross_simd_sum, torch.randn(64), torch.zeros(1), threads=64, group_size=64)
    assert "kernel cross_simd_sum" in msg and "data race on buf[" in msg
    assert f"line {_line('if (t < s) buf[t] += buf[t + s];')}" in msg
    assert re.search(r"thread \d+ \(SIMD-group 1\)", msg)


def test_tree_reduction_with_barriers_passes(lib):
    x = torch.randn(1024)
    out = torch.zeros(4)
    lib.tree_sum(x, out, 0, arg_casts={2: "int32"}, threads=1024, group_size=256)
    torch.testing.assert_close(out, x.view(4, 256).sum(1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("skip", [1, 128, 64])
def test_each_removed_barrier_is_reported(lib, skip):
    msg = _error(lib.tree_sum, torch.randn(1024), torch.zeros(4), skip, arg_casts={2: "int32"},
                 threads=1024, group_size=256)
    assert "kernel tree_sum" in msg and "data race on buf[" in msg and "line " in msg


@pytest.mark.parametrize("skip", [32, 16])
def test_barriers_within_one_simd_group_may_go(lib, skip):
    # from the step of 32 threads on, only SIMD-group 0 works: lockstep orders its steps
    x = torch.randn(256)
    out = torch.zeros(1)
    lib.tree_sum(x, out, skip, arg_casts={2: "int32"}, threads=256, group_size=256)
    torch.testing.assert_close(out[0], x.sum(), rtol=1e-4, atol=1e-4)


def test_reading_another_simd_groups_result_before_the_barrier(lib):
    msg = _error(lib.early_read, torch.randn(64), torch.zeros(1), threads=64, group_size=64)
    assert "data race on part[1]" in msg and f"line {_line('total += part[k]')}" in msg


def test_softmax_with_simd_reductions_passes(lib):
    x = torch.randn(5, 300)
    y = torch.empty_like(x)
    lib.softmax_rows(x, y, 300, arg_casts={2: "int32"}, threads=(5 * 128,), group_size=(128,))
    torch.testing.assert_close(y, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)


def test_two_threadgroups_writing_one_element(lib):
    msg = _error(lib.overlap, torch.zeros(64), threads=128, group_size=32)
    assert "kernel overlap" in msg and "data race on out (argument 0)[" in msg
    assert f"line {_line('out[i % 32] = float(i);')}" in msg and "another threadgroup" in msg


def test_writes_of_one_value_and_atomics_are_not_races(lib):
    out = torch.zeros(4)
    lib.same_value(out, threads=256, group_size=64)
    assert out[0] == 5.0
    c = torch.zeros(1, dtype=torch.int32)
    lib.count(c, threads=1000, group_size=100)
    assert c.item() == 1000


def test_reading_another_threadgroups_write(lib):
    msg = _error(lib.cross_group_read, torch.zeros(64), threads=64, group_size=32)
    assert "data race on buf (argument 0)[" in msg and "another threadgroup" in msg


def test_out_of_bounds_device_access(lib):
    msg = _error(lib.past_end, torch.zeros(64), torch.zeros(64))
    assert "kernel past_end" in msg and "out-of-bounds read of 4 bytes" in msg
    assert f"line {_line('out[i] = x[i + 1];')}" in msg and "x (argument 0)" in msg


def test_out_of_bounds_threadgroup_access(lib):
    msg = _error(lib.tg_past_end, torch.zeros(32), threads=32, group_size=32)
    assert "out-of-bounds write" in msg and "threadgroup variable 'buf'" in msg
    assert f"line {_line('p[t + 1] = 1.0f;')}" in msg


def test_out_of_bounds_private_array_is_an_error_not_a_crash(lib):
    msg = _error(lib.private_before, torch.zeros(8), 0, arg_casts={1: "int32"})
    assert "index -2 is out of bounds for an array of 4 elements" in msg
    assert f"line {_line('acc[k - 2] = 1.0f;')}" in msg
    out = torch.zeros(8)
    lib.private_before(out, 2, arg_casts={1: "int32"})
    assert out.tolist() == [1.0] * 8


def test_integer_division_by_zero_is_an_error_not_a_crash(lib):
    msg = _error(lib.divide, torch.zeros(8, dtype=torch.int32), 0, arg_casts={1: "int32"})
    assert "integer division by zero" in msg and f"line {_line('out[i] = int(i) / d')}" in msg
    out = torch.zeros(8, dtype=torch.int32)
    lib.divide(out, 3, arg_casts={1: "int32"})
    assert out.tolist() == [i // 3 + i % 3 for i in range(8)]


TWO_LEVEL = r"""#include <metal_stdlib>
using namespace metal;
// the two-level sum of the major code bases' norms: simd_sum, partials per SIMD-group, simd_sum again,
// one lane writing; the compiler duplicates the last block per side of that lane's branch
kernel void row_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
    uint gid [[threadgroup_position_in_grid]], uint lid [[thread_position_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float partial[32];
  float acc = x[gid * 128 + lid];
  acc = simd_sum(acc);
  if (sg == 0) {
    partial[lane] = 0;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) {
    partial[sg] = acc;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) {
    acc = simd_sum(partial[lane]);
    if (lane == 0) {
      out[gid] = acc;
    }
  }
}
// a SIMD-group function whose argument only some lanes load: every lane still takes part
kernel void masked_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
    uint lid [[thread_position_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float vals[32];
  vals[lane] = x[lid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[lid] = simd_sum(lane < 4 ? vals[lane] : 0.0f);
}
"""


def test_two_level_sum_with_one_writing_lane_is_exact():
    lib = MpsEmuBackend().compile(TWO_LEVEL)
    x, out = torch.randn(4, 128), torch.zeros(4)
    lib.row_sum(x, out, threads=512, group_size=128)
    torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-5)


def test_a_simd_group_function_waits_for_lanes_loading_its_argument():
    lib = MpsEmuBackend().compile(TWO_LEVEL)
    x, out = torch.randn(32), torch.zeros(32)
    lib.masked_sum(x, out, threads=32, group_size=32)
    torch.testing.assert_close(out, x[:4].sum().expand(32), rtol=1e-5, atol=1e-5)


REUSE = r"""#include <metal_stdlib>
using namespace metal;
// the scratch is overwritten for a second pass before every thread has read the first pass's total
// (threadgroup 0 waits, so the race is in threadgroup 1)
kernel void two_pass(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
    uint gid [[threadgroup_position_in_grid]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float acc[64];
  acc[lid] = x[gid * 64 + lid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid == 0) { float s = 0; for (int k = 0; k < 64; ++k) s += acc[k]; acc[0] = s; }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = acc[0];
  if (gid == 0) threadgroup_barrier(mem_flags::mem_threadgroup);
  acc[lid] = total * x[gid * 64 + lid];
  out[gid * 64 + lid] = acc[lid];
}
"""


def test_a_threadgroup_memory_race_past_the_first_group_names_a_thread_of_that_group():
    lib = MpsEmuBackend().compile(REUSE)
    msg = _error(lib.two_pass, torch.randn(128) + 2, torch.zeros(128), threads=128, group_size=64)
    assert "data race on acc[0]" in msg and "another threadgroup" not in msg
    assert re.search(r"thread \d+ \(SIMD-group 1\)", msg)


LOOPED = r"""#include <metal_stdlib>
using namespace metal;
// one simd_sum per row in a loop, lane 0 storing each total: on the GPU all 32 lanes take part in every
// iteration's simd_sum; ordering waits by source line alone ran iteration r+1's call (an earlier line)
// before lane 0's store of iteration r, so lane 0 summed alone from the second row on
kernel void per_row_totals(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  float v[4];
  for (int r = 0; r < 4; ++r) v[r] = float(lane + 100 * r);
  for (int r = 0; r < 4; ++r) {
    float s = simd_sum(v[r]);
    if (lane == 0) out[r] = s;
  }
}
// lanes leave the loop after different counts of iterations: each call sums the lanes still in it
kernel void shrinking(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  for (uint r = 0; r < lane / 8 + 1; ++r) {
    float s = simd_sum(1.0f);
    if (lane == 31) out[r] = s;
  }
  float all = simd_sum(2.0f);
  if (lane == 0) out[4] = all;
}
"""


def test_a_simd_sum_per_loop_iteration_with_one_storing_lane():
    out = torch.zeros(4)
    MpsEmuBackend().compile(LOOPED).per_row_totals(out, threads=32, group_size=32)
    assert out.tolist() == [496.0 + 3200.0 * r for r in range(4)]


def test_lanes_leaving_a_loop_early_wait_for_the_others_after_it():
    out = torch.zeros(5)
    MpsEmuBackend().compile(LOOPED).shrinking(out, threads=32, group_size=32)
    assert out.tolist() == [32.0, 24.0, 16.0, 8.0, 64.0]
