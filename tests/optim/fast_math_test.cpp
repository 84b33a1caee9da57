// SPDX-License-Identifier: Apache-2.0
// The overflow checks in a caller's code compiled with -ffast-math (tests/CMakeLists.txt
// compiles this file so): std::isfinite may be folded to true there, and a header-only
// library's checks are compiled in the caller's translation unit. The pipeline must still
// skip a step whose gradients hold an inf or a NaN, and clipping must still see them.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <spillway/optim/adam.hpp>
#include <spillway/optim/update_pipeline.hpp>
#include <spillway/tier/host_tier.hpp>

using namespace spillway;

namespace {
std::vector<float16> gradients(std::size_t n, std::size_t bad_at, float bad) {
    std::vector<float16> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = from_float<float16>(0.01f * static_cast<float>(i % 7) - 0.03f);
    g[bad_at] = from_float<float16>(bad);
    return g;
}
}  // namespace

TEST_CASE("under -ffast-math an inf or NaN gradient still skips the pipeline's step and leaves every param") {
    const std::size_t n = 100;
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> init(n);
    for (std::size_t i = 0; i < n; ++i) init[i] = 0.001f * static_cast<float>(i);
    for (const double max_norm : {0.0, 1.0}) {  // without and with clipping
        for (const std::size_t at : {std::size_t{7}, n - 1}) {  // inside and in the short last subgroup
            for (const float bad : {inf, -inf, std::nanf("")}) {
                CAPTURE(max_norm);
                CAPTURE(at);
                host_tier tier;
                pipeline_config cfg{.param_count = n, .subgroup_size = 32, .host_buffers = 3, .max_grad_norm = max_norm};
                update_pipeline<host_tier, float16, float> pipe(tier, cfg, init);
                std::vector<float> copy(init);
                CHECK(pipe.update(gradients(n, at, bad), copy) == step_result::skipped_overflow);
                CHECK(pipe.steps() == 0);
                CHECK(std::memcmp(copy.data(), init.data(), n * sizeof(float)) == 0);
                std::vector<float> held(n);
                pipe.read_params(held);
                CHECK(std::memcmp(held.data(), init.data(), n * sizeof(float)) == 0);
            }
        }
    }
}

TEST_CASE("under -ffast-math clip_coefficient of a non-finite total is NaN (the caller skips)") {
    const float c = clip_coefficient(std::numeric_limits<double>::infinity(), 1.0);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &c, sizeof bits);
    CHECK((bits & 0x7f800000u) == 0x7f800000u);  // NaN, read from its bits (std::isnan may fold here)
    CHECK((bits & 0x007fffffu) != 0u);
    CHECK(clip_coefficient(4.0, 1.0) < 1.0f);  // a finite norm of 2 clips to 1/2
}
