// The CUDA built-ins that kernels/*.cu use, for the host: the kernel emulator of
// crates/tl-tape-cuda (feature `cuda-emu`, docs/cuda.md "The kernel emulator") compiles each
// kernels/<family>.cu (and a user's own .cu, tl_cuda_build::Emulator) with g++ after this
// header, unchanged but for the poisoning of static shared memory (below), and runs its
// kernels with runtime.cpp: one fiber per CUDA thread, the blocks of a grid one after another.
// Built-ins a kernel uses that are missing here are a compile error in the emulator build, not
// a silent difference.
//
// - threadIdx / blockIdx / blockDim / gridDim are per-OS-thread globals that the scheduler sets
//   before it resumes a fiber (one fiber runs at a time on the launching thread);
// - __shared__ is `static thread_local`: every fiber of the running block sees the same array,
//   and two host threads launching at once do not share it. Shared memory is undefined at a
//   block's start on a GPU, so static declarations are poisoned (0xFF bytes, a NaN) each block:
//   tl_cuda_build::Emulator compiles copies of the source and of the headers it includes with
//   `#include "..."`, with a call after each declaration (below, TL_EMU_SHARED_POISON*; its
//   `shared` module says which declarations it rewrites). Dynamic shared memory
//   (TL_DYNAMIC_SHARED, declared in kernels/common.cuh for nvcc) is the launch's buffer of the
//   bytes it asked for, poisoned before each block and guarded on both sides;
// - __syncthreads() parks the fiber until every live thread of the block has arrived,
//   __syncwarp() until every live lane of its warp has;
//   __shfl_down_sync() exchanges through per-thread slots between two warp barriers;
// - atomicAdd is a plain read-add-write (fibers never interleave inside it);
// - __fadd_rn / __fmul_rn are single roundings, and the library is built with
//   -ffp-contract=off, as nvcc's --fmad=false (tl_cuda_build::NVCC_FLAGS); __fmaf_rn is the C
//   library's fmaf, one rounding as IEEE 754 and CUDA define it (on x86-64 each source is
//   also built with -mfma, where fmaf is the FMA instruction inline: the same roundings, and
//   launches use that build when the CPU has FMA);
// - expf, logf, tanhf, ... are the host libm's, so they match the simulation device (which
//   uses the same libm), not CUDA's few-ulp approximations.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct uint3 {
    unsigned int x, y, z;
};
typedef uint3 dim3;

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

// The barriers live in runtime.cpp, out of line, and the compiler barriers around the call
// make it assume any memory (shared arrays included) and every built-in changed meanwhile.
void tl_emu_syncthreads();
void* tl_emu_dynamic_shared();
// `extern __shared__ T name[]` (kernels/common.cuh): the running block's dynamic shared memory.
#define TL_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(tl_emu_dynamic_shared())
// Fill the `bytes` bytes at `p` (a static __shared__ variable) with 0xFF bytes the first time
// the running block asks (true then), so a read before any write shows as a NaN; false
// afterwards in that block, and outside a launch.
bool tl_emu_shared_poison(void* p, std::size_t bytes);
// Register the `bytes` bytes at `p` to be filled with 0xFF bytes at the start of every later
// block of the running kernel on this thread (true once registered; false outside a launch).
bool tl_emu_shared_poison_jumpable(void* p, std::size_t bytes);
// `&name` as the `void*` the runtime takes (the variable may be const or volatile).
#define TL_EMU_SHARED_ADDR(name) const_cast<void*>(static_cast<const volatile void*>(&name))
// Placed by tl_cuda_build::Emulator's rewrite after a static `__shared__` declaration in a
// function, on its line, once per declarator. A declaration whose initializer runs each time
// control passes it: the block's first thread to get there poisons the variable, later threads
// (and later passes, in a loop) leave it alone, as it may hold earlier threads' writes by then;
// no thread can reach code that names the variable without passing its declaration (C++
// forbids a jump past an initialised local), so no write is lost.
#define TL_EMU_SHARED_POISON(name)                                             \
    [[maybe_unused]] const bool tl_emu_poisoned_##name =                       \
        tl_emu_shared_poison(TL_EMU_SHARED_ADDR(name), sizeof(name))
// The rewrite's call where a label (`case`, `default`, a goto label) comes after the
// declaration in its block, so the local above would not compile: an expression statement
// that registers the variable, poisoned at the start of the kernel's later blocks on this thread
// before any thread runs (a thread that jumped to the label may already have written it in this
// block, so it is not filled now).
#define TL_EMU_SHARED_POISON_JUMPABLE(name) \
    ((void)tl_emu_shared_poison_jumpable(TL_EMU_SHARED_ADDR(name), sizeof(name)))

// A namespace-scope static __shared__ variable, found at each block's start: a function that
// returns its address on the calling thread (it is thread_local) and its size, in a list per
// translation unit.
struct TlEmuStaticShared {
    void* (*addr)(std::size_t* bytes);
    TlEmuStaticShared* next;
};
inline bool tl_emu_static_shared_link(TlEmuStaticShared** head, TlEmuStaticShared* v) {
    v->next = *head;
    *head = v;
    return true;
}
// The rewrite's call after a namespace-scope declaration: adds the variable to its unit's list
// `tl_emu_unit_statics` (declared by tl_cuda_build::Emulator before the source, in the unit's
// namespace) at program start; the runtime fills every variable of the running kernel's unit
// at the start of each block, before any of its threads runs.
#define TL_EMU_SHARED_POISON_EACH_BLOCK(name)                                                \
    static TlEmuStaticShared tl_emu_static_##name = {                                        \
        [](std::size_t* bytes) -> void* {                                                    \
            *bytes = sizeof(name);                                                           \
            return TL_EMU_SHARED_ADDR(name);                                                 \
        },                                                                                   \
        nullptr};                                                                            \
    [[maybe_unused]] static const bool tl_emu_linked_##name =                                \
        tl_emu_static_shared_link(&tl_emu_unit_statics, &tl_emu_static_##name)
float tl_emu_shfl_down(float v, int offset);
// The value lane `src` of the calling thread's warp passed (its own where `src` is outside
// the warp): every shuffle, through the same per-thread slots between two warp barriers.
float tl_emu_shfl_from(float v, int src);
void tl_emu_syncwarp();
inline void __syncthreads() {
    asm volatile("" ::: "memory");
    tl_emu_syncthreads();
    asm volatile("" ::: "memory");
}
// Every live lane of the warp arrives (the kernels sync whole warps).
inline void __syncwarp(unsigned int /*mask*/ = 0xffffffffu) {
    asm volatile("" ::: "memory");
    tl_emu_syncwarp();
    asm volatile("" ::: "memory");
}
inline float __shfl_down_sync(unsigned int /*mask: the kernels shuffle whole warps*/, float v,
                              int offset) {
    asm volatile("" ::: "memory");
    float r = tl_emu_shfl_down(v, offset);
    asm volatile("" ::: "memory");
    return r;
}

// The other shuffles, by source lane (`width` 32: the whole warp), for float and the 32-bit
// integers (their bits travel unchanged). A thread's lane is its linear id in the block (x
// fastest, then y, then z) modulo 32, as CUDA forms warps.
inline unsigned int tl_emu_lane() {
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
}
inline float tl_emu_shfl(float v, int src) {
    asm volatile("" ::: "memory");
    float r = tl_emu_shfl_from(v, src);
    asm volatile("" ::: "memory");
    return r;
}
inline int tl_emu_shfl(int v, int src) {
    float f, r;
    std::memcpy(&f, &v, sizeof f);
    r = tl_emu_shfl(f, src);
    std::memcpy(&v, &r, sizeof v);
    return v;
}
inline unsigned int tl_emu_shfl(unsigned int v, int src) {
    return (unsigned int)tl_emu_shfl((int)v, src);
}
template <typename T>
inline T __shfl_sync(unsigned int /*mask*/, T v, int src_lane) {
    return tl_emu_shfl(v, src_lane & 31);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int /*mask*/, T v, int lane_mask) {
    return tl_emu_shfl(v, (int)(tl_emu_lane() ^ (unsigned)lane_mask));
}
template <typename T>
inline T __shfl_up_sync(unsigned int /*mask*/, T v, unsigned int delta) {
    return tl_emu_shfl(v, (int)tl_emu_lane() - (int)delta);
}
inline int __shfl_down_sync(unsigned int /*mask*/, int v, int offset) {
    return tl_emu_shfl(v, (int)tl_emu_lane() + offset);
}
inline unsigned int __shfl_down_sync(unsigned int /*mask*/, unsigned int v, int offset) {
    return tl_emu_shfl(v, (int)tl_emu_lane() + offset);
}

// A few more of CUDA's device built-ins, with the host's arithmetic (CUDA's `rsqrtf` and
// `__fdividef` are approximations on a GPU, so the bits may differ there).
constexpr int warpSize = 32;
template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, sizeof i);
    return i;
}
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}

inline float atomicAdd(float* p, float v) {
    float old = *p;
    *p = old + v;
    return old;
}
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    unsigned int old = *p;
    *p = old + v;
    return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    unsigned long long old = *p;
    *p = old + v;
    return old;
}

// ---- The launch table: each kernel with its parameter signature ----------------------------

// One character per parameter type; the launching side passes the same string for its
// arguments, and a launch whose arguments do not match the kernel's parameters is refused.
template <typename T, typename = void>
struct TlEmuTag;
template <typename T>
struct TlEmuTag<T*> {
    static constexpr char v = 'p';
};
template <>
struct TlEmuTag<unsigned int> {
    static constexpr char v = 'u';
};
template <>
struct TlEmuTag<int> {
    static constexpr char v = 'i';
};
template <>
struct TlEmuTag<unsigned long long> {
    static constexpr char v = 'U';
};
template <>
struct TlEmuTag<float> {
    static constexpr char v = 'f';
};
template <>
struct TlEmuTag<double> {
    static constexpr char v = 'd';
};
// `Dims8` (eight u32 by value): each family's copy of common.cuh declares its own, inside the
// family's namespace, so it is recognised by shape.
template <typename T>
struct TlEmuTag<T, std::enable_if_t<std::is_class_v<T> && sizeof(T) == 8 * sizeof(unsigned int) &&
                                    std::is_trivially_copyable_v<T>>> {
    static constexpr char v = 'D';
};

/// A kernel of the table: its name, parameter signature, and how to call it with CUDA's
/// `kernelParams` convention (one pointer to each argument's value); `fn_fma` is the same
/// kernel built with -mfma (null where there is no such build), which launches take when the
/// CPU has FMA; `statics` (`statics_fma`) points to the list of the namespace-scope static
/// __shared__ variables of the kernel's translation unit (of its -mfma build's), poisoned at the
/// start of each block.
struct TlEmuKernel {
    const char* name;
    const char* sig;
    void (*call)(void* fn, void** params);
    void* fn;
    void* fn_fma;
    TlEmuStaticShared* const* statics;
    TlEmuStaticShared* const* statics_fma;
};

template <typename... A>
struct TlEmuThunk {
    static constexpr char sig[sizeof...(A) + 1] = {TlEmuTag<A>::v..., '\0'};
    template <std::size_t... I>
    static void call_with(void (*f)(A...), void** p, std::index_sequence<I...>) {
        f(*static_cast<std::remove_reference_t<A>*>(p[I])...);
    }
    static void call(void* fn, void** p) {
        call_with(reinterpret_cast<void (*)(A...)>(fn), p, std::index_sequence_for<A...>{});
    }
};

template <typename... A>
TlEmuKernel tl_emu_kernel(const char* name, void (*f)(A...), TlEmuStaticShared* const* statics) {
    return TlEmuKernel{name, TlEmuThunk<A...>::sig, &TlEmuThunk<A...>::call,
                       reinterpret_cast<void*>(f), nullptr, statics, nullptr};
}

// A kernel of the unit's table, with the unit's list of namespace-scope shared variables.
#define TL_EMU_KERNEL(k) tl_emu_kernel(#k, &k, &tl_emu_unit_statics)

// ---- Faults a kernel's built-ins detect ------------------------------------------------------

// Record a misuse that CUDA leaves undefined (the first one of the launch wins); the launch then
// fails with the kernel's name and this message, like the runtime's own checks.
void tl_emu_fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Whether the launch has recorded a fault (a built-in that detects one does no memory access).
bool tl_emu_faulted();
// A warp barrier at which every live lane of the warp passes `v`; true when they all passed the
// same value (a *_sync built-in whose arguments CUDA requires to be warp-uniform).
bool tl_emu_warp_same(std::uint64_t v);

// ---- bf16 (cuda_bf16.h) ------------------------------------------------------------------------

// The 16-bit encoding; conversions round as tl_spec::bf16 does (nearest, ties to even; NaN kept
// quiet with its sign and top payload bits, where a GPU returns its canonical NaN: NaN either way).
struct __nv_bfloat16 {
    unsigned short x;
};
inline __nv_bfloat16 __float2bfloat16(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    __nv_bfloat16 h;
    if (std::isnan(f)) {
        h.x = (unsigned short)((u >> 16) | 0x0040u);
        return h;
    }
    h.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}
inline float __bfloat162float(__nv_bfloat16 h) {
    const std::uint32_t u = (std::uint32_t)h.x << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// ---- Warp matrix functions (mma.h: nvcuda::wmma) -----------------------------------------------
//
// The shapes CUDA has for bf16 (m16n16k16, m32n8k16, m8n32k16) and TF32 (m16n16k8), f32
// accumulators. Warp-collective semantics: every lane of the warp must call each *_sync
// function, with the same pointer, ldm and layout (checked: a warp barrier at which the lanes
// compare them); each emulated thread then holds the WHOLE tile in its fragment (`x` is the tile
// row-major, `num_elements` its size, where a GPU spreads it over the lanes), so a kernel may only
// use fragment elements uniformly (`for (i < num_elements) f.x[i] = g(f.x[i])`), as CUDA requires.
// Checked at each load and store, as CUDA requires: the pointer 256-bit (32-byte) aligned and ldm
// a multiple of 16 bytes; a violation is a fault of the launch and the call touches no memory.
//
// mma_sync's order, the one the sim twin (device/sim/linalg.rs) reproduces bit for bit: for each
// output element (i, j), d = c(i, j), then for kk = 0, 1, ..., K-1 in order
// d = fmaf(a(i, kk), b(kk, j), d): each product exact (two bf16 or two TF32 values), each sum
// rounded to f32. A TF32 operand is read through its top 19 bits (the low 13 cleared: the tensor
// cores ignore them, so a kernel must round with __float_to_tf32 first). A GPU sums in its own
// order: the same values within tl_spec::bf16::accumulation_bound, not the same bits.
namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

// f32 → TF32 as PTX's cvt.rna.tf32.f32: nearest, ties away from zero (tl_spec::tf32::round).
inline float __float_to_tf32(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if (std::isnan(f)) {
        u |= 0x00400000u;
    } else if (!std::isinf(f)) {
        u = (u + 0x1000u) & ~0x1fffu;
    }
    std::memcpy(&f, &u, sizeof f);
    return f;
}

namespace detail {
// (rows, cols) of a fragment's tile.
template <typename Use, int M, int N, int K>
struct tile;
template <int M, int N, int K>
struct tile<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct tile<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct tile<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N;
};
// The element a fragment stores, and how a product reads it.
template <typename T>
struct elem;
template <>
struct elem<__nv_bfloat16> {
    typedef __nv_bfloat16 type;
    static float value(__nv_bfloat16 h) { return __bfloat162float(h); }
};
template <>
struct elem<precision::tf32> {
    typedef float type;
    static float value(float f) {
        std::uint32_t u;
        std::memcpy(&u, &f, sizeof u);
        u &= ~0x1fffu;
        std::memcpy(&f, &u, sizeof f);
        return f;
    }
};
template <>
struct elem<float> {
    typedef float type;
    static float value(float f) { return f; }
};
template <int M, int N, int K, typename T>
constexpr bool shape_ok() {
    return (std::is_same<T, __nv_bfloat16>::value &&
            ((M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) ||
             (M == 8 && N == 32 && K == 16))) ||
           (std::is_same<T, precision::tf32>::value && M == 16 && N == 16 && K == 8) ||
           (std::is_same<T, float>::value &&
            ((M == 16 && N == 16 && (K == 16 || K == 8)) || (M == 32 && N == 8 && K == 16) ||
             (M == 8 && N == 32 && K == 16)));
}
// The checks every load and store makes (module comment); false after a fault.
inline bool access_ok(const char* what, const void* p, unsigned ldm, unsigned elem_bytes,
                      int layout) {
    const std::uint64_t key = (std::uint64_t)reinterpret_cast<std::uintptr_t>(p) * 31u +
                              (std::uint64_t)ldm * 2u + (std::uint64_t)layout;
    if (!tl_emu_warp_same(key)) {
        tl_emu_fail("%s: the lanes of a warp passed different pointers, ldm or layouts (CUDA "
                    "requires them warp-uniform)",
                    what);
        return false;
    }
    if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) {
        tl_emu_fail("%s: pointer %p is not 256-bit (32-byte) aligned", what, p);
        return false;
    }
    if (((std::uint64_t)ldm * elem_bytes) % 16 != 0) {
        tl_emu_fail("%s: ldm %u (%u bytes) is not a multiple of 16 bytes", what, ldm,
                    ldm * elem_bytes);
        return false;
    }
    return !tl_emu_faulted();
}
}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(detail::shape_ok<M, N, K, T>(), "a wmma shape/type CUDA does not have");
    typedef typename detail::elem<T>::type element_type;
    static constexpr int rows = detail::tile<Use, M, N, K>::rows;
    static constexpr int cols = detail::tile<Use, M, N, K>::cols;
    // The whole tile, row-major (see the comment above: a GPU holds num_elements per lane).
    static constexpr int num_elements = rows * cols;
    element_type x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f,
                          typename fragment<Use, M, N, K, T, L>::element_type v) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}

template <typename Use, int M, int N, int K, typename T, typename L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f,
                             const typename fragment<Use, M, N, K, T, L>::element_type* p,
                             unsigned ldm) {
    static_assert(std::is_same<L, row_major>::value || std::is_same<L, col_major>::value,
                  "matrix_a / matrix_b fragments name their layout");
    typedef fragment<Use, M, N, K, T, L> F;
    asm volatile("" ::: "memory");
    const bool col = std::is_same<L, col_major>::value;
    if (!detail::access_ok("load_matrix_sync", p, ldm, sizeof(typename F::element_type),
                           col ? 1 : 0)) {
        std::memset(f.x, 0xff, sizeof f.x);  // NaN (bf16 or f32): poison, no access
        return;
    }
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c)
            f.x[r * F::cols + c] = col ? p[(std::size_t)c * ldm + r] : p[(std::size_t)r * ldm + c];
}

// An accumulator fragment from memory (`layout` as store_matrix_sync's).
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float, void>& f, const float* p,
                             unsigned ldm, layout_t layout) {
    typedef fragment<accumulator, M, N, K, float, void> F;
    asm volatile("" ::: "memory");
    const bool col = layout == mem_col_major;
    if (!detail::access_ok("load_matrix_sync", p, ldm, sizeof(float), col ? 1 : 0)) {
        std::memset(f.x, 0xff, sizeof f.x);  // NaN: poison, no access
        return;
    }
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c)
            f.x[r * F::cols + c] = col ? p[(std::size_t)c * ldm + r] : p[(std::size_t)r * ldm + c];
}

template <int M, int N, int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float, void>& f,
                              unsigned ldm, layout_t layout) {
    typedef fragment<accumulator, M, N, K, float, void> F;
    asm volatile("" ::: "memory");
    const bool col = layout == mem_col_major;
    if (!detail::access_ok("store_matrix_sync", p, ldm, sizeof(float), col ? 1 : 0)) return;
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c)
            (col ? p[(std::size_t)c * ldm + r] : p[(std::size_t)r * ldm + c]) =
                f.x[r * F::cols + c];
    asm volatile("" ::: "memory");
}

template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float, void>& d,
                     const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b,
                     const fragment<accumulator, M, N, K, float, void>& c) {
    // Warp-collective: every lane of the warp arrives (a divergent call is a barrier error).
    if (!tl_emu_warp_same(0)) return;
    float out[M * N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            float acc = c.x[i * N + j];
            for (int kk = 0; kk < K; ++kk)
                acc = std::fmaf(detail::elem<T>::value(a.x[i * K + kk]),
                                detail::elem<T>::value(b.x[kk * N + j]), acc);
            out[i * N + j] = acc;
        }
    std::memcpy(d.x, out, sizeof out);
}

}  // namespace wmma
}  // namespace nvcuda
