// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/schedule/shard_range.hpp: which items of `count` a rank owns when `ranks`
/// processes share them: the split a data-parallel trainer uses for its batch rows and its
/// optimizer shards.
///
/// Guarantees, for count items, rank r of n ranks:
/// - shard_range(count, r, n) is [floor(count*r/n), floor(count*(r+1)/n)): contiguous, in rank
///   order, covering [0, count) exactly once; sizes differ by at most one. Computed without
///   overflow for any count (and n below 2^32).
/// - shard_range(count, r, n, block) splits the ceil(count/block) blocks of `block` items the
///   same way and gives the shard in items, the last block cut at count: every shard starts on
///   a block boundary (an optimizer subgroup is never split between ranks).
/// - Both are pure functions, constexpr, and throw std::invalid_argument for n == 0, r >= n
///   or block == 0.
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>

namespace spillway {

/// A half-open range of item indices [begin, end).
struct index_range {
    std::size_t begin = 0;  ///< The first index.
    std::size_t end = 0;    ///< One past the last index.
    /// The number of indices, end - begin.
    [[nodiscard]] constexpr std::size_t size() const noexcept { return end - begin; }
    /// Ranges are equal when both ends are.
    friend constexpr bool operator==(const index_range&, const index_range&) = default;
};

namespace detail {
// floor(count * r / n) for r <= n without forming count * r: count = q n + m, so
// count r / n = q r + m r / n, and m r < n^2 fits in 64 bits for n < 2^32.
constexpr std::size_t scaled_floor(std::size_t count, std::size_t r, std::size_t n) noexcept {
    return count / n * r + count % n * r / n;
}
}  // namespace detail

/// Rank `rank`'s share of `count` items split over `ranks` ranks (see the file comment).
/// @throws std::invalid_argument when ranks is 0 or rank >= ranks
constexpr index_range shard_range(std::size_t count, std::size_t rank, std::size_t ranks) {
    if (ranks == 0 || rank >= ranks)
        throw std::invalid_argument(
            "shard_range: rank must be below the number of ranks (at least 1)");
    return {detail::scaled_floor(count, rank, ranks), detail::scaled_floor(count, rank + 1, ranks)};
}

/// Rank `rank`'s share of `count` items split over `ranks` ranks in whole blocks of `block`
/// items (the last block may be shorter): the blocks are shared as shard_range(blocks, rank,
/// ranks) shares items, and the range is given in items.
/// @throws std::invalid_argument when ranks or block is 0, or rank >= ranks
constexpr index_range shard_range(std::size_t count, std::size_t rank, std::size_t ranks,
                                  std::size_t block) {
    if (block == 0) throw std::invalid_argument("shard_range: the block size must be at least 1");
    const std::size_t blocks = count / block + (count % block != 0);
    const index_range b = shard_range(blocks, rank, ranks);
    return {std::min(count, b.begin * block), std::min(count, b.end * block)};
}

}  // namespace spillway
