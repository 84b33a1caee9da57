// SPDX-License-Identifier: Apache-2.0
// The optimizer's Thrust kernels (spillway/cuda/thrust_optim.hpp) on the CPU: built with
// Thrust's OpenMP backend (the sequential CPP backend under ThreadSanitizer), so the
// kernels' logic is checked against the CPU step on machines without a GPU.
// - adamw_step: bit-identical to spillway::adamw_step (the same formula), over several steps
//   of random data, every gradient type, with and without a compute copy, and the overflow
//   skip leaving everything untouched;
// - narrow: bit-identical to spillway::narrow on random floats and special values;
// - check_gradients: within 1e-12 (relative) of a long double reference; overflow flagged.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <thrust/find.h>
#include <thrust/transform_reduce.h>

#include <spillway/cuda/thrust_optim.hpp>
#include <spillway/optim/adam.hpp>
#include <spillway/optim/half.hpp>

using namespace spillway;

namespace {
std::uint32_t bits_of(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
std::size_t mismatches(const std::vector<float>& a, const std::vector<float>& b) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < a.size(); ++i) bad += bits_of(a[i]) != bits_of(b[i]);
    return bad;
}
template <class Half>
std::size_t mismatches(const std::vector<Half>& a, const std::vector<Half>& b) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < a.size(); ++i) bad += !(a[i] == b[i]);
    return bad;
}
template <class Grad>
std::vector<Grad> random_grads(std::size_t n, std::mt19937& rng, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<Grad> g(n);
    for (auto& x : g) {
        if constexpr (std::is_same_v<Grad, float>)
            x = d(rng);
        else
            x = from_float<Grad>(d(rng));
    }
    return g;
}

template <class Grad, class Copy>
void check_adam_matches_cpu(bool with_copy) {
    CAPTURE(with_copy);
    constexpr std::size_t n = 100003;  // not a multiple of any tile or vector width
    std::mt19937 rng(11);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
    for (auto& x : p) x = d(rng);
    const std::vector<float> p0 = p;  // the initial params
    auto p2 = p, m2 = m, v2 = v;
    std::vector<Copy> copy(with_copy ? n : 0), copy2(with_copy ? n : 0);
    adamw_config config{
        .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (std::int64_t step = 1; step <= 4; ++step) {
        auto g = random_grads<Grad>(n, rng, 0.01f * static_cast<float>(step) * 256.0f);
        adamw_step_args args{
            .step = step, .grad_scale = 256.0f, .clip_coef = step == 3 ? 0.5f : 1.0f};
        auto r1 = spillway::adamw_step<Grad, Copy>(config, args, p, m, v, g, copy);
        auto r2 = spillway::cuda::adamw_step(thrust::device, config, args, std::span<float>(p2),
                                             std::span<float>(m2), std::span<float>(v2),
                                             std::span<const Grad>(g), std::span<Copy>(copy2));
        REQUIRE(r1 == step_result::applied);
        REQUIRE(r2 == step_result::applied);
    }
    CHECK(mismatches(p, p2) == 0);
    CHECK(mismatches(m, m2) == 0);
    CHECK(mismatches(v, v2) == 0);
    if (with_copy) CHECK(mismatches(copy, copy2) == 0);
    CHECK(mismatches(p2, p0) >
          n / 2);  // the params really moved (a step with lr = 0 would fail here)
}
}  // namespace

TEST_CASE("thrust adamw_step on the CPU backend is bit-identical to the CPU step") {
    check_adam_matches_cpu<float, float16>(false);
    check_adam_matches_cpu<float16, float16>(true);
    check_adam_matches_cpu<bfloat16, bfloat16>(true);
    check_adam_matches_cpu<bfloat16, float16>(false);
}

TEST_CASE("thrust adamw_step: an inf or NaN gradient skips the step and touches nothing") {
    constexpr std::size_t n = 5000;
    std::mt19937 rng(2);
    for (float bad :
         {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        auto g = random_grads<float16>(n, rng, 1.0f);
        g[n - 17] = from_float<float16>(bad);
        std::vector<float> p(n, 1.5f), m(n, 0.25f), v(n, 0.5f);
        std::vector<float16> copy(n, from_float<float16>(7.0f));
        auto r = spillway::cuda::adamw_step(thrust::device, adamw_config{}, adamw_step_args{},
                                            std::span<float>(p), std::span<float>(m),
                                            std::span<float>(v), std::span<const float16>(g),
                                            std::span<float16>(copy));
        CHECK(r == step_result::skipped_overflow);
        CHECK(p == std::vector<float>(n, 1.5f));
        CHECK(m == std::vector<float>(n, 0.25f));
        CHECK(v == std::vector<float>(n, 0.5f));
        CHECK(copy == std::vector<float16>(n, from_float<float16>(7.0f)));
    }
}

TEST_CASE("thrust adamw_step: bad arguments are refused naming the field or the span") {
    std::vector<float> p(10), m(10), v(9);
    std::vector<float> g(10);
    auto call = [&](adamw_config c, adamw_step_args a) {
        return spillway::cuda::adamw_step(thrust::device, c, a, std::span<float>(p),
                                          std::span<float>(m), std::span<float>(v),
                                          std::span<const float>(g));
    };
    CHECK_THROWS_WITH_AS(call({}, {}), doctest::Contains("v has 9 elements but params has 10"),
                         std::invalid_argument);
    v.resize(10);
    CHECK_THROWS_WITH_AS(call({.lr = -1.0f}, {}), doctest::Contains("lr = -1"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(call({}, {.step = 0}), doctest::Contains("step = 0"),
                         std::invalid_argument);
}

TEST_CASE("thrust narrow on the CPU backend is bit-identical to spillway::narrow") {
    constexpr std::size_t n = (std::size_t{1} << 18) + 5;
    std::mt19937 rng(9);
    std::vector<float> in(n);
    for (auto& x : in) {  // random bit patterns: every exponent, subnormals, infinities, NaNs
        std::uint32_t u = static_cast<std::uint32_t>(rng());
        std::memcpy(&x, &u, sizeof x);
    }
    const float specials[] = {0.0f,
                              -0.0f,
                              65504.0f,
                              65520.0f,
                              65519.99f,
                              5.9604645e-8f,
                              2.9802322e-8f,
                              std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::denorm_min()};
    for (std::size_t i = 0; i < std::size(specials); ++i) in[i] = specials[i];
    std::vector<float16> h1(n), h2(n);
    std::vector<bfloat16> b1(n), b2(n);
    spillway::narrow(in, std::span<float16>(h1));
    spillway::narrow(in, std::span<bfloat16>(b1));
    spillway::cuda::narrow(thrust::device, std::span<const float>(in), std::span<float16>(h2));
    spillway::cuda::narrow(thrust::device, std::span<const float>(in), std::span<bfloat16>(b2));
    CHECK(mismatches(h1, h2) == 0);
    CHECK(mismatches(b1, b2) == 0);
    std::vector<float16> short_out(n - 1);
    CHECK_THROWS_AS(spillway::cuda::narrow(thrust::device, std::span<const float>(in),
                                           std::span<float16>(short_out)),
                    std::invalid_argument);
}

TEST_CASE(
    "thrust check_gradients: the norm within 1e-12 of a long double reference, overflow flagged") {
    constexpr std::size_t n = 300007;
    std::mt19937 rng(4);
    auto g = random_grads<bfloat16>(n, rng, 3.0f);
    const float scale = 1024.0f;
    long double ref = 0;
    for (auto x : g) {
        long double w = to_float(x) / static_cast<long double>(scale);
        ref += w * w;
    }
    auto r = spillway::cuda::check_gradients(thrust::device, std::span<const bfloat16>(g), scale);
    CHECK_FALSE(r.overflow);
    CHECK(std::fabs(static_cast<long double>(r.sum_squares) - ref) <= 1e-12L * ref);
    CHECK(std::fabs(static_cast<long double>(r.norm) - std::sqrt(ref)) <= 1e-12L * std::sqrt(ref));
    // The CPU's sum adds in another order: the two agree to double rounding, not bits.
    double cpu = spillway::grad_sum_squares(std::span<const bfloat16>(g), scale);
    CHECK(std::fabs(cpu - r.sum_squares) <= 1e-12 * cpu);

    g[12345] = from_float<bfloat16>(-std::numeric_limits<float>::infinity());
    auto bad = spillway::cuda::check_gradients(thrust::device, std::span<const bfloat16>(g), scale);
    CHECK(bad.overflow);
    CHECK_FALSE(std::isfinite(bad.norm));
    CHECK_THROWS_WITH_AS(
        spillway::cuda::check_gradients(thrust::device, std::span<const bfloat16>(g), 0.0f),
        doctest::Contains("grad_scale = 0"), std::invalid_argument);
    // The CPU's rule: 1/grad_scale must be finite in float too (below 1/FLT_MAX it is not).
    CHECK_THROWS_WITH_AS(
        spillway::cuda::check_gradients(thrust::device, std::span<const bfloat16>(g), 1e-39f),
        doctest::Contains("grad_scale = 1e-39"), std::invalid_argument);
    CHECK_THROWS_AS(spillway::grad_sum_squares(std::span<const bfloat16>(g), 1e-39f),
                    std::invalid_argument);
}

// The overflow scan is one reduction per call. A thrust::any_of is a find_if, which Thrust's
// CUDA backend runs as a loop of bounded searches, each ending in a host round trip (and
// its own scratch allocation): thousands per step at billions of parameters. A policy of
// the CPU backend that counts the algorithms Thrust dispatches to shows which one runs.
namespace counted {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
struct policy : thrust::system::omp::execution_policy<policy> {};
inline constexpr auto& base = thrust::omp::par;
#else
struct policy : thrust::system::cpp::execution_policy<policy> {};
inline constexpr auto& base = thrust::cpp::par;
#endif
int find_ifs = 0, reductions = 0;
template <class It, class Pred>
It find_if(policy&, It first, It last, Pred pred) {
    ++find_ifs;
    return thrust::find_if(base, first, last, pred);
}
template <class It, class F, class T, class Op>
T transform_reduce(policy&, It first, It last, F f, T init, Op op) {
    ++reductions;
    return thrust::transform_reduce(base, first, last, f, init, op);
}
}  // namespace counted

TEST_CASE("thrust adamw_step: the overflow scan is one reduction, not a find_if") {
    const std::size_t n =
        (std::size_t{3} << 20) + 7;  // several of the CUDA backend's search intervals
    std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f), g(n, 0.5f);
    counted::policy policy;
    for (bool overflow : {false, true}) {
        CAPTURE(overflow);
        if (overflow) g[n - 3] = std::numeric_limits<float>::infinity();
        counted::find_ifs = counted::reductions = 0;
        auto r = spillway::cuda::adamw_step(policy, adamw_config{}, adamw_step_args{},
                                            std::span<float>(p), std::span<float>(m),
                                            std::span<float>(v), std::span<const float>(g));
        CHECK(r == (overflow ? step_result::skipped_overflow : step_result::applied));
        CHECK(counted::find_ifs == 0);
        CHECK(counted::reductions == 1);
    }
}
