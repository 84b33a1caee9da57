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
///  - place_key(): placement by finish time, in bytes. A child's finish time is the bytes of
///    the keys counted on it over its weight: how long it takes to move its keys once (one
///    pass). The key goes to the candidate (an eligible child of positive weight) that would
///    finish earliest with the key on it, and stays on its current child unless another
///    candidate would finish strictly earlier (ties go to the current child, then to the
///    lower index). When every eligible child has weight 0, they count as equal: better a
///    slow child than a lost blob. No eligible child: std::nullopt.
///    Why not shares of keys: rounding a 12:2:1 ratio to whole keys can give the slowest
///    child one key more than its share, and that key decides when the pass ends; and with
///    keys of mixed sizes, key counts say little about time. Under this rule no key moves
///    once every key is where the rule puts it (a move makes the moved key finish strictly
///    earlier, so moves stop). Once settled, with keys of one size the split is the best one
///    of whole keys (no other ends the pass sooner); with mixed sizes the last child finishes
///    at most n * S / W after the ideal (n children, S the largest key, W the weights' sum).
///  - striped_child(): the child of a numbered key under placement_mode::striped: the number
///    after the key's last '-', modulo the children; std::nullopt for a key without one.
///  - has_room(): a child has room when its used bytes, less the key's copy there, plus the
///    writes already headed there, leave nbytes free; sums saturate at SIZE_MAX.
/// The reasoning is in docs/design.md ("Multi-path offload").
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

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

/// The striped child of `key` among `children` (> 0): the decimal number after its last '-'
/// modulo `children`; std::nullopt when the key does not end in "-<digits>" (or the number
/// does not fit a size_t).
inline std::optional<std::size_t> striped_child(std::string_view key, std::size_t children) {
    const auto dash = key.rfind('-');
    if (dash == std::string_view::npos || dash + 1 == key.size() || children == 0)
        return std::nullopt;
    std::size_t n = 0;
    for (const char c : key.substr(dash + 1)) {
        if (c < '0' || c > '9') return std::nullopt;
        const auto digit = static_cast<std::size_t>(c - '0');
        if (n > (std::numeric_limits<std::size_t>::max() - digit) / 10) return std::nullopt;
        n = n * 10 + digit;
    }
    return n % children;
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
    /// The child's placement weight (placement_weights()), bytes per second or any ratio.
    double weight = 0;
    /// Bytes of the keys counted on the child, the key being placed included (at the bytes it
    /// is counted for) when it is counted there.
    std::size_t bytes = 0;
};

/// The child a write of `nbytes` goes to (see the file comment: placement by finish time).
/// @param children      every child, in index order
/// @param nbytes        the size of the blob being written
/// @param current       the child the key is counted on now (std::nullopt for a new key)
/// @param counted_bytes the bytes the key is counted for on `current` (its committed size, or
///                      the size of a write in flight); ignored without `current`
/// @return the child's index, or std::nullopt when no child is eligible
inline std::optional<std::size_t> place_key(std::span<const placement_child> children,
                                            std::size_t nbytes, std::optional<std::size_t> current,
                                            std::size_t counted_bytes = 0) {
    const std::size_t n = children.size();
    std::vector<double> w(n, 0);
    bool any = false, any_weight = false;
    for (std::size_t i = 0; i < n; ++i) {
        if (!children[i].eligible) continue;
        any = true;
        w[i] = children[i].weight > 0 ? children[i].weight : 0;
        any_weight = any_weight || w[i] > 0;
    }
    if (!any) return std::nullopt;
    if (!any_weight)
        for (std::size_t i = 0; i < n; ++i) w[i] = children[i].eligible ? 1.0 : 0.0;
    // Child i's finish time with the key on it: its other keys' bytes plus this blob's.
    auto finish = [&](std::size_t i) {
        std::size_t others = children[i].bytes;
        if (current == i) others -= std::min(others, counted_bytes);
        return (static_cast<double>(others) + static_cast<double>(nbytes)) / w[i];
    };
    std::optional<std::size_t> best;
    double best_finish = std::numeric_limits<double>::infinity();
    if (current && *current < n && w[*current] > 0) {
        best = current;
        best_finish = finish(*current);
    }
    for (std::size_t i = 0; i < n; ++i) {
        if (w[i] == 0 || i == current) continue;
        const double f = finish(i);
        // Strictly earlier by more than rounding, so that ties keep the key where it is (or
        // at the lower index) on every machine.
        if (!best || f < best_finish * (1 - 1e-12)) {
            best = i;
            best_finish = f;
        }
    }
    return best;
}

}  // namespace spillway::detail
