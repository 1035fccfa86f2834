// MSL emulator: floating-point to integer conversions of values the integer type cannot hold.
// MSL spec 2.14 ("Type Conversions and Re-interpreting Data"): static_cast converts "with no saturation",
// rounding toward zero, so converting NaN, an infinity or a value outside the integer type's range (3e9 to
// int, -1.0 to uint, 300.0 to char) has no defined result; x86 gives INT_MIN, an Apple GPU may saturate.
// The emulator stops the thread with an error naming the line instead of computing either.
// Checked: vector conversions (vec.h: int4(f4), int4 v = ..., constructors from scalars), scalar casts
// written with a builtin integer type, and static_cast to a template parameter or typedef (static_cast<IdxT>(x)),
// which the translator rewrites (msl_convert.py):
//   int(E) / static_cast<int>(E)  ->  int(ma_rt::cvt<int>((E), __LINE__))
//   (int)E                        ->  (int)(ma_rt::Fc<int, __LINE__>)E   (same precedence as the cast)
// Not checked: implicit conversions (`int i = f;`, a float stored to an int buffer) and functional casts to a
// template parameter (`T(x)` with T an integer type).
#pragma once
#include <cstring>
#include "shadow.h"

namespace ma_rt {
[[noreturn]] MA_NOSAN inline void float_cast_error(double v, const char* from, const char* to, int line) {
  char who[160]; describe_thread(who, sizeof who);
  char where[48] = "in a vector conversion";
  if (line > 0) std::snprintf(where, sizeof where, "at line %d", line);
  fail("conversion of the %s %.9g to %s, which cannot hold it, %s: undefined in Metal (MSL spec 2.14: conversions "
       "to integer types round toward zero without saturation; NaN, infinities and out-of-range values have no "
       "defined result; clamp first, e.g. int(clamp(x, -2147483648.0f, 2147483520.0f))) (%s)", from, v, to, where, who);
  abort_thread();
}

template <class To, class F> constexpr To cvt(const F& f, int line) {
  if constexpr (metal::is_vec_v<To> && metal::is_vec_v<F>) {
    if constexpr (metal::vlen_v<To> == metal::vlen_v<F>)
      for (int i = 0; i < metal::vlen_v<F>; ++i) metal::ma_convert<metal::elem_t<To>>(f[i], line);
    return To(f);
  } else if constexpr (metal::is_vec_v<To> && metal::ma_is_float_v<F>) {
    metal::ma_convert<metal::elem_t<To>>(f, line);
    return To(f);
  } else if constexpr (!metal::is_vec_v<To> && metal::ma_is_float_v<F>) {
    return metal::ma_convert<To>(f, line);
  } else {
    return static_cast<To>(f);
  }
}
// target of a C-style cast: (int)(Fc<int, __LINE__>)E converts E as (int)E would, after the check
template <class To, int Line> struct Fc {
  To v;
  template <class F> constexpr Fc(const F& f) : v(cvt_c(f)) {}
  template <class F> static constexpr To cvt_c(const F& f) {
    if constexpr (metal::ma_is_float_v<F> || (metal::is_vec_v<F> && metal::is_vec_v<To>)) return cvt<To>(f, Line);
    else return (To)f;
  }
  constexpr operator To() const { return v; }
};
}  // namespace ma_rt
