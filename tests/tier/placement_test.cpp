// SPDX-License-Identifier: Apache-2.0
// The virtual tier's placement as pure functions: weights from given and measured
// bandwidth, which child a key goes to, and whether a blob fits; no tier, no I/O.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include <spillway/tier/bandwidth_split.hpp>
#include <spillway/tier/detail/placement.hpp>

using spillway::detail::child_bandwidth;
using spillway::detail::has_room;
using spillway::detail::place_key;
using spillway::detail::placement_child;
using spillway::detail::placement_weights;

namespace {
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();

std::vector<placement_child> eligible(const std::vector<double>& weights,
                                      const std::vector<std::size_t>& keys) {
    std::vector<placement_child> out;
    for (std::size_t i = 0; i < weights.size(); ++i)
        out.push_back({.eligible = true, .weight = weights[i], .keys = keys[i]});
    return out;
}
}  // namespace

TEST_CASE("placement_weights: measured, given, and given scaled to the measured ones") {
    SUBCASE("both directions measured: 1 / (1/read + 1/write)") {
        std::vector<child_bandwidth> c{{.given = 0, .read = 200, .write = 50}};
        CHECK(placement_weights(c) == std::vector<double>{40});
    }
    SUBCASE("one direction measured: that one") {
        std::vector<child_bandwidth> c{{.given = 7, .read = 0, .write = 30},
                                       {.given = 7, .read = 12, .write = 0}};
        CHECK(placement_weights(c) == std::vector<double>{30, 12});
    }
    SUBCASE("nothing measured: the given figures, unscaled") {
        std::vector<child_bandwidth> c{{.given = 3}, {.given = 1}, {.given = 0}};
        CHECK(placement_weights(c) == std::vector<double>{3, 1, 0});
    }
    SUBCASE("an unmeasured child's given figure takes the mean measured/given ratio") {
        // Child 0 measures at 2x its given figure, child 1 at 4x: the mean ratio is 3, so
        // child 2 (given 10, unmeasured) weighs 30. Child 3 has neither: 0.
        std::vector<child_bandwidth> c{{.given = 100, .read = 400, .write = 400},
                                       {.given = 50, .read = 200, .write = 0},
                                       {.given = 10},
                                       {}};
        CHECK(placement_weights(c) == std::vector<double>{200, 200, 30, 0});
    }
    SUBCASE("a measured child without a given figure does not enter the ratio") {
        std::vector<child_bandwidth> c{{.given = 0, .read = 80, .write = 80}, {.given = 5}};
        CHECK(placement_weights(c) == std::vector<double>{40, 5});
    }
}

TEST_CASE("place_key: a new key goes to the child furthest below its share") {
    // Weights 3:1, 3 keys placed so far (2 and 1), a 4th arrives: shares of 4 are 3 and 1.
    auto c = eligible({3, 1}, {2, 1});
    CHECK(place_key(c, 4, std::nullopt) == 0u);
    // With 3 and 1 placed, a 5th: shares of 5 are 4 and 1 (3.75 rounds up, 1.25 down).
    c = eligible({3, 1}, {3, 1});
    CHECK(place_key(c, 5, std::nullopt) == 0u);
    // Ties go to the lower index.
    c = eligible({1, 1, 1}, {0, 0, 0});
    CHECK(place_key(c, 1, std::nullopt) == 0u);
    c = eligible({1, 1, 1}, {1, 0, 0});
    CHECK(place_key(c, 2, std::nullopt) == 1u);
}

TEST_CASE("place_key: a known key stays while its child is not above its share") {
    // 4 keys at 2:2 on equal weights; the key on child 1 stays.
    auto c = eligible({1, 1}, {2, 2});
    CHECK(place_key(c, 4, 1u) == 1u);
    // Child 1 slowed to a third of child 0: shares of 4 are 3 and 1; a key on child 1
    // (which holds 2) moves to child 0.
    c = eligible({3, 1}, {2, 2});
    CHECK(place_key(c, 4, 1u) == 0u);
    // A key already on child 0 stays there.
    CHECK(place_key(c, 4, 0u) == 0u);
}

TEST_CASE("place_key: ineligible and zero-weight children get no key") {
    auto c = eligible({5, 1, 0}, {0, 0, 0});
    c[0].eligible = false;  // degraded, excluded or full
    CHECK(place_key(c, 1, std::nullopt) == 1u);
    // A key whose current child became ineligible leaves it.
    c = eligible({1, 1}, {0, 1});
    c[1].eligible = false;
    CHECK(place_key(c, 1, 1u) == 0u);
    // Nothing eligible: no child.
    c[0].eligible = false;
    CHECK(place_key(c, 1, 1u) == std::nullopt);
    // Only zero-weight children left: they share equally rather than lose the blob.
    c = eligible({0, 0, 0}, {2, 1, 1});
    c[0].eligible = false;
    CHECK(place_key(c, 5, std::nullopt) == 1u);
}

TEST_CASE("place_key: placing keys one by one over two children follows split_by_bandwidth") {
    // With two children the largest-remainder shares of k + 1 keys exceed those of k by one
    // key on one child, so placing keys one at a time reproduces the split exactly. (With
    // three or more, the shares of k + 1 may take a key from a child: Hamilton's Alabama
    // paradox; placement then moves no key, only new keys follow the shares.)
    std::mt19937_64 rng(34);
    for (int trial = 0; trial < 300; ++trial) {
        std::vector<double> w{static_cast<double>(rng() % 1000),
                              static_cast<double>(1 + rng() % 1000)};
        if (trial % 2) std::swap(w[0], w[1]);
        const std::size_t keys = rng() % 80;
        std::vector<std::size_t> count(2, 0);
        for (std::size_t k = 0; k < keys; ++k) {
            auto child = place_key(eligible(w, count), k + 1, std::nullopt);
            REQUIRE(child.has_value());
            ++count[*child];
        }
        CAPTURE(trial);
        CHECK(count == spillway::split_by_bandwidth(keys, w));
    }
}

TEST_CASE("place_key: with many children, keys go only to eligible children of weight > 0") {
    std::mt19937_64 rng(35);
    for (int trial = 0; trial < 200; ++trial) {
        const std::size_t n = 1 + rng() % 6;
        std::vector<double> w(n);
        for (auto& x : w) x = static_cast<double>(rng() % 4 == 0 ? 0 : 1 + rng() % 1000);
        w[rng() % n] = 1 + static_cast<double>(rng() % 1000);
        std::vector<std::size_t> count(n, 0);
        const std::size_t keys = rng() % 60;
        for (std::size_t k = 0; k < keys; ++k) {
            auto c = eligible(w, count);
            auto child = place_key(c, k + 1, std::nullopt);
            REQUIRE(child.has_value());
            CHECK(w[*child] > 0);
            ++count[*child];
        }
        std::size_t total = 0;
        for (std::size_t i = 0; i < n; ++i) {
            total += count[i];
            if (w[i] == 0) CHECK(count[i] == 0);
        }
        CHECK(total == keys);
    }
}

TEST_CASE("has_room: the replaced copy frees its bytes, pending writes take theirs") {
    using space = spillway::detail::child_space;
    CHECK(has_room(space{.capacity = 100, .used = 60, .pending = 0}, 0, 40));
    CHECK_FALSE(has_room(space{.capacity = 100, .used = 60, .pending = 0}, 0, 41));
    CHECK(has_room(space{.capacity = 100, .used = 60, .pending = 0}, 30, 70));
    CHECK_FALSE(has_room(space{.capacity = 100, .used = 60, .pending = 10}, 0, 31));
    CHECK(has_room(space{.capacity = 100, .used = 60, .pending = 10}, 0, 30));
    // A child already over its capacity (shared with others) has no room at all.
    CHECK_FALSE(has_room(space{.capacity = 100, .used = 120, .pending = 0}, 0, 0));
    // An unbounded child: the sums saturate rather than wrap.
    CHECK(has_room(space{.capacity = size_max, .used = 10, .pending = size_max}, 0, 0));
    CHECK_FALSE(has_room(space{.capacity = size_max, .used = 10, .pending = size_max}, 0, 1));
    CHECK(spillway::detail::saturating_add(size_max - 1, 5) == size_max);
    CHECK(spillway::detail::saturating_add(3, 4) == 7u);
}
