// SPDX-License-Identifier: Apache-2.0
// split_by_bandwidth: exact sums, shares within one of the ideal, the largest-remainder rule,
// zero-bandwidth and single paths, thousands of random cases checked in exact integer
// arithmetic, and clear errors for bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <spillway/tier/bandwidth_split.hpp>

using spillway::split_by_bandwidth;

namespace {
// Checks a split of `count` over integer bandwidths against exact rational arithmetic:
// ideal_i = count * B_i / S; floor_i = (count * B_i) div S, rem_i = (count * B_i) mod S.
void check_exact(std::uint64_t count, const std::vector<std::uint64_t>& bw) {
    std::vector<double> b(bw.begin(), bw.end());
    auto share = split_by_bandwidth(count, b);
    REQUIRE(share.size() == bw.size());
    std::uint64_t s = std::accumulate(bw.begin(), bw.end(), std::uint64_t{0});
    std::uint64_t total = std::accumulate(share.begin(), share.end(), std::uint64_t{0});
    CHECK(total == count);
    std::uint64_t min_rounded_up = std::numeric_limits<std::uint64_t>::max(), max_rounded_down = 0;
    bool any_up = false, any_down = false;
    for (std::size_t i = 0; i < bw.size(); ++i) {
        std::uint64_t num = count * bw[i];
        std::uint64_t fl = num / s, rem = num % s;
        if (bw[i] == 0) CHECK(share[i] == 0);
        // Within one of the ideal: floor, or floor + 1 when the ideal is not whole.
        bool ok = share[i] == fl || (rem != 0 && share[i] == fl + 1);
        CHECK_MESSAGE(ok, "path " << i << " share " << share[i] << " ideal " << num << "/" << s);
        if (bw[i] == 0) continue;
        if (share[i] == fl + 1) {
            any_up = true;
            min_rounded_up = std::min(min_rounded_up, rem);
        } else {
            any_down = true;
            max_rounded_down = std::max(max_rounded_down, rem);
        }
    }
    // Largest remainder: every path rounded up has a remainder >= every path rounded down.
    if (any_up && any_down) CHECK(min_rounded_up >= max_rounded_down);
}
}  // namespace

TEST_CASE("split_by_bandwidth: the examples of the paper and simple cases") {
    CHECK(split_by_bandwidth(9, {2.0, 1.0}) == std::vector<std::size_t>{6, 3});
    CHECK(split_by_bandwidth(10, {2.0, 1.0}) == std::vector<std::size_t>{7, 3});  // 6.67 / 3.33
    CHECK(split_by_bandwidth(10, {1.0, 1.0, 1.0}) ==
          std::vector<std::size_t>{4, 3, 3});  // ties: lower index
    CHECK(split_by_bandwidth(0, {5.0, 1.0}) == std::vector<std::size_t>{0, 0});
    CHECK(split_by_bandwidth(1, {1.0, 3.0}) == std::vector<std::size_t>{0, 1});
}

TEST_CASE("split_by_bandwidth: a single path takes everything; a zero-bandwidth path nothing") {
    CHECK(split_by_bandwidth(17, {4.2e9}) == std::vector<std::size_t>{17});
    CHECK(split_by_bandwidth(17, {0.0, 3.0, 0.0}) == std::vector<std::size_t>{0, 17, 0});
    // Even when the zero path would win a remainder tie by index.
    CHECK(split_by_bandwidth(5, {0.0, 1.0, 1.0}) == std::vector<std::size_t>{0, 3, 2});
    CHECK(split_by_bandwidth(1, {0.0, 1e-300}) == std::vector<std::size_t>{0, 1});
}

TEST_CASE("split_by_bandwidth: thousands of random cases, checked exactly") {
    std::mt19937_64 rng(20251129);
    for (int trial = 0; trial < 5000; ++trial) {
        std::size_t paths = 1 + rng() % (trial % 10 == 0 ? 64 : 6);
        std::uint64_t count = rng() % (trial % 3 == 0 ? 20 : 1000000);
        std::vector<std::uint64_t> bw(paths);
        for (auto& b : bw) b = (rng() % 5 == 0) ? 0 : 1 + rng() % 1000000000;
        if (std::accumulate(bw.begin(), bw.end(), std::uint64_t{0}) == 0) bw[rng() % paths] = 1;
        CAPTURE(trial);
        check_exact(count, bw);
    }
}

TEST_CASE("split_by_bandwidth: random real bandwidths of wildly different magnitude") {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> expo(-6, 12);
    for (int trial = 0; trial < 3000; ++trial) {
        std::size_t paths = 1 + rng() % 8;
        std::size_t count = rng() % 100000;
        std::vector<double> bw(paths);
        for (auto& b : bw) b = std::pow(10.0, expo(rng));
        auto share = split_by_bandwidth(count, bw);
        long double total = 0;
        for (double b : bw) total += b;
        CHECK(std::accumulate(share.begin(), share.end(), std::size_t{0}) == count);
        for (std::size_t i = 0; i < paths; ++i) {
            long double ideal = static_cast<long double>(count) * bw[i] / total;
            CHECK(std::fabs(static_cast<long double>(share[i]) - ideal) < 1.0L + 1e-9L);
        }
    }
}

TEST_CASE("split_by_bandwidth: bad input names the path and the value") {
    auto message = [](auto&& fn) {
        try {
            fn();
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("no exception");
    };
    CHECK(message([] { split_by_bandwidth(3, std::span<const double>{}); }).find("no paths") !=
          std::string::npos);
    CHECK(message([] { split_by_bandwidth(3, {1.0, -2.0}); }).find("path 1") != std::string::npos);
    CHECK(message([] {
              split_by_bandwidth(3, {std::nan(""), 1.0});
          }).find("path 0") != std::string::npos);
    CHECK(message([] {
              split_by_bandwidth(3, {1.0, std::numeric_limits<double>::infinity()});
          }).find("path 1") != std::string::npos);
    CHECK(message([] {
              split_by_bandwidth(3, {0.0, 0.0});
          }).find("bandwidth 0") != std::string::npos);
    // Above 2^62 items long double's 64-bit mantissa cannot place every share within one of
    // its ideal (17934447696040317800 over {1, 9} would give 1793444769604031781 where the
    // exact share is 1793444769604031780): refused, naming the count.
    CHECK(message([] {
              split_by_bandwidth(17934447696040317800ull, {1.0, 9.0});
          }).find("17934447696040317800 items") != std::string::npos);
    CHECK(message([] { split_by_bandwidth(spillway::max_split_count + 1, {1.0}); }).find("2^62") !=
          std::string::npos);
}

TEST_CASE("split_by_bandwidth: exact at the largest count it takes") {
    // Integer bandwidths: the exact ideals come from 128-bit integers (a GCC/Clang extension).
    __extension__ typedef unsigned __int128 u128;
    const std::size_t counts[] = {spillway::max_split_count, spillway::max_split_count - 1,
                                  spillway::max_split_count / 3 * 2 + 1};
    const double bws[][3] = {{1, 9, 0}, {278024, 42048, 7}, {3, 3, 3}, {1, 1e6, 12345}};
    for (std::size_t count : counts) {
        for (const auto& b : bws) {
            auto share = split_by_bandwidth(count, std::span<const double>(b, 3));
            u128 total = 0, sum = 0;
            for (double x : b) total += static_cast<std::uint64_t>(x);
            for (std::size_t i = 0; i < 3; ++i) {
                const u128 num = static_cast<u128>(count) * static_cast<std::uint64_t>(b[i]);
                const u128 lo = num / total, hi = lo + (num % total != 0);
                CAPTURE(count);
                CAPTURE(i);
                CHECK((share[i] >= lo && share[i] <= hi));
                sum += share[i];
            }
            CHECK(sum == count);
        }
    }
}
