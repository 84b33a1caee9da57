// SPDX-License-Identifier: Apache-2.0
// Tests for spillway/optim/adam.hpp: the AdamW step against a float64 reference, SIMD levels
// and sub-span splits bit for bit, overflow skip, unscaling, clipping, sums of squares and
// argument validation.
#include <spillway/optim/adam.hpp>

#include <doctest/doctest.h>

#include "support/simd_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using spillway::adamw_config;
using spillway::adamw_step_args;
using spillway::bfloat16;
using spillway::float16;
using spillway::step_result;
using spillway::detail::no_copy;
using spillway::detail::simd_level;

namespace {

#if defined(SPILLWAY_SANITIZED) || !defined(__OPTIMIZE__)  // sanitizers and -O0: smaller
constexpr std::size_t large_n = (1u << 16) + 3;
#else
constexpr std::size_t large_n = (1u << 20) + 3;
#endif

const simd_level all_levels[] = {simd_level::scalar, simd_level::avx2, simd_level::avx512};

template <class Grad>
Grad make_grad(float x) {
    if constexpr (std::is_same_v<Grad, float>) return x;
    else return spillway::from_float<Grad>(x);
}
template <class Grad>
double grad_value(Grad g) {
    return static_cast<double>(spillway::detail::widen_one(g));
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
template <class T>
const char* type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, float16>) return "float16";
    else if constexpr (std::is_same_v<T, bfloat16>) return "bfloat16";
    else return "none";
}

struct state {
    std::vector<float> p, m, v;
};

state random_state(std::size_t n, std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    state s{std::vector<float>(n), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
    for (auto& x : s.p) x = nd(rng);
    return s;
}

// Gradient values spread over 5 decades, times `scale` (the loss scale), stored as Grad.
template <class Grad>
std::vector<Grad> random_grads(std::size_t n, float scale, std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> decade(-4.0f, 1.0f);
    std::vector<Grad> g(n);
    for (auto& x : g) x = make_grad<Grad>(nd(rng) * std::pow(10.0f, decade(rng)) * scale);
    return g;
}

// float64 reference of torch.optim.AdamW, plus running magnitudes for error bounds.
struct reference {
    std::vector<double> p, m, v, m_scale, p_scale;
    explicit reference(const state& s)
        : p(s.p.begin(), s.p.end()), m(s.m.begin(), s.m.end()), v(s.v.begin(), s.v.end()),
          m_scale(s.p.size(), 0.0), p_scale(s.p.size(), 0.0) {}

    template <class Grad>
    void step(const adamw_config& c, const adamw_step_args& a, const std::vector<Grad>& grads) {
        double lr = c.lr, b1 = c.beta1, b2 = c.beta2, eps = c.eps, wd = c.weight_decay;
        double t = static_cast<double>(a.step);
        double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
        for (std::size_t i = 0; i < p.size(); ++i) {
            double g = grad_value(grads[i]) / a.grad_scale * a.clip_coef;
            p[i] *= 1 - lr * wd;
            m[i] = b1 * m[i] + (1 - b1) * g;
            v[i] = b2 * v[i] + (1 - b2) * g * g;
            m_scale[i] = b1 * m_scale[i] + (1 - b1) * std::fabs(g);
            double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
            p[i] -= lr / bc1 * m[i] / denom;
            p_scale[i] += std::fabs(p[i]) + lr / bc1 * m_scale[i] / denom;
        }
    }
};

// |float - double| within a few float32 roundings per step of the magnitudes involved.
void check_close(const state& s, const reference& r, int steps) {
    const double u = std::ldexp(1.0, -24) * 16 * steps;
    std::size_t i = 0;  // the first element out of bounds (checked in a plain loop: fast)
    for (; i < s.p.size(); ++i)
        if (!(std::fabs(s.m[i] - r.m[i]) <= u * r.m_scale[i] && std::fabs(s.v[i] - r.v[i]) <= u * r.v[i] &&
              std::fabs(s.p[i] - r.p[i]) <= u * r.p_scale[i]))
            break;
    if (i == s.p.size()) return;
    CAPTURE(i);
    CHECK(std::fabs(s.m[i] - r.m[i]) <= u * r.m_scale[i]);
    CHECK(std::fabs(s.v[i] - r.v[i]) <= u * r.v[i]);
    CHECK(std::fabs(s.p[i] - r.p[i]) <= u * r.p_scale[i]);
    FAIL("element " << i << " of " << s.p.size() << " differs from the float64 reference");
}

template <class Grad, class Copy>
void reference_case(std::size_t n, std::mt19937_64& rng) {
    CAPTURE(n);
    CAPTURE(std::string(type_name<Grad>()));
    CAPTURE(std::string(type_name<Copy>()));
    const adamw_config cfg{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
    const float scale = std::is_same_v<Grad, float> ? 1000.0f : 512.0f;
    state s = random_state(n, rng);
    reference r(s);
    std::vector<Copy> copy(std::is_same_v<Copy, no_copy> ? 0 : n);
    const std::int64_t steps[] = {1, 2, 3, 1000};
    const float clips[] = {1.0f, 0.7f, 1.0f, 0.3f};
    for (int k = 0; k < 4; ++k) {
        auto grads = random_grads<Grad>(n, scale, rng);
        adamw_step_args args{.step = steps[k], .grad_scale = scale, .clip_coef = clips[k]};
        step_result res;
        if constexpr (std::is_same_v<Copy, no_copy>)
            res = spillway::adamw_step<Grad>(cfg, args, s.p, s.m, s.v, std::span<const Grad>(grads));
        else
            res = spillway::adamw_step<Grad, Copy>(cfg, args, s.p, s.m, s.v, std::span<const Grad>(grads), copy);
        REQUIRE(res == step_result::applied);
        r.step(cfg, args, grads);
        check_close(s, r, k + 1);
        if constexpr (!std::is_same_v<Copy, no_copy>) {
            std::size_t bad = 0;
            for (std::size_t i = 0; i < n; ++i) bad += !(copy[i] == spillway::from_float<Copy>(s.p[i]));
            REQUIRE(bad == 0);
        }
    }
}

const std::size_t tail_lengths[] = {0,   1,   2,   3,   7,   8,   9,    15,    16,    17,    31,   32,
                                    33,  63,  64,  65,  127, 128, 129,  255,   256,   257,   1000, 16383,
                                    16384, 16385, 3 * 16384 + 17};

template <class Grad, class Copy>
void all_lengths(std::mt19937_64& rng, bool with_large) {
    for (std::size_t n : tail_lengths) reference_case<Grad, Copy>(n, rng);
    if (with_large) reference_case<Grad, Copy>(large_n, rng);
}

// Runs the step with an explicit SIMD level; returns p, m, v and the copy.
template <class Grad, class Copy>
std::tuple<state, std::vector<Copy>> run_level(simd_level level, const state& s0, const std::vector<Grad>& g,
                                               const spillway::adamw_coefficients& c,
                                               spillway::thread_pool& pool) {
    state s = s0;
    std::vector<Copy> copy(std::is_same_v<Copy, no_copy> ? 0 : s.p.size());
    auto res = spillway::detail::adamw_step_at(level, c, spillway::grad_check::scan, s.p.data(), s.m.data(),
                                               s.v.data(), g.data(), copy.data(), s.p.size(), pool);
    REQUIRE(res == step_result::applied);
    return {std::move(s), std::move(copy)};
}

// Compares SIMD level `only` with the scalar level.
template <class Grad, class Copy>
void levels_case(std::mt19937_64& rng, simd_level only) {
    spillway::thread_pool pool(2);
    const adamw_config cfg{.lr = 3e-3f, .weight_decay = 0.01f};
    std::vector<std::size_t> lengths;
    for (std::size_t n = 0; n <= 70; ++n) lengths.push_back(n);
    lengths.push_back(2 * 16384 + 5);
    for (std::size_t n : lengths) {
        CAPTURE(n);
        state s0 = random_state(n, rng);
        std::uniform_real_distribution<float> pos(0.0f, 2.0f);
        for (auto& x : s0.m) x = pos(rng) - 1.0f;
        for (auto& x : s0.v) x = pos(rng) * 1e-3f;
        auto g = random_grads<Grad>(n, 64.0f, rng);
        auto c = make_adamw_coefficients(cfg, adamw_step_args{.step = 7, .grad_scale = 64.0f, .clip_coef = 0.9f});
        auto [want, want_copy] = run_level<Grad, Copy>(simd_level::scalar, s0, g, c, pool);
        {
            const simd_level level = only;
            auto [got, got_copy] = run_level<Grad, Copy>(level, s0, g, c, pool);
            const std::string level_name = spillway::detail::to_string(level);
            CAPTURE(level_name);
            REQUIRE(same_bits(got.p, want.p));
            REQUIRE(same_bits(got.m, want.m));
            REQUIRE(same_bits(got.v, want.v));
            if constexpr (!std::is_same_v<Copy, no_copy>) REQUIRE(same_bits(got_copy, want_copy));
        }
    }
}

}  // namespace

TEST_CASE("adamw_step matches a float64 AdamW reference for every gradient type, with and without copy out") {
    std::mt19937_64 rng(1);
    SUBCASE("float grads") {
        all_lengths<float, no_copy>(rng, true);
        all_lengths<float, float16>(rng, false);
        all_lengths<float, bfloat16>(rng, false);
    }
    SUBCASE("float16 grads") {
        all_lengths<float16, no_copy>(rng, false);
        all_lengths<float16, float16>(rng, true);
        all_lengths<float16, bfloat16>(rng, false);
    }
    SUBCASE("bfloat16 grads") {
        all_lengths<bfloat16, no_copy>(rng, false);
        all_lengths<bfloat16, float16>(rng, false);
        all_lengths<bfloat16, bfloat16>(rng, true);
    }
}

SPILLWAY_SIMD_CASES("the SIMD step gives the scalar bits, for every tail length, in level", level) {
    std::mt19937_64 rng(2);
    levels_case<float, no_copy>(rng, level);
    levels_case<float, float16>(rng, level);
    levels_case<float16, bfloat16>(rng, level);
    levels_case<float16, no_copy>(rng, level);
    levels_case<bfloat16, float16>(rng, level);
    levels_case<bfloat16, bfloat16>(rng, level);
}

TEST_CASE("one call over N equals calls over arbitrary sub-spans and any pool size, bit for bit") {
    std::mt19937_64 rng(3);
    const std::size_t n = 3 * 16384 + 1234;
    const adamw_config cfg{.lr = 1e-3f, .weight_decay = 0.05f};
    state s0 = random_state(n, rng);
    auto g = random_grads<float16>(n, 128.0f, rng);
    const adamw_step_args args{.step = 4, .grad_scale = 128.0f, .clip_coef = 0.8f};
    spillway::thread_pool pool3(3);
    state whole = s0;
    std::vector<bfloat16> whole_copy(n);
    REQUIRE(spillway::adamw_step<float16, bfloat16>(cfg, args, whole.p, whole.m, whole.v, std::span<const float16>(g),
                                                    whole_copy, &pool3) == step_result::applied);
    for (std::size_t workers : {0, 1, 3}) {
        CAPTURE(workers);
        spillway::thread_pool pool(workers);
        for (int trial = 0; trial < 3; ++trial) {
            state parts = s0;
            std::vector<bfloat16> parts_copy(n);
            std::uniform_int_distribution<std::size_t> len(1, trial == 0 ? 40 : 20000);
            for (std::size_t b = 0; b < n;) {
                std::size_t e = std::min(n, b + len(rng));
                std::span<float> p(parts.p), m(parts.m), v(parts.v);
                REQUIRE(spillway::adamw_step<float16, bfloat16>(
                            cfg, args, p.subspan(b, e - b), m.subspan(b, e - b), v.subspan(b, e - b),
                            std::span<const float16>(g).subspan(b, e - b),
                            std::span<bfloat16>(parts_copy).subspan(b, e - b), &pool) == step_result::applied);
                b = e;
            }
            REQUIRE(same_bits(parts.p, whole.p));
            REQUIRE(same_bits(parts.m, whole.m));
            REQUIRE(same_bits(parts.v, whole.v));
            REQUIRE(same_bits(parts_copy, whole_copy));
        }
    }
}

template <class Grad>
void overflow_case(Grad bad, const char* what) {
    CAPTURE(std::string(what));
    std::mt19937_64 rng(4);
    const std::size_t n = 40000;
    const adamw_config cfg{.weight_decay = 0.1f};
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        CAPTURE(at);
        state s = random_state(n, rng);
        for (auto& x : s.v) x = 1e-4f;
        auto g = random_grads<Grad>(n, 1.0f, rng);
        g[at] = bad;
        std::vector<float16> copy(n, float16{0x1234});
        const state before = s;
        for (simd_level level : all_levels) {
            if (!spillway::detail::supported(level)) continue;
            spillway::thread_pool pool(2);
            auto c = make_adamw_coefficients(cfg, adamw_step_args{});
            REQUIRE(spillway::detail::adamw_step_at(level, c, spillway::grad_check::scan, s.p.data(), s.m.data(),
                                                    s.v.data(), g.data(), copy.data(), n,
                                                    pool) == step_result::skipped_overflow);
        }
        REQUIRE(spillway::adamw_step<Grad>(cfg, adamw_step_args{.step = 3}, s.p, s.m, s.v, std::span<const Grad>(g),
                                           std::span<float16>(copy)) == step_result::skipped_overflow);
        REQUIRE(same_bits(s.p, before.p));
        REQUIRE(same_bits(s.m, before.m));
        REQUIRE(same_bits(s.v, before.v));
        REQUIRE(std::count_if(copy.begin(), copy.end(), [](float16 h) { return h.bits != 0x1234; }) == 0);
        double ss = spillway::grad_sum_squares(std::span<const Grad>(g));
        REQUIRE(!std::isfinite(ss));
        // caller_verified skips the scan: the step runs (the caller vouched for the grads).
        REQUIRE(spillway::adamw_step<Grad>(cfg, adamw_step_args{.check = spillway::grad_check::caller_verified}, s.p,
                                           s.m, s.v, std::span<const Grad>(g)) == step_result::applied);
        REQUIRE(!same_bits(s.p, before.p));
    }
}

TEST_CASE("a non-finite gradient skips the step and leaves params, m, v and the copy untouched") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    overflow_case<float>(inf, "float +inf");
    overflow_case<float>(-inf, "float -inf");
    overflow_case<float>(nan, "float NaN");
    overflow_case<float16>(float16{0x7c00}, "float16 +inf");
    overflow_case<float16>(float16{0xfc00}, "float16 -inf");
    overflow_case<float16>(float16{0x7d01}, "float16 sNaN");
    overflow_case<bfloat16>(bfloat16{0x7f80}, "bfloat16 +inf");
    overflow_case<bfloat16>(bfloat16{0xffc1}, "bfloat16 NaN");
    // The largest finite values are not overflow.
    std::vector<float> p(3, 1.0f), m(3), v(3);
    std::vector<float16> g16(3, float16{0x7bff});
    CHECK(spillway::adamw_step<float16>(adamw_config{}, adamw_step_args{}, p, m, v, std::span<const float16>(g16)) ==
          step_result::applied);
    CHECK(p[0] < 1.0f);
}

TEST_CASE("a finite gradient beyond sqrt(FLT_MAX / (1 - beta2)) makes v infinite and freezes the element (documented)") {
    // 5e20: 0.001 * g * g = 2.5e38 is finite; 1e21: 1e39 overflows float.
    std::vector<float> p{1.0f, 1.0f}, m(2), v(2);
    std::vector<float> g{5e20f, 1e21f};
    REQUIRE(spillway::adamw_step<float>(adamw_config{}, adamw_step_args{}, p, m, v, std::span<const float>(g)) ==
            step_result::applied);
    CHECK(std::isfinite(v[0]));
    CHECK(p[0] < 1.0f);  // moved by about lr
    CHECK(std::isinf(v[1]));
    CHECK(p[1] == 1.0f);  // m_hat / inf = 0
    const std::vector<float> small{1.0f, 1.0f};
    REQUIRE(spillway::adamw_step<float>(adamw_config{}, adamw_step_args{.step = 2}, p, m, v,
                                        std::span<const float>(small)) == step_result::applied);
    CHECK(std::isinf(v[1]));
    CHECK(p[1] == 1.0f);  // and stays frozen
}

TEST_CASE("unscaling and clipping are fused: scaled grads give the unscaled result") {
    std::mt19937_64 rng(5);
    const std::size_t n = 5000;
    const adamw_config cfg{.lr = 1e-3f, .weight_decay = 0.01f};
    state s0 = random_state(n, rng);
    std::uniform_real_distribution<float> mag(1e-3f, 10.0f);
    std::vector<float> g(n), g_scaled(n), g_quarter(n);
    std::vector<float16> h(n), h_scaled(n);
    for (std::size_t i = 0; i < n; ++i) {
        g[i] = (i % 2 ? -1.0f : 1.0f) * mag(rng);
        g_scaled[i] = g[i] * 1024.0f;  // exact: powers of two
        g_quarter[i] = g[i] * 0.25f;
        h[i] = spillway::from_float<float16>(g[i]);
        h_scaled[i] = spillway::from_float<float16>(g_scaled[i]);
    }
    auto run = [&](auto grads, adamw_step_args args) {
        state s = s0;
        using G = typename decltype(grads)::value_type;
        REQUIRE(spillway::adamw_step<G>(cfg, args, s.p, s.m, s.v, std::span<const G>(grads)) == step_result::applied);
        return s;
    };
    state plain = run(g, {.step = 2});
    state unscaled = run(g_scaled, {.step = 2, .grad_scale = 1024.0f});
    CHECK(same_bits(plain.p, unscaled.p));
    CHECK(same_bits(plain.m, unscaled.m));
    CHECK(same_bits(plain.v, unscaled.v));
    state clipped = run(g, {.step = 2, .clip_coef = 0.25f});
    state quarter = run(g_quarter, {.step = 2});
    CHECK(same_bits(clipped.p, quarter.p));
    CHECK(same_bits(clipped.m, quarter.m));
    CHECK(!same_bits(clipped.m, plain.m));
    state half_plain = run(h, {.step = 2});
    state half_unscaled = run(h_scaled, {.step = 2, .grad_scale = 1024.0f});
    CHECK(same_bits(half_plain.p, half_unscaled.p));
    CHECK(same_bits(half_plain.v, half_unscaled.v));
}

template <class Grad>
void sum_squares_case(std::mt19937_64& rng) {
    CAPTURE(std::string(type_name<Grad>()));
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{65535}, std::size_t{65536},
                          std::size_t{3 * 65536 + 5}}) {
        CAPTURE(n);
        auto g = random_grads<Grad>(n, 8.0f, rng);
        double ref = 0;
        for (auto x : g) ref += grad_value(x) * grad_value(x);
        ref /= 64.0;
        double got = spillway::grad_sum_squares(std::span<const Grad>(g), 8.0f);
        CHECK(std::fabs(got - ref) <= 1e-12 * ref);
        // Deterministic: the same bits for every pool size and SIMD level.
        for (std::size_t workers : {0, 1, 3}) {
            spillway::thread_pool pool(workers);
            for (simd_level level : all_levels) {
                if (!spillway::detail::supported(level)) continue;
                double again = spillway::detail::grad_sum_squares_at(level, g.data(), n, 8.0f, pool);
                REQUIRE(std::memcmp(&again, &got, sizeof got) == 0);
            }
        }
        CHECK(spillway::grad_sum_squares(std::span<const Grad>(g), 1.0f) / 64.0 == got);
    }
}

TEST_CASE("grad_sum_squares: float64 sums, deterministic, and global-norm clipping across spans") {
    std::mt19937_64 rng(6);
    sum_squares_case<float>(rng);
    sum_squares_case<float16>(rng);
    sum_squares_case<bfloat16>(rng);

    // Global norm over three spans of mixed types, as a trainer computes it.
    auto a = random_grads<float16>(1000, 256.0f, rng);
    auto b = random_grads<bfloat16>(70000, 256.0f, rng);
    auto c = random_grads<float>(33, 256.0f, rng);
    double ref = 0;
    for (auto x : a) ref += std::pow(grad_value(x) / 256.0, 2);
    for (auto x : b) ref += std::pow(grad_value(x) / 256.0, 2);
    for (auto x : c) ref += std::pow(grad_value(x) / 256.0, 2);
    double total = spillway::grad_sum_squares(std::span<const float16>(a), 256.0f) +
                   spillway::grad_sum_squares(std::span<const bfloat16>(b), 256.0f) +
                   spillway::grad_sum_squares(std::span<const float>(c), 256.0f);
    CHECK(std::fabs(total - ref) <= 1e-12 * ref);
    const double norm = std::sqrt(ref);
    CHECK(spillway::clip_coefficient(total, norm / 4) == doctest::Approx(0.25).epsilon(1e-6));
    CHECK(spillway::clip_coefficient(total, norm * 4) == 1.0f);
    CHECK(std::isnan(spillway::clip_coefficient(std::numeric_limits<double>::infinity(), 1.0)));
    CHECK_THROWS_WITH_AS(spillway::clip_coefficient(total, -1.0), doctest::Contains("max_norm = -1"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(spillway::grad_sum_squares(std::span<const float>(c), 0.0f),
                         doctest::Contains("grad_scale = 0"), std::invalid_argument);
}

TEST_CASE("validation names the field and its value and changes nothing") {
    std::vector<float> p(10, 1.0f), m(10, 0.5f), v(10, 0.25f);
    std::vector<float> g(10, 0.1f);
    const std::vector<float> p0 = p, m0 = m, v0 = v;
    auto step = [&](adamw_config c, adamw_step_args a) {
        return spillway::adamw_step<float>(c, a, p, m, v, std::span<const float>(g));
    };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    struct bad_config {
        adamw_config c;
        const char* text;
    };
    const bad_config configs[] = {
        {{.lr = -0.5f}, "lr = -0.5"},       {{.lr = nan}, "lr = nan"},
        {{.beta1 = 1.0f}, "beta1 = 1"},     {{.beta1 = -0.1f}, "beta1 = -0.1"},
        {{.beta2 = 1.5f}, "beta2 = 1.5"},   {{.beta2 = nan}, "beta2 = nan"},
        {{.eps = 0.0f}, "eps = 0"},         {{.eps = -1e-8f}, "eps = -1e-08"},
        {{.weight_decay = -0.25f}, "weight_decay = -0.25"},
        {{.weight_decay = std::numeric_limits<float>::infinity()}, "weight_decay = inf"},
    };
    for (const auto& bc : configs) {
        CAPTURE(std::string(bc.text));
        CHECK_THROWS_WITH_AS(step(bc.c, {}), doctest::Contains(bc.text), std::invalid_argument);
        CHECK_THROWS_AS(spillway::validate(bc.c), std::invalid_argument);
    }
    CHECK_THROWS_WITH_AS(step({}, {.step = 0}), doctest::Contains("step = 0"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(step({}, {.step = -3}), doctest::Contains("step = -3"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(step({}, {.grad_scale = 0.0f}), doctest::Contains("grad_scale = 0"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(step({}, {.grad_scale = -2.0f}), doctest::Contains("grad_scale = -2"), std::invalid_argument);
    // A scale so small that 1/grad_scale is inf in float would turn every parameter into NaN
    // while the step reports success (the step multiplies by clip_coef / grad_scale).
    CHECK_THROWS_WITH_AS(step({}, {.grad_scale = 1e-39f}), doctest::Contains("at least 1/FLT_MAX"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(step({}, {.clip_coef = nan}), doctest::Contains("clip_coef = nan"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(step({}, {.clip_coef = -1.0f}), doctest::Contains("clip_coef = -1"), std::invalid_argument);

    std::vector<float> m9(9);
    CHECK_THROWS_WITH_AS(spillway::adamw_step<float>({}, {}, p, m9, v, std::span<const float>(g)),
                         doctest::Contains("m has 9 elements but params has 10"), std::invalid_argument);
    std::vector<float16> g11(11);
    CHECK_THROWS_WITH_AS(spillway::adamw_step<float16>({}, {}, p, m, v, std::span<const float16>(g11)),
                         doctest::Contains("grads has 11 elements"), std::invalid_argument);
    std::vector<bfloat16> copy4(4);
    auto with_copy = [&] {
        return spillway::adamw_step<float, bfloat16>({}, {}, p, m, v, std::span<const float>(g), copy4);
    };
    CHECK_THROWS_WITH_AS(with_copy(), doctest::Contains("copy_out has 4 elements"), std::invalid_argument);
    std::span<float> all(p);
    CHECK_THROWS_WITH_AS(spillway::adamw_step<float>({}, {}, all.subspan(0, 5), all.subspan(3, 5),
                                                     std::span<float>(v).subspan(0, 5),
                                                     std::span<const float>(g).subspan(0, 5)),
                         doctest::Contains("spans params and m overlap"), std::invalid_argument);
    CHECK(same_bits(p, p0));
    CHECK(same_bits(m, m0));
    CHECK(same_bits(v, v0));
    // Valid edge values are accepted.
    CHECK(step({.lr = 0.0f, .beta1 = 0.0f, .beta2 = 0.0f, .eps = 1e-30f}, {.clip_coef = 0.0f}) == step_result::applied);
}
