// MSL emulator: math, common, geometric, relational and integer functions (metal::, fast::, precise::).
// Floating functions compute in float (double for double) and round to the argument type, so half and
// bfloat results are correctly rounded; fast:: and precise:: variants compute the same precise value.
#pragma once
#include "vec_ops.h"

namespace metal {

#define MA_FP_SCALAR(T) template <class T, std::enable_if_t<is_fp_v<T>, int> = 0>
#define MA_FP_VEC(V) template <class V, std::enable_if_t<is_vec_v<V> && is_fp_v<elem_t<V>>, int> = 0>

// ---------------------------------------------------------------- unary floating functions
// sin(pi x) with the argument reduced exactly (x - 2k and 1 - r are exact in double for any float or half x):
// multiplying by pi first would round away the period of large arguments; integers give zeros of x's sign
inline double ma_sinpi(double x) {
  if (!std::isfinite(x)) return std::numeric_limits<double>::quiet_NaN();
  double r = std::fmod(x, 2.0);
  if (r > 1) r -= 2; else if (r < -1) r += 2;
  if (r > 0.5) r = 1 - r; else if (r < -0.5) r = -1 - r;
  return r == 0 ? std::copysign(0.0, x) : std::sin(3.14159265358979323846 * r);
}
inline double ma_cospi(double x) {  // cos(pi x) = sin(pi (|x| + 1/2)), exact in double; +0 at half-integers
  if (!std::isfinite(x)) return std::numeric_limits<double>::quiet_NaN();
  double s = ma_sinpi(std::fabs(x) + 0.5);
  return s == 0 ? 0.0 : s;
}
// the largest value of T below 1 (fract's bound: x - floor(x) of a tiny negative x rounds up to 1 otherwise)
template <class T> constexpr double ma_below_one() {
  constexpr int digits = sizeof(T) >= 8 ? 53 : (sizeof(T) == 4 ? 24 : (std::is_same<std::remove_cv_t<T>, bfloat>::value ? 8 : 11));
  double e = 1; for (int i = 0; i < digits; ++i) e /= 2;
  return 1 - e;
}
#define MA_F1(name, ...)                                                                         \
  MA_FP_SCALAR(T) inline T name(T x_) { using C = fcalc_t<T>; C x = C(x_); (void)x; return T(__VA_ARGS__); } \
  MA_FP_VEC(V) inline vec<elem_t<V>, vlen_v<V>> name(const V& v) {                                \
    vec<elem_t<V>, vlen_v<V>> r;                                                                  \
    for (int i = 0; i < vlen_v<V>; ++i) r.d[i] = name(elem_t<V>(v[i]));                           \
    return r;                                                                                     \
  }
MA_F1(exp, std::exp(x)) MA_F1(exp2, std::exp2(x)) MA_F1(exp10, std::pow(C(10), x))
MA_F1(log, std::log(x)) MA_F1(log2, std::log2(x)) MA_F1(log10, std::log10(x))
MA_F1(sqrt, std::sqrt(x)) MA_F1(rsqrt, C(1) / std::sqrt(x)) MA_F1(cbrt, std::cbrt(x))
MA_F1(sin, std::sin(x)) MA_F1(cos, std::cos(x)) MA_F1(tan, std::tan(x))
MA_F1(asin, std::asin(x)) MA_F1(acos, std::acos(x)) MA_F1(atan, std::atan(x))
MA_F1(sinh, std::sinh(x)) MA_F1(cosh, std::cosh(x)) MA_F1(tanh, std::tanh(x))
MA_F1(asinh, std::asinh(x)) MA_F1(acosh, std::acosh(x)) MA_F1(atanh, std::atanh(x))
MA_F1(sinpi, C(ma_sinpi(double(x)))) MA_F1(cospi, C(ma_cospi(double(x))))
MA_F1(tanpi, C(ma_sinpi(double(x)) / ma_cospi(double(x))))
MA_F1(floor, std::floor(x)) MA_F1(ceil, std::ceil(x)) MA_F1(round, std::round(x))
MA_F1(rint, std::nearbyint(x)) MA_F1(trunc, std::trunc(x)) MA_F1(fabs, std::fabs(x))
MA_F1(fract, std::fmin(x - std::floor(x), C(ma_below_one<T>())))
MA_F1(recip, C(1) / x)
MA_F1(saturate, std::fmin(std::fmax(x, C(0)), C(1)))
MA_F1(sign, x > C(0) ? C(1) : (x < C(0) ? C(-1) : (x == C(0) ? x : C(0))))
#undef MA_F1

// ---------------------------------------------------------------- n-ary floating functions (broadcasting)
#define MA_F2(name, ...)                                                                         \
  template <class A, class B, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_fp_v<calc_t<A, B>>, int> = 0> \
  inline auto name(const A& a, const B& b) {                                                      \
    using T = calc_t<A, B>;                                                                       \
    return ma_map([](T x_, T y_) { using C = fcalc_t<T>; C x = C(x_), y = C(y_); return T(__VA_ARGS__); }, a, b); \
  }
MA_F2(pow, std::pow(x, y)) MA_F2(powr, std::pow(x, y)) MA_F2(atan2, std::atan2(x, y))
MA_F2(fmod, std::fmod(x, y)) MA_F2(fdim, std::fdim(x, y)) MA_F2(copysign, std::copysign(x, y))
MA_F2(fmin, std::fmin(x, y)) MA_F2(fmax, std::fmax(x, y)) MA_F2(nextafter, std::nextafter(x, y))
MA_F2(divide, x / y) MA_F2(step, y < x ? C(0) : C(1)) MA_F2(hypot, std::hypot(x, y))
#undef MA_F2

#define MA_F3(name, ...)                                                                         \
  template <class A, class B, class D,                                                            \
            std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_operand_v<D> && is_fp_v<calc_t<A, B, D>>, int> = 0> \
  inline auto name(const A& a, const B& b, const D& c) {                                          \
    using T = calc_t<A, B, D>;                                                                    \
    return ma_map([](T x_, T y_, T z_) { using C = fcalc_t<T>; C x = C(x_), y = C(y_), z = C(z_); return T(__VA_ARGS__); }, a, b, c); \
  }
MA_F3(fma, std::fma(x, y, z)) MA_F3(mad, x * y + z) MA_F3(mix, x + (y - x) * z)
MA_F3(smoothstep, [&] { C t = std::fmin(std::fmax((z - x) / (y - x), C(0)), C(1)); return t * t * (C(3) - C(2) * t); }())
#undef MA_F3

// ---------------------------------------------------------------- min / max / clamp / abs (all scalar types)
// for floating types these follow fmin/fmax: a NaN operand yields the other operand
template <class T> inline T ma_max(T x, T y) {
  if constexpr (is_fp_v<T>) return T(std::fmax(fcalc_t<T>(x), fcalc_t<T>(y))); else return x < y ? y : x;
}
template <class T> inline T ma_min(T x, T y) {
  if constexpr (is_fp_v<T>) return T(std::fmin(fcalc_t<T>(x), fcalc_t<T>(y))); else return y < x ? y : x;
}
template <class A, class B, std::enable_if_t<is_operand_v<A> && is_operand_v<B>, int> = 0>
inline auto max(const A& a, const B& b) { using T = calc_t<A, B>; return ma_map([](T x, T y) { return ma_max<T>(x, y); }, a, b); }
template <class A, class B, std::enable_if_t<is_operand_v<A> && is_operand_v<B>, int> = 0>
inline auto min(const A& a, const B& b) { using T = calc_t<A, B>; return ma_map([](T x, T y) { return ma_min<T>(x, y); }, a, b); }
template <class A, class B, class D, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_operand_v<D>, int> = 0>
inline auto clamp(const A& a, const B& lo, const D& hi) {
  using T = calc_t<A, B, D>;
  return ma_map([](T x, T l, T h) { return ma_min<T>(ma_max<T>(x, l), h); }, a, lo, hi);
}
template <class A, class B, class D, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_operand_v<D>, int> = 0>
inline auto max3(const A& a, const B& b, const D& c) { return max(max(a, b), c); }
template <class A, class B, class D, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_operand_v<D>, int> = 0>
inline auto min3(const A& a, const B& b, const D& c) { return min(min(a, b), c); }
template <class A, class B, class D, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_operand_v<D>, int> = 0>
inline auto median3(const A& a, const B& b, const D& c) { return max(min(a, b), min(max(a, b), c)); }
template <class A, std::enable_if_t<is_operand_v<A>, int> = 0>
inline auto abs(const A& a) {
  using T = calc_t<A>;
  return ma_map([](T x) -> T { if constexpr (is_fp_v<T>) return T(std::fabs(fcalc_t<T>(x))); else return x < 0 ? T(-x) : x; }, a);
}

// ---------------------------------------------------------------- out-parameter functions
template <class T, std::enable_if_t<is_fp_v<T>, int> = 0> inline T sincos(T x, T& c) {
  c = T(std::cos(fcalc_t<T>(x))); return T(std::sin(fcalc_t<T>(x)));
}
template <class T, int N> inline vec<T, N> sincos(const vec<T, N>& x, vec<T, N>& c) {
  vec<T, N> s; for (int i = 0; i < N; ++i) s.d[i] = sincos(x.d[i], c.d[i]); return s;
}
template <class T, std::enable_if_t<is_fp_v<T>, int> = 0> inline T frexp(T x, int& e) { return T(std::frexp(fcalc_t<T>(x), &e)); }
template <class T, int N> inline vec<T, N> frexp(const vec<T, N>& x, vec<int, N>& e) {
  vec<T, N> r; for (int i = 0; i < N; ++i) r.d[i] = frexp(x.d[i], e.d[i]); return r;
}
template <class T, std::enable_if_t<is_fp_v<T>, int> = 0> inline T modf(T x, T& ip) {
  fcalc_t<T> i; fcalc_t<T> f = std::modf(fcalc_t<T>(x), &i); ip = T(i); return T(f);
}
template <class T, int N> inline vec<T, N> modf(const vec<T, N>& x, vec<T, N>& ip) {
  vec<T, N> r; for (int i = 0; i < N; ++i) r.d[i] = modf(x.d[i], ip.d[i]); return r;
}
template <class A, class B, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_fp_v<calc_t<A>>, int> = 0>
inline auto ldexp(const A& a, const B& k) {
  using T = calc_t<A>;
  return ma_map([](T x, int e) { return T(std::ldexp(fcalc_t<T>(x), e)); }, a, k);
}

// ---------------------------------------------------------------- relational
#define MA_REL(name, ...)                                                                        \
  template <class A, std::enable_if_t<is_operand_v<A> && is_fp_v<calc_t<A>>, int> = 0>            \
  inline auto name(const A& a) { using T = calc_t<A>; return ma_map([](T x_) -> bool { fcalc_t<T> x = fcalc_t<T>(x_); return __VA_ARGS__; }, a); }
MA_REL(isnan, std::isnan(x)) MA_REL(isinf, std::isinf(x)) MA_REL(isfinite, std::isfinite(x))
MA_REL(isnormal, std::isnormal(x)) MA_REL(signbit, std::signbit(x))
#undef MA_REL
template <class A, class B, std::enable_if_t<is_operand_v<A> && is_operand_v<B>, int> = 0>
inline auto isunordered(const A& a, const B& b) { using T = calc_t<A, B>; return ma_map([](T x, T y) -> bool { return x != x || y != y; }, a, b); }
template <class A, class B, std::enable_if_t<is_operand_v<A> && is_operand_v<B>, int> = 0>
inline auto isordered(const A& a, const B& b) { using T = calc_t<A, B>; return ma_map([](T x, T y) -> bool { return x == x && y == y; }, a, b); }
inline bool all(bool b) { return b; }
inline bool any(bool b) { return b; }
template <class A, std::enable_if_t<is_vec_v<A>, int> = 0> inline bool all(const A& v) {
  for (int i = 0; i < vlen_v<A>; ++i) if (!v[i]) return false; return true;
}
template <class A, std::enable_if_t<is_vec_v<A>, int> = 0> inline bool any(const A& v) {
  for (int i = 0; i < vlen_v<A>; ++i) if (v[i]) return true; return false;
}
// select(a, b, c): c ? b : a, component-wise when c is a vector
template <class A, class B, class C, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_operand_v<C>, int> = 0>
inline auto select(const A& a, const B& b, const C& c) {
  using T = calc_t<A, B>;
  return ma_map([](T x, T y, bool s) { return s ? y : x; }, a, b, c);
}

// ---------------------------------------------------------------- geometric
template <class A, class B, std::enable_if_t<is_vec_v<A> && is_vec_v<B>, int> = 0>
inline elem_t<A> dot(const A& a, const B& b) {
  static_assert(vlen_v<A> == vlen_v<B>, "dot: vectors of different lengths");
  using C = fcalc_t<elem_t<A>>; C s = 0;
  for (int i = 0; i < vlen_v<A>; ++i) s += C(a[i]) * C(b[i]);
  return elem_t<A>(s);
}
template <class A, class B, std::enable_if_t<is_vec_v<A> && is_vec_v<B>, int> = 0>
inline vec<elem_t<A>, 3> cross(const A& a, const B& b) {
  using T = elem_t<A>;
  return vec<T, 3>(T(a[1] * b[2] - a[2] * b[1]), T(a[2] * b[0] - a[0] * b[2]), T(a[0] * b[1] - a[1] * b[0]));
}
template <class A, std::enable_if_t<is_vec_v<A>, int> = 0> inline elem_t<A> length_squared(const A& a) { return dot(a, a); }
template <class A, std::enable_if_t<is_vec_v<A>, int> = 0> inline elem_t<A> length(const A& a) {
  using C = fcalc_t<elem_t<A>>; C s = 0;
  for (int i = 0; i < vlen_v<A>; ++i) s += C(a[i]) * C(a[i]);
  return elem_t<A>(std::sqrt(s));
}
MA_FP_SCALAR(T) inline T length(T x) { return abs(x); }
template <class A, class B, std::enable_if_t<is_vec_v<A>, int> = 0> inline elem_t<A> distance(const A& a, const B& b) { return length(a - b); }
template <class A, class B, std::enable_if_t<is_vec_v<A>, int> = 0> inline elem_t<A> distance_squared(const A& a, const B& b) { return length_squared(a - b); }
template <class A, std::enable_if_t<is_vec_v<A>, int> = 0> inline vec<elem_t<A>, vlen_v<A>> normalize(const A& a) {
  using C = fcalc_t<elem_t<A>>; C s = 0;
  for (int i = 0; i < vlen_v<A>; ++i) s += C(a[i]) * C(a[i]);
  C inv = C(1) / std::sqrt(s);
  vec<elem_t<A>, vlen_v<A>> r; for (int i = 0; i < vlen_v<A>; ++i) r.d[i] = elem_t<A>(C(a[i]) * inv);
  return r;
}
template <class A, class B> inline auto reflect(const A& i, const B& n) { return i - n * (dot(n, i) * elem_t<A>(2)); }
// refract(i, n, eta): the refraction of incident I at a surface of normal N (both normalized), 0 on total reflection
template <class A, class B, class E> inline auto refract(const A& i, const B& n, E eta) {
  using T = elem_t<A>; using C = fcalc_t<T>;
  C d = C(dot(n, i)), e = C(eta), k = C(1) - e * e * (C(1) - d * d);
  vec<T, vlen_v<A>> r;
  for (int c = 0; c < vlen_v<A>; ++c) r.d[c] = k < C(0) ? T(0) : T(e * C(i[c]) - (e * d + std::sqrt(k)) * C(n[c]));
  return r;
}
template <class A, class B, class C> inline auto faceforward(const A& n, const B& i, const C& nref) {
  return dot(nref, i) < elem_t<A>(0) ? as_vec(n) : -as_vec(n);
}

// ---------------------------------------------------------------- integer functions
template <class T> inline T ma_saturate(__int128 v) {
  return v > __int128(std::numeric_limits<T>::max()) ? std::numeric_limits<T>::max()
       : (v < __int128(std::numeric_limits<T>::min()) ? std::numeric_limits<T>::min() : T(v));
}
#define MA_I1(name, ...)                                                                         \
  template <class A, std::enable_if_t<is_operand_v<A> && is_int_v<calc_t<A>>, int> = 0>           \
  inline auto name(const A& a) {                                                                  \
    using T = calc_t<A>; using U = std::make_unsigned_t<T>;                                       \
    return ma_map([](T x) -> T { U u = U(x); (void)u; return T(__VA_ARGS__); }, a);                      \
  }
MA_I1(popcount, __builtin_popcountll((unsigned long long)u))
MA_I1(clz, u == 0 ? int(sizeof(T) * 8) : __builtin_clzll((unsigned long long)u) - int(64 - sizeof(T) * 8))
MA_I1(ctz, u == 0 ? int(sizeof(T) * 8) : __builtin_ctzll((unsigned long long)u))
MA_I1(reverse_bits, [&] { U r = 0; for (unsigned i = 0; i < sizeof(T) * 8; ++i) if (u >> i & 1) r |= U(U(1) << (sizeof(T) * 8 - 1 - i)); return r; }())
#undef MA_I1
#define MA_I2(name, ...)                                                                         \
  template <class A, class B, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_int_v<calc_t<A, B>>, int> = 0> \
  inline auto name(const A& a, const B& b) {                                                      \
    using T = calc_t<A, B>;                                                                       \
    return ma_map([](T x, T y) -> T { using W = std::conditional_t<std::is_signed<T>::value, __int128, unsigned __int128>; \
                                      using S = __int128; (void)sizeof(W); (void)sizeof(S); return T(__VA_ARGS__); }, a, b); \
  }
// T f(T, T) in T itself (uchar + uchar saturates at 255, not in int); sums and differences in a signed
// 128-bit type, where no value of a 64-bit T wraps
MA_I2(addsat, ma_saturate<T>(S(x) + S(y)))
MA_I2(subsat, ma_saturate<T>(S(x) - S(y)))
MA_I2(hadd, (W(x) + W(y)) >> 1) MA_I2(rhadd, (W(x) + W(y) + 1) >> 1)
MA_I2(mulhi, (W(x) * W(y)) >> (sizeof(T) * 8))
MA_I2(mul24, x * y)
MA_I2(rotate, [&] { using U = std::make_unsigned_t<T>; unsigned n = sizeof(T) * 8, s = unsigned(y) % n;
                    U u = U(x); return T(s ? U(u << s | u >> (n - s)) : u); }())
#undef MA_I2
// absdiff returns the unsigned type of its arguments (|INT_MIN - INT_MAX| is 0xFFFFFFFF)
template <class A, class B, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_int_v<calc_t<A, B>>, int> = 0>
inline auto absdiff(const A& a, const B& b) {
  using T = calc_t<A, B>; using U = std::make_unsigned_t<T>;
  return ma_map([](T x, T y) -> U { return x > y ? U(U(x) - U(y)) : U(U(y) - U(x)); }, a, b);
}
// madhi(a, b, c) = mulhi(a, b) + c; madsat(a, b, c) = a * b + c, saturated to T
template <class A, class B, class D, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_operand_v<D> && is_int_v<calc_t<A, B, D>>, int> = 0>
inline auto madhi(const A& a, const B& b, const D& c) {
  using T = calc_t<A, B, D>;
  return ma_map([](T x, T y, T z) -> T { return T(mulhi(x, y) + z); }, a, b, c);
}
template <class A, class B, class D, std::enable_if_t<is_operand_v<A> && is_operand_v<B> && is_operand_v<D> && is_int_v<calc_t<A, B, D>>, int> = 0>
inline auto madsat(const A& a, const B& b, const D& c) {
  using T = calc_t<A, B, D>;
  return ma_map([](T x, T y, T z) -> T {
    using W = std::conditional_t<std::is_signed<T>::value, __int128, unsigned __int128>;
    if constexpr (sizeof(T) < 8) return ma_saturate<T>(__int128(x) * __int128(y) + __int128(z));
    else {  // a 64-bit product may not fit 128 bits with its sign: saturate the product first
      W p; bool over = __builtin_mul_overflow(W(x), W(y), &p);
      __int128 lo = __int128(std::numeric_limits<T>::min()), hi = __int128(std::numeric_limits<T>::max());
      if (!over && __int128(p) >= lo && __int128(p) <= hi) return ma_saturate<T>(__int128(p) + __int128(z));
      bool negative = std::is_signed<T>::value && ((x < 0) != (y < 0));
      return negative ? std::numeric_limits<T>::min() : std::numeric_limits<T>::max();
    }
  }, a, b, c);
}
template <class A, class B, class C> inline auto mad24(const A& a, const B& b, const C& c) { return a * b + c; }
template <class T, std::enable_if_t<is_int_v<T>, int> = 0> inline T extract_bits(T x, uint offset, uint bits) {
  using U = std::make_unsigned_t<T>; constexpr uint n = sizeof(T) * 8;
  if (bits == 0) return T(0);
  U v = U(U(x) << (n - offset - bits));
  if constexpr (std::is_signed<T>::value) return T(T(v) >> (n - bits)); else return T(v >> (n - bits));
}
template <class T, std::enable_if_t<is_int_v<T>, int> = 0> inline T insert_bits(T base, T insert, uint offset, uint bits) {
  using U = std::make_unsigned_t<T>;
  if (bits == 0) return base;
  U mask = U(bits >= sizeof(T) * 8 ? ~U(0) : U((U(1) << bits) - 1)) << offset;
  return T((U(base) & ~mask) | ((U(insert) << offset) & mask));
}

// ---------------------------------------------------------------- reinterpretation
template <class To, class From> inline To as_type(const From& x) {
  static_assert(sizeof(To) == sizeof(From), "as_type: source and destination must have the same size");
  To r; std::memcpy((void*)&r, (const void*)&x, sizeof(To)); return r;
}

// fast:: and precise:: name the same functions through using-declarations (not a using-directive),
// so that a source's own overloads added to either namespace (e.g. for bfloat) join them in
// overload resolution instead of hiding them: precise::exp(float) stays a float function.
#define MA_MATH_NAMES \
using metal::exp; using metal::exp2; using metal::exp10; using metal::log; using metal::log2; using metal::log10; \
using metal::sqrt; using metal::rsqrt; using metal::sin; using metal::cos; using metal::tan; using metal::asin; \
using metal::acos; using metal::atan; using metal::atan2; using metal::sinh; using metal::cosh; using metal::tanh; \
using metal::asinh; using metal::acosh; using metal::atanh; using metal::sinpi; using metal::cospi; using metal::tanpi; \
using metal::pow; using metal::powr; using metal::floor; using metal::ceil; using metal::round; using metal::rint; \
using metal::trunc; using metal::fract; using metal::fabs; using metal::abs; using metal::fmin; using metal::fmax; \
using metal::min; using metal::max; using metal::clamp; using metal::saturate; using metal::fmod; using metal::divide; \
using metal::sincos; using metal::length; using metal::normalize; using metal::distance; using metal::dot; \
using metal::copysign; using metal::fdim; using metal::frexp; using metal::ldexp; using metal::modf; using metal::cbrt; \
using metal::recip; using metal::hypot; using metal::sign; using metal::mix; using metal::fma;
namespace fast { MA_MATH_NAMES }
namespace precise { MA_MATH_NAMES }
#undef MA_MATH_NAMES

#undef MA_FP_SCALAR
#undef MA_FP_VEC
}  // namespace metal
