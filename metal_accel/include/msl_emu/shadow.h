// MSL emulator: what every threadgroup and device memory access of a kernel goes through.
// The kernel is compiled with GCC's address instrumentation in callback mode
// (-fsanitize=thread, whose runtime calls are defined here instead of linking GCC's): before each
// load or store that reaches memory the compiler calls __tsan_{read,write}N(address).
// For each access this file
//  - classifies the address: the thread's own stack (private memory: nothing to do), a threadgroup
//    variable, a bound buffer, the library's constant data; anything else is out of bounds, and the
//    thread stops with an error naming the buffer or variable and the access site;
//  - makes the lanes of a SIMD-group advance together: before a threadgroup access, or an access to
//    a buffer the kernel may write, the thread waits until the scheduler (runtime.h, release_waits)
//    releases the lanes of its SIMD-group that wait at the same position, one step at a time;
//  - checks it against the shadow of the address (who wrote it last, who read it, in which barrier
//    epoch and lockstep step): a read or a write whose value depends on the order of threads that no
//    barrier, lockstep or atomic orders is a data race, reported with both access sites.
// Sites are reported as "{pc:0x...}" (offsets in the library), turned into source lines by the host.
#pragma once
#include "runtime.h"

extern "C" char __ehdr_start __attribute__((visibility("hidden")));
extern "C" char _end __attribute__((visibility("hidden")));

namespace ma_rt {

// ---------------------------------------------------------------- what the host passes (backend.py)
struct Region {            // one bound buffer
  uint64_t base, size;     // its bytes (a tensor's extent from data_ptr, a scalar's packed bytes)
  int32_t index;           // kernel argument index
  int32_t flags;           // kWritable: the kernel may write it (its accesses are tracked)
  int32_t gran;            // bytes per shadow entry (the buffer's scalar size, 1 to 4)
  int32_t esize;           // bytes per element (error messages count elements)
};
constexpr int32_t kWritable = 1;
constexpr int kPathWidth = kMaxDepth + 2;  // a site's path: count, then lines, outermost first
struct Config {
  uint32_t nregions, nsites;
  const Region* regions;      // sorted by base
  const uint64_t* site_pc;    // sorted: offsets of the return addresses of the access callbacks
  const int32_t* site_path;   // nsites * kPathWidth
};

// ---------------------------------------------------------------- shadow entries
// One per byte of threadgroup memory, one per granule of a tracked buffer.
struct Ent {
  uint32_t serial;           // threadgroup memory: the group run the entry belongs to (else stale)
  uint32_t wg, rg;           // group + 1 of the last writer / last reader (0: none)
  uint16_t wt, rt;           // their thread index in the group
  uint16_t we, re;           // barrier epoch of the write / of the readers
  uint16_t ws;               // lockstep step of the writer's SIMD-group
  uint8_t wch, rm;           // the write changed the value; readers from several SIMD-groups / groups
  uint32_t wpc, rpc;         // sites of the last write and read
};
constexpr uint8_t kReadersSg = 1, kReadersGroups = 2;
constexpr int kMaxRegions = 64;
struct Shadow {
  Ent* ent[kMaxRegions] = {nullptr};
  size_t bytes[kMaxRegions] = {0};
  std::atomic<uint8_t> lock[4096];
  uintptr_t img_lo = 0, img_hi = 0;
};
inline thread_local Ent* tl_tg_ent = nullptr;  // kMaxThreadgroupMemory entries per OS thread
MA_NOSAN inline void tg_shadow_ensure() {
  if (tl_tg_ent) return;
  void* m = mmap(nullptr, kMaxThreadgroupMemory * sizeof(Ent), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) { fail("cannot allocate the threadgroup memory shadow"); return; }
  tl_tg_ent = static_cast<Ent*>(m);  // kept for the life of the OS thread
}

MA_NOSAN inline void shadow_begin(Launch& L, const Config* cfg) {
  L.cfg = cfg;
  Shadow* s = new Shadow();
  for (auto& l : s->lock) l.store(0, std::memory_order_relaxed);
  s->img_lo = reinterpret_cast<uintptr_t>(&__ehdr_start);
  s->img_hi = reinterpret_cast<uintptr_t>(&_end);
  for (uint32_t i = 0; cfg && i < cfg->nregions && i < uint32_t(kMaxRegions); ++i) {
    const Region& r = cfg->regions[i];
    if (!(r.flags & kWritable) || !r.size) continue;
    size_t n = (r.size + size_t(r.gran) - 1) / size_t(r.gran);
    size_t bytes = n * sizeof(Ent);
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) continue;  // not tracked: bounds are still checked
    s->ent[i] = static_cast<Ent*>(m);
    s->bytes[i] = bytes;
  }
  L.shadow = s;
}
MA_NOSAN inline void shadow_end(Launch& L) {
  Shadow* s = L.shadow;
  if (!s) return;
  for (int i = 0; i < kMaxRegions; ++i) if (s->ent[i]) munmap(s->ent[i], s->bytes[i]);
  delete s;
  L.shadow = nullptr;
}

// ---------------------------------------------------------------- stopping a thread with an error
// The thread's fiber is abandoned (never resumed); the launch fails and its groups stop.
[[noreturn]] MA_NOSAN inline void abort_thread() {
  Group* g = tl_group;
  if (g) g->block(g->cur, ABORTED);
  __builtin_trap();  // not reached: an aborted fiber is never resumed
}
MA_NOSAN inline uint64_t site_of(const void* ret) {
  return uint64_t(reinterpret_cast<uintptr_t>(ret) - reinterpret_cast<uintptr_t>(&__ehdr_start));
}
MA_NOSAN inline void describe_thread(char* buf, size_t n) {
  Group* g = tl_group;
  if (!g) { buf[0] = 0; return; }
  const uint32_t* p = g->base.tgpig;
  int t = g->thread();
  std::snprintf(buf, n, "thread %d (SIMD-group %d, lane %d) of threadgroup (%u, %u, %u)", t, t / kSimdWidth,
                t % kSimdWidth, p[0], p[1], p[2]);
}

// ---------------------------------------------------------------- checks the translator inserts
// an index into an array of known extent (private, threadgroup or constant arrays)
[[noreturn]] MA_NOSAN inline void index_error(long long i, unsigned long long n, int line) {
  char who[160]; describe_thread(who, sizeof who);
  fail("index %lld is out of bounds for an array of %llu elements at line %d (%s)", i, n, line, who);
  abort_thread();
}
// constexpr: a check inside a constant expression (`constexpr int v = kTab[2];`, `static_assert(BN % TN == 0)`)
// passes at compile time, as Metal's compiler evaluates it; a failing one is no constant expression, a compile error
template <class A, class I> __attribute__((always_inline)) constexpr I ix(I i, int line) {
  using D = std::remove_cv_t<std::remove_reference_t<A>>;
  if constexpr (std::is_array<D>::value && std::is_integral<I>::value) {
    constexpr unsigned long long n = std::extent<D>::value;
    if (__builtin_expect(static_cast<unsigned long long>(static_cast<long long>(i)) >= n, 0))
      index_error(static_cast<long long>(i), n, line);
  }
  return i;
}
[[noreturn]] MA_NOSAN inline void div_error(int line) {
  char who[160]; describe_thread(who, sizeof who);
  fail("integer division by zero at line %d (%s)", line, who);
  abort_thread();
}
// the right operand of an integer `/` or `%`: zero stops the thread (a GPU returns an undefined value)
template <class T> __attribute__((always_inline)) constexpr const T& dz(const T& v, int line) {
  if constexpr (std::is_integral<T>::value) {
    if (__builtin_expect(v == 0, 0)) div_error(line);
  } else if constexpr (metal::vlen_v<T> > 0) {
    if constexpr (std::is_integral<metal::elem_t<T>>::value)
      for (int k = 0; k < metal::vlen_v<T>; ++k)
        if (__builtin_expect(v[k] == 0, 0)) div_error(line);
  }
  return v;
}

// ---------------------------------------------------------------- memory accesses
MA_NOSAN_INLINE inline int sg_of(const Group* g, int t) { return g->plain ? t : t / kSimdWidth; }

// where a waiting thread stands in program order: the path of its access site
MA_NOSAN_INLINE inline void set_position(Group* g, uint64_t pc) {
  Fiber& f = g->fib[g->cur];
  f.pc = pc; f.nsite = 0;
  const Config* c = tl_launch->cfg;
  if (!c || !c->nsites) return;
  uint32_t lo = 0, hi = c->nsites;
  while (lo < hi) { uint32_t mid = (lo + hi) / 2; if (c->site_pc[mid] < pc) lo = mid + 1; else hi = mid; }
  if (lo == c->nsites || c->site_pc[lo] != pc) return;
  const int32_t* p = c->site_path + size_t(lo) * kPathWidth;
  int n = p[0] < kMaxDepth + 1 ? p[0] : kMaxDepth + 1;
  // a site inside a helper that reaches SIMD-group functions also has the helper's call on the
  // thread's call path (SiteGuard); the site's own path (from debug information) already holds it
  for (int k = 0; k < n; ++k) f.site[f.nsite++] = p[1 + k];
}

[[noreturn]] MA_NOSAN inline void race(const char* what, const char* var, long long elem, uint64_t pc, const Ent& e, bool vs_write,
                          int other_t, uint32_t other_g, uint32_t my_g) {
  char who[160]; describe_thread(who, sizeof who);
  char other[200];
  if (other_g != my_g)  // threadgroup memory: both are group 1 (its entries belong to one group run)
    std::snprintf(other, sizeof other, "thread %d of another threadgroup (number %u)", other_t, other_g - 1);
  else
    std::snprintf(other, sizeof other, "thread %d (SIMD-group %d)", other_t, other_t / kSimdWidth);
  fail("data race on %s[%lld]: %s at {pc:%llx} by %s; %s %s it at {pc:%llx}, and no threadgroup_barrier "
       "orders the two (different SIMD-groups or threadgroups; use a barrier, or an atomic)",
       var, elem, what, (unsigned long long)pc, who, other, vs_write ? "wrote" : "read",
       (unsigned long long)(vs_write ? e.wpc : e.rpc));
  abort_thread();
}

// a read of one entry by the running thread
MA_NOSAN_INLINE inline void check_read(Ent& e, Group* g, uint32_t G, const char* var, long long elem, uint64_t pc) {
  int t = g->thread();
  uint16_t ep = uint16_t(g->epoch);
  if (e.wg && e.wch) {
    bool conc = e.wg != G || (e.we == ep && e.wt != t && sg_of(g, e.wt) != sg_of(g, t));
    if (conc) race("read", var, elem, pc, e, true, e.wt, e.wg, G);
  }
  if (e.rg == 0) { e.rg = G; e.rt = uint16_t(t); e.re = ep; e.rm = 0; }
  else if (e.rg != G) { e.rm |= kReadersGroups; e.rg = G; e.rt = uint16_t(t); e.re = ep; }
  else if (e.re != ep) { e.rt = uint16_t(t); e.re = ep; e.rm &= uint8_t(~kReadersSg); }
  else { if (sg_of(g, e.rt) != sg_of(g, t)) e.rm |= kReadersSg; e.rt = uint16_t(t); }
  e.rpc = uint32_t(pc);
}
// a write that changed the value, by the running thread
MA_NOSAN_INLINE inline void check_write(Ent& e, Group* g, uint32_t G, const char* var, long long elem, uint64_t pc) {
  int t = g->thread();
  uint16_t ep = uint16_t(g->epoch);
  uint16_t st = uint16_t(g->plain ? 0 : g->step[t / kSimdWidth]);
  if (e.rg) {
    bool conc = (e.rm & kReadersGroups) || e.rg != G ||
                (e.re == ep && ((e.rm & kReadersSg) || (e.rt != t && sg_of(g, e.rt) != sg_of(g, t))));
    if (conc) race("write", var, elem, pc, e, false, e.rt, e.rg, G);
  }
  if (e.wg && e.wch) {
    bool conc = e.wg != G || (e.we == ep && e.wt != t && (sg_of(g, e.wt) != sg_of(g, t) || e.ws == st));
    if (conc) race("write", var, elem, pc, e, true, e.wt, e.wg, G);
  }
  e.wg = G; e.wt = uint16_t(t); e.we = ep; e.ws = st; e.wch = 1; e.wpc = uint32_t(pc);
}

struct Where {  // a classified address
  int region;   // >= 0: bound buffer; -1 - k: threadgroup variable k
  uintptr_t base;
  size_t size, gran, esize;
  Ent* ent;
  const char* name;
};
MA_NOSAN inline const char* region_name(int index, char* buf, size_t n) {
  std::snprintf(buf, n, "{arg:%d}", index);
  return buf;
}

MA_NOSAN_INLINE inline void apply(Group* g, const Where& w, uintptr_t a, size_t size, bool store, uint64_t pc) {
  Shadow* s = tl_launch->shadow;
  char nb[32];
  const char* var = w.region >= 0 ? region_name(tl_launch->cfg->regions[w.region].index, nb, sizeof nb) : w.name;
  uint32_t G = w.region >= 0 ? uint32_t(g->group + 1) : 1u;
  size_t first = (a - w.base) / w.gran, last = (a + size - 1 - w.base) / w.gran;
  for (size_t i = first; i <= last; ++i) {
    Ent& e = w.ent[i];
    std::atomic<uint8_t>* lk = nullptr;
    if (w.region >= 0) {
      lk = &s->lock[(i * 131 + size_t(w.region)) & 4095];
      // a thread that found a race stops (abort_thread) holding its entry's lock: once the launch has failed,
      // a thread waiting for a lock stops too, instead of spinning forever (a hang of the launch)
      while (lk->exchange(1, std::memory_order_acquire))
        if (tl_launch->failed.load(std::memory_order_relaxed)) abort_thread();
    } else if (e.serial != g->serial) {
      std::memset(&e, 0, sizeof e);
      e.serial = g->serial;
    }
    long long elem = (long long)(i * w.gran / w.esize);
    if (store) check_write(e, g, G, var, elem, pc);
    else check_read(e, g, G, var, elem, pc);
    if (lk) lk->store(0, std::memory_order_release);
  }
}

// the previous store of thread ME, now that it has happened: did it change the value?
MA_NOSAN_INLINE inline void commit_pending(Group* g, int me) {
  Pending& p = g->fib[me].pend;
  if (!p.size) return;
  uint32_t size = p.size;
  p.size = 0;
  bool changed = size > 16;
  const unsigned char* now = reinterpret_cast<const unsigned char*>(p.addr);
  for (uint32_t k = 0; k < size && !changed; ++k) changed = now[k] != p.old[k];
  if (!changed) return;
  Where w;
  if (p.region >= 0) {
    const Region& r = tl_launch->cfg->regions[p.region];
    w = Where{p.region, uintptr_t(r.base), size_t(r.size), size_t(r.gran), size_t(r.esize > 0 ? r.esize : 1),
              tl_launch->shadow->ent[p.region], nullptr};
  } else {
    int k = -1 - p.region;
    w = Where{p.region, reinterpret_cast<uintptr_t>(tl_tg.p[k]), tl_tg.bytes[k], 1, tl_tg.esize[k], tl_tg_ent + tl_tg.off[k],
              tl_tg.name[k]};
  }
  apply(g, w, p.addr, size, true, g->fib[me].pc);
}

[[noreturn]] MA_NOSAN inline void out_of_bounds(uintptr_t a, size_t size, bool store, uint64_t pc) {
  char who[160]; describe_thread(who, sizeof who);
  const Config* c = tl_launch->cfg;
  // the nearest buffer or threadgroup variable
  long long best = -1; char where[200] = "outside every buffer and threadgroup variable";
  unsigned long long dist = ~0ull;
  for (uint32_t i = 0; c && i < c->nregions; ++i) {
    const Region& r = c->regions[i];
    unsigned long long d = a < r.base ? r.base - a : a - (r.base + r.size) + 1;
    if (d < dist) {
      dist = d; best = i;
      if (a < r.base) std::snprintf(where, sizeof where, "%llu bytes before the start of {arg:%d} (%llu bytes)", d, r.index,
                                    (unsigned long long)r.size);
      else std::snprintf(where, sizeof where, "%llu bytes past the start of {arg:%d}, which holds %llu bytes",
                         (unsigned long long)(a - r.base), r.index, (unsigned long long)r.size);
    }
  }
  for (int k = 0; k < tl_tg.n; ++k) {
    uintptr_t lo = reinterpret_cast<uintptr_t>(tl_tg.p[k]);
    unsigned long long d = a < lo ? lo - a : a - (lo + tl_tg.bytes[k]) + 1;
    if (d < dist) {
      dist = d;
      if (a < lo) std::snprintf(where, sizeof where, "%llu bytes before the start of threadgroup variable '%s' (%zu bytes)", d,
                                tl_tg.name[k], tl_tg.bytes[k]);
      else std::snprintf(where, sizeof where, "%llu bytes past the start of threadgroup variable '%s', which holds %zu bytes",
                         (unsigned long long)(a - lo), tl_tg.name[k], tl_tg.bytes[k]);
    }
  }
  (void)best;
  fail("out-of-bounds %s of %zu bytes at {pc:%llx}: %s (%s)", store ? "write" : "read", size, (unsigned long long)pc,
       where, who);
  abort_thread();
}

// An access the compiler made as aligned (its type's alignment is at least its size: float4, half4, int, ...) to an
// address that is not: the pointer broke its type's alignment (C++ [basic.align]; MSL spec 2.2, vector sizes and
// alignments: float4 is 16-byte aligned), e.g. a `device float4*` cast from a float row whose length is not a
// multiple of 4. Undefined in Metal, and a fault on the CPU (an aligned SSE load): an error naming the line.
[[noreturn]] MA_NOSAN inline void misaligned(uintptr_t a, size_t size, bool store, uint64_t pc) {
  char who[160]; describe_thread(who, sizeof who);
  char where[200] = "";
  const Config* c = tl_launch->cfg;
  for (uint32_t i = 0; c && i < c->nregions; ++i) {
    const Region& r = c->regions[i];
    if (a - r.base < r.size)
      std::snprintf(where, sizeof where, " (byte %llu of {arg:%d})", (unsigned long long)(a - r.base), r.index);
  }
  for (int k = 0; k < tl_tg.n; ++k) {
    uintptr_t lo = reinterpret_cast<uintptr_t>(tl_tg.p[k]);
    if (a - lo < tl_tg.bytes[k])
      std::snprintf(where, sizeof where, " (byte %llu of threadgroup variable '%s')", (unsigned long long)(a - lo), tl_tg.name[k]);
  }
  fail("misaligned %s of %zu bytes at {pc:%llx}: the address%s is not a multiple of %zu, the alignment of the accessed "
       "type (a vector pointer such as device float4* cast from an address its type's alignment does not divide; "
       "undefined in Metal) (%s)", store ? "write" : "read", size, (unsigned long long)pc, where, size, who);
  abort_thread();
}

__attribute__((no_sanitize_thread, always_inline)) inline void access(uintptr_t a, size_t size, bool store, const void* ret) {
  Group* g = tl_group;
  if (!g || !g->running) return;
  if (a - g->stack_lo < g->stack_hi - g->stack_lo) return;  // the thread's private memory
  Launch* L = tl_launch;
  uint64_t pc = site_of(ret);
  commit_pending(g, g->cur);
  Where w;
  w.region = kMaxRegions;
  if (a >= tl_tg.lo && a < tl_tg.hi) {
    for (int k = 0; k < tl_tg.n; ++k) {
      uintptr_t lo = reinterpret_cast<uintptr_t>(tl_tg.p[k]);
      if (a >= lo && a < lo + tl_tg.bytes[k]) {
        if (a + size > lo + tl_tg.bytes[k]) out_of_bounds(a, size, store, pc);
        if (tl_tg.off[k] + tl_tg.bytes[k] > kMaxThreadgroupMemory || !tl_tg_ent) return;  // the launch fails anyway
        w = Where{-1 - k, lo, tl_tg.bytes[k], 1, tl_tg.esize[k], tl_tg_ent + tl_tg.off[k], tl_tg.name[k]};
        break;
      }
    }
    if (w.region == kMaxRegions) out_of_bounds(a, size, store, pc);
  } else {
    const Config* c = L->cfg;
    for (uint32_t i = 0; c && i < c->nregions; ++i) {
      const Region& r = c->regions[i];
      if (a - r.base < r.size) {
        if (a + size > r.base + r.size) out_of_bounds(a, size, store, pc);
        if (!(r.flags & kWritable)) return;  // read-only: the order of reads does not matter
        if (i >= uint32_t(kMaxRegions) || !L->shadow->ent[i]) return;
        w = Where{int(i), uintptr_t(r.base), size_t(r.size), size_t(r.gran), size_t(r.esize > 0 ? r.esize : 1),
                  L->shadow->ent[i], nullptr};
        break;
      }
    }
    if (w.region == kMaxRegions) {
      if (a - L->shadow->img_lo < L->shadow->img_hi - L->shadow->img_lo) return;  // the library's constants
      if (a - L->host_lo < L->host_hi - L->host_lo) return;  // the launcher's own frame
      out_of_bounds(a, size, store, pc);
    }
  }
  if (!g->plain) {  // lockstep: wait for the SIMD-group's step
    set_position(g, pc);
    note_wait(g->fib[g->cur], WAIT_STEP);
    g->block(g->cur, WAIT_STEP);
  }
  if (store) {
    Pending& p = g->fib[g->cur].pend;
    p.addr = a; p.size = uint32_t(size); p.region = w.region;
    g->fib[g->cur].pc = pc;
    if (size <= 16) std::memcpy(p.old, reinterpret_cast<const void*>(a), size);
  } else {
    apply(g, w, a, size, false, pc);
  }
}

}  // namespace ma_rt

#define MA_HOOK_ATTR extern "C" __attribute__((visibility("hidden"), used, noinline, no_sanitize_thread))
#define MA_HOOK(kind, n, store)                                                                        \
  MA_HOOK_ATTR void __tsan_##kind##n(void* a) {                                                       \
    if (__builtin_expect(uintptr_t(a) & (n - 1), 0) && ma_rt::tl_group && ma_rt::tl_group->running &&     \
        uintptr_t(a) - ma_rt::tl_group->stack_lo >= ma_rt::tl_group->stack_hi - ma_rt::tl_group->stack_lo) \
      ma_rt::misaligned(uintptr_t(a), n, store, ma_rt::site_of(__builtin_return_address(0)));                \
    ma_rt::access(uintptr_t(a), n, store, __builtin_return_address(0)); }                                 \
  MA_HOOK_ATTR void __tsan_unaligned_##kind##n(void* a) { ma_rt::access(uintptr_t(a), n, store, __builtin_return_address(0)); }
MA_HOOK(read, 1, false) MA_HOOK(read, 2, false) MA_HOOK(read, 4, false) MA_HOOK(read, 8, false) MA_HOOK(read, 16, false)
MA_HOOK(write, 1, true) MA_HOOK(write, 2, true) MA_HOOK(write, 4, true) MA_HOOK(write, 8, true) MA_HOOK(write, 16, true)
#undef MA_HOOK
MA_HOOK_ATTR void __tsan_read_range(void* a, size_t n) { ma_rt::access(uintptr_t(a), n, false, __builtin_return_address(0)); }
MA_HOOK_ATTR void __tsan_write_range(void* a, size_t n) { ma_rt::access(uintptr_t(a), n, true, __builtin_return_address(0)); }
MA_HOOK_ATTR void __tsan_init() {}
MA_HOOK_ATTR void __tsan_func_entry(void*) {}
MA_HOOK_ATTR void __tsan_func_exit() {}
MA_HOOK_ATTR void __tsan_vptr_update(void**, void*) {}
MA_HOOK_ATTR void __tsan_vptr_read(void**) {}
#undef MA_HOOK_ATTR
