// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/detail/placement.hpp: which child of a virtual tier a key is written to,
/// as pure functions of the children's figures (no tier, no locks, no I/O).
///
/// Guarantees:
///  - placement_weights(): a child's weight is 1 / (1/read + 1/write) once both directions
///    are measured (the time one key costs per update: one read, one write), else the one
///    measured; a child not measured yet keeps its given bandwidth scaled by the mean
///    measured-over-given ratio of the children that have both (unscaled when none has);
///    a child with neither gets 0.
///  - place_key(): the shares n_i of all keys (split_by_bandwidth over the weights of the
///    eligible children) decide. The key stays on its current child while that child is
///    eligible, has a positive weight and is not above its share; otherwise it goes to the
///    eligible child of positive weight furthest below its share (ties to the lower index).
///    When every eligible child has weight 0, they share equally: better a slow child than
///    a lost blob. No eligible child: std::nullopt.
///  - has_room(): a child has room when its used bytes, less the key's copy there, plus the
///    writes already headed there, leave nbytes free; sums saturate at SIZE_MAX.
/// The reasoning is in docs/design.md ("Multi-path offload").
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "spillway/tier/bandwidth_split.hpp"

namespace spillway::detail {

/// a + b, or SIZE_MAX when that overflows.
inline std::size_t saturating_add(std::size_t a, std::size_t b) noexcept {
    return a > std::numeric_limits<std::size_t>::max() - b ? std::numeric_limits<std::size_t>::max()
                                                           : a + b;
}

/// One child's bandwidth figures, in any one unit (bytes per second, or a ratio).
struct child_bandwidth {
    double given = 0;  ///< from the options; 0 when none was given
    double read = 0;   ///< measured read bandwidth; 0 when not measured yet
    double write = 0;  ///< measured write bandwidth; 0 when not measured yet
};

/// The weight of a child from its measurements alone (0 when it has none).
inline double measured_weight(const child_bandwidth& c) noexcept {
    if (c.read > 0 && c.write > 0) return 1.0 / (1.0 / c.read + 1.0 / c.write);
    return std::max(c.read, c.write);
}

/// The placement weight of each child (see the file comment), in the order given.
inline std::vector<double> placement_weights(std::span<const child_bandwidth> children) {
    double ratio_sum = 0;
    int ratio_count = 0;
    for (const auto& c : children) {
        double m = measured_weight(c);
        if (m > 0 && c.given > 0) {
            ratio_sum += m / c.given;
            ++ratio_count;
        }
    }
    const double scale = ratio_count ? ratio_sum / ratio_count : 1.0;
    std::vector<double> out(children.size(), 0);
    for (std::size_t i = 0; i < children.size(); ++i) {
        if (double m = measured_weight(children[i]); m > 0)
            out[i] = m;
        else if (children[i].given != 0)
            out[i] = children[i].given * scale;
    }
    return out;
}

/// A child's space, in bytes.
struct child_space {
    std::size_t capacity = 0;  ///< the child's capacity()
    std::size_t used = 0;      ///< the child's used()
    std::size_t pending = 0;   ///< writes submitted to the child and not finished
};

/// Whether a blob of `nbytes` fits on the child once the key's copy there (`replaced_nbytes`,
/// 0 when the child holds none) is replaced and the pending writes have landed.
inline bool has_room(const child_space& space, std::size_t replaced_nbytes,
                     std::size_t nbytes) noexcept {
    const std::size_t taken =
        saturating_add(space.used - std::min(space.used, replaced_nbytes), space.pending);
    return taken <= space.capacity && space.capacity - taken >= nbytes;
}

/// One child as place_key() sees it.
struct placement_child {
    /// Whether the key may go there: healthy, not excluded from this write, and has_room().
    bool eligible = false;
    /// The child's placement weight (placement_weights()).
    double weight = 0;
    /// Keys counted on the child, the key being placed included when it is counted there.
    std::size_t keys = 0;
};

/// The child a key goes to (see the file comment).
/// @param children  every child, in index order
/// @param key_count the keys to split over the children, this one included
/// @param current   the child the key is counted on now (std::nullopt for a new key)
/// @return the child's index, or std::nullopt when no child is eligible
inline std::optional<std::size_t> place_key(std::span<const placement_child> children,
                                            std::size_t key_count,
                                            std::optional<std::size_t> current) {
    const std::size_t n = children.size();
    std::vector<double> w(n, 0);
    bool any = false, any_weight = false;
    for (std::size_t i = 0; i < n; ++i) {
        if (!children[i].eligible) continue;
        any = true;
        w[i] = children[i].weight;
        any_weight = any_weight || w[i] > 0;
    }
    if (!any) return std::nullopt;
    if (!any_weight)
        for (std::size_t i = 0; i < n; ++i) w[i] = children[i].eligible ? 1.0 : 0.0;
    const auto share = split_by_bandwidth(key_count, w);
    // Keys on child i besides this one.
    auto others = [&](std::size_t i) { return children[i].keys - (current == i ? 1 : 0); };
    if (current && *current < n && children[*current].eligible && w[*current] > 0 &&
        others(*current) + 1 <= share[*current])
        return current;
    std::optional<std::size_t> best;
    double best_gap = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < n; ++i) {
        if (!children[i].eligible || w[i] == 0) continue;
        double gap = static_cast<double>(share[i]) - static_cast<double>(others(i));
        if (gap > best_gap) {
            best_gap = gap;
            best = i;
        }
    }
    return best;
}

}  // namespace spillway::detail
