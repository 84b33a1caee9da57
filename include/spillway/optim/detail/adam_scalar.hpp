// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/adam_scalar.hpp: the scalar AdamW kernel, gradient scan and sum of
// squares: the reference every SIMD kernel matches bit for bit (see adam_kernels.hpp).
#pragma once

#include "spillway/optim/adam_formula.hpp"
#include "spillway/optim/detail/half_core.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace spillway::detail {

/// Copy type meaning "no compute copy".
struct no_copy {};

template <class Copy>
inline void store_copy(Copy* out, std::size_t i, float p) noexcept {
    if constexpr (!std::is_same_v<Copy, no_copy>) out[i] = from_float<Copy>(p);
}

template <class Grad>
SPILLWAY_HOST_DEVICE float widen_one(Grad g) noexcept {
    if constexpr (std::is_same_v<Grad, float>) return g;
    else return to_float(g);
}

template <class Grad, class Copy>
void adamw_scalar(const adamw_coefficients& c, float* p, float* m, float* v, const Grad* g, Copy* out,
                  std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
        adamw_update(p[i], m[i], v[i], widen_one(g[i]), c);
        store_copy(out, i, p[i]);
    }
}

/// True when the raw bits of g are inf or NaN.
template <class Grad>
SPILLWAY_HOST_DEVICE bool nonfinite_bits(Grad g) noexcept {
    if constexpr (std::is_same_v<Grad, float>) return (float_bits(g) & 0x7f800000u) == 0x7f800000u;
    else if constexpr (std::is_same_v<Grad, float16>) return (g.bits & 0x7c00u) == 0x7c00u;
    else return (g.bits & 0x7f80u) == 0x7f80u;
}

template <class Grad>
bool any_nonfinite_scalar(const Grad* g, std::size_t n) noexcept {
    bool bad = false;
    for (std::size_t i = 0; i < n; ++i) bad |= nonfinite_bits(g[i]);
    return bad;
}

template <class Grad>
void sum_squares_scalar(const Grad* g, std::size_t n, double* lanes) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
        double x = static_cast<double>(widen_one(g[i]));
        lanes[i % 16] += x * x;  // exact product (24-bit mantissas), so fma or not is the same
    }
}

}  // namespace spillway::detail

