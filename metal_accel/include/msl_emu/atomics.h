// MSL emulator: atomic<T> (atomic_int, atomic_uint, atomic_float, ...) and the *_explicit functions.
// Every operation is a real CPU atomic: threadgroups run concurrently on several OS threads.
#pragma once
#include "types.h"

// Atomics are not instrumented (include/msl_emu/shadow.h): they never race, and are not bounds-checked.
#define MA_ATOMIC_FN __attribute__((no_sanitize_thread)) inline
namespace metal {

enum memory_order { memory_order_relaxed = 0, memory_order_acquire = 2, memory_order_release = 3,
                    memory_order_acq_rel = 4, memory_order_seq_cst = 5 };
enum thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };

template <class T> struct atomic {
  T __v;  // same size and layout as T, so a buffer of T can be viewed as a buffer of atomic<T>
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<float> atomic_float;
typedef atomic<bool> atomic_bool;
typedef atomic<ulong> atomic_ulong;
typedef atomic<long> atomic_long;

namespace ma_atomic {
inline constexpr int order(memory_order) { return __ATOMIC_SEQ_CST; }
// read-modify-write through a compare-exchange loop (floating types, min/max)
template <class T, class F> MA_ATOMIC_FN T rmw(volatile T* p, F f) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomic of unsupported size");
  using B = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  volatile B* q = reinterpret_cast<volatile B*>(p);
  B old = __atomic_load_n(q, __ATOMIC_SEQ_CST), nw;
  T o, n;
  do {
    std::memcpy(&o, &old, sizeof(T));
    n = f(o);
    std::memcpy(&nw, &n, sizeof(T));
  } while (!__atomic_compare_exchange_n(q, &old, nw, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return o;
}
template <class T> constexpr bool plain_int = std::is_integral<T>::value;
}  // namespace ma_atomic

#define MA_ATOMIC_PTR volatile atomic<T>*
template <class T, class U> MA_ATOMIC_FN void atomic_store_explicit(MA_ATOMIC_PTR obj, U desired, memory_order = memory_order_relaxed) {
  T v = T(desired);
  if constexpr (ma_atomic::plain_int<T>) __atomic_store_n(&obj->__v, v, __ATOMIC_SEQ_CST);
  else ma_atomic::rmw(&obj->__v, [&](T) { return v; });
}
template <class T> MA_ATOMIC_FN T atomic_load_explicit(const volatile atomic<T>* obj, memory_order = memory_order_relaxed) {
  if constexpr (ma_atomic::plain_int<T>) return __atomic_load_n(&obj->__v, __ATOMIC_SEQ_CST);
  else return ma_atomic::rmw(const_cast<volatile T*>(&obj->__v), [](T o) { return o; });
}
template <class T, class U> MA_ATOMIC_FN T atomic_exchange_explicit(MA_ATOMIC_PTR obj, U desired, memory_order = memory_order_relaxed) {
  T v = T(desired);
  if constexpr (ma_atomic::plain_int<T>) return __atomic_exchange_n(&obj->__v, v, __ATOMIC_SEQ_CST);
  else return ma_atomic::rmw(&obj->__v, [&](T) { return v; });
}
template <class T, class U>
MA_ATOMIC_FN bool atomic_compare_exchange_weak_explicit(MA_ATOMIC_PTR obj, T* expected, U desired, memory_order = memory_order_relaxed,
                                                  memory_order = memory_order_relaxed) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 1, "atomic of unsupported size");
  using B = std::conditional_t<sizeof(T) == 4, uint32_t, std::conditional_t<sizeof(T) == 8, uint64_t, uint8_t>>;
  T d = T(desired);
  B e, n; std::memcpy(&e, expected, sizeof(T)); std::memcpy(&n, &d, sizeof(T));
  bool ok = __atomic_compare_exchange_n(reinterpret_cast<volatile B*>(&obj->__v), &e, n, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  if (!ok) std::memcpy(expected, &e, sizeof(T));
  return ok;
}
template <class T, class U>
MA_ATOMIC_FN bool atomic_compare_exchange_strong_explicit(MA_ATOMIC_PTR obj, T* expected, U desired, memory_order a = memory_order_relaxed,
                                                    memory_order b = memory_order_relaxed) {
  return atomic_compare_exchange_weak_explicit(obj, expected, desired, a, b);
}

#define MA_FETCH(name, builtin, expr)                                                             \
  template <class T, class U> MA_ATOMIC_FN T atomic_fetch_##name##_explicit(MA_ATOMIC_PTR obj, U operand_, \
                                                                      memory_order = memory_order_relaxed) { \
    T y = T(operand_);                                                                            \
    if constexpr (ma_atomic::plain_int<T>) return builtin(&obj->__v, y, __ATOMIC_SEQ_CST);        \
    else return ma_atomic::rmw(&obj->__v, [&](T x) { return T(expr); });                          \
  }
MA_FETCH(add, __atomic_fetch_add, x + y)
MA_FETCH(sub, __atomic_fetch_sub, x - y)
MA_FETCH(and, __atomic_fetch_and, x)
MA_FETCH(or, __atomic_fetch_or, x)
MA_FETCH(xor, __atomic_fetch_xor, x)
#undef MA_FETCH
template <class T, class U> MA_ATOMIC_FN T atomic_fetch_max_explicit(MA_ATOMIC_PTR obj, U operand_, memory_order = memory_order_relaxed) {
  T y = T(operand_);
  return ma_atomic::rmw(&obj->__v, [&](T x) { return x < y ? y : x; });
}
template <class T, class U> MA_ATOMIC_FN T atomic_fetch_min_explicit(MA_ATOMIC_PTR obj, U operand_, memory_order = memory_order_relaxed) {
  T y = T(operand_);
  return ma_atomic::rmw(&obj->__v, [&](T x) { return y < x ? y : x; });
}
#undef MA_ATOMIC_PTR

// fences: every emulated atomic is sequentially consistent already
template <class F> MA_ATOMIC_FN void atomic_thread_fence(F, memory_order = memory_order_seq_cst,
                                                   thread_scope = thread_scope::thread_scope_device) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

}  // namespace metal
