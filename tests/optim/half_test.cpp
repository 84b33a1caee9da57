// SPDX-License-Identifier: Apache-2.0
// Tests for spillway/optim/half.hpp: exhaustive fp16/bf16 widening, narrowing against an
// independent nearest-value reference, and every SIMD level against the scalar code.
#include <spillway/optim/half.hpp>

#include <doctest/doctest.h>

#include "support/simd_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using spillway::bfloat16;
using spillway::float16;
using spillway::detail::simd_level;

namespace {

std::uint32_t bits_of(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
float float_of(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

const simd_level all_levels[] = {simd_level::scalar, simd_level::avx2, simd_level::avx512};

#ifdef SPILLWAY_SANITIZED  // fewer random inputs and alignments; every case kind still runs
constexpr int random_inputs = 20000;
constexpr std::uint32_t bf16_stride = 61;
const std::size_t large_offsets[] = {5};
#else
constexpr int random_inputs = 200000;
constexpr std::uint32_t bf16_stride = 7;
const std::size_t large_offsets[] = {0, 1, 5};
#endif

// The value of a finite fp16 pattern from its definition, in double.
double fp16_value(std::uint16_t h) {
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
    return (h & 0x8000) ? -mag : mag;
}

// Reference narrowing: of the two neighbours lo <= a < hi (hi is the next pattern, lo + 1,
// which past the largest finite value is the infinity pattern, valued as the next power of
// two), the nearer by distance in double; a tie goes to the even pattern.
std::uint16_t nearest(double a, std::uint16_t lo, double vlo, double vhi) {
    double dlo = a - vlo, dhi = vhi - a;
    if (dlo < dhi || (dlo == dhi && (lo & 1) == 0)) return lo;
    return static_cast<std::uint16_t>(lo + 1);
}

std::uint16_t ref_fp16(float x) {
    std::uint32_t u = bits_of(x);
    std::uint16_t sign = (u >> 16) & 0x8000;
    if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7e00 | ((u >> 13) & 0x3ff));
    double a = std::fabs(static_cast<double>(x));
    // Largest pattern whose value is <= a (binary search over the monotonic positive patterns).
    std::uint16_t lo = 0, hi = 0x7bff;
    if (a >= fp16_value(0x7bff)) {
        lo = 0x7bff;
    } else {
        while (lo < hi) {
            auto mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
            if (fp16_value(mid) <= a) lo = mid;
            else hi = static_cast<std::uint16_t>(mid - 1);
        }
    }
    double vlo = fp16_value(lo);
    double vhi = lo == 0x7bff ? 65536.0 : fp16_value(static_cast<std::uint16_t>(lo + 1));
    return static_cast<std::uint16_t>(sign | nearest(a, lo, vlo, vhi));  // a = inf: lo + 1 = inf
}

std::uint16_t ref_bf16(float x) {
    std::uint32_t u = bits_of(x);
    std::uint16_t sign = (u >> 16) & 0x8000;
    if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
    if (std::isinf(x)) return static_cast<std::uint16_t>(sign | 0x7f80);
    double a = std::fabs(static_cast<double>(x));
    auto lo = static_cast<std::uint16_t>((u >> 16) & 0x7fff);  // truncation: value <= a
    double vlo = static_cast<double>(float_of(static_cast<std::uint32_t>(lo) << 16));
    double vhi = lo == 0x7f7f ? std::ldexp(1.0, 128) : static_cast<double>(float_of(static_cast<std::uint32_t>(lo + 1) << 16));
    return static_cast<std::uint16_t>(sign | nearest(a, lo, vlo, vhi));
}

// Inputs that hit every rounding case: random bits, every fp16 value and its neighbours,
// exact midpoints between fp16 values, bf16 neighbours and midpoints, specials.
std::vector<float> narrowing_inputs() {
    std::vector<float> xs;
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<std::uint32_t> any;
    for (int i = 0; i < random_inputs; ++i) xs.push_back(float_of(any(rng)));
    for (std::uint32_t h = 0; h < 0x7c00; ++h) {
        float f = spillway::to_float(float16{static_cast<std::uint16_t>(h)});
        double next = h == 0x7bff ? 65536.0 : fp16_value(static_cast<std::uint16_t>(h + 1));
        float mid = static_cast<float>((static_cast<double>(f) + next) / 2);  // exact in float
        for (float y : {f, mid}) {
            xs.push_back(y);
            xs.push_back(std::nextafter(y, 0.0f));
            xs.push_back(std::nextafter(y, 1e30f));
            xs.push_back(-y);
        }
    }
    for (std::uint32_t b = 0; b < 0x7f80; b += bf16_stride) {
        std::uint32_t base = b << 16;
        for (std::uint32_t low : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
            xs.push_back(float_of(base | low));
            xs.push_back(float_of(0x80000000u | base | low));
        }
    }
    const float inf = std::numeric_limits<float>::infinity();
    for (float y : {0.0f, -0.0f, inf, -inf, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e-8f, 2.9802322e-08f,
                    5.9604645e-08f, 3.4028235e38f, 1.17549435e-38f, 1e-45f, std::numeric_limits<float>::quiet_NaN()})
        xs.push_back(y);
    for (std::uint32_t payload : {1u, 0x2000u, 0x3fffffu, 0x400000u, 0x7fffffu, 0x1234u, 0x10000u})
        for (std::uint32_t s : {0u, 0x80000000u}) xs.push_back(float_of(s | 0x7f800000u | payload));
    return xs;
}

}  // namespace

SPILLWAY_SIMD_CASES("float16 widening is exact for all 65,536 patterns, in SIMD level", level) {
    std::vector<float16> all(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) all[i].bits = static_cast<std::uint16_t>(i);
    std::vector<float> scalar(65536);
    spillway::detail::widen(simd_level::scalar, all.data(), scalar.data(), all.size());
    for (std::uint32_t i = 0; i < 65536; ++i) {
        auto h = static_cast<std::uint16_t>(i);
        float f = spillway::to_float(float16{h});
        REQUIRE(bits_of(f) == bits_of(scalar[i]));
        int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
        REQUIRE(std::signbit(f) == ((h & 0x8000) != 0));
        if (exp == 0x1f && mant != 0) {  // NaN: same payload, quiet
            REQUIRE(std::isnan(f));
            REQUIRE(((bits_of(f) >> 13) & 0x3ff) == (mant | 0x200u));
            REQUIRE((bits_of(f) & 0x1fff) == 0);
        } else if (exp == 0x1f) {
            REQUIRE(std::isinf(f));
        } else {
            REQUIRE(static_cast<double>(f) == fp16_value(h));
            REQUIRE(spillway::from_float<float16>(f).bits == h);  // round trip
        }
    }
    {
        const std::string level_name = spillway::detail::to_string(level);
        CAPTURE(level_name);
        // Offsets and lengths that leave every tail length.
        for (std::size_t off : {0, 1, 7}) {
            std::size_t n = all.size() - off - (off * 3);
            std::vector<float> out(n, -1.0f);
            spillway::detail::widen(level, all.data() + off, out.data(), n);
            for (std::size_t i = 0; i < n; ++i) REQUIRE(bits_of(out[i]) == bits_of(scalar[i + off]));
        }
    }
}

TEST_CASE("bfloat16 widening is exact for all 65,536 patterns, in every SIMD level") {
    std::vector<bfloat16> all(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) all[i].bits = static_cast<std::uint16_t>(i);
    for (simd_level level : all_levels) {
        if (!spillway::detail::supported(level)) continue;
        const std::string level_name = spillway::detail::to_string(level);
        CAPTURE(level_name);
        std::vector<float> out(all.size() - 3);
        spillway::detail::widen(level, all.data() + 3, out.data(), out.size());
        for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(bits_of(out[i]) == (i + 3) << 16);
    }
    for (std::uint32_t i = 0; i < 65536; ++i) {
        auto h = static_cast<std::uint16_t>(i);
        float f = spillway::to_float(bfloat16{h});
        if (!std::isnan(f)) REQUIRE(spillway::from_float<bfloat16>(f).bits == h);
        else REQUIRE(spillway::from_float<bfloat16>(f).bits == (h | 0x40));
    }
}

TEST_CASE("narrowing rounds to nearest even, overflows to inf, keeps subnormals and NaN") {
    const std::vector<float> xs = narrowing_inputs();
    std::size_t checked = 0;
    for (float x : xs) {
        CAPTURE(x);
        CAPTURE(bits_of(x));
        REQUIRE(spillway::from_float<float16>(x).bits == ref_fp16(x));
        REQUIRE(spillway::from_float<bfloat16>(x).bits == ref_bf16(x));
        ++checked;
    }
    CHECK(checked > 250000);
    // Named cases.
    CHECK(spillway::from_float<float16>(65504.0f).bits == 0x7bff);
    CHECK(spillway::from_float<float16>(65519.996f).bits == 0x7bff);
    CHECK(spillway::from_float<float16>(65520.0f).bits == 0x7c00);
    CHECK(spillway::from_float<float16>(-1e6f).bits == 0xfc00);
    CHECK(spillway::from_float<float16>(5.9604645e-08f).bits == 0x0001);   // smallest subnormal
    CHECK(spillway::from_float<float16>(2.9802322e-08f).bits == 0x0000);   // 2^-25 ties to even (0)
    CHECK(spillway::from_float<float16>(2.9802326e-08f).bits == 0x0001);   // just above the tie
    CHECK(spillway::from_float<float16>(-1e-10f).bits == 0x8000);
    CHECK(spillway::from_float<float16>(1.00048828125f).bits == 0x3c00);  // 1 + 2^-11: tie, to even (down)
    CHECK(spillway::from_float<float16>(1.00146484375f).bits == 0x3c02);  // 1 + 3*2^-11: tie, to even (up)
    CHECK(spillway::from_float<bfloat16>(3.4028235e38f).bits == 0x7f80);  // rounds past max
    CHECK(spillway::from_float<bfloat16>(1e-45f).bits == 0x0000);
    CHECK(spillway::from_float<bfloat16>(float_of(0x00018000u)).bits == 0x0002);  // subnormal tie, odd: up
    CHECK(spillway::from_float<bfloat16>(float_of(0x7f800001u)).bits == 0x7fc0);  // sNaN stays NaN
    CHECK(std::isnan(spillway::to_float(spillway::from_float<float16>(std::numeric_limits<float>::quiet_NaN()))));
}

SPILLWAY_SIMD_CASES("SIMD narrowing gives the scalar bits, at every tail length, in level", level) {
    const std::vector<float> xs = narrowing_inputs();
    std::vector<float16> want16(xs.size());
    std::vector<bfloat16> want_bf(xs.size());
    spillway::detail::narrow(simd_level::scalar, xs.data(), want16.data(), xs.size());
    spillway::detail::narrow(simd_level::scalar, xs.data(), want_bf.data(), xs.size());
    {
        const std::string level_name = spillway::detail::to_string(level);
        CAPTURE(level_name);
        std::vector<float16> got16(xs.size());
        std::vector<bfloat16> got_bf(xs.size());
        spillway::detail::narrow(level, xs.data(), got16.data(), xs.size());
        spillway::detail::narrow(level, xs.data(), got_bf.data(), xs.size());
        REQUIRE(std::memcmp(got16.data(), want16.data(), xs.size() * 2) == 0);
        REQUIRE(std::memcmp(got_bf.data(), want_bf.data(), xs.size() * 2) == 0);
        for (std::size_t n = 0; n <= 70; ++n) {  // every tail; nothing written past n
            std::vector<float16> o16(n + 4, float16{0xabcd});
            std::vector<bfloat16> obf(n + 4, bfloat16{0xabcd});
            spillway::detail::narrow(level, xs.data() + 5, o16.data(), n);
            spillway::detail::narrow(level, xs.data() + 5, obf.data(), n);
            for (std::size_t i = 0; i < n; ++i) {
                REQUIRE(o16[i] == want16[i + 5]);
                REQUIRE(obf[i] == want_bf[i + 5]);
            }
            for (std::size_t i = n; i < n + 4; ++i) {
                REQUIRE(o16[i].bits == 0xabcd);
                REQUIRE(obf[i].bits == 0xabcd);
            }
            std::vector<float> w(n + 4, 7.0f);
            spillway::detail::widen(level, o16.data(), w.data(), n);
            for (std::size_t i = 0; i < n; ++i) REQUIRE(bits_of(w[i]) == bits_of(spillway::to_float(o16[i])));
            for (std::size_t i = n; i < n + 4; ++i) REQUIRE(w[i] == 7.0f);
        }
    }
}

TEST_CASE("large conversions (streaming stores) give the scalar bits at any alignment") {
    // Past nontemporal_min_bytes the SIMD kernels peel to a line boundary and stream.
    const std::size_t n = spillway::detail::nontemporal_min_bytes / 2 + 77;  // narrow outputs too
    std::mt19937_64 rng(9);
    std::uniform_int_distribution<std::uint32_t> any;
    std::vector<float> xs(n + 8);
    for (auto& x : xs) x = float_of(any(rng));
    std::vector<float16> want16(n);
    std::vector<bfloat16> want_bf(n);
    spillway::detail::narrow(simd_level::scalar, xs.data() + 3, want16.data(), n);
    spillway::detail::narrow(simd_level::scalar, xs.data() + 3, want_bf.data(), n);
    std::vector<float> want_w16(n), want_wbf(n);
    spillway::detail::widen(simd_level::scalar, want16.data(), want_w16.data(), n);
    spillway::detail::widen(simd_level::scalar, want_bf.data(), want_wbf.data(), n);
    for (simd_level level : all_levels) {
        if (level == simd_level::scalar || !spillway::detail::supported(level)) continue;
        const std::string level_name = spillway::detail::to_string(level);
        CAPTURE(level_name);
        for (std::size_t off : large_offsets) {  // output misaligned by off elements
            CAPTURE(off);
            std::vector<float16> o16(n + off + 1, float16{0xabcd});
            std::vector<bfloat16> obf(n + off + 1, bfloat16{0xabcd});
            spillway::detail::narrow(level, xs.data() + 3, o16.data() + off, n);
            spillway::detail::narrow(level, xs.data() + 3, obf.data() + off, n);
            REQUIRE(std::memcmp(o16.data() + off, want16.data(), n * 2) == 0);
            REQUIRE(std::memcmp(obf.data() + off, want_bf.data(), n * 2) == 0);
            REQUIRE(o16[n + off].bits == 0xabcd);
            REQUIRE(obf[n + off].bits == 0xabcd);
            std::vector<float> w(n + off + 1, 7.0f);
            spillway::detail::widen(level, want16.data(), w.data() + off, n);
            REQUIRE(std::memcmp(w.data() + off, want_w16.data(), n * 4) == 0);
            REQUIRE(w[n + off] == 7.0f);
            spillway::detail::widen(level, want_bf.data(), w.data() + off, n);
            REQUIRE(std::memcmp(w.data() + off, want_wbf.data(), n * 4) == 0);
        }
    }
}

TEST_CASE("span widen/narrow use the best level and reject mismatched sizes") {
    std::vector<float> f = {1.5f, -2.25f, 65520.0f, 1e-8f, 3.0f};
    std::vector<float16> h(f.size());
    std::vector<bfloat16> b(f.size());
    spillway::narrow(f, std::span<float16>(h));
    spillway::narrow(f, std::span<bfloat16>(b));
    for (std::size_t i = 0; i < f.size(); ++i) {
        CHECK(h[i] == spillway::from_float<float16>(f[i]));
        CHECK(b[i] == spillway::from_float<bfloat16>(f[i]));
    }
    std::vector<float> back(f.size());
    spillway::widen(std::span<const float16>(h), std::span<float>(back));
    CHECK(back[0] == 1.5f);
    CHECK(std::isinf(back[2]));
    std::vector<float> short_out(3);
    CHECK_THROWS_WITH_AS(spillway::widen(std::span<const float16>(h), std::span<float>(short_out)),
                         doctest::Contains("input has 5 elements but output has 3"), std::invalid_argument);
    std::vector<bfloat16> short_b(2);
    CHECK_THROWS_WITH_AS(spillway::narrow(f, std::span<bfloat16>(short_b)),
                         doctest::Contains("narrow: input has 5 elements but output has 2"), std::invalid_argument);
    MESSAGE("best SIMD level: " << std::string(spillway::detail::to_string(spillway::detail::best_simd_level())));
}
