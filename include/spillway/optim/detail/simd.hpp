// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/simd.hpp: run-time choice of the SIMD instruction set.
//
// Guarantees:
// - simd_level names the kernel families the optimizer headers carry: scalar (any CPU, any
//   compiler, nvcc), avx2 (AVX2 + FMA + F16C) and avx512 (AVX-512 F, BW, VL, DQ + FMA + F16C).
// - supported(level) is true only when the CPU and the OS (XSAVE state) can run that level;
//   best_simd_level() is the widest supported level, capped by the environment variable
//   SPILLWAY_SIMD=scalar|avx2|avx512 when set (read once, on first use).
// - Kernels for a level are compiled with the target attribute of that level only, so the
//   rest of the program needs no -mavx flags. SPILLWAY_X86_SIMD is 1 where such kernels exist
//   (x86-64 with GCC or clang, not under nvcc), else 0 and every level falls back to scalar.
#pragma once

#include <cstdlib>
#include <string_view>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__)
#  define SPILLWAY_X86_SIMD 1
#  include <cpuid.h>
#  include <immintrin.h>
#  define SPILLWAY_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#  define SPILLWAY_TARGET_AVX512 \
      __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#else
#  define SPILLWAY_X86_SIMD 0
#endif

namespace spillway::detail {

enum class simd_level { scalar = 0, avx2 = 1, avx512 = 2 };

inline const char* to_string(simd_level level) noexcept {
    switch (level) {
        case simd_level::avx512: return "avx512";
        case simd_level::avx2: return "avx2";
        default: return "scalar";
    }
}

/// True when this CPU (and OS) can run kernels of `level`.
inline bool supported(simd_level level) noexcept {
    if (level == simd_level::scalar) return true;
#if SPILLWAY_X86_SIMD
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
    bool avx2 = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (level == simd_level::avx2) return avx2;
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return false;
#endif
}

/// The widest supported level, capped by SPILLWAY_SIMD (scalar, avx2, avx512) when set.
inline simd_level best_simd_level() noexcept {
    static const simd_level level = [] {
        simd_level cap = simd_level::avx512;
        if (const char* env = std::getenv("SPILLWAY_SIMD")) {
            std::string_view s(env);
            if (s == "scalar") cap = simd_level::scalar;
            else if (s == "avx2") cap = simd_level::avx2;
        }
        for (int l = static_cast<int>(cap); l > 0; --l)
            if (supported(static_cast<simd_level>(l))) return static_cast<simd_level>(l);
        return simd_level::scalar;
    }();
    return level;
}

}  // namespace spillway::detail
