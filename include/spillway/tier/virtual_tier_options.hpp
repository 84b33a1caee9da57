// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/virtual_tier_options.hpp: the plain values of a virtual_tier's interface:
/// its settings, the per-child report it gives back, the requests of a batch, and
/// child_args() for children built in place.
///
/// Guarantees: plain values, no behaviour. virtual_tier's constructor checks the options
/// eagerly (detail::check_options) and throws std::invalid_argument naming the tier and the
/// field; what each field does is in virtual_tier.hpp and docs/design.md ("Multi-path
/// offload").
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/lock/lock_policy.hpp"
#include "spillway/tier/bandwidth_split.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway {

/// Whether placement follows measured bandwidth, stays with the initial figures, or stripes
/// numbered keys over the children.
enum class placement_mode {
    adaptive,  ///< weights follow the moving averages of measured bandwidth (the default)
    fixed,     ///< weights stay the given (or probed) bandwidths
    /// A key ending in "-<n>" (a layer's blob, "<prefix>-<layer>") goes to child n mod the
    /// children while that child is healthy and has room, so each child holds a known share
    /// of every stream and a walk over the layers alternates children; any other key, and a
    /// numbered key whose child is degraded or full (fail-over), is placed by finish time
    /// with the given (or probed) weights, as in `fixed`.
    striped,
};

/// A child's condition as the virtual tier sees it.
enum class child_health {
    healthy,   ///< receives new keys
    degraded,  ///< a write or read failed there: no new keys until restore()
};

/// Settings of a virtual_tier, checked eagerly by its constructor.
struct virtual_tier_options {
    /// The tier's name in messages and reports, and the prefix of the default lock names.
    std::string name = "virtual";
    /// Bandwidth of each child (bytes per second, or any ratio); empty: probe at construction.
    std::vector<double> bandwidths{};
    /// Whether placement follows measured bandwidth (adaptive) or keeps the initial figures.
    placement_mode placement = placement_mode::adaptive;
    /// Time constant of the bandwidth moving average, in seconds of busy time: long enough
    /// to average a few transfers delayed by a busy machine, short enough to follow a path
    /// that slows down within one pass over the keys.
    double bandwidth_window_seconds = 0.5;
    /// Bytes of each probe transfer at construction (one warm-up and three timed writes, then
    /// reads, per child).
    std::size_t probe_nbytes = std::size_t{1} << 20;
    /// The most bytes of blobs the virtual tier holds at once (SIZE_MAX: the children's sum).
    std::size_t capacity = std::numeric_limits<std::size_t>::max();
    /// Worker threads; 0: two per child (one reader and one writer each).
    std::size_t workers = 0;
    /// Where named lock policies keep their files (node_lock).
    lock_options locks{};
    /// The lock name of each child (empty: `"<name>.<index>"`); one entry per child when
    /// given. Processes that share a path must use one name for it.
    std::vector<std::string> lock_names{};
    /// Longest wait between scans of the queue for the one worker that stays awake when every
    /// wanted child lock is taken (the others sleep in the locks held outside the tier).
    std::chrono::microseconds poll_interval{500};
};

/// One child as virtual_tier::report() shows it.
struct child_report {
    std::size_t index = 0;                        ///< position among the children
    std::string name;                             ///< the child's name()
    child_health health = child_health::healthy;  ///< degraded after a failure, until restore()
    std::string fault;                            ///< the error that degraded the child, if any
    std::size_t keys = 0;        ///< keys placed on the child (including writes in flight)
    std::size_t bytes = 0;       ///< their bytes (a write in flight at its new size)
    double read_bandwidth = 0;   ///< moving average, bytes per second (0: not measured yet)
    double write_bandwidth = 0;  ///< moving average, bytes per second (0: not measured yet)
    double weight = 0;           ///< placement weight now (bytes per second, or the given ratio)
    tier_stats moved{};          ///< transfers the virtual tier made to and from the child
};

/// Arguments of one child, built in place by the virtual tier: child_args(path, options).
/// @return the arguments, decayed and copied into a tuple (so temporaries may be passed)
template <class... Args>
std::tuple<std::decay_t<Args>...> child_args(Args&&... args) {
    return std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...);
}

/// One write of a batch; the caller keeps `bytes` alive until its completion is ready.
struct write_request {
    std::string_view key;              ///< validated like any key; copied at submission
    std::span<const std::byte> bytes;  ///< the blob to store
};
/// One read of a batch; the caller keeps `bytes` alive until its completion is ready.
struct read_request {
    std::string_view key;        ///< validated like any key; copied at submission
    std::span<std::byte> bytes;  ///< receives the blob; its size must equal size_of(key)
};

namespace detail {

/// Checks `options` for a virtual tier of `children` children.
/// @throws std::invalid_argument naming the tier and the offending field
inline void check_options(const virtual_tier_options& options, std::size_t children) {
    const std::string tier = "virtual_tier " + spillway::quoted(options.name) + ": ";
    const std::string n = std::to_string(children);
    expect_argument(children >= 1, tier + "needs at least one child");
    expect_argument(options.bandwidths.empty() || options.bandwidths.size() == children,
                    tier + std::to_string(options.bandwidths.size()) + " bandwidths given for " +
                        n + " children");
    if (!options.bandwidths.empty())
        (void)split_by_bandwidth(1, options.bandwidths);  // validates the values
    expect_argument(
        options.bandwidth_window_seconds > 0 && std::isfinite(options.bandwidth_window_seconds),
        tier + "bandwidth_window_seconds must be positive");
    expect_argument(options.lock_names.empty() || options.lock_names.size() == children,
                    tier + std::to_string(options.lock_names.size()) + " lock names given for " +
                        n + " children");
    expect_argument(!options.bandwidths.empty() || options.probe_nbytes > 0,
                    tier + "probe_nbytes must be positive when no bandwidths are given");
}

}  // namespace detail

}  // namespace spillway
