// The kernel emulator's runtime (docs/cuda.md "The kernel emulator"): device memory with
// guard zones, and launches that run every thread of a block as a fiber (ucontext) on the
// launching OS thread, the blocks of the grid one after another.
//
// What it checks that a GPU would only show as garbage or a crash:
// - a launch's arguments against the kernel's parameter list (count and type of each);
// - every pointer argument points into a live allocation;
// - the launch shape against CUDA's limits (block 1..1024 threads, grid y and z <= 65535);
// - writes past either end of an allocation passed to the kernel (guard zones, checked after
//   the launch);
// - a barrier that not every live thread of the block (or lane of the warp) reaches.
// New memory and guard zones are filled with 0xFF bytes (a NaN), so a read of an unwritten or
// out-of-bounds element poisons the result instead of passing for a plausible number.
#include <ucontext.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

// ---- The kernel table (kernels.rs-generated registry.cpp lists the families) ------------------

struct TlEmuFamily {
    const char* name;
    const TlEmuKernel* (*table)(std::size_t* n);
};
extern const TlEmuFamily tl_emu_families[];
extern const std::size_t tl_emu_family_count;

static const std::vector<TlEmuKernel>& kernels() {
    static const std::vector<TlEmuKernel> all = [] {
        std::vector<TlEmuKernel> v;
        for (std::size_t f = 0; f < tl_emu_family_count; ++f) {
            std::size_t n = 0;
            const TlEmuKernel* t = tl_emu_families[f].table(&n);
            v.insert(v.end(), t, t + n);
        }
        return v;
    }();
    return all;
}

static void say(char* err, std::size_t cap, const char* fmt, ...) {
    if (cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

// ---- Memory ------------------------------------------------------------------------------------

namespace {

constexpr std::size_t GUARD = 256;  // bytes on each side of an allocation
constexpr unsigned char POISON = 0xFF;

struct Allocation {
    std::size_t bytes;
    char* base;  // GUARD bytes before the user's address
};

std::mutex mem_lock;
std::map<std::uintptr_t, Allocation>& allocations() {
    static std::map<std::uintptr_t, Allocation> m;
    return m;
}

// The allocation holding [p, p + bytes), if any. Caller holds mem_lock.
const Allocation* find(std::uintptr_t p, std::size_t bytes, std::uintptr_t* start) {
    auto& m = allocations();
    auto it = m.upper_bound(p);
    if (it == m.begin()) return nullptr;
    --it;
    if (p + bytes > it->first + it->second.bytes) return nullptr;
    *start = it->first;
    return &it->second;
}

bool guards_intact(const Allocation& a) {
    const char* after = a.base + GUARD + a.bytes;
    for (std::size_t i = 0; i < GUARD; ++i) {
        if ((unsigned char)a.base[i] != POISON || (unsigned char)after[i] != POISON) return false;
    }
    return true;
}

}  // namespace

extern "C" std::uint64_t tl_emu_alloc(std::size_t bytes) {
    char* base = static_cast<char*>(std::malloc(bytes + 2 * GUARD));
    if (base == nullptr) return 0;
    std::memset(base, POISON, bytes + 2 * GUARD);
    auto p = reinterpret_cast<std::uintptr_t>(base + GUARD);
    std::lock_guard<std::mutex> g(mem_lock);
    allocations()[p] = Allocation{bytes, base};
    return p;
}

extern "C" void tl_emu_free(std::uint64_t p) {
    std::lock_guard<std::mutex> g(mem_lock);
    auto& m = allocations();
    auto it = m.find(p);
    if (it == m.end()) return;
    std::free(it->second.base);
    m.erase(it);
}

/// Bytes in live allocations (for the device's free/total report).
extern "C" std::size_t tl_emu_live_bytes() {
    std::lock_guard<std::mutex> g(mem_lock);
    std::size_t s = 0;
    for (auto& kv : allocations()) s += kv.second.bytes;
    return s;
}

static int copy(void* dst, const void* src, std::uint64_t dev, std::size_t n, const char* what,
                char* err, std::size_t cap) {
    std::lock_guard<std::mutex> g(mem_lock);
    std::uintptr_t start = 0;
    if (find(dev, 4 * n, &start) == nullptr) {
        say(err, cap, "%s of %zu floats at 0x%llx: not inside one live allocation", what, n,
            (unsigned long long)dev);
        return 1;
    }
    std::memcpy(dst, src, 4 * n);
    return 0;
}

extern "C" int tl_emu_copy_to_device(std::uint64_t dst, const float* src, std::size_t n, char* err,
                                     std::size_t cap) {
    return copy(reinterpret_cast<void*>(dst), src, dst, n, "upload", err, cap);
}

extern "C" int tl_emu_copy_to_host(float* dst, std::uint64_t src, std::size_t n, char* err,
                                   std::size_t cap) {
    return copy(dst, reinterpret_cast<const void*>(src), src, n, "download", err, cap);
}

// ---- Fibers and barriers -----------------------------------------------------------------------

namespace {

// The order in which the threads of a block run between barriers: forward (0, 1, ...) or
// reverse. A kernel that reads another thread's write without a barrier between them gives
// different results in the two orders. TL_EMU_SCHEDULE=reverse picks the second for the
// process; tl_emu_set_reverse sets either for the calling thread's launches.
std::atomic<int> reverse_order{-1};
thread_local int reverse_here = -1;

bool reversed() {
    if (reverse_here >= 0) return reverse_here == 1;
    int r = reverse_order.load(std::memory_order_relaxed);
    if (r < 0) {
        const char* e = std::getenv("TL_EMU_SCHEDULE");
        r = (e != nullptr && std::strcmp(e, "reverse") == 0) ? 1 : 0;
        reverse_order.store(r, std::memory_order_relaxed);
    }
    return r == 1;
}

constexpr unsigned MAX_BLOCK = 1024;
constexpr std::size_t STACK = 64 * 1024;

enum class State { Run, AtSync, AtWarp, Done };

// The launching OS thread's scheduler: one slot per thread of a block, reused block after block.
struct Scheduler {
    ucontext_t main;
    std::unique_ptr<ucontext_t[]> ctx;  // never reallocated: glibc's contexts point into themselves
    std::unique_ptr<char[]> stacks;
    State state[MAX_BLOCK];
    float slot[MAX_BLOCK];  // __shfl_down_sync's exchange
    unsigned ready = 0;     // contexts made by getcontext so far
    unsigned n = 0;         // threads of the running block
    unsigned cur = 0;
    const TlEmuKernel* k = nullptr;
    void** params = nullptr;
    Scheduler()
        : ctx(new ucontext_t[MAX_BLOCK]), stacks(new char[(std::size_t)MAX_BLOCK * STACK]) {}
};

// One per launching OS thread, created at its first launch and freed when the thread ends.
thread_local std::unique_ptr<Scheduler> owned;
thread_local Scheduler* sched = nullptr;

void set_thread(unsigned t) {
    sched->cur = t;
    threadIdx = uint3{t, 0, 0};
}

void park(State s) {
    Scheduler& S = *sched;
    unsigned me = S.cur;
    S.state[me] = s;
    swapcontext(&S.ctx[me], &S.main);
    set_thread(me);
}

void fiber_main() {
    Scheduler& S = *sched;
    S.k->call(S.k->fn, S.params);
    S.state[S.cur] = State::Done;
    // returning resumes S.main through uc_link
}

// Run the block `blockIdx`; false (with a message) when a barrier can never be passed.
bool run_block(char* err, std::size_t cap) {
    Scheduler& S = *sched;
    for (unsigned t = 0; t < S.n; ++t) {
        if (t >= S.ready) {
            getcontext(&S.ctx[t]);
            S.ready = t + 1;
        }
        S.ctx[t].uc_stack.ss_sp = S.stacks.get() + (std::size_t)t * STACK;
        S.ctx[t].uc_stack.ss_size = STACK;
        S.ctx[t].uc_link = &S.main;
        makecontext(&S.ctx[t], fiber_main, 0);
        S.state[t] = State::Run;
    }
    const bool rev = reversed();
    for (;;) {
        for (unsigned i = 0; i < S.n; ++i) {
            const unsigned t = rev ? S.n - 1 - i : i;
            if (S.state[t] != State::Run) continue;
            set_thread(t);
            swapcontext(&S.main, &S.ctx[t]);
        }
        // Every thread has now finished or waits at a barrier.
        bool any_live = false, released = false;
        for (unsigned w = 0; w < S.n; w += 32) {
            unsigned end = w + 32 < S.n ? w + 32 : S.n;
            bool all_at_warp = true, some = false;
            for (unsigned t = w; t < end; ++t) {
                if (S.state[t] == State::Done) continue;
                some = true;
                all_at_warp &= S.state[t] == State::AtWarp;
            }
            any_live |= some;
            if (some && all_at_warp) {
                for (unsigned t = w; t < end; ++t)
                    if (S.state[t] == State::AtWarp) S.state[t] = State::Run;
                released = true;
            }
        }
        if (!any_live) return true;
        if (released) continue;
        bool all_at_sync = true;
        for (unsigned t = 0; t < S.n; ++t)
            all_at_sync &= S.state[t] == State::Done || S.state[t] == State::AtSync;
        if (!all_at_sync) {
            say(err, cap,
                "block (%u, %u, %u): threads wait at different barriers (a __syncthreads or "
                "warp shuffle that not every thread reaches)",
                blockIdx.x, blockIdx.y, blockIdx.z);
            return false;
        }
        for (unsigned t = 0; t < S.n; ++t)
            if (S.state[t] == State::AtSync) S.state[t] = State::Run;
    }
}

}  // namespace

void tl_emu_syncthreads() { park(State::AtSync); }

float tl_emu_shfl_down(float v, int off) {
    Scheduler& S = *sched;
    const unsigned me = S.cur, lane = me % 32, warp0 = me - lane;
    S.slot[me] = v;
    park(State::AtWarp);  // every lane has written
    const unsigned src = lane + (unsigned)off;
    float r = (src < 32 && warp0 + src < S.n) ? S.slot[warp0 + src] : v;
    park(State::AtWarp);  // every lane has read before the next exchange writes
    return r;
}

/// The calling thread's later launches run the threads of each block in reverse order
/// (non-zero) or forward (zero), whatever TL_EMU_SCHEDULE says.
extern "C" void tl_emu_set_reverse(int on) { reverse_here = on ? 1 : 0; }

extern "C" int tl_emu_find(const char* name) {
    const auto& ks = kernels();
    for (std::size_t i = 0; i < ks.size(); ++i)
        if (std::strcmp(ks[i].name, name) == 0) return (int)i;
    return -1;
}

extern "C" int tl_emu_launch(int index, const std::uint32_t grid[3], std::uint32_t block,
                             void** params, const char* sig, char* err, std::size_t cap) {
    const auto& ks = kernels();
    if (index < 0 || (std::size_t)index >= ks.size()) {
        say(err, cap, "no kernel with index %d", index);
        return 1;
    }
    const TlEmuKernel& k = ks[index];
    if (std::strcmp(k.sig, sig) != 0) {
        say(err, cap, "%s takes parameters (%s) but the launch passed (%s)", k.name, k.sig, sig);
        return 1;
    }
    if (block == 0 || block > MAX_BLOCK || grid[0] == 0 || grid[1] == 0 || grid[2] == 0 ||
        grid[0] > 0x7fffffffu || grid[1] > 65535 || grid[2] > 65535) {
        say(err, cap, "%s: launch shape grid (%u, %u, %u) x block %u is outside CUDA's limits",
            k.name, grid[0], grid[1], grid[2], block);
        return 1;
    }
    // Pointer arguments: each inside a live allocation; remember them for the guard check.
    std::vector<std::uintptr_t> bufs;
    {
        std::lock_guard<std::mutex> g(mem_lock);
        for (std::size_t i = 0; sig[i]; ++i) {
            if (sig[i] != 'p') continue;
            auto p = *static_cast<std::uintptr_t*>(params[i]);
            std::uintptr_t start = 0;
            if (find(p, 0, &start) == nullptr) {
                say(err, cap, "%s: argument %zu (0x%llx) is not a live allocation", k.name, i,
                    (unsigned long long)p);
                return 1;
            }
            bufs.push_back(start);
        }
    }
    if (sched == nullptr) {
        owned.reset(new Scheduler());
        sched = owned.get();
    }
    Scheduler& S = *sched;
    S.k = &k;
    S.params = params;
    S.n = block;
    blockDim = dim3{block, 1, 1};
    gridDim = dim3{grid[0], grid[1], grid[2]};
    int rc = 0;
    for (unsigned z = 0; z < grid[2] && rc == 0; ++z)
        for (unsigned y = 0; y < grid[1] && rc == 0; ++y)
            for (unsigned x = 0; x < grid[0] && rc == 0; ++x) {
                blockIdx = uint3{x, y, z};
                if (!run_block(err, cap)) rc = 1;
            }
    if (rc != 0) {
        std::string m(err);
        say(err, cap, "%s: %s", k.name, m.c_str());
        return rc;
    }
    std::lock_guard<std::mutex> g(mem_lock);
    for (std::uintptr_t p : bufs) {
        auto it = allocations().find(p);
        if (it == allocations().end() || guards_intact(it->second)) continue;
        const Allocation& a = it->second;
        say(err, cap, "%s wrote outside an allocation of %zu bytes it was passed", k.name,
            a.bytes);
        std::memset(a.base, POISON, GUARD);
        std::memset(a.base + GUARD + a.bytes, POISON, GUARD);
        return 1;
    }
    return 0;
}
