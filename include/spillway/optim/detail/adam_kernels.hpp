// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/adam_kernels.hpp: the AdamW step and gradient scans, per SIMD level.
//
// Guarantees:
// - adamw_kernel(level, ...) applies adamw_update (adam_formula.hpp) to elements [0, n):
//   the AVX-512 and AVX2 kernels evaluate the same float operations in the same order, lane
//   by lane, and handle the last partial vector with masked (AVX-512) or padded (AVX2) vector
//   code, so an element's bits depend neither on the level nor on where a call, tile or
//   thread chunk starts or ends. Gradients are widened in registers (a tile is one vector):
//   no fp32 copy of the gradients is ever written to memory.
// - Copy is float16, bfloat16, or no_copy (no compute copy written).
// - any_nonfinite / sum_squares_block are an exact integer scan / a fixed 16-lane double
//   accumulation (lane j takes the elements with index = j mod 16, lanes summed 0..15), the
//   same in every level, so their results are independent of the level.
// - Everything is noexcept and allocation-free; callers validate the arguments.
#pragma once

#include "spillway/optim/detail/adam_scalar.hpp"
#include "spillway/optim/detail/adam_simd.hpp"
#include "spillway/optim/detail/simd.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace spillway::detail {

template <class Grad, class Copy>
void adamw_kernel(simd_level level, const adamw_coefficients& c, float* p, float* m, float* v, const Grad* g,
                  Copy* out, std::size_t n) noexcept {
#if SPILLWAY_X86_SIMD
    if (level == simd_level::avx512) return adamw_avx512(c, p, m, v, g, out, n);
    if (level == simd_level::avx2) return adamw_avx2(c, p, m, v, g, out, n);
#endif
    (void)level;
    adamw_scalar(c, p, m, v, g, out, n);
}

template <class Grad>
bool any_nonfinite(simd_level level, const Grad* g, std::size_t n) noexcept {
#if SPILLWAY_X86_SIMD
    if (level == simd_level::avx512) return any_nonfinite_avx512(g, n);
    if (level == simd_level::avx2) return any_nonfinite_avx2(g, n);
#endif
    (void)level;
    return any_nonfinite_scalar(g, n);
}

/// Sum of squares of n <= sum_squares_block_size widened gradients, in double (see top).
template <class Grad>
double sum_squares_block(simd_level level, const Grad* g, std::size_t n) noexcept {
    double lanes[16] = {};
#if SPILLWAY_X86_SIMD
    if (level == simd_level::avx512) sum_squares_avx512(g, n, lanes);
    else if (level == simd_level::avx2) sum_squares_avx2(g, n, lanes);
    else sum_squares_scalar(g, n, lanes);
#else
    (void)level;
    sum_squares_scalar(g, n, lanes);
#endif
    double s = 0.0;
    for (double l : lanes) s += l;
    return s;
}

}  // namespace spillway::detail
