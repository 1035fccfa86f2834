// MSL emulator: the subset of <metal_stdlib> that compute kernels use, in C++17 for the CPU.
// Kernels are translated by metal_accel/backends/msl_translate.py (address spaces, attributes,
// threadgroup variables, launchers) and compiled against this header.
#pragma once
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700  // ucontext fibers (before any system header)
#define _DARWIN_C_SOURCE 1
#endif
#include "types.h"
#include "vec.h"
#include "vec_ops.h"
#include "math.h"
#include "atomics.h"
#include "runtime.h"
#include "sync.h"
#include "shadow.h"
#include "conversions.h"
#include "simdgroup_matrix.h"
#include "lang.h"

// Metal's scalar and vector types are visible without `using namespace metal`
#define MA_GLOBAL_VEC(name) using metal::name##2; using metal::name##3; using metal::name##4; \
  using metal::packed_##name##2; using metal::packed_##name##3; using metal::packed_##name##4;
MA_GLOBAL_VEC(float) MA_GLOBAL_VEC(half) MA_GLOBAL_VEC(bfloat) MA_GLOBAL_VEC(int) MA_GLOBAL_VEC(uint)
MA_GLOBAL_VEC(short) MA_GLOBAL_VEC(ushort) MA_GLOBAL_VEC(char) MA_GLOBAL_VEC(uchar) MA_GLOBAL_VEC(bool)
MA_GLOBAL_VEC(long) MA_GLOBAL_VEC(ulong)
#undef MA_GLOBAL_VEC
#define MA_GLOBAL_MAT(name) using metal::name##2x2; using metal::name##2x3; using metal::name##2x4; \
  using metal::name##3x2; using metal::name##3x3; using metal::name##3x4; using metal::name##4x2; using metal::name##4x3; \
  using metal::name##4x4;
MA_GLOBAL_MAT(float) MA_GLOBAL_MAT(half) MA_GLOBAL_MAT(bfloat)
#undef MA_GLOBAL_MAT
using metal::half;
using metal::bfloat;
using metal::uchar;
using metal::ushort;
using metal::uint;
using metal::ulong;
// Metal's assert (<metal_assert>) compiles to nothing unless shader validation enables it.
#ifndef assert
#define assert(cond) ((void)0)
#endif
