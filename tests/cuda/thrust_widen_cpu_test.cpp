// SPDX-License-Identifier: Apache-2.0
// The Thrust widening kernel (spillway/cuda/thrust_widen.hpp) on the CPU: the build compiles
// this file with THRUST_DEVICE_SYSTEM set to the OpenMP backend (the sequential CPP backend
// under ThreadSanitizer, which cannot see into libgomp), so the kernel's logic is checked on
// machines without a GPU. Checked exhaustively over all 65,536 bit patterns of fp16 and
// bf16 against an independent decoding in double precision.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <spillway/cuda/thrust_widen.hpp>

using namespace spillway;

namespace {
// Independent reference: decode the bits by the IEEE formulas, in double.
double decode_fp16(std::uint16_t b) {
    int sign = b >> 15, exp = (b >> 10) & 0x1f, mant = b & 0x3ff;
    double mag;
    if (exp == 0x1f) mag = mant ? std::nan("") : INFINITY;
    else if (exp == 0) mag = std::ldexp(mant, -24);
    else mag = std::ldexp(1024 + mant, exp - 25);
    return sign ? -mag : mag;
}
double decode_bf16(std::uint16_t b) {
    int sign = b >> 15, exp = (b >> 7) & 0xff, mant = b & 0x7f;
    double mag;
    if (exp == 0xff) mag = mant ? std::nan("") : INFINITY;
    else if (exp == 0) mag = std::ldexp(mant, -133);
    else mag = std::ldexp(128 + mant, exp - 134);
    return sign ? -mag : mag;
}
std::uint32_t bits_of(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
// The product of two floats is exact in double, so one rounding to float gives the
// correctly rounded fp32 product the kernel must produce.
float reference(double decoded, float scale) { return static_cast<float>(decoded * static_cast<double>(scale)); }

template <class Half>
void check_exhaustive(double (*decode)(std::uint16_t), float scale) {
    CAPTURE(scale);
    std::vector<Half> in(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) in[i].bits = static_cast<std::uint16_t>(i);
    std::vector<float> out(65536, -1.0f);
    spillway::cuda::widen(std::span<const Half>(in), std::span<float>(out), scale);
    int mismatches = 0;
    for (std::uint32_t i = 0; i < 65536; ++i) {
        double d = decode(static_cast<std::uint16_t>(i));
        float want = reference(d, scale);
        bool ok = std::isnan(want) ? std::isnan(out[i]) && std::signbit(out[i]) == std::signbit(d)
                                   : bits_of(out[i]) == bits_of(want);
        if (!ok && ++mismatches <= 5)
            FAIL_CHECK("bits 0x" << std::hex << i << std::dec << ": got " << out[i] << ", want " << want);
    }
    CHECK(mismatches == 0);
}
}  // namespace

TEST_CASE("thrust widen on the CPU backend: every fp16 bit pattern, several scales") {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
    MESSAGE("Thrust device system: OpenMP");
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP
    MESSAGE("Thrust device system: CPP (sequential)");
#endif
    for (float scale : {1.0f, 0.5f, 1.0f / 1024, 3.7f, 65536.0f, 1e-30f})
        check_exhaustive<float16>(decode_fp16, scale);
}

TEST_CASE("thrust widen on the CPU backend: every bf16 bit pattern, several scales") {
    for (float scale : {1.0f, 0.5f, 1.0f / 1024, 3.7f, 65536.0f, 1e-30f})
        check_exhaustive<bfloat16>(decode_bf16, scale);
}

TEST_CASE("thrust widen on the CPU backend: a large random span, with an explicit policy") {
    constexpr std::size_t n = (std::size_t{1} << 20) + 3;
    std::vector<bfloat16> in(n);
    std::mt19937 rng(5);
    for (auto& h : in) h.bits = static_cast<std::uint16_t>(rng());
    std::vector<float> out(n);
    const float scale = 1.0f / 4096;
    spillway::cuda::widen(thrust::device, std::span<const bfloat16>(in), std::span<float>(out), scale);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
        float want = reference(decode_bf16(in[i].bits), scale);
        if (std::isnan(want) ? !std::isnan(out[i]) : bits_of(out[i]) != bits_of(want)) ++bad;
    }
    CHECK(bad == 0);
}

TEST_CASE("thrust widen: spans of different sizes are refused before anything is written") {
    std::vector<float16> in(10);
    std::vector<float> out(9, 42.0f);
    try {
        spillway::cuda::widen(std::span<const float16>(in), std::span<float>(out));
        FAIL("mismatched sizes accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("10 elements") != std::string::npos);
        CHECK(std::string(e.what()).find("9") != std::string::npos);
    }
    CHECK(out == std::vector<float>(9, 42.0f));
    std::vector<float16> none;
    std::vector<float> none_out;
    spillway::cuda::widen(std::span<const float16>(none), std::span<float>(none_out));  // empty is fine
}
