// MSL emulator: the parts of <metal_stdlib> that code bases use besides types, math and SIMD-group
// functions: type traits, metal::array, matrix types (float4x4, half2x3, ...), the __metal_*
// builtins that the stdlib's own functions are written with, simd_shuffle_and_fill_up/down,
// and the helpers of generated launchers.
#pragma once
#include <tuple>
#include <vector>
#include "sync.h"

namespace metal {

// ---------------------------------------------------------------- type traits (<metal_type_traits>)
using std::integral_constant; using std::bool_constant; using std::true_type; using std::false_type;
using std::enable_if; using std::enable_if_t; using std::conditional; using std::conditional_t;
using std::is_same; using std::is_same_v; using std::is_convertible; using std::is_convertible_v;
using std::remove_cv; using std::remove_cv_t; using std::remove_const; using std::remove_const_t;
using std::remove_volatile; using std::remove_volatile_t; using std::remove_reference; using std::remove_reference_t;
using std::remove_pointer; using std::remove_pointer_t; using std::remove_extent; using std::remove_extent_t;
using std::add_const; using std::add_const_t; using std::add_pointer; using std::add_pointer_t;
using std::add_lvalue_reference; using std::add_lvalue_reference_t; using std::decay; using std::decay_t;
using std::is_pointer; using std::is_pointer_v; using std::is_reference; using std::is_reference_v;
using std::is_const; using std::is_const_v; using std::is_volatile; using std::is_volatile_v;
using std::is_void; using std::is_void_v; using std::is_class; using std::is_class_v; using std::is_enum;
using std::is_enum_v; using std::is_array; using std::is_array_v; using std::is_base_of; using std::is_base_of_v;
using std::is_empty; using std::is_empty_v; using std::is_trivially_copyable; using std::is_trivially_copyable_v;
using std::underlying_type; using std::underlying_type_t; using std::declval;
using std::extent; using std::extent_v; using std::rank; using std::rank_v; using std::is_function;
using std::is_function_v; using std::common_type; using std::common_type_t; using std::conjunction;
using std::disjunction; using std::negation; using std::void_t; using std::is_integral; using std::is_integral_v;
using std::is_unsigned; using std::is_unsigned_v; using std::is_constructible; using std::is_constructible_v;
using std::is_default_constructible; using std::is_default_constructible_v; using std::is_nothrow_constructible;
using std::integer_sequence; using std::make_integer_sequence; using std::index_sequence;
using std::make_index_sequence;
// half and bfloat are floating-point, arithmetic, signed scalar types in Metal
template <class T> struct is_floating_point : bool_constant<is_fp_v<std::remove_cv_t<T>>> {};
template <class T> constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T> struct is_arithmetic : bool_constant<std::is_arithmetic<std::remove_cv_t<T>>::value ||
                                                        is_floating_point<T>::value> {};
template <class T> constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T> struct is_signed : bool_constant<std::is_signed<std::remove_cv_t<T>>::value ||
                                                    is_floating_point<T>::value> {};
template <class T> constexpr bool is_signed_v = is_signed<T>::value;
template <class T> struct is_scalar : bool_constant<is_scalar_v<T>> {};
template <class T> struct is_vector : bool_constant<is_vec_v<T>> {};
template <class T> constexpr bool is_vector_v = is_vec_v<T>;
template <class T> struct vec_elements : integral_constant<int, (is_vec_v<T> ? vlen_v<T> : 1)> {};
template <class T> constexpr int vec_elements_v = vec_elements<T>::value;
template <class T> struct make_scalar { using type = std::conditional_t<is_vec_v<T>, elem_t<T>, T>; };
template <class T> using make_scalar_t = typename make_scalar<T>::type;
template <class T, int N> struct make_vector { using type = vec<make_scalar_t<T>, N>; };
template <class T, int N> using make_vector_t = typename make_vector<T, N>::type;
template <class T> struct make_signed : std::make_signed<T> {};
template <> struct make_signed<half> { using type = half; };
template <> struct make_signed<bfloat> { using type = bfloat; };
template <class T> using make_signed_t = typename make_signed<T>::type;
template <class T> struct make_unsigned : std::make_unsigned<T> {};
template <class T> using make_unsigned_t = typename make_unsigned<T>::type;

// ---------------------------------------------------------------- three-argument min/max (metal and fast/precise)
template <class A, class B, class D> inline auto fmax3(const A& a, const B& b, const D& c) { return fmax(fmax(a, b), c); }
template <class A, class B, class D> inline auto fmin3(const A& a, const B& b, const D& c) { return fmin(fmin(a, b), c); }
template <class A, class B, class D> inline auto fmedian3(const A& a, const B& b, const D& c) { return median3(a, b, c); }
namespace fast { using metal::fmax3; using metal::fmin3; using metal::fmedian3; using metal::max3; using metal::min3;
                 using metal::median3; using metal::exp10; }
namespace precise { using metal::fmax3; using metal::fmin3; using metal::fmedian3; using metal::max3;
                    using metal::min3; using metal::median3; }

// ---------------------------------------------------------------- metal::array
template <class T, size_t N> struct array {
  T _M_elems[N ? N : 1];
  constexpr size_t size() const { return N; }
  constexpr bool empty() const { return N == 0; }
  constexpr T& operator[](size_t i) { return _M_elems[i]; }
  constexpr const T& operator[](size_t i) const { return _M_elems[i]; }
  constexpr T& front() { return _M_elems[0]; }
  constexpr T& back() { return _M_elems[N - 1]; }
  constexpr T* data() { return _M_elems; }
  constexpr const T* data() const { return _M_elems; }
  constexpr T* begin() { return _M_elems; }
  constexpr T* end() { return _M_elems + N; }
  constexpr const T* begin() const { return _M_elems; }
  constexpr const T* end() const { return _M_elems + N; }
};
template <class T, size_t N> using array_ref_t = array<T, N>;

// ---------------------------------------------------------------- matrices: matrix<T, Cols, Rows> (floatCxR)
// Column-major as in Metal: m[c] is column c, a vec<T, Rows>.
template <class T, int C, int R> struct matrix {
  vec<T, R> columns[C];
  matrix() = default;
  constexpr explicit matrix(T diag) : columns{} { for (int c = 0; c < C; ++c) { columns[c] = vec<T, R>(T(0)); if (c < R) columns[c][c] = diag; } }
  template <class... V, std::enable_if_t<sizeof...(V) == C && (is_vec_v<V> && ...), int> = 0>
  constexpr matrix(const V&... cols) : columns{} { int i = 0; ((columns[i++] = vec<T, R>(as_vec(cols))), ...); }
  template <class... S, std::enable_if_t<sizeof...(S) == C * R && C * R != C && (is_scalar_v<S> && ...), int> = 0>
  constexpr matrix(const S&... s) : columns{} { T v[] = {T(s)...}; for (int i = 0; i < C * R; ++i) columns[i / R][i % R] = v[i]; }
  template <class U> constexpr explicit matrix(const matrix<U, C, R>& o) : columns{} {
    for (int c = 0; c < C; ++c) for (int r = 0; r < R; ++r) columns[c][r] = T(o.columns[c][r]);
  }
  constexpr vec<T, R>& operator[](int c) { return columns[c]; }
  constexpr const vec<T, R>& operator[](int c) const { return columns[c]; }
  matrix& operator+=(const matrix& o) { return *this = *this + o; }
  matrix& operator-=(const matrix& o) { return *this = *this - o; }
  template <class X> matrix& operator*=(const X& o) { return *this = *this * o; }
};
template <class T, int C, int R> inline matrix<T, C, R> operator+(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  matrix<T, C, R> m; for (int c = 0; c < C; ++c) m.columns[c] = a.columns[c] + b.columns[c]; return m;
}
template <class T, int C, int R> inline matrix<T, C, R> operator-(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  matrix<T, C, R> m; for (int c = 0; c < C; ++c) m.columns[c] = a.columns[c] - b.columns[c]; return m;
}
template <class T, int C, int R> inline matrix<T, C, R> operator-(const matrix<T, C, R>& a) {
  matrix<T, C, R> m; for (int c = 0; c < C; ++c) m.columns[c] = -a.columns[c]; return m;
}
template <class T, int C, int R, class S, std::enable_if_t<is_scalar_v<S>, int> = 0>
inline matrix<T, C, R> operator*(const matrix<T, C, R>& a, S s) {
  matrix<T, C, R> m; for (int c = 0; c < C; ++c) m.columns[c] = a.columns[c] * T(s); return m;
}
template <class T, int C, int R, class S, std::enable_if_t<is_scalar_v<S>, int> = 0>
inline matrix<T, C, R> operator*(S s, const matrix<T, C, R>& a) { return a * s; }
// matrix * column vector (C components) -> R components, accumulated in T as the GPU does
template <class T, int C, int R, class V, std::enable_if_t<is_vec_v<V>, int> = 0>
inline vec<T, R> operator*(const matrix<T, C, R>& a, const V& v) {
  static_assert(vlen_v<V> == C, "matrix * vector: the vector needs one component per matrix column");
  vec<T, R> r(T(0)); for (int c = 0; c < C; ++c) r = r + a.columns[c] * T(v[c]); return r;
}
// row vector (R components) * matrix -> C components
template <class T, int C, int R, class V, std::enable_if_t<is_vec_v<V>, int> = 0>
inline vec<T, C> operator*(const V& v, const matrix<T, C, R>& a) {
  static_assert(vlen_v<V> == R, "vector * matrix: the vector needs one component per matrix row");
  vec<T, C> r; for (int c = 0; c < C; ++c) r[c] = dot(vec<T, R>(as_vec(v)), a.columns[c]); return r;
}
template <class T, int C, int R, int K>
inline matrix<T, C, R> operator*(const matrix<T, K, R>& a, const matrix<T, C, K>& b) {
  matrix<T, C, R> m; for (int c = 0; c < C; ++c) m.columns[c] = a * b.columns[c]; return m;
}
template <class T, int C, int R> inline matrix<T, R, C> transpose(const matrix<T, C, R>& a) {
  matrix<T, R, C> m; for (int c = 0; c < C; ++c) for (int r = 0; r < R; ++r) m.columns[r][c] = a.columns[c][r]; return m;
}
template <class T> inline T determinant(const matrix<T, 2, 2>& m) { return m[0][0] * m[1][1] - m[1][0] * m[0][1]; }
template <class T> inline T determinant(const matrix<T, 3, 3>& m) { return dot(m[0], cross(m[1], m[2])); }
#define MA_MAT_NAMES(T, name) \
  typedef matrix<T, 2, 2> name##2x2; typedef matrix<T, 2, 3> name##2x3; typedef matrix<T, 2, 4> name##2x4; \
  typedef matrix<T, 3, 2> name##3x2; typedef matrix<T, 3, 3> name##3x3; typedef matrix<T, 3, 4> name##3x4; \
  typedef matrix<T, 4, 2> name##4x2; typedef matrix<T, 4, 3> name##4x3; typedef matrix<T, 4, 4> name##4x4;
MA_MAT_NAMES(float, float) MA_MAT_NAMES(half, half) MA_MAT_NAMES(bfloat, bfloat)
#undef MA_MAT_NAMES

// ---------------------------------------------------------------- simd_shuffle_and_fill_up / _down
namespace ma_simd {
template <class T> struct FillPair { T data, fill; };
// lane i of each `modulo`-wide segment reads data from lane i -/+ delta of its segment, or, past the
// segment's edge, filling_data from the lane as far from the other edge
template <bool Up, int W = 32> struct ShuffleFill {  // W: 32 for SIMD-groups, 4 for quads
  template <class P> static void run(Group* g, int base, uint32_t mask) {
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      int64_t a = g->slot[base + l].arg;
      int delta = int(a & 0xffff), mod = int(a >> 16);
      if (mod < 1 || mod > W) mod = W;
      int seg = l - l % mod, i = l % mod, s = Up ? i - delta : i + delta;
      bool fill = Up ? s < 0 : s >= mod;
      int src = seg + (fill ? (Up ? s + mod : s - mod) : s);
      if (src < 0 || src >= 32 || !(mask >> src & 1u)) { poison(g, base + l); continue; }
      P p = in<P>(g, base + src);
      if (fill) p.data = p.fill;
      out(g, base + l, p);
    }
  }
};
}  // namespace ma_simd
// the call site of the fill shuffles: a type of its own, which no int argument converts to (an int `site_` would
// take a modulo given as int as the site, and make a uint modulo ambiguous); delta and modulo are ushort in Metal
struct ma_fill_site { int line; explicit ma_fill_site(int l) : line(l) {} };
#define MA_FILL(name, up, W)                                                                       \
  template <class T> inline T name(const T& data, const T& filling, ushort delta, ushort modulo,   \
                                   ma_fill_site site_ = ma_fill_site(__builtin_LINE())) {          \
    using V = std::conditional_t<is_vec_v<T>, vec<elem_t<T>, vlen_v<T>>, T>;                       \
    using P = ma_simd::FillPair<V>;                                                                \
    P p = ma_simd::collective<P, ma_simd::ShuffleFill<up, W>>(P{V(data), V(filling)},              \
                                                             int64_t(delta) | int64_t(modulo) << 16, site_.line); \
    return T(p.data);                                                                              \
  }                                                                                                \
  template <class T> inline T name(const T& data, const T& filling, ushort delta,                  \
                                   ma_fill_site site_ = ma_fill_site(__builtin_LINE())) {          \
    return name(data, filling, delta, ushort(W), site_);                                           \
  }
MA_FILL(simd_shuffle_and_fill_down, false, 32)
MA_FILL(simd_shuffle_and_fill_up, true, 32)
MA_FILL(quad_shuffle_and_fill_down, false, 4)
MA_FILL(quad_shuffle_and_fill_up, true, 4)
#undef MA_FILL

}  // namespace metal

// ---------------------------------------------------------------- Metal's __metal_* builtins
// The real <metal_stdlib> implements its functions with compiler builtins (__metal_exp(x, fast_flag),
// __metal_simd_sum(x), ...) that code bases call when they add overloads of their own (e.g. for a
// bfloat type). Each forwards to the emulator's function; the fast-math flag is ignored (see math.h).
#define __METAL_MAYBE_FAST_MATH__ false
#define __METAL_FAST_MATH__ true
#define __METAL_PRECISE_MATH__ false
#define MA_B1(n) template <class A, class... F> inline auto __metal_##n(const A& a, F...) { return metal::n(a); }
#define MA_B2(n) template <class A, class B, class... F> inline auto __metal_##n(const A& a, const B& b, F...) { return metal::n(a, b); }
#define MA_B3(n, f) template <class A, class B, class D, class... F> inline auto __metal_##n(const A& a, const B& b, const D& c, F...) { return metal::f(a, b, c); }
MA_B1(fabs) MA_B1(abs) MA_B1(acos) MA_B1(acosh) MA_B1(asin) MA_B1(asinh) MA_B1(atan) MA_B1(atanh) MA_B1(ceil)
MA_B1(cos) MA_B1(cosh) MA_B1(cospi) MA_B1(exp) MA_B1(exp10) MA_B1(exp2) MA_B1(floor) MA_B1(fract) MA_B1(log)
MA_B1(log10) MA_B1(log2) MA_B1(rint) MA_B1(round) MA_B1(rsqrt) MA_B1(sin) MA_B1(sinh) MA_B1(sinpi) MA_B1(sqrt)
MA_B1(tan) MA_B1(tanh) MA_B1(tanpi) MA_B1(trunc) MA_B1(isnan) MA_B1(isinf) MA_B1(isfinite) MA_B1(signbit)
MA_B1(saturate) MA_B1(sign) MA_B1(popcount) MA_B1(clz) MA_B1(ctz) MA_B1(cbrt)
MA_B2(atan2) MA_B2(divide) MA_B2(fmax) MA_B2(fmin) MA_B2(fmod) MA_B2(pow) MA_B2(powr) MA_B2(nextafter)
MA_B2(copysign) MA_B2(fdim) MA_B2(max) MA_B2(min) MA_B2(hypot) MA_B2(step)
MA_B3(fma, fma) MA_B3(fmax3, fmax3) MA_B3(fmin3, fmin3) MA_B3(fmedian3, fmedian3) MA_B3(max3, max3)
MA_B3(min3, min3) MA_B3(median3, median3) MA_B3(clamp, clamp) MA_B3(mix, mix) MA_B3(select, select)
#undef MA_B1
#undef MA_B2
#undef MA_B3
template <class A, class... F> inline auto __metal_ldexp(const A& a, int k, F...) { return metal::ldexp(a, k); }
template <class A> inline auto __metal_frexp(const A& a, int* e) { return metal::frexp(a, *e); }
template <class T> inline metal::ushort __metal_get_simdgroup_size(T) { return metal::ushort(ma_rt::kSimdWidth); }
#define MA_BS(n) template <class T> inline auto __metal_##n(const T& x, int site_ = __builtin_LINE()) { return metal::n(x, site_); }
#define MA_BS_ARG(n) template <class T, class A> inline auto __metal_##n(const T& x, A a, int site_ = __builtin_LINE()) { return metal::n(x, a, site_); }
MA_BS(simd_sum) MA_BS(simd_product) MA_BS(simd_min) MA_BS(simd_max) MA_BS(simd_and) MA_BS(simd_or) MA_BS(simd_xor)
MA_BS(simd_prefix_inclusive_sum) MA_BS(simd_prefix_exclusive_sum) MA_BS(simd_prefix_inclusive_product)
MA_BS(simd_prefix_exclusive_product) MA_BS(simd_broadcast_first) MA_BS(quad_sum) MA_BS(quad_max) MA_BS(quad_min)
MA_BS_ARG(simd_shuffle) MA_BS_ARG(simd_broadcast) MA_BS_ARG(simd_shuffle_down) MA_BS_ARG(simd_shuffle_up)
MA_BS_ARG(simd_shuffle_xor) MA_BS_ARG(simd_shuffle_rotate_down) MA_BS_ARG(simd_shuffle_rotate_up)
MA_BS_ARG(quad_shuffle) MA_BS_ARG(quad_shuffle_down) MA_BS_ARG(quad_shuffle_up) MA_BS_ARG(quad_shuffle_xor)
MA_BS_ARG(quad_broadcast)
#undef MA_BS
#undef MA_BS_ARG
template <class T> inline T __metal_simd_shuffle_and_fill_down(const T& d, const T& f, metal::ushort delta,
                                                                metal::ushort mod, int site_ = __builtin_LINE()) {
  return metal::simd_shuffle_and_fill_down(d, f, delta, mod, site_);
}
template <class T> inline T __metal_simd_shuffle_and_fill_up(const T& d, const T& f, metal::ushort delta,
                                                              metal::ushort mod, int site_ = __builtin_LINE()) {
  return metal::simd_shuffle_and_fill_up(d, f, delta, mod, site_);
}

// ---------------------------------------------------------------- launcher helpers
namespace ma_rt {
// the type of parameter I of a kernel function (for kernels instantiated from templates)
template <int I, class F> struct param;
template <int I, class R, class... A> struct param<I, R (*)(A...)> { using type = std::tuple_element_t<I, std::tuple<A...>>; };
template <int I, class F> using param_t = typename param<I, F>::type;
// a function constant compiled without a value: reading it fails the launch, naming it
template <class T> struct UndefinedConstant {
  const char* name;
  int index;
  operator T() const {
    fail("function constant '%s' ([[function_constant(%d)]]) is read but has no value: compile the source with "
         "function_constants={'%s': ...}", name, index, name);
    return T();
  }
};
// `threadgroup T x[N] = {0};`: zeroed by the first thread of each threadgroup to reach it
// (not instrumented: the zeros are the declaration's, not a store of one thread that others would race with)
MA_NOSAN inline void tg_note_zero(void* p, size_t bytes, const char* name = "", size_t esize = 1) {
  for (int i = 0; i < tl_tg.n; ++i) if (tl_tg.p[i] == p) return;
  tg_note(p, bytes, name, esize);
  std::memset(p, 0, bytes);
}
// a [[threadgroup(n)]] kernel parameter: BYTES of threadgroup memory (sized at launch), one block per OS
// thread (a threadgroup runs on one), poisoned and counted like threadgroup variables
// (plain thread-local pointers, no thread_local object: its constructor would run instrumented, shadow.h)
template <class P> MA_NOSAN inline P tg_param(int slot, uint64_t bytes) {
  static thread_local void* bufs[32];
  static thread_local size_t caps[32];
  int i = slot & 31;
  size_t need = size_t((bytes + 15) / 16 * 16);
  if (need == 0) need = 16;
  if (caps[i] < need) {
    std::free(bufs[i]);
    bufs[i] = std::aligned_alloc(16, need);
    caps[i] = bufs[i] ? need : 0;
    if (!bufs[i]) fail("cannot allocate %zu bytes of threadgroup memory", need);
  }
  if (bytes) tg_note(bufs[i], size_t(bytes));
  return reinterpret_cast<P>(bufs[i]);
}
}  // namespace ma_rt
