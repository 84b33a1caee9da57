// SPDX-License-Identifier: Apache-2.0
// spillway/optim/update_stats.hpp: what one update_pipeline call did, and how busy each
// storage path was while it ran.
//
// Guarantees:
// - update_stats describes exactly one call (update() or hand_over_gradients()); every
//   counter starts at zero for that call, so no difference is needed to read it.
// - child_io counts what one tier (or one child of a virtual tier) moved during the call:
//   child_snapshot(tier) reads the tier's monotonic counters, and after.since(before)
//   subtracts two snapshots through tier_stats::since, the one place where tier counters
//   are subtracted.
// - busy_fraction() near 1 means the path worked for the whole call; lower means it idled
//   for part of it (the start and end of a call, or waits on its lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ranges>
#include <string>
#include <utility>
#include <vector>

#include "spillway/optim/adam.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway {

/// Bytes a tier (or one child of a virtual tier) moved during a call, and how long it was
/// busy doing so: busy_fraction() near 1 means the path worked for the whole call, lower
/// means it idled for part of it (the start and end of a call, or waits on its lock).
/// Busy seconds come from the tier's own counters (tier_stats: wall time with at least one
/// operation of that direction in flight); for a virtual tier's child they count only the
/// transfers this tier made to it (another process under node_lock is not seen), and a
/// plain tier's count the operations of all its users during the call.
struct child_io {
    std::string name;                 ///< the tier's (or child's) name()
    std::uint64_t bytes_read = 0;     ///< bytes read from it during the call
    std::uint64_t bytes_written = 0;  ///< bytes written to it during the call
    double read_busy_seconds = 0;     ///< wall time with >= 1 read in flight to it during the call
    double write_busy_seconds = 0;    ///< wall time with >= 1 write in flight to it during the call

    /// Mean over the two directions of busy time / `call_seconds` (0 when call_seconds <= 0).
    [[nodiscard]] double busy_fraction(double call_seconds) const noexcept {
        return call_seconds > 0 ? (read_busy_seconds + write_busy_seconds) / (2 * call_seconds)
                                : 0.0;
    }

    /// What moved between the snapshot `before` and this one (stats after minus stats
    /// before, by tier_stats::since), field by field; the name is this one's.
    [[nodiscard]] child_io since(const child_io& before) const {
        return of(name, counters().since(before.counters()));
    }

    /// The bytes and busy seconds of `stats` (a tier's, or a child's), under `name`.
    [[nodiscard]] static child_io of(std::string name, const tier_stats& stats) {
        return child_io{.name = std::move(name),
                        .bytes_read = stats.bytes_read,
                        .bytes_written = stats.bytes_written,
                        .read_busy_seconds = stats.read_busy_seconds,
                        .write_busy_seconds = stats.write_busy_seconds};
    }
    /// These counters as a tier_stats (operation and failure counts 0: not kept).
    [[nodiscard]] tier_stats counters() const noexcept {
        return tier_stats{.bytes_read = bytes_read,
                          .bytes_written = bytes_written,
                          .read_busy_seconds = read_busy_seconds,
                          .write_busy_seconds = write_busy_seconds};
    }
};

/// What one update() (or hand_over_gradients()) call did.
struct update_stats {
    step_result result = step_result::applied;  ///< applied, or skipped on a gradient overflow
    std::int64_t step = 0;                      ///< the Adam step applied (0 when skipped)
    double seconds = 0;                         ///< wall time of the update call
    double read_wait_seconds = 0;               ///< blocked waiting for reads
    double compute_seconds = 0;                 ///< in the Adam step (and the gradient check)
    double write_wait_seconds = 0;              ///< blocked waiting for writes
    double gradient_wait_seconds = 0;  ///< a streamed update: waiting for the gradients to be final
    double handover_seconds = 0;       ///< hand_over_gradients() for this step (0 when not called)
    std::size_t subgroups_read = 0;    ///< subgroups whose state was read from the tier
    std::size_t subgroups_written = 0;     ///< subgroups whose state was written to the tier
    std::size_t served_from_resident = 0;  ///< subgroups found in the resident set (no read)
    std::size_t served_from_prefetch =
        0;                         ///< subgroups whose read begin_prefetch() issued before the call
    std::uint64_t bytes_read = 0;  ///< state (and fp32 gradient) bytes the pipeline read
    std::uint64_t bytes_written = 0;  ///< state bytes the pipeline wrote
    std::uint64_t handover_bytes_written =
        0;  ///< fp32 gradient bytes written by the hand-over (fp32_on_tier)
    std::vector<child_io> children;  ///< per tier child (one entry for a plain tier)
    double grad_norm = 0;            ///< global L2 norm of the unscaled gradients
    float clip_coef = 1.0f;  ///< factor applied to the gradients by clipping (1: not clipped)
};

/// A tier that reports per-child statistics (a virtual tier): report() returns a range of
/// entries with `name` and `moved` (the tier_stats of the transfers to and from that child).
/// Detected, not required.
template <class T>
concept tier_with_children = requires(const T& t) {
    { t.report() } -> std::ranges::range;
}
&&requires(const std::ranges::range_value_t<decltype(std::declval<const T&>().report())>& c) {
    { c.name } -> std::convertible_to<std::string>;
    { c.moved } -> std::convertible_to<tier_stats>;
};

/// A snapshot of the counters of `tier`: one entry per child for a tier_with_children, one
/// entry for a plain tier. Subtract two with child_io::since.
template <storage_tier Tier>
[[nodiscard]] std::vector<child_io> child_snapshot(const Tier& tier) {
    std::vector<child_io> out;
    if constexpr (tier_with_children<Tier>) {
        for (const auto& c : tier.report())
            out.push_back(child_io::of(std::string(c.name), c.moved));
    } else {
        out.push_back(child_io::of(std::string(tier.name()), tier.stats()));
    }
    return out;
}

}  // namespace spillway
