// MSL emulator: threadgroup_barrier, simdgroup_barrier, and the SIMD-group and quad-group functions
// (simd_sum, simd_shuffle_down, simd_prefix_exclusive_sum, simd_broadcast, quad_*, ...).
// A SIMD-group function is a rendezvous: each thread deposits its value and suspends; when every
// thread of the SIMD-group has finished or is waiting, the threads waiting at one call site (see
// ma_rt::release_waits for which) form the active set, the operation is computed over them, and
// they resume.
// Reading an inactive lane (shuffle from a lane that has returned or lies outside a partial group)
// yields all-one bits (NaN for floating types), as the value is undefined on the GPU.
#pragma once
#include "runtime.h"
#include "math.h"

namespace metal {

enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4,
                              mem_threadgroup_imageblock = 8, mem_object_data = 16 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }
constexpr mem_flags operator&(mem_flags a, mem_flags b) { return mem_flags(uint(a) & uint(b)); }

MA_NOSAN_INLINE inline void threadgroup_barrier(mem_flags = mem_flags::mem_none, int line_ = __builtin_LINE()) {
  ma_rt::Group* g = ma_rt::tl_group;
  if (!g) { ma_rt::fail("internal error: threadgroup_barrier reached in a kernel run without fibers"); return; }
  g->fib[g->cur].bline = line_;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  g->block(g->cur, ma_rt::WAIT_BARRIER);
}

// result of simd_ballot / simd_active_threads_mask
struct simd_vote {
  typedef ulong vote_t;
  vote_t v;
  explicit constexpr simd_vote(vote_t x = 0) : v(x) {}
  explicit constexpr operator vote_t() const { return v; }
  constexpr bool all() const { return v == ~vote_t(0) >> (64 - ma_rt::kSimdWidth); }
  constexpr bool any() const { return v != 0; }
};
typedef simd_vote quad_vote;

namespace ma_simd {
using ma_rt::Group;
template <class T> MA_NOSAN_INLINE inline T in(Group* g, int i) { T v; std::memcpy((void*)&v, g->slot[i].in, sizeof(T)); return v; }
template <class T> MA_NOSAN_INLINE inline void out(Group* g, int i, const T& v) { std::memcpy(g->slot[i].out, (const void*)&v, sizeof(T)); }
MA_NOSAN_INLINE inline void poison(Group* g, int i) { std::memset(g->slot[i].out, 0xFF, ma_rt::kSlotBytes); }
// lanes of the W-wide group (SIMD-group or quad) that lane l belongs to, within the active mask
template <int W> inline uint32_t peers(int l, uint32_t mask) {
  int q0 = l & ~(W - 1);
  uint32_t m = W == 32 ? 0xffffffffu : ((1u << W) - 1u) << q0;
  return mask & m;
}

template <class T, class Op> MA_NOSAN_INLINE inline T collective(const T& x, int64_t arg, int site) {
  static_assert(sizeof(T) <= ma_rt::kSlotBytes, "SIMD-group function on a value larger than 64 bytes");
  Group* g = ma_rt::tl_group;
  if (!g) { ma_rt::fail("internal error: SIMD-group function reached in a kernel run without fibers"); return x; }
  int me = g->cur;
  std::memcpy(g->slot[me].in, (const void*)&x, sizeof(T));
  g->slot[me].arg = arg;
  g->fib[me].op = &Op::template run<T>;
  ma_rt::Fiber& f = g->fib[me];
  f.nsite = 0;
  for (int k = 0; k < f.depth && k < ma_rt::kMaxDepth; ++k) f.site[f.nsite++] = f.path[k];
  f.site[f.nsite++] = site;
  ma_rt::note_wait(f, ma_rt::WAIT_SIMD);
  g->block(me, ma_rt::WAIT_SIMD);
  T r; std::memcpy((void*)&r, g->slot[me].out, sizeof(T)); return r;
}

struct Sum { template <class T> static T f(const T& a, const T& b) { return T(a + b); } template <class T> static T id() { return T(0); } };
struct Prod { template <class T> static T f(const T& a, const T& b) { return T(a * b); } template <class T> static T id() { return T(1); } };
struct Min { template <class T> static T f(const T& a, const T& b) { return T(metal::min(a, b)); } };
struct Max { template <class T> static T f(const T& a, const T& b) { return T(metal::max(a, b)); } };
struct And { template <class T> static T f(const T& a, const T& b) { return T(a & b); } };
struct Or { template <class T> static T f(const T& a, const T& b) { return T(a | b); } };
struct Xor { template <class T> static T f(const T& a, const T& b) { return T(a ^ b); } };

template <int W, class K> struct Reduce {
  template <class T> MA_NOSAN_INLINE static void run(Group* g, int base, uint32_t mask) {
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      uint32_t p = peers<W>(l, mask);
      int first = __builtin_ctz(p);
      T acc = in<T>(g, base + first);
      for (int j = first + 1; j < 32; ++j) if (p >> j & 1u) acc = K::f(acc, in<T>(g, base + j));
      out(g, base + l, acc);
    }
  }
};
template <int W, class K, bool Inclusive> struct Prefix {
  template <class T> MA_NOSAN_INLINE static void run(Group* g, int base, uint32_t mask) {
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      uint32_t p = peers<W>(l, mask);
      T acc = K::template id<T>();
      for (int j = 0; j < l; ++j) if (p >> j & 1u) acc = K::f(acc, in<T>(g, base + j));
      if (Inclusive) acc = K::f(acc, in<T>(g, base + l));
      out(g, base + l, acc);
    }
  }
};
// source lane (index within the W-group) of lane index q given argument a; -1: the lane's own value
struct SrcIdx { static int src(int, int64_t a, int) { return int(a); } };
struct SrcDown { static int src(int q, int64_t a, int W) { return q + a >= W ? -1 : int(q + a); } };
struct SrcUp { static int src(int q, int64_t a, int) { return q - a < 0 ? -1 : int(q - a); } };
struct SrcXor { static int src(int q, int64_t a, int) { return int(q ^ a); } };
struct SrcRotDown { static int src(int q, int64_t a, int W) { return int(((q + a) % W + W) % W); } };
struct SrcRotUp { static int src(int q, int64_t a, int W) { return int(((q - a) % W + W) % W); } };
template <int W, class S> struct Shuffle {
  template <class T> MA_NOSAN_INLINE static void run(Group* g, int base, uint32_t mask) {
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      int q0 = l & ~(W - 1);
      int s = S::src(l - q0, g->slot[base + l].arg, W);
      if (s < 0) out(g, base + l, in<T>(g, base + l));
      else if (s < W && (mask >> (q0 + s) & 1u)) out(g, base + l, in<T>(g, base + q0 + s));
      else poison(g, base + l);
    }
  }
};
template <int W> struct BroadcastFirst {
  template <class T> MA_NOSAN_INLINE static void run(Group* g, int base, uint32_t mask) {
    for (int l = 0; l < 32; ++l)
      if (mask >> l & 1u) out(g, base + l, in<T>(g, base + __builtin_ctz(peers<W>(l, mask))));
  }
};
enum VoteKind { kAll, kAny, kBallot, kIsFirst, kActive };
template <int W, int V> struct Vote {
  template <class T> MA_NOSAN_INLINE static void run(Group* g, int base, uint32_t mask) {
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      uint32_t p = peers<W>(l, mask), yes = 0;
      for (int j = 0; j < 32; ++j) if ((p >> j & 1u) && in<bool>(g, base + j)) yes |= 1u << j;
      uint64_t r = V == kAll ? uint64_t(yes == p) : V == kAny ? uint64_t(yes != 0)
                 : V == kBallot ? uint64_t(yes) : V == kIsFirst ? uint64_t(l == __builtin_ctz(p)) : uint64_t(p);
      if (W == 4 && (V == kBallot || V == kActive)) r >>= (l & ~3);
      out(g, base + l, r);
    }
  }
};
struct Nop { template <class T> static void run(Group* g, int base, uint32_t mask) { (void)g; (void)base; (void)mask; } };
}  // namespace ma_simd

// every SIMD-group function records the source line of its call
#define MA_SITE int site_ = __builtin_LINE()
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none, MA_SITE) {
  ma_simd::collective<int, ma_simd::Nop>(0, 0, site_);
}

#define MA_COLL(name, ...)                                                       \
  template <class T> inline auto name(const T& x, MA_SITE) {                     \
    using V = std::conditional_t<is_vec_v<T>, vec<elem_t<T>, vlen_v<T>>, T>;    \
    return ma_simd::collective<V, __VA_ARGS__>(V(x), 0, site_);             \
  }
#define MA_COLL_ARG(name, ...)                                                   \
  template <class T, class A> inline auto name(const T& x, A a, MA_SITE) {       \
    using V = std::conditional_t<is_vec_v<T>, vec<elem_t<T>, vlen_v<T>>, T>;    \
    return ma_simd::collective<V, __VA_ARGS__>(V(x), int64_t(a), site_);    \
  }
#define MA_VOTE(R, name, kind, ...)                                              \
  inline R name(__VA_ARGS__ MA_SITE) {                                           \
    return R(ma_simd::collective<uint64_t, ma_simd::Vote<W_, kind>>(MA_VOTE_ARG, 0, site_)); \
  }
#define MA_GROUP_FUNCS(pre, W)                                                   \
  MA_COLL(pre##_sum, ma_simd::Reduce<W, ma_simd::Sum>)                           \
  MA_COLL(pre##_product, ma_simd::Reduce<W, ma_simd::Prod>)                      \
  MA_COLL(pre##_min, ma_simd::Reduce<W, ma_simd::Min>)                           \
  MA_COLL(pre##_max, ma_simd::Reduce<W, ma_simd::Max>)                           \
  MA_COLL(pre##_and, ma_simd::Reduce<W, ma_simd::And>)                           \
  MA_COLL(pre##_or, ma_simd::Reduce<W, ma_simd::Or>)                             \
  MA_COLL(pre##_xor, ma_simd::Reduce<W, ma_simd::Xor>)                           \
  MA_COLL(pre##_prefix_inclusive_sum, ma_simd::Prefix<W, ma_simd::Sum, true>)    \
  MA_COLL(pre##_prefix_exclusive_sum, ma_simd::Prefix<W, ma_simd::Sum, false>)   \
  MA_COLL(pre##_prefix_inclusive_product, ma_simd::Prefix<W, ma_simd::Prod, true>) \
  MA_COLL(pre##_prefix_exclusive_product, ma_simd::Prefix<W, ma_simd::Prod, false>) \
  MA_COLL(pre##_broadcast_first, ma_simd::BroadcastFirst<W>)                     \
  MA_COLL_ARG(pre##_shuffle, ma_simd::Shuffle<W, ma_simd::SrcIdx>)               \
  MA_COLL_ARG(pre##_broadcast, ma_simd::Shuffle<W, ma_simd::SrcIdx>)             \
  MA_COLL_ARG(pre##_shuffle_down, ma_simd::Shuffle<W, ma_simd::SrcDown>)         \
  MA_COLL_ARG(pre##_shuffle_up, ma_simd::Shuffle<W, ma_simd::SrcUp>)             \
  MA_COLL_ARG(pre##_shuffle_xor, ma_simd::Shuffle<W, ma_simd::SrcXor>)           \
  MA_COLL_ARG(pre##_shuffle_rotate_down, ma_simd::Shuffle<W, ma_simd::SrcRotDown>) \
  MA_COLL_ARG(pre##_shuffle_rotate_up, ma_simd::Shuffle<W, ma_simd::SrcRotUp>)
#define W_ 32
#define MA_VOTE_ARG b
MA_VOTE(bool, simd_all, ma_simd::kAll, bool b,)
MA_VOTE(bool, simd_any, ma_simd::kAny, bool b,)
MA_VOTE(simd_vote, simd_ballot, ma_simd::kBallot, bool b,)
#undef MA_VOTE_ARG
#define MA_VOTE_ARG true
MA_VOTE(bool, simd_is_first, ma_simd::kIsFirst)
MA_VOTE(simd_vote, simd_active_threads_mask, ma_simd::kActive)
#undef W_
#undef MA_VOTE_ARG
#define W_ 4
#define MA_VOTE_ARG b
MA_VOTE(bool, quad_all, ma_simd::kAll, bool b,)
MA_VOTE(bool, quad_any, ma_simd::kAny, bool b,)
MA_VOTE(quad_vote, quad_ballot, ma_simd::kBallot, bool b,)
#undef MA_VOTE_ARG
#define MA_VOTE_ARG true
MA_VOTE(bool, quad_is_first, ma_simd::kIsFirst)
MA_VOTE(quad_vote, quad_active_threads_mask, ma_simd::kActive)
#undef W_
#undef MA_VOTE_ARG
MA_GROUP_FUNCS(simd, 32)
MA_GROUP_FUNCS(quad, 4)
#undef MA_GROUP_FUNCS
#undef MA_COLL
#undef MA_COLL_ARG
#undef MA_VOTE
#undef MA_SITE
inline bool simd_is_helper_thread() { return false; }

}  // namespace metal
