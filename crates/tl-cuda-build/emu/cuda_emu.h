// The CUDA built-ins that kernels/*.cu use, for the host: the kernel emulator of
// crates/tl-tape-cuda (feature `cuda-emu`, docs/cuda.md "The kernel emulator") compiles each
// kernels/<family>.cu (and a user's own .cu, tl_cuda_build::Emulator) with g++ after this
// header, unchanged, and runs its kernels with runtime.cpp: one fiber per CUDA thread, the
// blocks of a grid one after another. Built-ins a kernel uses that are missing here are a
// compile error in the emulator build, not a silent difference.
//
// - threadIdx / blockIdx / blockDim / gridDim are per-OS-thread globals that the scheduler sets
//   before it resumes a fiber (one fiber runs at a time on the launching thread);
// - __shared__ is `static thread_local`: every fiber of the running block sees the same array,
//   and two host threads launching at once do not share it;
// - __syncthreads() parks the fiber until every live thread of the block has arrived;
//   __shfl_down_sync() exchanges through per-thread slots between two warp barriers;
// - atomicAdd is a plain read-add-write (fibers never interleave inside it);
// - __fadd_rn / __fmul_rn are single roundings, and the library is built with
//   -ffp-contract=off, as nvcc's --fmad=false (tl_cuda_build::NVCC_FLAGS); __fmaf_rn is the C
//   library's fmaf, one rounding as IEEE 754 and CUDA define it;
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
float tl_emu_shfl_down(float v, int offset);
inline void __syncthreads() {
    asm volatile("" ::: "memory");
    tl_emu_syncthreads();
    asm volatile("" ::: "memory");
}
inline float __shfl_down_sync(unsigned int /*mask: the kernels shuffle whole warps*/, float v,
                              int offset) {
    asm volatile("" ::: "memory");
    float r = tl_emu_shfl_down(v, offset);
    asm volatile("" ::: "memory");
    return r;
}

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
/// `kernelParams` convention (one pointer to each argument's value).
struct TlEmuKernel {
    const char* name;
    const char* sig;
    void (*call)(void* fn, void** params);
    void* fn;
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
TlEmuKernel tl_emu_kernel(const char* name, void (*f)(A...)) {
    return TlEmuKernel{name, TlEmuThunk<A...>::sig, &TlEmuThunk<A...>::call,
                       reinterpret_cast<void*>(f)};
}

#define TL_EMU_KERNEL(k) tl_emu_kernel(#k, &k)
