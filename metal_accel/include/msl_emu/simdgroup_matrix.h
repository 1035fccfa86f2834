// MSL emulator: simdgroup_matrix<T, Cols, Rows> (simdgroup_float8x8, simdgroup_half8x8, ...).
// On the GPU each thread of the SIMD-group holds a slice of the matrix. Here every thread holds the
// whole matrix and computes the whole result: the operations are uniform over the SIMD-group (Metal
// requires it), so every thread's copy is equal and no exchange between threads is needed.
// thread_elements() (a thread's own slice) is not emulated.
#pragma once
#include "vec_ops.h"

namespace metal {

template <class T, int Cols, int Rows> struct simdgroup_matrix {
  T m[Rows][Cols];  // m[row][col]
  simdgroup_matrix() = default;
  // a diagonal matrix with `d` on the diagonal (as in Metal)
  explicit simdgroup_matrix(T d) {
    for (int r = 0; r < Rows; ++r) for (int c = 0; c < Cols; ++c) m[r][c] = r == c ? d : T(0);
  }
  template <class X> void thread_elements(X) = delete;
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int Cols, int Rows> inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(const T& v) {
  simdgroup_matrix<T, Cols, Rows> a;
  for (int r = 0; r < Rows; ++r) for (int c = 0; c < Cols; ++c) a.m[r][c] = v;
  return a;
}

// origin is (column, row) of the matrix's first element in the source; with transpose the source
// holds the transposed matrix: element (r, c) is read from source row c, column r
template <class T, int Cols, int Rows, class U>
inline void simdgroup_load(simdgroup_matrix<T, Cols, Rows>& d, const U* src, ulong elements_per_row = Cols,
                           vec<ulong, 2> matrix_origin = vec<ulong, 2>(0), bool transpose_matrix = false) {
  const ulong ox = matrix_origin.x, oy = matrix_origin.y;
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c)
      d.m[r][c] = T(transpose_matrix ? src[(oy + c) * elements_per_row + ox + r] : src[(oy + r) * elements_per_row + ox + c]);
}
template <class T, int Cols, int Rows, class U>
inline void simdgroup_store(const simdgroup_matrix<T, Cols, Rows>& a, U* dst, ulong elements_per_row = Cols,
                            vec<ulong, 2> matrix_origin = vec<ulong, 2>(0), bool transpose_matrix = false) {
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
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, N, M>& d, const simdgroup_matrix<TA, K, M>& a,
                                          const simdgroup_matrix<TB, N, K>& b, const simdgroup_matrix<TC, N, M>& c) {
  using C = fcalc_t<TD>;
  simdgroup_matrix<TD, N, M> r;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      C acc = C(c.m[i][j]);
      for (int k = 0; k < K; ++k) acc += C(a.m[i][k]) * C(b.m[k][j]);
      r.m[i][j] = TD(acc);
    }
  d = r;
}
template <class TD, class TA, class TB, int M, int N, int K>
inline void simdgroup_multiply(simdgroup_matrix<TD, N, M>& d, const simdgroup_matrix<TA, K, M>& a,
                               const simdgroup_matrix<TB, N, K>& b) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<TD, N, M>(TD(0)));
}

}  // namespace metal
