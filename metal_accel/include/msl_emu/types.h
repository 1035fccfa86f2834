// MSL emulator: scalar types (half, bfloat, uint, ...), type traits and numeric limits.
#pragma once
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

static_assert(sizeof(long) == 8, "the MSL emulator needs an LP64 platform (Metal's long is 64-bit)");

namespace metal {

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
using std::int8_t; using std::int16_t; using std::int32_t; using std::int64_t;
using std::uint8_t; using std::uint16_t; using std::uint32_t; using std::uint64_t;
using std::size_t; using std::ptrdiff_t;

// ---------------------------------------------------------------- bfloat (storage: 16 bits)
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  static constexpr bfloat from_bits(uint16_t b) { bfloat r{}; r.bits = b; return r; }
  constexpr bfloat(float f) : bits(0) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = uint16_t((u >> 16) | 0x40u); return; }  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    bits = uint16_t(u >> 16);
  }
  template <class T, std::enable_if_t<std::is_arithmetic<T>::value || std::is_same<T, _Float16>::value, int> = 0>
  constexpr bfloat(T v) : bfloat(float(v)) {}
  constexpr operator float() const { return __builtin_bit_cast(float, uint32_t(bits) << 16); }
  template <class T> constexpr bfloat& operator+=(T o) { return *this = bfloat(float(*this) + float(o)); }
  template <class T> constexpr bfloat& operator-=(T o) { return *this = bfloat(float(*this) - float(o)); }
  template <class T> constexpr bfloat& operator*=(T o) { return *this = bfloat(float(*this) * float(o)); }
  template <class T> constexpr bfloat& operator/=(T o) { return *this = bfloat(float(*this) / float(o)); }
  constexpr bfloat& operator++() { return *this += 1.0f; }
  constexpr bfloat& operator--() { return *this -= 1.0f; }
  constexpr bfloat operator++(int) { bfloat t = *this; *this += 1.0f; return t; }
  constexpr bfloat operator--(int) { bfloat t = *this; *this -= 1.0f; return t; }
};
// bfloat op bfloat stays bfloat; mixed with other types it converts to float (templates: no ambiguity)
#define MA_BF_OP(op)                                                                              \
  template <class A, class B,                                                                     \
            std::enable_if_t<std::is_same<A, bfloat>::value && std::is_same<B, bfloat>::value, int> = 0> \
  constexpr bfloat operator op(A a, B b) { return bfloat(float(a) op float(b)); }
MA_BF_OP(+) MA_BF_OP(-) MA_BF_OP(*) MA_BF_OP(/)
#undef MA_BF_OP
template <class A, std::enable_if_t<std::is_same<A, bfloat>::value, int> = 0>
constexpr bfloat operator-(A a) { return bfloat::from_bits(uint16_t(a.bits ^ 0x8000u)); }
template <class A, std::enable_if_t<std::is_same<A, bfloat>::value, int> = 0>
constexpr bfloat operator+(A a) { return a; }

// ---------------------------------------------------------------- traits
template <class T> struct is_scalar_t : std::integral_constant<bool,
    std::is_arithmetic<T>::value || std::is_same<T, half>::value || std::is_same<T, bfloat>::value> {};
template <class T> constexpr bool is_scalar_v = is_scalar_t<std::remove_cv_t<std::remove_reference_t<T>>>::value;
template <class T> constexpr bool is_fp_v = std::is_floating_point<std::remove_cv_t<T>>::value ||
    std::is_same<std::remove_cv_t<T>, half>::value || std::is_same<std::remove_cv_t<T>, bfloat>::value;
template <class T> constexpr bool is_int_v = std::is_integral<std::remove_cv_t<T>>::value &&
    !std::is_same<std::remove_cv_t<T>, bool>::value;
// the type a floating operation on T is computed in (float for half/bfloat/float, double for double)
template <class T> using fcalc_t = std::conditional_t<std::is_same<std::remove_cv_t<T>, double>::value, double, float>;
// the result type of a binary arithmetic operation on two scalars
template <class A, class B> using scalar_common_t =
    std::remove_cv_t<decltype(std::declval<A>() + std::declval<B>())>;

// ---------------------------------------------------------------- numeric limits
// Metal's numeric_limits<T> derives from _numeric_limits_impl<T>, which code bases specialize for
// their own types (with _fp_numeric_limits_impl_base as the base of floating ones).
struct _fp_numeric_limits_impl_base {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false,
                        has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = true, is_iec559 = true,
                        is_bounded = true, is_modulo = false, traps = false, tinyness_before = false;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr int radix = 2;
};
template <class T> struct _numeric_limits_impl : std::numeric_limits<T> {};
template <> struct _numeric_limits_impl<half> : _fp_numeric_limits_impl_base {
  static constexpr int digits = 11, digits10 = 3, max_digits10 = 5, max_exponent = 16, min_exponent = -13,
                       max_exponent10 = 4, min_exponent10 = -4;
  static constexpr half min() { return half(6.103515625e-05f); }
  static constexpr half max() { return half(65504.0f); }
  static constexpr half lowest() { return half(-65504.0f); }
  static constexpr half epsilon() { return half(0.0009765625f); }
  static constexpr half round_error() { return half(0.5f); }
  static constexpr half denorm_min() { return half(5.9604644775390625e-08f); }
  static constexpr half infinity() { return half(__builtin_inff()); }
  static constexpr half quiet_NaN() { return half(__builtin_nanf("")); }
  static constexpr half signaling_NaN() { return half(__builtin_nansf("")); }
};
template <> struct _numeric_limits_impl<bfloat> : _fp_numeric_limits_impl_base {
  static constexpr int digits = 8, digits10 = 2, max_digits10 = 4, max_exponent = 128, min_exponent = -125,
                       max_exponent10 = 38, min_exponent10 = -37;
  static constexpr bfloat min() { return bfloat::from_bits(0x0080); }
  static constexpr bfloat max() { return bfloat::from_bits(0x7f7f); }
  static constexpr bfloat lowest() { return bfloat::from_bits(0xff7f); }
  static constexpr bfloat epsilon() { return bfloat::from_bits(0x3c00); }
  static constexpr bfloat round_error() { return bfloat::from_bits(0x3f00); }
  static constexpr bfloat denorm_min() { return bfloat::from_bits(0x0001); }
  static constexpr bfloat infinity() { return bfloat::from_bits(0x7f80); }
  static constexpr bfloat quiet_NaN() { return bfloat::from_bits(0x7fc0); }
  static constexpr bfloat signaling_NaN() { return bfloat::from_bits(0x7f81); }
};
template <class T> struct numeric_limits : _numeric_limits_impl<T> {};
template <class T> struct numeric_limits<const T> : numeric_limits<T> {};

// bit layout of the floating types (Metal's _fp_encoding_traits)
template <class T> struct _fp_encoding_traits;
#define MA_FP_ENC(T, U, bits_, mant_)                                                              \
  template <> struct _fp_encoding_traits<T> {                                                      \
    using encoding_type = U;                                                                       \
    static constexpr int bits = bits_, mantissa_bits = mant_, exponent_bits = bits_ - 1 - mant_;   \
    static constexpr U sign_mask = U(U(1) << (bits_ - 1));                                         \
    static constexpr U mantissa_mask = U((U(1) << mant_) - 1);                                     \
    static constexpr U exponent_mask = U(U(~sign_mask) & U(~mantissa_mask));                       \
    static constexpr U inf_mask = exponent_mask;                                                   \
    static constexpr int exponent_bias = (1 << (bits_ - 2 - mant_)) - 1;                          \
  };
MA_FP_ENC(float, uint32_t, 32, 23) MA_FP_ENC(half, uint16_t, 16, 10) MA_FP_ENC(bfloat, uint16_t, 16, 7)
#undef MA_FP_ENC

}  // namespace metal

// ---------------------------------------------------------------- MSL constants
#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif
#ifndef HUGE_VALF
#define HUGE_VALF __builtin_huge_valf()
#endif
#define HUGE_VALH ((metal::half)__builtin_huge_valf())
#define HALF_MAX ((metal::half)65504.0f)
#define HALF_MIN ((metal::half)6.103515625e-05f)
#define HALF_EPSILON ((metal::half)0.0009765625f)
#define MAXHALF HALF_MAX
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f
#define M_E_H ((metal::half)M_E_F)
#define M_LOG2E_H ((metal::half)M_LOG2E_F)
#define M_LN2_H ((metal::half)M_LN2_F)
#define M_PI_H ((metal::half)M_PI_F)
#define M_SQRT2_H ((metal::half)M_SQRT2_F)
