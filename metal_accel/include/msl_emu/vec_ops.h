// MSL emulator: component-wise operators on vectors, swizzles and packed vectors.
#pragma once
#include "vec.h"

namespace metal {

// element type of the result of a binary operation: the vector operand's element type
template <class A, class B> struct binop_elem {
  static_assert(!(is_vec_v<A> && is_vec_v<B>) || std::is_same<elem_t<A>, elem_t<B>>::value,
                "MSL: operands of a vector operation must have the same element type (use an explicit conversion)");
  static_assert(!(is_vec_v<A> && is_vec_v<B>) || vlen_v<A> == vlen_v<B>,
                "MSL: operands of a vector operation must have the same number of components");
  using type = std::conditional_t<is_vec_v<A>, elem_t<A>, elem_t<B>>;
  static constexpr int n = is_vec_v<A> ? vlen_v<A> : vlen_v<B>;
};
template <class A, class B> constexpr bool vbin_v =
    (is_vec_v<A> || is_vec_v<B>) && is_operand_v<A> && is_operand_v<B>;

#define MA_ARITH(op)                                                                              \
  template <class A, class B, std::enable_if_t<vbin_v<A, B>, int> = 0>                            \
  inline vec<typename binop_elem<A, B>::type, binop_elem<A, B>::n> operator op(const A& a, const B& b) { \
    using E = typename binop_elem<A, B>::type;                                                    \
    vec<E, binop_elem<A, B>::n> r;                                                                \
    for (int i = 0; i < binop_elem<A, B>::n; ++i) r.d[i] = E(E(lane(a, i)) op E(lane(b, i)));     \
    return r;                                                                                     \
  }
MA_ARITH(+) MA_ARITH(-) MA_ARITH(*) MA_ARITH(/) MA_ARITH(%) MA_ARITH(&) MA_ARITH(|) MA_ARITH(^)
MA_ARITH(<<) MA_ARITH(>>)
#undef MA_ARITH

#define MA_CMP(op)                                                                                \
  template <class A, class B, std::enable_if_t<vbin_v<A, B>, int> = 0>                            \
  inline vec<bool, binop_elem<A, B>::n> operator op(const A& a, const B& b) {                     \
    using E = typename binop_elem<A, B>::type;                                                    \
    vec<bool, binop_elem<A, B>::n> r;                                                             \
    for (int i = 0; i < binop_elem<A, B>::n; ++i) r.d[i] = E(lane(a, i)) op E(lane(b, i));        \
    return r;                                                                                     \
  }
MA_CMP(==) MA_CMP(!=) MA_CMP(<) MA_CMP(<=) MA_CMP(>) MA_CMP(>=) MA_CMP(&&) MA_CMP(||)
#undef MA_CMP

#define MA_UNARY(op)                                                                              \
  template <class A, std::enable_if_t<is_vec_v<A>, int> = 0>                                      \
  inline vec<elem_t<A>, vlen_v<A>> operator op(const A& a) {                                      \
    vec<elem_t<A>, vlen_v<A>> r;                                                                  \
    for (int i = 0; i < vlen_v<A>; ++i) r.d[i] = elem_t<A>(op a[i]);                             \
    return r;                                                                                     \
  }
MA_UNARY(-) MA_UNARY(+) MA_UNARY(~)
#undef MA_UNARY
template <class A, std::enable_if_t<is_vec_v<A>, int> = 0>
inline vec<bool, vlen_v<A>> operator!(const A& a) {
  vec<bool, vlen_v<A>> r; for (int i = 0; i < vlen_v<A>; ++i) r.d[i] = !a[i]; return r;
}

// ---------------------------------------------------------------- element-wise application
// apply F to each component; scalar operands broadcast; result element type is F's
template <class F, class... A> inline auto ma_map(F f, const A&... a) {
  constexpr int N = max_len<A...>();
  if constexpr (N == 0) {
    return f(a...);
  } else {
    using E = decltype(f(lane(a, 0)...));
    vec<E, N> r;
    for (int i = 0; i < N; ++i) r.d[i] = f(lane(a, i)...);
    return r;
  }
}
// the type in which an operation on these operands is computed: the first vector operand's element
// type, else the common type of the scalars
template <bool HasVec, class... A> struct calc_type { using type = typename first_vec_elem<A...>::type; };
template <class A0, class... A> struct calc_type<false, A0, A...> {  // scalars of one type: that type (no promotion)
  using type = std::conditional_t<(std::is_same<A0, A>::value && ...), A0,
                                  std::decay_t<decltype((std::declval<A0>() + ... + std::declval<A>()))>>;
};
template <class... A> using calc_t =
    typename calc_type<(is_vec_v<A> || ...), std::remove_cv_t<std::remove_reference_t<A>>...>::type;

}  // namespace metal
