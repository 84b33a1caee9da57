// SPDX-License-Identifier: Apache-2.0
// The stash's budget pool on its own, no tier: the budget is never exceeded by the pool,
// eviction order, what happens when nothing can be evicted, and the high-water marks.
#include <doctest/doctest.h>

#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include <spillway/stash/detail/budget_pool.hpp>

using spillway::aligned_buffer;
using spillway::detail::budget_pool;

namespace {

constexpr std::size_t KiB = 1024;

// A buffer of `nbytes` counted as held by the caller, as the stash counts a fresh one.
aligned_buffer held(budget_pool& p, std::size_t nbytes) {
    p.account(budget_pool::charge_of(nbytes));
    return aligned_buffer(nbytes);
}

}  // namespace

TEST_CASE("a buffer counts its capacity: whole 4 KiB blocks, at least one") {
    CHECK(budget_pool::charge_of(0) == 4 * KiB);
    CHECK(budget_pool::charge_of(1) == 4 * KiB);
    CHECK(budget_pool::charge_of(4 * KiB) == 4 * KiB);
    CHECK(budget_pool::charge_of(4 * KiB + 1) == 8 * KiB);
}

TEST_CASE("recycled buffers are pooled and taken back by size, oldest first") {
    budget_pool p(1 << 20, 1 << 20);
    aligned_buffer a = held(p, 8 * KiB), b = held(p, 8 * KiB);
    const std::byte* first = a.data();
    p.recycle(std::move(a));
    p.recycle(std::move(b));
    CHECK(p.resident() == 16 * KiB);
    CHECK(p.pooled() == 16 * KiB);
    CHECK(p.contains(8 * KiB));
    CHECK_FALSE(p.contains(4 * KiB));
    auto t = p.take(8 * KiB);
    REQUIRE(t);
    CHECK(t->data() == first);
    CHECK(p.pooled() == 8 * KiB);
    CHECK(p.resident() == 16 * KiB);  // still resident, now held by the caller
    CHECK_FALSE(p.take(4 * KiB));
    p.uncount(t->capacity());
    CHECK(p.clear() == 8 * KiB);
    CHECK(p.resident() == 0);
    CHECK(p.pooled() == 0);
}

TEST_CASE("eviction frees the largest buffer first, of equal sizes the one pooled last") {
    budget_pool p(40 * KiB, 1 << 20);
    std::vector<aligned_buffer> bufs;
    for (std::size_t kib : {4, 8, 8, 16}) bufs.push_back(held(p, kib * KiB));
    const std::byte* older8 = bufs[1].data();
    for (auto& b : bufs) p.recycle(std::move(b));
    REQUIRE(p.resident() == 36 * KiB);
    REQUIRE(p.pooled() == 36 * KiB);

    CHECK(p.trim_to_fit(8 * KiB));  // 36 + 8 > 40: the 16 KiB buffer goes
    CHECK(p.resident() == 20 * KiB);
    CHECK_FALSE(p.contains(16 * KiB));
    CHECK(p.trim_to_fit(24 * KiB));  // 20 + 24 > 40: one 8 KiB buffer goes, the newer
    CHECK(p.resident() == 12 * KiB);
    auto left = p.take(8 * KiB);
    REQUIRE(left);
    CHECK(left->data() == older8);
    CHECK(p.contains(4 * KiB));
}

TEST_CASE("the pool never lifts resident bytes above the budget") {
    budget_pool p(16 * KiB, 1 << 20);
    aligned_buffer a = held(p, 8 * KiB);
    aligned_buffer b = held(p, 8 * KiB);
    REQUIRE(p.resident() == 16 * KiB);
    CHECK_FALSE(p.fits(1));

    SUBCASE("give_back refuses a buffer the budget has no room for, and leaves it") {
        aligned_buffer extra(4 * KiB);
        p.give_back(std::move(extra));
        CHECK(extra.data() != nullptr);
        CHECK(p.resident() == 16 * KiB);
        p.uncount(b.capacity());
        b = aligned_buffer();
        p.give_back(std::move(extra));  // now it fits
        CHECK(extra.data() == nullptr);
        CHECK(p.resident() == 12 * KiB);
        CHECK(p.pooled() == 4 * KiB);
    }
    SUBCASE("adopt_if_room refuses a buffer beyond the budget or beyond pool_limit") {
        aligned_buffer extra(4 * KiB);
        p.adopt_if_room(std::move(extra));
        CHECK(extra.data() != nullptr);
        CHECK(p.resident() == 16 * KiB);

        budget_pool small(1 << 20, 4 * KiB);
        aligned_buffer big(8 * KiB);
        small.adopt_if_room(std::move(big));
        CHECK(big.data() != nullptr);
        CHECK(small.resident() == 0);
        aligned_buffer fits(4 * KiB);
        small.adopt_if_room(std::move(fits));
        CHECK(fits.data() == nullptr);
        CHECK(small.resident() == 4 * KiB);
        CHECK(small.pooled() == 4 * KiB);
    }
    SUBCASE("trim_to_fit keeps every charge it allows within the budget") {
        p.recycle(std::move(a));
        p.recycle(std::move(b));
        for (std::size_t need : {4 * KiB, 8 * KiB, 12 * KiB, 16 * KiB}) {
            if (p.trim_to_fit(need)) {
                CHECK(p.resident() + need <= p.budget());
            }
        }
        CHECK(p.peak() <= p.budget());
    }
}

TEST_CASE("when nothing can be evicted, trim_to_fit says so and changes nothing") {
    budget_pool p(40 * KiB, 1 << 20);
    aligned_buffer a = held(p, 32 * KiB);
    CHECK_FALSE(p.trim_to_fit(16 * KiB));  // the pool is empty; the held bytes stay
    CHECK(p.resident() == 32 * KiB);
    CHECK_FALSE(p.trim_to_fit(41 * KiB));

    aligned_buffer b = held(p, 4 * KiB);
    p.recycle(std::move(b));
    CHECK_FALSE(p.trim_to_fit(16 * KiB));  // evicting the pool is not enough
    CHECK(p.pooled() == 0);
    CHECK(p.resident() == 32 * KiB);
    CHECK(p.trim_to_fit(8 * KiB));
}

TEST_CASE(
    "recycling frees beyond pool_limit unless the bytes stay within the held high-water mark") {
    budget_pool p(1 << 20, 8 * KiB);
    std::vector<aligned_buffer> bufs;
    for (int i = 0; i < 3; ++i) bufs.push_back(held(p, 8 * KiB));
    REQUIRE(p.held_peak() == 24 * KiB);
    for (auto& b : bufs) p.recycle(std::move(b));  // within the mark: all three are kept
    CHECK(p.pooled() == 24 * KiB);

    p.roll_high_water();  // a new step: the mark is the last step's, 24 KiB
    CHECK(p.pooled() == 24 * KiB);
    p.roll_high_water();  // a step that held nothing: the pool shrinks to pool_limit
    CHECK(p.pooled() == 8 * KiB);
    CHECK(p.resident() == 8 * KiB);

    aligned_buffer x = held(p, 8 * KiB);
    p.recycle(std::move(x));  // beyond pool_limit and above the mark (8 KiB held): freed
    CHECK(p.pooled() == 8 * KiB);
    CHECK(p.resident() == 8 * KiB);
}

TEST_CASE("restart_high_water shrinks the pool to pool_limit and restarts the mark from now") {
    budget_pool p(1 << 20, 8 * KiB);
    std::vector<aligned_buffer> bufs;
    for (int i = 0; i < 3; ++i) bufs.push_back(held(p, 8 * KiB));
    for (auto& b : bufs) p.recycle(std::move(b));
    REQUIRE(p.pooled() == 24 * KiB);
    p.restart_high_water();
    CHECK(p.pooled() == 8 * KiB);
    CHECK(p.resident() == 8 * KiB);
    CHECK(p.held_peak() == 0);
    CHECK(p.peak() == 24 * KiB);  // the peak restarts only with reset_peak()
}

TEST_CASE("account frees pooled buffers that would lift resident bytes past the held mark") {
    budget_pool p(1 << 20, 0);  // no pool_limit: only the held high-water mark keeps buffers
    std::vector<aligned_buffer> bufs;
    for (int i = 0; i < 3; ++i) bufs.push_back(held(p, 8 * KiB));
    for (auto& b : bufs) p.recycle(std::move(b));
    REQUIRE(p.pooled() == 24 * KiB);
    REQUIRE(p.held_peak() == 24 * KiB);

    p.account(8 * KiB);  // 24 + 8 > 24: one pooled buffer goes, then the charge fits the mark
    CHECK(p.pooled() == 16 * KiB);
    CHECK(p.resident() == 24 * KiB);
    p.account(16 * KiB);  // both pooled buffers go to make room for it
    CHECK(p.pooled() == 0);
    CHECK(p.resident() == 24 * KiB);
    p.account(8 * KiB);
    CHECK(p.resident() == 32 * KiB);
    CHECK(p.held_peak() == 32 * KiB);
}

TEST_CASE("the peak counts every resident byte, the pool included") {
    budget_pool p(1 << 20, 1 << 20);
    aligned_buffer a = held(p, 12 * KiB);
    p.recycle(std::move(a));
    CHECK(p.peak() == 12 * KiB);
    p.count(4 * KiB);
    CHECK(p.peak() == 16 * KiB);
    p.uncount(4 * KiB);
    CHECK(p.peak() == 16 * KiB);
    p.reset_peak();
    CHECK(p.peak() == 12 * KiB);
    p.restart_high_water();  // keeps the peak
    CHECK(p.peak() == 12 * KiB);
}

TEST_CASE("a pool_limit of SIZE_MAX is no limit: no sum wraps around, no free buffer is freed") {
    // The benchmark's keep_all baseline (memory_budget and pool_limit SIZE_MAX). A sum with
    // pool_limit that wrapped around made account() and roll_high_water() free the pool.
    constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
    budget_pool p(none, none);
    std::vector<aligned_buffer> bufs;
    for (int i = 0; i < 4; ++i) bufs.push_back(held(p, 8 * KiB));
    for (auto& b : bufs) p.recycle(std::move(b));
    REQUIRE(p.pooled() == 32 * KiB);
    p.restart_high_water();  // as reset_peak() does: the held mark restarts from 0
    REQUIRE(p.held_peak() == 0);
    CHECK(p.pooled() == 32 * KiB);

    aligned_buffer x = held(p, 4 * KiB);  // a size the pool has not: fresh memory
    CHECK(p.pooled() == 32 * KiB);
    CHECK(p.resident() == 36 * KiB);
    auto y = p.take(8 * KiB);  // something held while a new step begins
    REQUIRE(y);
    p.roll_high_water();
    CHECK(p.pooled() == 24 * KiB);
    CHECK(p.resident() == 36 * KiB);
    p.recycle(std::move(x));
    p.recycle(std::move(*y));
    CHECK(p.pooled() == 36 * KiB);
    p.adopt_if_room(aligned_buffer(8 * KiB));
    CHECK(p.pooled() == 44 * KiB);
    CHECK(p.fits(none));  // no budget: anything fits
    CHECK(p.trim_to_fit(none));
    CHECK(p.pooled() == 44 * KiB);
}

TEST_CASE("a charge too large for any budget does not fit, however the sum would wrap") {
    constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
    budget_pool p(1 << 20, 0);
    aligned_buffer a = held(p, 8 * KiB);
    CHECK_FALSE(p.fits(none));
    CHECK_FALSE(p.fits(none - 4 * KiB));
    CHECK_FALSE(p.trim_to_fit(none));
    aligned_buffer b(8 * KiB);
    p.give_back(std::move(b));  // 8 KiB more fit the budget: pooled and counted
    CHECK(p.resident() == 16 * KiB);
}
