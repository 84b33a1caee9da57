// SPDX-License-Identifier: Apache-2.0
// shard_range: [floor(count r / n), floor(count (r+1) / n)) for rank r of n, in items or in
// whole blocks; the shards tile [0, count) in rank order, uneven splits included.
#include <doctest/doctest.h>

#include <spillway/schedule/shard_range.hpp>

#include <cstddef>
#include <limits>
#include <stdexcept>

using spillway::index_range;
using spillway::shard_range;

TEST_CASE("uneven splits: sizes differ by at most one") {
    static_assert(shard_range(10, 0, 3) == index_range{0, 3});
    CHECK(shard_range(10, 1, 3) == index_range{3, 6});
    CHECK(shard_range(10, 2, 3) == index_range{6, 10});
    CHECK(shard_range(16, 1, 2) == index_range{8, 16});  // the trainer's rows: --batch 16, 2 ranks
    CHECK(shard_range(2, 0, 4).size() == 0);             // fewer items than ranks: empty shards
    CHECK(shard_range(2, 3, 4) == index_range{1, 2});
}

TEST_CASE("the shards tile [0, count) for every count and number of ranks") {
    for (std::size_t count = 0; count < 70; ++count) {
        for (std::size_t n = 1; n < 12; ++n) {
            std::size_t next = 0, sum = 0, smallest = count, largest = 0;
            for (std::size_t r = 0; r < n; ++r) {
                const index_range s = shard_range(count, r, n);
                REQUIRE(s.begin == next);
                next = s.end;
                sum += s.size();
                smallest = std::min(smallest, s.size());
                largest = std::max(largest, s.size());
            }
            CHECK(next == count);
            CHECK(sum == count);
            CHECK(largest - smallest <= 1);
        }
    }
}

TEST_CASE("whole blocks: every shard starts on a block boundary; the last block is cut at count") {
    // 10 items in blocks of 4: blocks [0,4) [4,8) [8,10) over 2 ranks: 1 and 2 blocks.
    CHECK(shard_range(10, 0, 2, 4) == index_range{0, 4});
    CHECK(shard_range(10, 1, 2, 4) == index_range{4, 10});
    // 834,304 parameters in subgroups of 65,536 (13 subgroups) over 3 ranks: 4, 4, 5.
    CHECK(shard_range(834304, 0, 3, 65536) == index_range{0, 4 * 65536});
    CHECK(shard_range(834304, 1, 3, 65536) == index_range{4 * 65536, 8 * 65536});
    CHECK(shard_range(834304, 2, 3, 65536) == index_range{8 * 65536, 834304});
    for (std::size_t count = 0; count < 60; ++count)
        for (std::size_t block = 1; block < 9; ++block)
            for (std::size_t n = 1; n < 7; ++n) {
                std::size_t next = 0;
                for (std::size_t r = 0; r < n; ++r) {
                    const index_range s = shard_range(count, r, n, block);
                    REQUIRE(s.begin == next);
                    CHECK((s.begin % block == 0 || s.begin == count));
                    next = s.end;
                }
                CHECK(next == count);
            }
}

TEST_CASE("no overflow for counts near the top of size_t") {
    const std::size_t big = std::numeric_limits<std::size_t>::max();
    CHECK(shard_range(big, 2, 3).end == big);
    CHECK(shard_range(big, 1, 3).size() == big / 3);
}

TEST_CASE("bad arguments are refused") {
    CHECK_THROWS_AS((void)shard_range(10, 0, 0), std::invalid_argument);
    CHECK_THROWS_AS((void)shard_range(10, 3, 3), std::invalid_argument);
    CHECK_THROWS_AS((void)shard_range(10, 0, 2, 0), std::invalid_argument);
}
