// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/detail/visit_order.hpp: where a training loop is in the order it visits
/// its layers, and how soon each layer is visited again.
///
/// A step visits its layers in one of two patterns (visit_pattern), and steps repeat, so the
/// visits form a periodic sequence S:
/// - forward_and_backward: 0..N-1 (forward), then N-1..0 (backward); period P = 2N,
///   S[p] = p for p < N and 2N-1-p for p >= N (each layer twice per period; at the turns,
///   N-1 and 0 are visited twice in a row). The parameters' pattern.
/// - backward_only: N-1..0 every step; period P = N, S[p] = N-1-p. The pattern of state
///   that only backward's updates touch (an optimizer's moments).
/// The cursor is the position of the last visit; before any visit it stands at P-1 (the
/// end of an imagined backward), so the first layer of the pattern comes first.
///
/// Guarantees:
/// - distance(l) is the number of positions from the cursor to the next visit of l
///   strictly after it: 1..P. The layer needed soonest has the smallest distance, the one
///   needed latest the largest (the eviction order of Belady's rule).
/// - visit(l) moves the cursor to that next visit, so a loop that skips a visit (holds
///   layer N-1 across the turn, runs a forward without backward) resynchronises at once.
/// - layer_at(offset) is S[cursor + offset], for walking the upcoming visits in order.
#pragma once

#include <algorithm>
#include <cstddef>

#include "spillway/stream/param_stream_options.hpp"

namespace spillway::detail {

/// The cursor over the periodic visiting order of `count` layers (see the file comment).
class visit_order {
public:
    /// An order over `count` layers (>= 1) in `pattern`, before its first visit.
    explicit visit_order(std::size_t count,
                         visit_pattern pattern = visit_pattern::forward_and_backward) noexcept
        : count_(count),
          period_(pattern == visit_pattern::backward_only ? count : 2 * count),
          cursor_(period_ - 1),
          backward_only_(pattern == visit_pattern::backward_only) {}

    /// The layer visited `offset` positions after the cursor.
    [[nodiscard]] std::size_t layer_at(std::size_t offset) const noexcept {
        const std::size_t p = (cursor_ + offset) % period_;
        if (backward_only_) return count_ - 1 - p;
        return p < count_ ? p : period_ - 1 - p;
    }
    /// Positions from the cursor to the next visit of `layer` (< count), strictly after the
    /// cursor: 1..period().
    [[nodiscard]] std::size_t distance(std::size_t layer) const noexcept {
        if (backward_only_) return ahead(count_ - 1 - layer);
        return std::min(ahead(layer), ahead(period_ - 1 - layer));
    }
    /// Moves the cursor to the next visit of `layer`.
    void visit(std::size_t layer) noexcept { cursor_ = (cursor_ + distance(layer)) % period_; }
    /// The visits of one step: 2 * count, or count for backward_only.
    [[nodiscard]] std::size_t period() const noexcept { return period_; }
    /// True while the cursor is in a forward pass (the last visit was ascending).
    [[nodiscard]] bool forward() const noexcept { return !backward_only_ && cursor_ < count_; }

private:
    // Positions from the cursor to position p of the period, strictly after it.
    [[nodiscard]] std::size_t ahead(std::size_t p) const noexcept {
        const std::size_t d = (p + period_ - cursor_) % period_;
        return d == 0 ? period_ : d;
    }
    std::size_t count_;
    std::size_t period_;
    std::size_t cursor_;
    bool backward_only_;
};

}  // namespace spillway::detail
