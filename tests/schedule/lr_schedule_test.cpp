// SPDX-License-Identifier: Apache-2.0
// lr_schedule: constant and warmup + cosine decay, checked against a long-double reference of
// the same formula (within one float ulp, and exactly at the points the header promises).
#include <doctest/doctest.h>

#include <spillway/schedule/lr_schedule.hpp>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

using spillway::learning_rate;
using spillway::lr_decay;
using spillway::lr_schedule;

namespace {

// The formula in long double, written from the header comment (not from the implementation).
long double reference(const lr_schedule& s, std::int64_t step) {
    const long double lr = s.lr, lr_min = s.lr_min;
    if (step < s.warmup_steps) return lr * (step + 1) / s.warmup_steps;
    if (s.decay == lr_decay::constant) return lr;
    if (step >= s.total_steps) return lr_min;
    const long double pi = 3.141592653589793238462643383279502884L;
    const long double ratio =
        static_cast<long double>(step - s.warmup_steps) / (s.total_steps - s.warmup_steps);
    return lr_min + 0.5L * (1.0L + std::cos(pi * ratio)) * (lr - lr_min);
}

// A cosine schedule from lr to lr_min over [warmup, total).
lr_schedule cosine(float lr, float lr_min, std::int64_t warmup, std::int64_t total) {
    return {.decay = lr_decay::cosine,
            .lr = lr,
            .lr_min = lr_min,
            .warmup_steps = warmup,
            .total_steps = total};
}

// |got - want| is at most one ulp of float at want.
bool within_one_ulp(float got, long double want) {
    const float w = static_cast<float>(want);
    return got == w || got == std::nextafter(w, INFINITY) || got == std::nextafter(w, -INFINITY);
}

}  // namespace

TEST_CASE("constant: the peak lr at every step, after an optional linear warmup") {
    lr_schedule s{.decay = lr_decay::constant, .lr = 6e-4f};
    for (std::int64_t t : {0, 1, 7, 1000000}) CHECK(learning_rate(s, t) == 6e-4f);
    s.warmup_steps = 4;
    CHECK(learning_rate(s, 0) == static_cast<float>(6e-4 / 4));  // step 0 is not 0
    CHECK(learning_rate(s, 1) == static_cast<float>(6e-4f * 2.0 / 4));
    CHECK(learning_rate(s, 3) == 6e-4f);  // the warmup's last step is the peak
    CHECK(learning_rate(s, 4) == 6e-4f);
}

TEST_CASE("cosine: warmup, then the cosine from lr to lr_min over [warmup, total)") {
    const lr_schedule s = cosine(6e-4f, 6e-5f, 10, 110);
    REQUIRE_NOTHROW(validate(s));
    CHECK(learning_rate(s, 9) == 6e-4f);   // end of the warmup
    CHECK(learning_rate(s, 10) == 6e-4f);  // cos(0) = 1
    // Half way (step 60): the mean of lr and lr_min, computed in double and rounded once.
    CHECK(learning_rate(s, 60) ==
          static_cast<float>((static_cast<double>(6e-4f) + static_cast<double>(6e-5f)) / 2));
    CHECK(learning_rate(s, 110) == 6e-5f);  // lr_min reached at total_steps exactly
    CHECK(learning_rate(s, 5000) == 6e-5f);
    float previous = learning_rate(s, 10);
    for (std::int64_t t = 0; t < 130; ++t) {
        const float got = learning_rate(s, t);
        INFO("step " << t << ": " << got << " vs " << static_cast<double>(reference(s, t)));
        CHECK(within_one_ulp(got, reference(s, t)));
        CHECK(got >= 0);
        CHECK(got <= 6e-4f);
        if (t > 10) {
            CHECK(got <= previous);  // monotone decay after the warmup
            previous = got;
        }
    }
}

TEST_CASE("the reference agrees over long runs and many shapes") {
    for (std::int64_t warmup : {0, 1, 700}) {
        for (std::int64_t total : {warmup + 1, warmup + 3, std::int64_t{19073}}) {
            const lr_schedule s = cosine(1.5e-3f, 0.0f, warmup, total);
            REQUIRE_NOTHROW(validate(s));
            for (std::int64_t t = 0; t <= total + 2; t += 1 + total / 997) {
                INFO("warmup " << warmup << " total " << total << " step " << t);
                CHECK(within_one_ulp(learning_rate(s, t), reference(s, t)));
            }
        }
    }
}

TEST_CASE("a pure function of the step: the same bits whatever was asked before") {
    const lr_schedule s = cosine(3e-4f, 1e-5f, 5, 40);
    float forward[40];
    for (int t = 0; t < 40; ++t) forward[t] = learning_rate(s, t);
    for (int t = 39; t >= 0; --t) CHECK(learning_rate(s, t) == forward[t]);
    const lr_schedule copy = s;
    CHECK(copy == s);
}

TEST_CASE("validate names the field and its value") {
    auto message = [](const lr_schedule& s) {
        try {
            validate(s);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    CHECK(message({.lr = -1.0f}).find("lr = -1") != std::string::npos);
    CHECK(message({.lr = NAN}).find("lr = nan") != std::string::npos);
    CHECK(message({.warmup_steps = -2}).find("warmup_steps = -2") != std::string::npos);
    const lr_schedule no_horizon{
        .decay = lr_decay::cosine, .lr = 1e-3f, .warmup_steps = 10, .total_steps = 10};
    CHECK(message(no_horizon).find("total_steps = 10") != std::string::npos);
    CHECK(message(no_horizon).find("warmup_steps = 10") != std::string::npos);
    const lr_schedule min_above{
        .decay = lr_decay::cosine, .lr = 1e-3f, .lr_min = 2e-3f, .total_steps = 10};
    CHECK(message(min_above).find("lr_min = 0.002") != std::string::npos);
    // Constant ignores lr_min and total_steps.
    CHECK(message({.decay = lr_decay::constant, .lr = 1e-3f, .lr_min = 5.0f}) == "(accepted)");
}
