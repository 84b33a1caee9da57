// SPDX-License-Identifier: Apache-2.0
// bandwidth_estimate: the bias-corrected moving average over busy time, checked against the
// closed form on samples the test chooses; no clock, no tier.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include <spillway/tier/bandwidth_estimate.hpp>

using spillway::bandwidth_estimate;

namespace {
// The estimate in closed form: sum_k w_k s_k / sum_k w_k, where sample k has weight
// alpha_k = 1 - exp(-busy_k / window) decayed by (1 - alpha_j) for every later sample j.
double reference(const std::vector<double>& samples, const std::vector<double>& busy,
                 double window) {
    long double num = 0, den = 0;
    for (std::size_t k = 0; k < samples.size(); ++k) {
        long double w = 1 - std::exp(-static_cast<long double>(busy[k]) / window);
        for (std::size_t j = k + 1; j < samples.size(); ++j)
            w *= std::exp(-static_cast<long double>(busy[j]) / window);
        num += w * samples[k];
        den += w;
    }
    return static_cast<double>(num / den);
}
}  // namespace

TEST_CASE("bandwidth_estimate: 0 until measured; one sample gives that sample") {
    bandwidth_estimate e(0.5);
    CHECK(e.bytes_per_second() == 0);
    CHECK(e.window_seconds() == 0.5);
    e.add(0.0, 0.0);  // no busy time: no weight, still unmeasured
    CHECK(e.bytes_per_second() == 0);
    e.add(40e6, 0.001);
    CHECK(e.bytes_per_second() == doctest::Approx(40e6).epsilon(1e-12));
}

TEST_CASE("bandwidth_estimate: matches the closed-form weighted mean") {
    const double window = 0.5;
    const std::vector<double> samples{200e6, 40e6, 38e6, 41e6, 10e6, 9e6};
    const std::vector<double> busy{0.0005, 0.05, 0.06, 0.05, 0.2, 0.3};
    bandwidth_estimate e(window);
    std::vector<double> s, b;
    for (std::size_t k = 0; k < samples.size(); ++k) {
        e.add(samples[k], busy[k]);
        s.push_back(samples[k]);
        b.push_back(busy[k]);
        CAPTURE(k);
        CHECK(e.bytes_per_second() == doctest::Approx(reference(s, b, window)).epsilon(1e-12));
    }
}

TEST_CASE("bandwidth_estimate: an instant first transfer barely counts") {
    // A throttle's burst: 1 GB/s for 0.1 ms, then the path's real 40 MB/s for 50 ms.
    bandwidth_estimate e(0.5);
    e.add(1e9, 1e-4);
    e.add(40e6, 0.05);
    // Weights: 1e-4/0.5 against 0.05/0.5, about 1:500, so the burst adds ~1.9 MB/s.
    const double w1 = (1 - std::exp(-1e-4 / 0.5)) * std::exp(-0.05 / 0.5);
    const double w2 = 1 - std::exp(-0.05 / 0.5);
    CHECK(e.bytes_per_second() == doctest::Approx((w1 * 1e9 + w2 * 40e6) / (w1 + w2)));
    CHECK(e.bytes_per_second() < 42e6);
    CHECK(e.bytes_per_second() > 40e6);
}

TEST_CASE("bandwidth_estimate: stays between the smallest and the largest sample") {
    bandwidth_estimate e(0.25);
    const double samples[] = {5e6, 80e6, 1e6, 30e6, 30e6, 2e6, 79e6};
    for (int round = 0; round < 50; ++round) {
        const double s = samples[round % 7];
        e.add(s, 0.001 + 0.01 * (round % 5));
        CHECK(e.bytes_per_second() >= 1e6 * (1 - 1e-12));
        CHECK(e.bytes_per_second() <= 80e6 * (1 + 1e-12));
    }
    // A long run of one figure converges to it.
    for (int k = 0; k < 200; ++k) e.add(12e6, 0.1);
    CHECK(e.bytes_per_second() == doctest::Approx(12e6).epsilon(1e-9));
}

TEST_CASE("bandwidth_estimate: update() folds the increments of running totals") {
    bandwidth_estimate by_totals(0.5), by_samples(0.5);
    CHECK_FALSE(by_totals.update(0, 0.0));  // nothing moved yet
    CHECK(by_totals.update(1'000'000, 0.1));
    by_samples.add(1'000'000 / 0.1, 0.1);
    CHECK(by_totals.bytes_per_second() == by_samples.bytes_per_second());
    // The same totals again, or bytes without busy time: no sample.
    CHECK_FALSE(by_totals.update(1'000'000, 0.1));
    CHECK_FALSE(by_totals.update(1'000'000, 0.05));
    // 3 MB more in 0.2 s more: one sample of 15 MB/s over 0.2 s.
    CHECK(by_totals.update(4'000'000, 0.3));
    by_samples.add(3'000'000 / (0.3 - 0.1), 0.3 - 0.1);
    CHECK(by_totals.bytes_per_second() == by_samples.bytes_per_second());
}

TEST_CASE("bandwidth_estimate: a window that is not a positive finite number is refused") {
    CHECK_THROWS_AS(bandwidth_estimate(0.0), std::invalid_argument);
    CHECK_THROWS_AS(bandwidth_estimate(-1.0), std::invalid_argument);
    CHECK_THROWS_AS(bandwidth_estimate(std::numeric_limits<double>::infinity()),
                    std::invalid_argument);
    CHECK_THROWS_AS(bandwidth_estimate(std::nan("")), std::invalid_argument);
    CHECK_THROWS_WITH(bandwidth_estimate(0.0), doctest::Contains("window"));
}
