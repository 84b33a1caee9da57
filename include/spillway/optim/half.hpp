// SPDX-License-Identifier: Apache-2.0
// spillway/optim/half.hpp: fp16 and bf16 storage types and exact conversions to and from float.
//
// Guarantees:
// - float16 (IEEE 754 binary16) and bfloat16 (the top half of a binary32) are 2-byte,
//   trivially copyable storage types holding the raw bits; they do no arithmetic.
// - to_float is exact for every one of the 65,536 bit patterns of either type: zeros keep
//   their sign, subnormals and infinities map to the same value, a NaN maps to a NaN with the
//   same sign and payload (float16 NaNs come back quiet, quiet bit 0x00400000 set, as F16C
//   hardware does; bfloat16 NaNs keep every bit).
// - from_float rounds to nearest, ties to even, at every magnitude: values past the largest
//   finite value (by at least half an ulp) become infinity of the same sign, tiny values
//   become subnormals or signed zero, a NaN stays a NaN: quiet, same sign, the top payload
//   bits kept (float16: 0x7e00 | payload >> 13; bfloat16: bits >> 16 | 0x0040). These are the
//   results of the F16C vcvtps2ph instruction, so scalar and SIMD results are bit-identical.
//   The MXCSR flush/denormals-are-zero modes must be off (the default).
// - widen/narrow over spans give exactly the scalar results element by element; they use
//   AVX-512, AVX2+F16C or a scalar loop, chosen at run time (detail::best_simd_level()).
//   They throw std::invalid_argument when the spans' sizes differ.
// - to_float and from_float are SPILLWAY_HOST_DEVICE: CUDA code uses the same rounding.
#pragma once

#include "spillway/optim/detail/half_core.hpp"
#include "spillway/optim/detail/half_simd.hpp"
#include "spillway/optim/detail/simd.hpp"

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>


namespace spillway {
namespace detail {
/// Widens n values with the kernels of `level` (which must be supported()).
template <class Half>
void widen(simd_level level, const Half* in, float* out, std::size_t n) noexcept {
#if SPILLWAY_X86_SIMD
    if (level == simd_level::avx512) return widen_avx512(in, out, n);
    if (level == simd_level::avx2) return widen_avx2(in, out, n);
#endif
    (void)level;
    widen_scalar(in, out, n);
}
/// Narrows n values with the kernels of `level` (which must be supported()).
template <class Half>
void narrow(simd_level level, const float* in, Half* out, std::size_t n) noexcept {
#if SPILLWAY_X86_SIMD
    if (level == simd_level::avx512) return narrow_avx512(in, out, n);
    if (level == simd_level::avx2) return narrow_avx2(in, out, n);
#endif
    (void)level;
    narrow_scalar(in, out, n);
}
inline void check_same_size(const char* what, std::size_t in, std::size_t out) {
    if (in != out)
        throw std::invalid_argument(std::string("spillway::") + what + ": input has " + std::to_string(in) +
                                    " elements but output has " + std::to_string(out));
}
}  // namespace detail

/// out[i] = to_float(in[i]). Throws std::invalid_argument when the sizes differ.
inline void widen(std::span<const float16> in, std::span<float> out) {
    detail::check_same_size("widen", in.size(), out.size());
    detail::widen(detail::best_simd_level(), in.data(), out.data(), in.size());
}
/// out[i] = to_float(in[i]). Throws std::invalid_argument when the sizes differ.
inline void widen(std::span<const bfloat16> in, std::span<float> out) {
    detail::check_same_size("widen", in.size(), out.size());
    detail::widen(detail::best_simd_level(), in.data(), out.data(), in.size());
}
/// out[i] = from_float<Half>(in[i]). Throws std::invalid_argument when the sizes differ.
inline void narrow(std::span<const float> in, std::span<float16> out) {
    detail::check_same_size("narrow", in.size(), out.size());
    detail::narrow(detail::best_simd_level(), in.data(), out.data(), in.size());
}
/// out[i] = from_float<bfloat16>(in[i]). Throws std::invalid_argument when the sizes differ.
inline void narrow(std::span<const float> in, std::span<bfloat16> out) {
    detail::check_same_size("narrow", in.size(), out.size());
    detail::narrow(detail::best_simd_level(), in.data(), out.data(), in.size());
}

}  // namespace spillway
