// SPDX-License-Identifier: Apache-2.0
// The Thrust kernels' host-side checks (spillway/cuda/thrust_optim.hpp) in a caller's
// translation unit compiled with -ffast-math (tests/CMakeLists.txt compiles this file so),
// on Thrust's CPU backend: std::isfinite may be folded to true there, and a header-only
// library's checks are compiled with the caller's flags. The overflow flag must still be set
// for an inf or NaN gradient, adamw_step must still skip, and a non-finite grad_scale must
// still be refused, like the CPU code (tests/optim/fast_math_test.cpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include <spillway/cuda/thrust_optim.hpp>
#include <spillway/optim/adam.hpp>
#include <spillway/optim/half.hpp>

using namespace spillway;

namespace {
// Whether x is inf or NaN, read from its bits (std::isfinite may fold here).
bool nonfinite(double x) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}
template <class Grad>
std::vector<Grad> gradients(std::size_t n, std::size_t bad_at, float bad) {
    std::vector<Grad> g(n);
    for (std::size_t i = 0; i < n; ++i) {
        const float x = 0.01f * static_cast<float>(i % 7) - 0.03f;
        if constexpr (std::is_same_v<Grad, float>) g[i] = x;
        else g[i] = from_float<Grad>(x);
    }
    if constexpr (std::is_same_v<Grad, float>) g[bad_at] = bad;
    else g[bad_at] = from_float<Grad>(bad);
    return g;
}
template <class Grad>
void check_overflow_flagged() {
    const float inf = std::numeric_limits<float>::infinity();
    const std::size_t n = 1000;
    for (const std::size_t at : {std::size_t{0}, std::size_t{123}, n - 1}) {
        for (const float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
            CAPTURE(at);
            CAPTURE(bad);
            const auto g = gradients<Grad>(n, at, bad);
            const auto r = spillway::cuda::check_gradients(thrust::device, std::span<const Grad>(g), 1.0f);
            CHECK(r.overflow);
            CHECK(nonfinite(r.sum_squares));
            CHECK(nonfinite(r.norm));
            // The CPU's sum agrees that the gradients are not finite.
            CHECK_FALSE(spillway::detail::finite_bits(spillway::grad_sum_squares(std::span<const Grad>(g), 1.0f)));
        }
    }
    const auto good = gradients<Grad>(n, 5, 0.5f);
    const auto r = spillway::cuda::check_gradients(thrust::device, std::span<const Grad>(good), 1.0f);
    CHECK_FALSE(r.overflow);
    CHECK_FALSE(nonfinite(r.norm));
    CHECK(r.norm > 0);
}
}  // namespace

TEST_CASE("under -ffast-math thrust check_gradients flags an inf or NaN gradient") {
    check_overflow_flagged<float>();
    check_overflow_flagged<float16>();
    check_overflow_flagged<bfloat16>();
}

TEST_CASE("under -ffast-math thrust grad_sum_squares refuses a grad_scale the CPU refuses") {
    const auto g = gradients<bfloat16>(100, 3, 0.25f);
    const std::span<const bfloat16> grads(g);
    const float inf = std::numeric_limits<float>::infinity();
    for (const float scale : {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.0f, -1.0f, 1e-39f}) {
        CAPTURE(scale);
        CHECK_THROWS_WITH_AS(spillway::cuda::grad_sum_squares(thrust::device, grads, scale),
                             doctest::Contains("grad_scale"), std::invalid_argument);
        CHECK_THROWS_WITH_AS(spillway::cuda::check_gradients(thrust::device, grads, scale),
                             doctest::Contains("grad_scale"), std::invalid_argument);
        CHECK_THROWS_AS(spillway::grad_sum_squares(grads, scale), std::invalid_argument);  // the same rule
    }
    CHECK(spillway::cuda::grad_sum_squares(thrust::device, grads, 1024.0f) > 0);
}

TEST_CASE("under -ffast-math thrust adamw_step skips a step whose gradients hold an inf or a NaN") {
    const std::size_t n = 5000;
    const float inf = std::numeric_limits<float>::infinity();
    for (const float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
        CAPTURE(bad);
        const auto g = gradients<float16>(n, n - 17, bad);
        std::vector<float> p(n, 1.5f), m(n, 0.25f), v(n, 0.5f);
        std::vector<float16> copy(n, from_float<float16>(7.0f));
        const auto r = spillway::cuda::adamw_step(thrust::device, adamw_config{}, adamw_step_args{},
                                                  std::span<float>(p), std::span<float>(m), std::span<float>(v),
                                                  std::span<const float16>(g), std::span<float16>(copy));
        CHECK(r == step_result::skipped_overflow);
        CHECK(p == std::vector<float>(n, 1.5f));
        CHECK(m == std::vector<float>(n, 0.25f));
        CHECK(v == std::vector<float>(n, 0.5f));
        CHECK(copy == std::vector<float16>(n, from_float<float16>(7.0f)));
    }
    // A non-finite grad_scale is refused before anything is touched.
    const auto good = gradients<float16>(n, 0, 0.5f);
    std::vector<float> p(n, 1.5f), m(n, 0.25f), v(n, 0.5f);
    CHECK_THROWS_WITH_AS(spillway::cuda::adamw_step(thrust::device, adamw_config{}, adamw_step_args{.grad_scale = inf},
                                                    std::span<float>(p), std::span<float>(m), std::span<float>(v),
                                                    std::span<const float16>(good)),
                         doctest::Contains("grad_scale"), std::invalid_argument);
    CHECK(p == std::vector<float>(n, 1.5f));
}
