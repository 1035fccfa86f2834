// MSL emulator runtime: runs a kernel over a grid. Threadgroups are spread over OS threads (OpenMP);
// within a threadgroup, threads run either as a plain loop (kernels without barriers or SIMD-group
// functions) or as fibers, so that threadgroup_barrier and simd_* functions can suspend a thread
// until the others arrive.
#pragma once
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sys/mman.h>
#include <unistd.h>
#include "vec.h"

#if defined(__x86_64__) && defined(__linux__) && !defined(MA_FORCE_UCONTEXT)
#define MA_ASM_SWITCH 1
extern "C" void ma_fiber_switch_(void** save_sp, void* to_sp) __attribute__((visibility("hidden")));
extern "C" void ma_fiber_start_() __attribute__((visibility("hidden")));
// switch stacks: save callee-saved registers, MXCSR and the x87 control word on the current stack,
// store its pointer to *save_sp, load to_sp and restore the same from there
__asm__(R"(
.text
.p2align 4
.globl ma_fiber_switch_
.hidden ma_fiber_switch_
.type ma_fiber_switch_,@function
ma_fiber_switch_:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size ma_fiber_switch_,.-ma_fiber_switch_
.p2align 4
.globl ma_fiber_start_
.hidden ma_fiber_start_
.type ma_fiber_start_,@function
ma_fiber_start_:
  movq %r12, %rdi
  callq *%r13
  ud2
.size ma_fiber_start_,.-ma_fiber_start_
)");
#else
#include <ucontext.h>  // other platforms: portable but slower switching (a system call per switch)
#endif
#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif
#if !defined(MAP_ANONYMOUS) && defined(MAP_ANON)
#define MAP_ANONYMOUS MAP_ANON
#endif

namespace ma_rt {

constexpr int kSimdWidth = 32;
constexpr int kMaxThreads = 1024;
constexpr size_t kMaxThreadgroupMemory = 32768;
constexpr size_t kStackBytes = 128 * 1024;
constexpr size_t kSlotBytes = 64;
constexpr int kMaxDepth = 8;
constexpr int kMaxLoops = 64;

// ---------------------------------------------------------------- one launch: error state
struct Config;
struct Shadow;
struct Launch {
  std::atomic<int> failed{0};
  char msg[1024] = {0};
  const Config* cfg = nullptr;  // the bound buffers and the access sites (shadow.h)
  Shadow* shadow = nullptr;      // race-detection state of the launch (shadow.h)
  uintptr_t host_lo = 0, host_hi = 0;  // the launcher's frame, which the kernel's closure lives in
};
inline thread_local Launch* tl_launch = nullptr;
#define MA_NOSAN __attribute__((no_sanitize_thread, noinline))
#define MA_NOSAN_INLINE __attribute__((no_sanitize_thread))
MA_NOSAN inline void fail(const char* fmt, ...) {
  Launch* L = tl_launch;
  if (!L) return;
  int expected = 0;
  if (L->failed.compare_exchange_strong(expected, 1)) {
    va_list ap; va_start(ap, fmt); vsnprintf(L->msg, sizeof L->msg, fmt, ap); va_end(ap);
  }
}

// ---------------------------------------------------------------- built-in thread position values
struct Ids {
  uint32_t tpig[3], tpitg[3], tgpig[3], tptg[3], dtptg[3], tgpg[3], tpg[3];
  uint32_t tiitg, lane, sgid, nsg, dnsg, qlane, qid, nq, dnq;
};
template <class P> inline P attr3(const uint32_t* v) {  // a position attribute declared as P
  using D = std::remove_cv_t<std::remove_reference_t<P>>;
  if constexpr (metal::vlen_v<D> == 0) return D(v[0]);
  else if constexpr (metal::vlen_v<D> == 2) return D(v[0], v[1]);
  else if constexpr (metal::vlen_v<D> == 3) return D(v[0], v[1], v[2]);
  else static_assert(metal::vlen_v<D> == 0, "position attributes are scalars, 2- or 3-vectors");
}
template <class P> inline P attr1(uint32_t v) {
  using D = std::remove_cv_t<std::remove_reference_t<P>>;
  static_assert(metal::vlen_v<D> == 0, "this thread-position attribute is a scalar (uint or ushort)");
  return D(v);
}
// a buffer argument declared as P, bound to the bytes at p
template <class P> MA_NOSAN_INLINE inline P bindp(void* p) {
  if constexpr (std::is_pointer<P>::value) return reinterpret_cast<P>(p);
  else if constexpr (std::is_reference<P>::value) return *reinterpret_cast<std::remove_reference_t<P>*>(p);
  else return *reinterpret_cast<const std::remove_cv_t<P>*>(p);
}

// ---------------------------------------------------------------- threadgroup memory accounting
// Each `threadgroup` variable is static thread_local storage (one threadgroup per OS thread at a
// time); the first thread of a group to reach its declaration fills it with 0xFF bytes (NaN for
// floating types), so that reading memory no thread wrote is visible.
// The variables are also the regions the race detector watches (shadow.h): their names, sizes, and the
// offset of each in the group's shadow.
struct TgNotes {
  const void* p[64]; size_t bytes[64], off[64], esize[64]; const char* name[64];
  uintptr_t lo, hi;  // the smallest range holding every variable
  size_t total; int n;
};
inline thread_local TgNotes tl_tg = {};
MA_NOSAN inline void tg_reset() { tl_tg.n = 0; tl_tg.total = 0; tl_tg.lo = ~uintptr_t(0); tl_tg.hi = 0; }
MA_NOSAN inline void tg_note(void* p, size_t bytes, const char* name = "", size_t esize = 1) {
  for (int i = 0; i < tl_tg.n; ++i) if (tl_tg.p[i] == p) return;
  if (tl_tg.n == 64) { fail("more than 64 threadgroup variables"); return; }
  int k = tl_tg.n++;
  tl_tg.p[k] = p; tl_tg.bytes[k] = bytes; tl_tg.off[k] = tl_tg.total; tl_tg.name[k] = name; tl_tg.esize[k] = esize;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a < tl_tg.lo) tl_tg.lo = a;
  if (a + bytes > tl_tg.hi) tl_tg.hi = a + bytes;
  tl_tg.total += bytes;
  std::memset(p, 0xFF, bytes);
  if (tl_tg.total > kMaxThreadgroupMemory)
    fail("the kernel declares %zu bytes of threadgroup memory; Metal allows at most %zu", tl_tg.total, kMaxThreadgroupMemory);
}

// ---------------------------------------------------------------- fibers
enum State { RUNNABLE = 0, WAIT_BARRIER = 1, WAIT_SIMD = 2, DONE = 3, WAIT_STEP = 4, ABORTED = 5 };
// a store whose effect is checked when its thread next stops (shadow.h): the bytes it overwrote
struct Pending { uintptr_t addr; uint32_t size; int region; alignas(16) unsigned char old[16]; };
struct Group;
typedef void (*SimdOp)(Group* g, int base, uint32_t mask);
struct Fiber {
  void* sp;
  int state;
  // where the thread waits: the source lines of the calls to helper functions that lead to the
  // SIMD-group function (outermost first), then the line of the SIMD-group function's call
  int path[kMaxDepth], depth, site[kMaxDepth + 1], nsite;
  uint64_t pc;  // WAIT_STEP: the access site (an offset in the library), to order sites of one line
  int lsite[kMaxDepth + 1], lnsite;  // the previous wait's position and kind (loop iterations)
  uint64_t lpc;
  int lstate;
  int bline;  // WAIT_BARRIER: the line of the threadgroup_barrier call
  uint16_t iter[kMaxLoops];  // iterations of each loop of the source, counted at backward jumps
  SimdOp op;
  Pending pend;
#ifndef MA_ASM_SWITCH
  ucontext_t uc;
#endif
};
struct Slot { alignas(16) unsigned char in[kSlotBytes]; alignas(16) unsigned char out[kSlotBytes]; int64_t arg; };

struct Group {
  int n = 0, cur = 0;
  Fiber fib[kMaxThreads];
  Slot slot[kMaxThreads];
  void* sched_sp = nullptr;
#ifndef MA_ASM_SWITCH
  ucontext_t sched_uc;
#endif
  const void* body_ctx = nullptr;
  void (*body)(const void*, const Ids&) = nullptr;
  // race detection (shadow.h): barrier epochs, lockstep steps of each SIMD-group, the thread that runs
  // (plain mode: one fiber runs every thread in turn), the group's number in the launch
  bool plain = false;
  bool running = false;  // a fiber runs (not the scheduler): accesses are the kernel's
  int tid = 0;
  uint32_t epoch = 0, serial = 0;
  uint64_t group = 0;
  uint32_t step[kMaxThreads / kSimdWidth];
  uintptr_t stack_lo = 0, stack_hi = 0;
  Ids base;  // the group-wide values; per-thread ones are filled in when a fiber starts
  char* stacks = nullptr;
  size_t nstacks = 0;
  MA_NOSAN_INLINE ~Group() { if (stacks) munmap(stacks, nstacks * (kStackBytes + 4096)); }
  MA_NOSAN_INLINE char* stack_top(int i) { return stacks + size_t(i) * (kStackBytes + 4096) + 4096 + kStackBytes; }
  MA_NOSAN_INLINE void ensure_stacks(int count) {
    if (nstacks >= size_t(count)) return;
    if (stacks) munmap(stacks, nstacks * (kStackBytes + 4096));
    size_t total = size_t(kMaxThreads) * (kStackBytes + 4096);
    void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) { stacks = nullptr; nstacks = 0; return; }
    stacks = static_cast<char*>(m);
    nstacks = kMaxThreads;
    stack_lo = reinterpret_cast<uintptr_t>(m); stack_hi = stack_lo + total;
    for (int i = 0; i < kMaxThreads; ++i) mprotect(stacks + size_t(i) * (kStackBytes + 4096), 4096, PROT_NONE);  // guard
  }
  // suspend the running fiber `me` in STATE and return to the scheduler
  MA_NOSAN_INLINE void block(int me, int state);
  MA_NOSAN_INLINE int thread() const { return plain ? tid : cur; }
};
inline void commit_pending(Group* g, int me);  // shadow.h
MA_NOSAN_INLINE inline void Group::block(int me, int state) {
  {
    commit_pending(this, me);
    fib[me].state = state;
#ifdef MA_ASM_SWITCH
    ma_fiber_switch_(&fib[me].sp, sched_sp);
#else
    swapcontext(&fib[me].uc, &sched_uc);
#endif
  }
}
inline thread_local Group* tl_group = nullptr;
inline thread_local std::unique_ptr<Group> tl_group_storage;  // one per OS thread, reused

MA_NOSAN_INLINE inline void fill_thread_ids(Ids& t, uint32_t x, uint32_t y, uint32_t z) {
  t.tpitg[0] = x; t.tpitg[1] = y; t.tpitg[2] = z;
  for (int d = 0; d < 3; ++d) t.tpig[d] = t.tgpig[d] * t.dtptg[d] + t.tpitg[d];
  t.tiitg = x + t.tptg[0] * (y + t.tptg[1] * z);
  t.lane = t.tiitg % kSimdWidth; t.sgid = t.tiitg / kSimdWidth;
  t.qlane = t.tiitg % 4; t.qid = t.tiitg / 4;
}
// the n-th kernel argument's address, as the host passed it
MA_NOSAN inline void* arg(void** b, int i) { return b[i]; }
MA_NOSAN inline uint64_t dim(const uint64_t* d, int i) { return d[i]; }  // the launch's sizes: not kernel memory

MA_NOSAN inline void fiber_main(void*) {
  Group* g = tl_group;
  int me = g->cur;
  Ids t = g->base;
  uint32_t w = t.tptg[0], h = t.tptg[1];
  fill_thread_ids(t, uint32_t(me) % w, (uint32_t(me) / w) % h, uint32_t(me) / (w * h));
  g->body(g->body_ctx, t);
  g->block(me, DONE);
  __builtin_unreachable();
}
#ifndef MA_ASM_SWITCH
inline void fiber_main_uc() { fiber_main(nullptr); }
#endif

}  // namespace ma_rt
// The loops of the source (the translator defines the table): their count, then the first and last
// line of each. Hidden: each library reads its own.
extern "C" __attribute__((weak, visibility("hidden"))) const int ma_loop_lines[];
namespace ma_rt {
MA_NOSAN_INLINE inline int nloops() { return ma_loop_lines ? ma_loop_lines[0] : 0; }
// the innermost loop whose lines hold lines a and b, or -1
MA_NOSAN_INLINE inline int loop_of(int a, int b) {
  int lo = a < b ? a : b, hi = a < b ? b : a, best = -1;
  const int* r = ma_loop_lines + 1;
  for (int i = 0; i < nloops() && i < kMaxLoops; ++i) {
    int s = r[2 * i], e = r[2 * i + 1];
    if (s <= lo && hi <= e && (best < 0 || e - s < r[2 * best + 1] - r[2 * best])) best = i;
  }
  return best;
}
// Called as a thread starts to wait: a position not after its previous wait's, in the same function,
// is a jump back, the next iteration of the innermost loop holding both (its inner loops start over).
MA_NOSAN_INLINE inline void note_wait(Fiber& f, int state) {
  int n = f.nsite;
  bool back = n > 0 && n == f.lnsite;
  for (int k = 0; back && k + 1 < n; ++k) back = f.site[k] == f.lsite[k];
  if (back) {
    int a = f.site[n - 1], b = f.lsite[n - 1];
    back = a < b || (a == b && state == f.lstate && (state != WAIT_STEP || f.pc <= f.lpc));
    int L = back ? loop_of(a, b) : -1;
    if (L >= 0) {
      ++f.iter[L];
      const int* r = ma_loop_lines + 1;
      for (int j = 0; j < nloops() && j < kMaxLoops; ++j)
        if (j != L && r[2 * j] >= r[2 * L] && r[2 * j + 1] <= r[2 * L + 1]) f.iter[j] = 0;
    }
  }
  for (int k = 0; k < n; ++k) f.lsite[k] = f.site[k];
  f.lnsite = n; f.lpc = f.pc; f.lstate = state;
}
// Lanes in one loop at different iterations: the earlier iteration goes first (0: not so told apart).
MA_NOSAN_INLINE inline int iter_cmp(const Fiber& a, const Fiber& b) {
  if (!nloops() || a.nsite == 0 || a.nsite != b.nsite) return 0;
  for (int k = 0; k + 1 < a.nsite; ++k) if (a.site[k] != b.site[k]) return 0;
  int L = loop_of(a.site[a.nsite - 1], b.site[b.nsite - 1]);
  if (L < 0 || a.iter[L] == b.iter[L]) return 0;
  return a.iter[L] < b.iter[L] ? -1 : 1;
}

// Position of a waiting thread in program order: the call path (source lines). Lanes at one position
// are one step, whatever instruction they wait at: the compiler may duplicate a line's code (a copy per
// side of a later branch), so lanes at the same access can wait at different instructions.
MA_NOSAN_INLINE inline int path_cmp(const Fiber& a, const Fiber& b) {
  for (int k = 0; k < a.nsite && k < b.nsite; ++k)
    if (a.site[k] != b.site[k]) return a.site[k] < b.site[k] ? -1 : 1;
  return a.nsite - b.nsite;
}
// Which of two waits goes first: the earlier position; on one line, a memory access before a SIMD-group
// function (the accesses that compute a call's arguments come before the call), then the lower site.
MA_NOSAN_INLINE inline int site_cmp(const Fiber& a, const Fiber& b) {
  if (int c = iter_cmp(a, b)) return c;
  if (int c = path_cmp(a, b)) return c;
  if (a.state != b.state) return a.state == WAIT_STEP ? -1 : (b.state == WAIT_STEP ? 1 : 0);
  return a.pc == b.pc ? 0 : (a.pc < b.pc ? -1 : 1);
}
// Calls to helper functions that reach SIMD-group functions are wrapped by the translator in
// (SiteGuard(__LINE__), helper(...)): the line is on the thread's call path while the helper runs.
struct SiteGuard {
  Fiber* f;
  MA_NOSAN explicit SiteGuard(int line) : f(nullptr) {
    Group* g = tl_group;
    if (!g || g->plain) return;
    f = &g->fib[g->cur];
    if (f->depth < kMaxDepth) f->path[f->depth] = line;
    ++f->depth;
  }
  MA_NOSAN ~SiteGuard() { if (f) --f->depth; }
  SiteGuard(const SiteGuard&) = delete;
  SiteGuard& operator=(const SiteGuard&) = delete;
};

// After every thread has run until it finishes or waits, release one set of waiting threads per
// SIMD-group: those waiting at the position first in program order (a SIMD-group function's call, or
// a memory access, see shadow.h), as a GPU runs a divergent branch before the code after it, a loop
// body before the code after the loop. Each release is one lockstep step of that SIMD-group.
// When no thread waits for its SIMD-group, a threadgroup barrier releases everyone.
MA_NOSAN inline bool release_waits(Group* g) {
  bool released = false;
  for (int base = 0; base < g->n; base += kSimdWidth) {
    int end = base + kSimdWidth < g->n ? base + kSimdWidth : g->n;
    int best = -1;
    for (int i = base; i < end; ++i) {
      int st = g->fib[i].state;
      if ((st == WAIT_SIMD || st == WAIT_STEP) && (best < 0 || site_cmp(g->fib[i], g->fib[best]) < 0)) best = i;
    }
    if (best < 0) continue;
    const Fiber& b = g->fib[best];
    uint32_t mask = 0;
    for (int i = base; i < end; ++i) {
      const Fiber& f = g->fib[i];
      if (f.state == b.state && path_cmp(f, b) == 0 && iter_cmp(f, b) == 0 && (f.state == WAIT_STEP || f.op == b.op)) mask |= 1u << (i - base);
    }
    ++g->step[base / kSimdWidth];
    if (b.state == WAIT_SIMD) b.op(g, base, mask);
    for (int i = base; i < end; ++i) if (mask >> (i - base) & 1u) g->fib[i].state = RUNNABLE;
    released = true;
  }
  if (released) return true;
  // Barrier divergence: every thread of a threadgroup must reach each threadgroup_barrier (MSL spec, section
  // threadgroup and SIMD-group synchronization functions: "must be encountered by all threads in a threadgroup";
  // inside a conditional, if any thread executes it, all threads must). A thread that returned (an early
  // `return` for out-of-range threads) or left the branch while others wait has undefined behaviour on the GPU
  // (a hang, or a barrier that orders nothing), so it is an error rather than the CPU's convenient answer.
  int waiting = -1, gone = -1;
  for (int i = 0; i < g->n; ++i) {
    if (g->fib[i].state == WAIT_BARRIER && waiting < 0) waiting = i;
    if (g->fib[i].state == DONE && gone < 0) gone = i;
  }
  if (waiting >= 0 && gone >= 0) {
    fail("barrier divergence: thread %d (SIMD-group %d) waits at the threadgroup_barrier at line %d, which thread %d "
         "(SIMD-group %d) of the same threadgroup finished without reaching; every thread of a threadgroup must reach "
         "each threadgroup_barrier (MSL spec, threadgroup synchronization functions), so an early `return` (e.g. for threads past the end of the data) "
         "before a barrier, or a barrier inside a branch not all threads take, is undefined on the GPU: guard the "
         "memory accesses instead, or return after the last barrier",
         waiting, waiting / kSimdWidth, g->fib[waiting].bline, gone, gone / kSimdWidth);
    return false;
  }
  for (int i = 0; waiting >= 0 && i < g->n; ++i)
    if (g->fib[i].state == WAIT_BARRIER && g->fib[i].bline != g->fib[waiting].bline) {
      fail("barrier divergence: thread %d (SIMD-group %d) waits at the threadgroup_barrier at line %d while thread %d "
           "(SIMD-group %d) of the same threadgroup waits at the one at line %d; every thread of a threadgroup must reach "
           "the same threadgroup_barrier (MSL spec, threadgroup synchronization functions: a barrier in a branch must "
           "be executed by all threads or none)", waiting, waiting / kSimdWidth, g->fib[waiting].bline, i,
           i / kSimdWidth, g->fib[i].bline);
      return false;
    }
  for (int i = 0; i < g->n; ++i)  // threadgroup barrier: released when every thread of the group waits at one
    if (g->fib[i].state == WAIT_BARRIER) { g->fib[i].state = RUNNABLE; released = true; }
  if (released) ++g->epoch;
  return released;
}

MA_NOSAN inline void run_fibers(Group* g) {
  g->ensure_stacks(g->n);
  if (!g->stacks) { fail("cannot allocate fiber stacks"); return; }
  for (int i = 0; i < g->n; ++i) {
    Fiber& f = g->fib[i];
    f.state = RUNNABLE; f.depth = 0; f.nsite = 0; f.op = nullptr; f.pc = 0; f.pend.size = 0;
    f.lnsite = 0; f.lpc = 0; f.lstate = 0;
    std::memset(f.iter, 0, sizeof f.iter);
#ifdef MA_ASM_SWITCH
    void** sp = reinterpret_cast<void**>(g->stack_top(i) - 80);  // frame popped by ma_fiber_switch_
    reinterpret_cast<uint32_t*>(sp)[0] = 0x1F80;                 // MXCSR default
    reinterpret_cast<uint16_t*>(sp)[2] = 0x037F;                 // x87 control word default
    sp[1] = nullptr; sp[2] = nullptr;                            // r15 r14
    sp[3] = reinterpret_cast<void*>(&fiber_main);                // r13: entry
    sp[4] = nullptr;                                             // r12: argument
    sp[5] = nullptr; sp[6] = nullptr;                            // rbx rbp
    sp[7] = reinterpret_cast<void*>(&ma_fiber_start_);           // return address
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = g->stack_top(i) - kStackBytes;
    f.uc.uc_stack.ss_size = kStackBytes;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiber_main_uc, 0);
#endif
  }
  Launch* L = tl_launch;
  do {
    for (int i = 0; i < g->n; ++i) {
      if (g->fib[i].state != RUNNABLE) continue;
      g->cur = i;
      g->running = true;
#ifdef MA_ASM_SWITCH
      ma_fiber_switch_(&g->sched_sp, g->fib[i].sp);
#else
      swapcontext(&g->sched_uc, &g->fib[i].uc);
#endif
      g->running = false;
      if (L->failed.load(std::memory_order_relaxed)) return;  // a thread failed: the group stops
    }
  } while (release_waits(g));
}

template <class F> inline void call_body(const void* ctx, const Ids& t) { (*static_cast<const F*>(ctx))(t); }
// plain mode: one fiber runs every thread of the group in turn
template <class F> MA_NOSAN void call_plain(const void* ctx, const Ids& base) {
  Group* g = tl_group;
  Ids t = base;
  for (uint32_t z = 0; z < t.tptg[2]; ++z)
    for (uint32_t y = 0; y < t.tptg[1]; ++y)
      for (uint32_t x = 0; x < t.tptg[0]; ++x) {
        fill_thread_ids(t, x, y, z);
        g->tid = int(t.tiitg);
        (*static_cast<const F*>(ctx))(t);
        commit_pending(g, 0);
      }
}

inline void shadow_begin(Launch& L, const Config* cfg);  // shadow.h
inline void shadow_end(Launch& L);
inline void tg_shadow_ensure();
MA_NOSAN inline uint32_t next_serial() { static thread_local uint32_t s = 0; return ++s; }

// ---------------------------------------------------------------- launch
// dims: grid (x,y,z) then threadgroup size (x,y,z); cfg: the bound buffers and access sites.
// Returns 0, or 1 with a message in err.
template <class F>
MA_NOSAN int launch(const uint64_t* dims, int use_fibers, const F& body, char* err, int errlen, const Config* cfg) {
  Launch L;
  shadow_begin(L, cfg);
  L.host_lo = reinterpret_cast<uintptr_t>(__builtin_frame_address(0)) - 4096;
  L.host_hi = L.host_lo + 4096 + 65536;
  uint64_t grid[3] = {dims[0], dims[1], dims[2]}, tg[3] = {dims[3], dims[4], dims[5]}, ng[3];
  for (int d = 0; d < 3; ++d) ng[d] = (grid[d] + tg[d] - 1) / tg[d];
  const int64_t total = int64_t(ng[0] * ng[1] * ng[2]);
  const uint32_t nominal = uint32_t(tg[0] * tg[1] * tg[2]);
#pragma omp parallel for schedule(dynamic, 1) if (total > 1)
  for (int64_t gi = 0; gi < total; ++gi) {
    if (L.failed.load(std::memory_order_relaxed)) continue;
    tl_launch = &L;
    tg_reset();
    tg_shadow_ensure();
    Ids t;
    uint64_t gp[3] = {uint64_t(gi) % ng[0], (uint64_t(gi) / ng[0]) % ng[1], uint64_t(gi) / (ng[0] * ng[1])};
    for (int d = 0; d < 3; ++d) {
      t.tgpig[d] = uint32_t(gp[d]); t.dtptg[d] = uint32_t(tg[d]); t.tgpg[d] = uint32_t(ng[d]);
      t.tpg[d] = uint32_t(grid[d]);
      uint64_t left = grid[d] - gp[d] * tg[d];
      t.tptg[d] = uint32_t(left < tg[d] ? left : tg[d]);  // the last group of a dimension may be smaller
    }
    const uint32_t count = t.tptg[0] * t.tptg[1] * t.tptg[2];
    t.nsg = (count + kSimdWidth - 1) / kSimdWidth; t.dnsg = (nominal + kSimdWidth - 1) / kSimdWidth;
    t.nq = (count + 3) / 4; t.dnq = (nominal + 3) / 4;
    Group* group = tl_group_storage.get();
    if (!group) { tl_group_storage.reset(new Group()); group = tl_group_storage.get(); }
    group->plain = !use_fibers;
    group->n = use_fibers ? int(count) : 1;
    group->tid = 0;
    group->base = t;
    group->body_ctx = &body;
    group->body = use_fibers ? &call_body<F> : &call_plain<F>;
    group->group = uint64_t(gi);
    group->epoch = 0;
    group->serial = next_serial();
    std::memset(group->step, 0, sizeof group->step);
    tl_group = group;
    run_fibers(group);
    tl_group = nullptr;
    tl_launch = nullptr;
  }
  shadow_end(L);
  if (L.failed.load()) {
    std::snprintf(err, size_t(errlen), "%s", L.msg);
    return 1;
  }
  return 0;
}

}  // namespace ma_rt
