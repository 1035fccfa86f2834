// MSL emulator: simdgroup_matrix<T, Cols, Rows> (simdgroup_float8x8, simdgroup_half8x8, ...).
// On the GPU each thread of the SIMD-group holds a slice of the matrix. Here every thread holds the
// whole matrix and computes the whole result: the operations are uniform over the SIMD-group (Metal
// requires it), so every thread's copy is equal.
// thread_elements() is a thread's own slice of an 8x8 matrix: 2 elements of one row, at the lane's
// place in Apple's layout (ma_frag::row / ma_frag::col). When a source calls it (the translator then
// defines MA_THREAD_ELEMENTS), each matrix also keeps that slice (`frag`), which is what the thread
// owns: every operation that writes the matrix refreshes it, and every operation that reads the
// matrix first rebuilds the whole matrix from the slices of all lanes (a SIMD-group exchange, so a
// lane that is inactive there contributes all-one bits, NaN for floating types: undefined on a GPU).
#pragma once
#include "vec_ops.h"
#include "sync.h"

#ifndef MA_THREAD_ELEMENTS
#define MA_THREAD_ELEMENTS 0
#endif

namespace ma_frag {
// Apple's distribution of an 8x8 SIMD-group matrix: lane l holds row row(l), columns col(l) and col(l) + 1
constexpr int row(int lane) { return (lane / 4 & 4) + (lane / 2) % 4; }
constexpr int col(int lane) { return (lane / 4 & 2) * 2 + (lane % 2) * 2; }
MA_NOSAN_INLINE inline int current_lane() {
  ma_rt::Group* g = ma_rt::tl_group;
  return g ? g->thread() % ma_rt::kSimdWidth : 0;
}
}  // namespace ma_frag

namespace metal {

template <class T, int Cols, int Rows> struct simdgroup_matrix {
  T m[Rows][Cols];  // m[row][col]
#if MA_THREAD_ELEMENTS
  vec<T, 2> frag;  // this thread's elements (see the top of this file)
#endif
  simdgroup_matrix() = default;
  // a diagonal matrix with `d` on the diagonal (as in Metal)
  explicit simdgroup_matrix(T d) {
    for (int r = 0; r < Rows; ++r) for (int c = 0; c < Cols; ++c) m[r][c] = r == c ? d : T(0);
    refresh_thread_elements();
  }
  void refresh_thread_elements() {
#if MA_THREAD_ELEMENTS
    if constexpr (Rows == 8 && Cols == 8) {
      const int lane = ma_frag::current_lane();
      frag = vec<T, 2>(m[ma_frag::row(lane)][ma_frag::col(lane)], m[ma_frag::row(lane)][ma_frag::col(lane) + 1]);
    }
#endif
  }
#if MA_THREAD_ELEMENTS
  vec<T, 2>& thread_elements() {
    static_assert(Rows == 8 && Cols == 8, "thread_elements() exists for 8x8 SIMD-group matrices");
    return frag;
  }
  const vec<T, 2>& thread_elements() const {
    static_assert(Rows == 8 && Cols == 8, "thread_elements() exists for 8x8 SIMD-group matrices");
    return frag;
  }
#endif
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int Cols, int Rows> inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(const T& v) {
  simdgroup_matrix<T, Cols, Rows> a;
  for (int r = 0; r < Rows; ++r) for (int c = 0; c < Cols; ++c) a.m[r][c] = v;
  a.refresh_thread_elements();
  return a;
}

}  // namespace metal

namespace ma_frag {
template <class T> struct Slice { metal::vec<T, 2> e; T* whole; };  // a lane's elements, and where its whole matrix goes
// every active lane's whole matrix gets every lane's slice; an inactive lane's slice is all-one bits
template <class T> struct Gather {
  template <class S> MA_NOSAN_INLINE static void run(ma_rt::Group* g, int base, uint32_t mask) {
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      T* whole = metal::ma_simd::in<S>(g, base + l).whole;
      for (int j = 0; j < 32; ++j) {
        T* e = whole + row(j) * 8 + col(j);
        if (mask >> j & 1u) {
          const S src = metal::ma_simd::in<S>(g, base + j);
          e[0] = src.e[0];
          e[1] = src.e[1];
        } else {
          std::memset(static_cast<void*>(e), 0xFF, 2 * sizeof(T));
        }
      }
    }
  }
};
// the matrix the SIMD-group holds: with thread_elements() in the source, gathered from the lanes' slices
template <class T, int Cols, int Rows>
MA_NOSAN_INLINE inline metal::simdgroup_matrix<T, Cols, Rows> whole(const metal::simdgroup_matrix<T, Cols, Rows>& a, int site) {
  metal::simdgroup_matrix<T, Cols, Rows> r = a;
#if MA_THREAD_ELEMENTS
  if constexpr (Rows == 8 && Cols == 8) {
    ma_rt::Group* g = ma_rt::tl_group;
    if (!g || g->plain) {
      ma_rt::fail("internal error: a SIMD-group matrix operation reached in a kernel run without fibers");
      return r;
    }
    metal::ma_simd::collective<Slice<T>, Gather<T>>(Slice<T>{a.frag, &r.m[0][0]}, 0, site);
  }
#else
  (void)site;
#endif
  return r;
}
}  // namespace ma_frag

namespace metal {
// origin is (column, row) of the matrix's first element in the source; with transpose the source
// holds the transposed matrix: element (r, c) is read from source row c, column r
template <class T, int Cols, int Rows, class U>
inline void simdgroup_load(simdgroup_matrix<T, Cols, Rows>& d, const U* src, ulong elements_per_row = Cols,
                           vec<ulong, 2> matrix_origin = vec<ulong, 2>(0), bool transpose_matrix = false) {
  const ulong ox = matrix_origin.x, oy = matrix_origin.y;
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c)
      d.m[r][c] = T(transpose_matrix ? src[(oy + c) * elements_per_row + ox + r] : src[(oy + r) * elements_per_row + ox + c]);
  d.refresh_thread_elements();
}
template <class T, int Cols, int Rows, class U>
inline void simdgroup_store(const simdgroup_matrix<T, Cols, Rows>& matrix, U* dst, ulong elements_per_row = Cols,
                            vec<ulong, 2> matrix_origin = vec<ulong, 2>(0), bool transpose_matrix = false,
                            int site_ = __builtin_LINE()) {
  const simdgroup_matrix<T, Cols, Rows> a = ma_frag::whole(matrix, site_);
  const ulong ox = matrix_origin.x, oy = matrix_origin.y;
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c) {
      U v = U(a.m[r][c]);
      if (transpose_matrix) dst[(oy + c) * elements_per_row + ox + r] = v;
      else dst[(oy + r) * elements_per_row + ox + c] = v;
    }
}

// d = a * b + c, accumulated in float (double for double) and rounded once to d's element type
template <class TD, class TA, class TB, class TC, int M, int N, int K>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, N, M>& d, const simdgroup_matrix<TA, K, M>& a_,
                                          const simdgroup_matrix<TB, N, K>& b_, const simdgroup_matrix<TC, N, M>& c_,
                                          int site_ = __builtin_LINE()) {
  const simdgroup_matrix<TA, K, M> a = ma_frag::whole(a_, site_);
  const simdgroup_matrix<TB, N, K> b = ma_frag::whole(b_, site_);
  const simdgroup_matrix<TC, N, M> c = ma_frag::whole(c_, site_);
  using C = fcalc_t<TD>;
  simdgroup_matrix<TD, N, M> r;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      C acc = C(c.m[i][j]);
      for (int k = 0; k < K; ++k) acc += C(a.m[i][k]) * C(b.m[k][j]);
      r.m[i][j] = TD(acc);
    }
  r.refresh_thread_elements();
  d = r;
}
template <class TD, class TA, class TB, int M, int N, int K>
inline void simdgroup_multiply(simdgroup_matrix<TD, N, M>& d, const simdgroup_matrix<TA, K, M>& a,
                               const simdgroup_matrix<TB, N, K>& b, int site_ = __builtin_LINE()) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<TD, N, M>(TD(0)), site_);
}

}  // namespace metal
