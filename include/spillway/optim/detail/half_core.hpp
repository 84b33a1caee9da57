// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/half_core.hpp: the fp16/bf16 storage types and their scalar
// conversions; see spillway/optim/half.hpp (which includes this) for the guarantees.
#pragma once

#include "spillway/config.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace spillway {

/// IEEE 754 binary16 bits: 1 sign, 5 exponent, 10 mantissa bits.
struct float16 {
    std::uint16_t bits;
    friend constexpr bool operator==(float16, float16) = default;  // bitwise
};
/// bfloat16 bits: the upper 16 bits of a binary32 (1 sign, 8 exponent, 7 mantissa bits).
struct bfloat16 {
    std::uint16_t bits;
    friend constexpr bool operator==(bfloat16, bfloat16) = default;  // bitwise
};
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

/// True for float16 and bfloat16.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

namespace detail {
SPILLWAY_HOST_DEVICE std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
}
SPILLWAY_HOST_DEVICE float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}
}  // namespace detail

/// Exact widening of a float16 (see the header comment for NaNs).
SPILLWAY_HOST_DEVICE float to_float(float16 h) noexcept {
    std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
    std::uint32_t exp = (h.bits >> 10) & 0x1fu;
    std::uint32_t mant = h.bits & 0x3ffu;
    if (exp == 0x1f) {  // infinity or NaN (quieted)
        return detail::bits_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
    }
    if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
        float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
        return detail::bits_float(sign | detail::float_bits(mag));
    }
    return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// Exact widening of a bfloat16.
SPILLWAY_HOST_DEVICE float to_float(bfloat16 h) noexcept {
    return detail::bits_float(static_cast<std::uint32_t>(h.bits) << 16);
}

/// Rounds f to the nearest Half (float16 or bfloat16), ties to even; see the header comment.
template <class Half>
SPILLWAY_HOST_DEVICE Half from_float(float f) noexcept {
    static_assert(is_half_v<Half>, "from_float<Half>: Half must be float16 or bfloat16");
    std::uint32_t x = detail::float_bits(f);
    if constexpr (std::is_same_v<Half, bfloat16>) {
        if ((x & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a NaN, quiet
            return bfloat16{static_cast<std::uint16_t>((x >> 16) | 0x0040u)};
        x += 0x7fffu + ((x >> 16) & 1u);  // carries into the exponent give inf on overflow
        return bfloat16{static_cast<std::uint16_t>(x >> 16)};
    } else {
        auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
        std::uint32_t a = x & 0x7fffffffu;
        if (a > 0x7f800000u)  // NaN
            return float16{static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
        if (a >= 0x477ff000u)  // >= 65520 (65504 + half an ulp, tie to even goes up): inf
            return float16{static_cast<std::uint16_t>(sign | 0x7c00u)};
        if (a >= 0x38800000u) {  // normal: rebias, round the 13 dropped bits
            std::uint32_t r = a - 0x38000000u + 0xfffu + ((a >> 13) & 1u);
            return float16{static_cast<std::uint16_t>(sign | (r >> 13))};
        }
        std::uint32_t exp = a >> 23;
        if (exp < 102) return float16{sign};  // below 2^-25: rounds to zero (2^-25 ties to 0)
        // Subnormal result in units of 2^-24: mant * 2^(exp - 126), shift in [14, 24].
        std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        std::uint32_t shift = 126u - exp;
        std::uint32_t r = mant >> shift;
        std::uint32_t rem = mant & ((1u << shift) - 1u);
        std::uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal
        return float16{static_cast<std::uint16_t>(sign | r)};
    }
}

namespace detail {
template <class Half>
void widen_scalar(const Half* in, float* out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}
template <class Half>
void narrow_scalar(const float* in, Half* out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = from_float<Half>(in[i]);
}
}  // namespace detail
}  // namespace spillway

