// MSL emulator: vector types vec<T,N> (float4, half2, uint3, ...) with swizzles, and packed vectors.
#pragma once
#include "types.h"
#include "swizzle.h"

namespace metal {

template <class T, int N> struct vec;
template <class T, int S, int... I> struct swz;

// ---------------------------------------------------------------- floating -> integer conversions
// MSL spec 2.14: static_cast converts "with no saturation", rounding toward zero: a NaN, an infinity or a value
// outside the integer type's range has no defined result (x86 gives INT_MIN, a GPU may saturate). The emulator
// stops the thread instead (ma_rt::float_cast_error, conversions.h). LINE is the kernel's line, or 0.
template <class F> constexpr bool ma_is_float_v = std::is_floating_point<F>::value || std::is_same<F, _Float16>::value ||
                                                  std::is_same<F, bfloat>::value;
template <class To, class F> constexpr bool ma_fits(const F& f) {
  if constexpr (std::is_integral<To>::value && !std::is_same<To, bool>::value && ma_is_float_v<F>) {
    const long double d = (long double)(float)f;
    return d > (long double)std::numeric_limits<To>::min() - 1.0L && d < (long double)std::numeric_limits<To>::max() + 1.0L;
  } else {
    return true;
  }
}
}  // namespace metal
namespace ma_rt { [[noreturn]] void float_cast_error(double v, const char* from, const char* to, int line); }
namespace metal {
template <class To> constexpr const char* ma_type_name() {
  if constexpr (std::is_same<To, bool>::value) return "bool";
  else if constexpr (sizeof(To) == 1) return std::is_signed<To>::value ? "char" : "uchar";
  else if constexpr (sizeof(To) == 2) return std::is_signed<To>::value ? "short" : "ushort";
  else if constexpr (sizeof(To) == 4) return std::is_signed<To>::value ? "int" : "uint";
  else return std::is_signed<To>::value ? "long" : "ulong";
}
template <class To, class F> constexpr To ma_convert(const F& f, int line) {
  if (!ma_fits<To>(f))
    ma_rt::float_cast_error(double((float)f), std::is_same<F, float>::value ? "float" : (std::is_same<F, bfloat>::value ? "bfloat" : "half"),
                            ma_type_name<To>(), line);
  return To(f);
}
template <class T, int N> struct packed_vec;

// ---------------------------------------------------------------- traits: scalars n=0
template <class X> struct vtraits { static constexpr int n = 0; using elem = X; };
template <class T, int N> struct vtraits<vec<T, N>> { static constexpr int n = N; using elem = T; };
template <class T, int S, int... I> struct vtraits<swz<T, S, I...>> { static constexpr int n = sizeof...(I); using elem = T; };
template <class T, int N> struct vtraits<packed_vec<T, N>> { static constexpr int n = N; using elem = T; };
template <class X> using vt = vtraits<std::remove_cv_t<std::remove_reference_t<X>>>;
template <class X> constexpr bool is_vec_v = (vt<X>::n > 0);
template <class X> using elem_t = typename vt<X>::elem;
template <class X> constexpr int vlen_v = vt<X>::n;
template <class X> constexpr bool is_operand_v = is_vec_v<X> || is_scalar_v<X>;

// element i of a vector-like operand, or the operand itself if it is a scalar
template <class X> inline auto lane(const X& x, int i) {
  if constexpr (is_vec_v<X>) return x[i]; else { (void)i; return x; }
}

template <class... A> constexpr int max_len() { int m = 0; ((m = vlen_v<A> > m ? vlen_v<A> : m), ...); return m; }
template <class... A> struct first_vec_elem;
template <class A, class... R> struct first_vec_elem<A, R...> {
  using type = std::conditional_t<is_vec_v<A>, elem_t<A>, typename first_vec_elem<R...>::type>;
};
template <> struct first_vec_elem<> { using type = void; };

// number of scalar components an argument of a vector constructor contributes
template <class X> constexpr int ncomp_v = is_vec_v<X> ? vlen_v<X> : (is_scalar_v<X> ? 1 : 1000);

// ---------------------------------------------------------------- swizzle proxy
template <class T, int S, int... I> struct swz {
  T d[S];
  static constexpr int M = sizeof...(I);
  using V = vec<T, M>;
  static constexpr bool distinct() { int a[] = {I...}; for (int i = 0; i < M; ++i) for (int j = i + 1; j < M; ++j) if (a[i] == a[j]) return false; return true; }
  operator V() const { return V(d[I]...); }
  V get() const { return V(d[I]...); }
  T operator[](int i) const { constexpr int idx[] = {I...}; return d[idx[i]]; }
  swz& set(const V& v) {
    static_assert(distinct(), "cannot assign to a swizzle that repeats a component");
    int k = 0; ((d[I] = v.d[k++]), ...); return *this;
  }
  swz& operator=(const swz& o) { return set(o.get()); }
  swz& operator=(const V& v) { return set(v); }
  template <int S2, int... J> swz& operator=(const swz<T, S2, J...>& o) { return set(o.get()); }
  template <class X, std::enable_if_t<is_scalar_v<X>, int> = 0> swz& operator=(X s) { return set(V(s)); }
  template <class X> swz& operator+=(const X& o) { return set(get() + o); }
  template <class X> swz& operator-=(const X& o) { return set(get() - o); }
  template <class X> swz& operator*=(const X& o) { return set(get() * o); }
  template <class X> swz& operator/=(const X& o) { return set(get() / o); }
  template <class X> swz& operator%=(const X& o) { return set(get() % o); }
  template <class X> swz& operator&=(const X& o) { return set(get() & o); }
  template <class X> swz& operator|=(const X& o) { return set(get() | o); }
  template <class X> swz& operator^=(const X& o) { return set(get() ^ o); }
  template <class X> swz& operator<<=(const X& o) { return set(get() << o); }
  template <class X> swz& operator>>=(const X& o) { return set(get() >> o); }
};

// ---------------------------------------------------------------- members shared by vec<T,2|3|4>
#define MA_VEC_COMMON(N)                                                                          \
  using value_type = T;                                                                           \
  vec() = default;                                                                                \
  vec(const vec&) = default;                                                                      \
  constexpr vec& operator=(const vec& o) { for (int i = 0; i < N; ++i) d[i] = o.d[i]; return *this; } \
  template <class S_, std::enable_if_t<is_scalar_v<S_>, int> = 0>                                 \
  constexpr vec(S_ s) : d{} { for (int i = 0; i < N; ++i) d[i] = ma_convert<T>(s, 0); }            \
  template <class U, std::enable_if_t<!std::is_same<U, T>::value, int> = 0>                       \
  constexpr explicit vec(const vec<U, N>& o) : d{} { for (int i = 0; i < N; ++i) d[i] = ma_convert<T>(o.d[i], 0); } \
  constexpr vec(const packed_vec<T, N>& o) : d{} { for (int i = 0; i < N; ++i) d[i] = o.d[i]; }   \
  template <class A0, class A1, class... As,                                                      \
            std::enable_if_t<(ncomp_v<A0> + ncomp_v<A1> + (0 + ... + ncomp_v<As>)) == N, int> = 0> \
  constexpr vec(const A0& a0, const A1& a1, const As&... as) : d{} {                              \
    int k = 0; put(k, a0); put(k, a1); (put(k, as), ...);                                         \
  }                                                                                               \
  /* brace initialization with fewer scalars than components ({1, 2, 3} for a uint4): the rest are 0 */  \
  template <class A0, class A1, class... As,                                                      \
            std::enable_if_t<(2 + sizeof...(As)) < N && is_scalar_v<A0> && is_scalar_v<A1> &&      \
                             (true && ... && is_scalar_v<As>), int> = 0>                           \
  constexpr vec(const A0& a0, const A1& a1, const As&... as) : d{} {                              \
    int k = 0; put(k, a0); put(k, a1); (put(k, as), ...); while (k < N) d[k++] = T(0);            \
  }                                                                                               \
  template <class X> constexpr void put(int& k, const X& x) {                                     \
    if constexpr (is_vec_v<X>) { for (int i = 0; i < vlen_v<X>; ++i) d[k++] = ma_convert<T>(x[i], 0); } \
    else d[k++] = ma_convert<T>(x, 0);                                                            \
  }                                                                                               \
  constexpr T& operator[](int i) { return d[i]; }                                                 \
  constexpr const T& operator[](int i) const { return d[i]; }                                     \
  template <class X> vec& operator+=(const X& o) { return *this = *this + o; }                    \
  template <class X> vec& operator-=(const X& o) { return *this = *this - o; }                    \
  template <class X> vec& operator*=(const X& o) { return *this = *this * o; }                    \
  template <class X> vec& operator/=(const X& o) { return *this = *this / o; }                    \
  template <class X> vec& operator%=(const X& o) { return *this = *this % o; }                    \
  template <class X> vec& operator&=(const X& o) { return *this = *this & o; }                    \
  template <class X> vec& operator|=(const X& o) { return *this = *this | o; }                    \
  template <class X> vec& operator^=(const X& o) { return *this = *this ^ o; }                    \
  template <class X> vec& operator<<=(const X& o) { return *this = *this << o; }                  \
  template <class X> vec& operator>>=(const X& o) { return *this = *this >> o; }                  \
  vec& operator++() { return *this += T(1); }                                                     \
  vec& operator--() { return *this -= T(1); }                                                     \
  vec operator++(int) { vec t = *this; *this += T(1); return t; }                                 \
  vec operator--(int) { vec t = *this; *this -= T(1); return t; }

#define MA_SWZ_MEMBER2(name, ...) swz<T, 2, __VA_ARGS__> name;
#define MA_SWZ_MEMBER3(name, ...) swz<T, 3, __VA_ARGS__> name;
#define MA_SWZ_MEMBER4(name, ...) swz<T, 4, __VA_ARGS__> name;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
template <class T> struct alignas(2 * sizeof(T)) vec<T, 2> {
  union {
    T d[2];
    struct { T x, y; };
    struct { T r, g; };
    MA_SWIZZLES_2(MA_SWZ_MEMBER2)
  };
  MA_VEC_COMMON(2)
};
template <class T> struct alignas(4 * sizeof(T)) vec<T, 3> {
  union {
    T d[3];
    struct { T x, y, z; };
    struct { T r, g, b; };
    MA_SWIZZLES_3(MA_SWZ_MEMBER3)
  };
  MA_VEC_COMMON(3)
};
template <class T> struct alignas(4 * sizeof(T)) vec<T, 4> {
  union {
    T d[4];
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
    MA_SWIZZLES_4(MA_SWZ_MEMBER4)
  };
  MA_VEC_COMMON(4)
};

// ---------------------------------------------------------------- packed vectors (no padding, scalar alignment)
#define MA_PACKED_COMMON(N)                                                                       \
  packed_vec() = default;                                                                         \
  constexpr packed_vec(const vec<T, N>& v) : d{} { for (int i = 0; i < N; ++i) d[i] = v.d[i]; }   \
  template <class S_, std::enable_if_t<is_scalar_v<S_>, int> = 0>                                 \
  constexpr packed_vec(S_ s) : d{} { for (int i = 0; i < N; ++i) d[i] = T(s); }                  \
  template <class A0, class A1, class... As,                                                      \
            std::enable_if_t<(ncomp_v<A0> + ncomp_v<A1> + (0 + ... + ncomp_v<As>)) == N, int> = 0> \
  constexpr packed_vec(const A0& a0, const A1& a1, const As&... as) : packed_vec(vec<T, N>(a0, a1, as...)) {} \
  operator vec<T, N>() const { vec<T, N> v; for (int i = 0; i < N; ++i) v.d[i] = d[i]; return v; } \
  T& operator[](int i) { return d[i]; }                                                           \
  const T& operator[](int i) const { return d[i]; }                                               \
  template <class X> packed_vec& operator+=(const X& o) { return *this = vec<T, N>(*this) + o; }  \
  template <class X> packed_vec& operator-=(const X& o) { return *this = vec<T, N>(*this) - o; }  \
  template <class X> packed_vec& operator*=(const X& o) { return *this = vec<T, N>(*this) * o; }  \
  template <class X> packed_vec& operator/=(const X& o) { return *this = vec<T, N>(*this) / o; }

template <class T> struct packed_vec<T, 2> { union { T d[2]; struct { T x, y; }; struct { T r, g; }; }; MA_PACKED_COMMON(2) };
template <class T> struct packed_vec<T, 3> { union { T d[3]; struct { T x, y, z; }; struct { T r, g, b; }; }; MA_PACKED_COMMON(3) };
template <class T> struct packed_vec<T, 4> { union { T d[4]; struct { T x, y, z, w; }; struct { T r, g, b, a; }; }; MA_PACKED_COMMON(4) };
#pragma GCC diagnostic pop

// the vector value of a vector-like operand
template <class X> constexpr vec<elem_t<X>, vlen_v<X>> as_vec(const X& x) {
  vec<elem_t<X>, vlen_v<X>> v{}; for (int i = 0; i < vlen_v<X>; ++i) v.d[i] = x[i]; return v;
}

// ---------------------------------------------------------------- type names
#define MA_VEC_NAMES(T, name)                                                                     \
  typedef vec<T, 2> name##2; typedef vec<T, 3> name##3; typedef vec<T, 4> name##4;               \
  typedef packed_vec<T, 2> packed_##name##2; typedef packed_vec<T, 3> packed_##name##3;           \
  typedef packed_vec<T, 4> packed_##name##4;
MA_VEC_NAMES(float, float) MA_VEC_NAMES(half, half) MA_VEC_NAMES(bfloat, bfloat)
MA_VEC_NAMES(int, int) MA_VEC_NAMES(uint, uint) MA_VEC_NAMES(short, short) MA_VEC_NAMES(ushort, ushort)
MA_VEC_NAMES(char, char) MA_VEC_NAMES(uchar, uchar) MA_VEC_NAMES(bool, bool)
MA_VEC_NAMES(long, long) MA_VEC_NAMES(ulong, ulong)
#undef MA_VEC_NAMES
template <class T, int N> using packed_vec_t = packed_vec<T, N>;

}  // namespace metal
