// SPDX-License-Identifier: Apache-2.0
// The alternating subgroup order: a random-access view, ascending on even iterations,
// descending on odd ones, with a configurable first direction.
#include <doctest/doctest.h>

#include <spillway/schedule/alternating_order.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <ranges>
#include <vector>

using spillway::alternating_order;
using spillway::direction;

namespace {
std::vector<std::size_t> collect(alternating_order o) {
    std::vector<std::size_t> v;
    std::ranges::copy(o, std::back_inserter(v));
    return v;
}
}  // namespace

TEST_CASE("alternating_order flips direction on every iteration") {
    CHECK(collect(alternating_order(4, 0)) == std::vector<std::size_t>{0, 1, 2, 3});
    CHECK(collect(alternating_order(4, 1)) == std::vector<std::size_t>{3, 2, 1, 0});
    CHECK(collect(alternating_order(4, 2)) == std::vector<std::size_t>{0, 1, 2, 3});
    CHECK(collect(alternating_order(4, 7)) == std::vector<std::size_t>{3, 2, 1, 0});
    // The first direction is a parameter.
    CHECK(collect(alternating_order(3, 0, direction::descending)) == std::vector<std::size_t>{2, 1, 0});
    CHECK(collect(alternating_order(3, 1, direction::descending)) == std::vector<std::size_t>{0, 1, 2});
    CHECK(alternating_order(5, 3).walk() == direction::descending);
    CHECK(spillway::direction_of(10, direction::descending) == direction::descending);
    CHECK(spillway::direction_of(11, direction::descending) == direction::ascending);
}

TEST_CASE("the last subgroups of one iteration are the first of the next") {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 50; ++trial) {
        std::size_t n = 1 + rng() % 40;
        std::uint64_t it = rng() % 9;
        auto a = collect(alternating_order(n, it));
        auto b = collect(alternating_order(n, it + 1));
        std::size_t r = rng() % (n + 1);
        // The last r of iteration it, read backwards, are the first r of iteration it+1.
        for (std::size_t k = 0; k < r; ++k) CHECK(b[k] == a[n - 1 - k]);
        // Each iteration is a permutation of 0..n-1.
        auto sorted = a;
        std::ranges::sort(sorted);
        std::vector<std::size_t> ids(n);
        std::iota(ids.begin(), ids.end(), std::size_t{0});
        CHECK(sorted == ids);
    }
}

TEST_CASE("empty and single-subgroup orders") {
    alternating_order empty(0, 3);
    CHECK(empty.empty());
    CHECK(empty.size() == 0);
    CHECK(empty.begin() == empty.end());
    CHECK(std::ranges::distance(empty) == 0);
    for (std::uint64_t it = 0; it < 4; ++it) {
        alternating_order one(1, it);
        CHECK(collect(one) == std::vector<std::size_t>{0});
        CHECK(one.front() == 0);
        CHECK(one.back() == 0);
    }
    alternating_order def;
    CHECK(def.empty());
}

TEST_CASE("alternating_order is a random-access view usable with std::ranges") {
    alternating_order o(10, 1);  // 9..0
    CHECK(o.size() == 10);
    CHECK(o[0] == 9);
    CHECK(o[9] == 0);
    CHECK(o.front() == 9);
    CHECK(o.back() == 0);
    auto it = o.begin() + 3;
    CHECK(*it == 6);
    CHECK(it[2] == 4);
    CHECK(it.position() == 3);
    CHECK((o.end() - o.begin()) == 10);
    CHECK(*(o.end() - 1) == 0);
    CHECK(o.begin() < it);
    auto found = std::ranges::find(o, std::size_t{4});
    REQUIRE(found != o.end());
    CHECK(found - o.begin() == 5);
    // Descending order is sorted with greater<>; binary search works on it.
    CHECK(std::ranges::is_sorted(o, std::ranges::greater{}));
    CHECK(std::ranges::binary_search(o, std::size_t{7}, std::ranges::greater{}));
    // Composes with other views. clang 14 cannot compile libstdc++ 12's range adaptors at all
    // (not even over std::vector), so that part runs only with other compilers.
#if defined(__clang__) && __clang_major__ < 15 && defined(__GLIBCXX__)
    MESSAGE("clang < 15 with libstdc++: std::views adaptors unavailable, composition not checked");
#else
    std::vector<std::size_t> rev;
    std::ranges::copy(o | std::views::reverse | std::views::take(3), std::back_inserter(rev));
    CHECK(rev == std::vector<std::size_t>{0, 1, 2});
    std::vector<std::size_t> evens;
    std::ranges::copy(o | std::views::filter([](std::size_t x) { return x % 2 == 0; }), std::back_inserter(evens));
    CHECK(evens == std::vector<std::size_t>{8, 6, 4, 2, 0});
#endif
    CHECK(spillway::ascending_order(3)[2] == 2);
    static_assert(alternating_order(4, 1)[0] == 3);  // constexpr
}
