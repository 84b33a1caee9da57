// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/bandwidth_split.hpp: splitting N items over paths in proportion to their
/// bandwidth, n_i = N * B_i / sum_j B_j, rounded by the largest-remainder method.
///
/// Guarantees of split_by_bandwidth(count, bandwidths):
///  - the shares sum to `count` exactly, for any number of paths;
///  - each share is within one of its ideal N * B_i / sum B (floor or ceiling of it); the
///    ideals are computed in long double (64-bit mantissa), so N is limited to 2^62, where
///    the product N * B_i still rounds to within an item (above it a share could miss by one
///    or two);
///  - a path of bandwidth 0 gets nothing; a single path gets everything;
///  - the result is a pure function of the input (ties go to the lower index), so every
///    process of a job computes the same placement.
/// Bad input (no paths, a negative, NaN or infinite bandwidth, all zero, N above 2^62) throws
/// std::invalid_argument naming the offending path index and value (or N).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "spillway/error.hpp"

namespace spillway {

/// The most items split_by_bandwidth() takes (2^62; see the file comment).
inline constexpr std::size_t max_split_count = std::size_t{1} << 62;

/// Shares of `count` items proportional to `bandwidths` (any unit; only ratios matter),
/// with the guarantees of the file comment.
/// @param count      the items to place (subgroups, blocks, ...)
/// @param bandwidths one entry per path, each finite and >= 0, at least one positive
/// @return one share per path, in the order of `bandwidths`, summing to `count`
/// @throws std::invalid_argument for no paths, a negative, NaN or infinite bandwidth (naming
///         the path index and value), all bandwidths 0, or `count` above max_split_count
inline std::vector<std::size_t> split_by_bandwidth(std::size_t count, std::span<const double> bandwidths) {
    expect_argument(!bandwidths.empty(), std::string("split_by_bandwidth: no paths to split ") + std::to_string(count) + " items over");
    expect_argument(count <= max_split_count, "split_by_bandwidth: " + std::to_string(count) +
                                                  " items is more than the 2^62 whose shares it computes exactly");
    long double total = 0;
    for (std::size_t i = 0; i < bandwidths.size(); ++i) {
        double b = bandwidths[i];
        expect_argument(std::isfinite(b) && b >= 0,
                        std::string("split_by_bandwidth: bandwidth of path ") + std::to_string(i) + " is " + std::to_string(b) +
                            "; it must be a finite number >= 0");
        total += b;
    }
    expect_argument(total > 0, "split_by_bandwidth: every path has bandwidth 0; at least one must be positive");

    const std::size_t n = bandwidths.size();
    std::vector<std::size_t> share(n, 0);
    std::vector<long double> remainder(n, 0);
    std::size_t assigned = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (bandwidths[i] == 0) continue;
        long double ideal = static_cast<long double>(count) * bandwidths[i] / total;
        long double whole = std::floor(ideal);
        // Rounding can put `ideal` a hair above count; never hand out more than count.
        share[i] = std::min(count, static_cast<std::size_t>(whole));
        remainder[i] = ideal - whole;
        assigned += share[i];
    }
    // Largest remainders first; ties to the lower index. Only positive-bandwidth paths take
    // a remainder item, so a zero-bandwidth path stays at zero.
    std::vector<std::size_t> order;
    order.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
        if (bandwidths[i] > 0) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
    // In exact arithmetic 0 <= count - assigned < order.size(); floating-point rounding can
    // move it by a few, so both directions are handled.
    for (std::size_t k = 0; assigned < count; k = (k + 1) % order.size()) {
        ++share[order[k]];
        ++assigned;
    }
    for (std::size_t k = order.size(); assigned > count;) {
        k = k == 0 ? order.size() - 1 : k - 1;  // smallest remainders give back first
        if (share[order[k]] > 0) {
            --share[order[k]];
            --assigned;
        }
    }
    return share;
}

/// Overload for braced lists: `split_by_bandwidth(10, {3.0, 1.0})` is {8, 2}.
inline std::vector<std::size_t> split_by_bandwidth(std::size_t count, std::initializer_list<double> bandwidths) {
    return split_by_bandwidth(count, std::span<const double>(bandwidths.begin(), bandwidths.size()));
}

}  // namespace spillway
