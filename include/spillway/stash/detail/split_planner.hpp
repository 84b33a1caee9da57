// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/detail/split_planner.hpp: which layers an activation stash offloads, and
/// the tier bandwidth the adaptive split is planned from.
///
/// Guarantees:
/// - Every decision is a pure function of what the caller supplies: layer profiles, forward
///   seconds and bandwidths (split_planner, plan_split, next_bandwidth, delivered_bandwidth,
///   round_bandwidth). Nothing here reads a clock or a tier, except probe_bandwidth(), which
///   times the probe's transfers with the clock it is given and feeds them to
///   round_bandwidth().
/// - A slower tier is believed at once (waiting for I/O costs more than keeping a layer),
///   a faster one half way per re-plan; a step in which nothing moved teaches nothing.
/// - first_kept() is SIZE_MAX when no layer is kept.
/// The rule itself is tba_split() (split_rule.hpp); docs/design.md, section "The activation
/// stash", says when the stash plans.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "spillway/stash/split_rule.hpp"
#include "spillway/stash/stash_options.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway::detail {

/// The bandwidth a tier delivered between two stats snapshots: bytes over busy seconds of
/// its writes and of its reads, the slower direction; 0 when nothing moved.
[[nodiscard]] inline double delivered_bandwidth(const tier_stats& before,
                                                const tier_stats& after) noexcept {
    auto rate = [](std::uint64_t bytes, double busy) {
        return bytes > 0 && busy > 0 ? static_cast<double>(bytes) / busy : 0.0;
    };
    const tier_stats d = after.since(before);
    const double w = rate(d.bytes_written, d.write_busy_seconds);
    const double r = rate(d.bytes_read, d.read_busy_seconds);
    return w > 0 && r > 0 ? std::min(w, r) : std::max(w, r);
}

/// The bandwidth to re-plan with, given the one the current plan used and the one the tier
/// delivered since: the observed one when slower, half way to it when faster.
/// Precondition: observed > 0.
[[nodiscard]] inline double next_bandwidth(double planned, double observed) noexcept {
    return observed < planned ? observed : 0.5 * (planned + observed);
}

/// One probe round: `nbytes` written in `write_seconds` and read back in `read_seconds`;
/// the slower direction's bytes per second (times under a nanosecond count as one).
[[nodiscard]] inline double round_bandwidth(std::size_t nbytes, double write_seconds,
                                            double read_seconds) noexcept {
    return static_cast<double>(nbytes) / std::max({write_seconds, read_seconds, 1e-9});
}

/// TBA's rule applied to `layers` (forward order): the plan with its first kept layer
/// (SIZE_MAX when every layer can be offloaded) and what it was computed from.
[[nodiscard]] inline split_plan plan_split(std::vector<layer_profile> layers,
                                           double forward_seconds, double bandwidth) {
    split_plan p;
    p.forward_seconds = forward_seconds;
    p.layers = std::move(layers);
    p.tier_bandwidth = bandwidth;
    p.first_kept_layer = tba_split(p.layers, p.forward_seconds, p.tier_bandwidth);
    if (p.first_kept_layer >= p.layers.size())
        p.first_kept_layer = std::numeric_limits<std::size_t>::max();
    p.planned = true;
    return p;
}

/// Writes `buffer` to `key` on `tier` and reads it back, three rounds; the best round's
/// bandwidth (noise only slows a round), each transfer timed by Clock::now(). Throws the
/// tier's error; the caller erases `key`.
template <class Clock = std::chrono::steady_clock, storage_tier Tier>
double probe_bandwidth(Tier& tier, const std::string& key, std::span<std::byte> buffer) {
    double bw = 0;
    for (int round = 0; round < 3; ++round) {
        auto t0 = Clock::now();
        tier.write(key, buffer).wait();
        auto t1 = Clock::now();
        tier.read(key, buffer).wait();
        auto t2 = Clock::now();
        bw = std::max(bw,
                      round_bandwidth(buffer.size(), std::chrono::duration<double>(t1 - t0).count(),
                                      std::chrono::duration<double>(t2 - t1).count()));
    }
    return bw;
}

/// The stash's split: whether a tensor is offloaded, and the plan of split_mode::adaptive.
/// Holds no clock and no tier; the stash says when a step profiles, plans or re-plans.
class split_planner {
public:
    explicit split_planner(const stash_options& o)
        : mode_(o.split),
          keep_below_bytes_(o.keep_below_bytes),
          first_kept_(o.split == split_mode::fixed ? o.first_kept_layer
                                                   : std::numeric_limits<std::size_t>::max()) {}

    /// True while split_mode::adaptive has no plan: the step profiles (offloads everything
    /// at or above keep_below_bytes).
    [[nodiscard]] bool profiling() const noexcept {
        return mode_ == split_mode::adaptive && !plan_.planned;
    }
    /// True once split_mode::adaptive planned.
    [[nodiscard]] bool planned() const noexcept { return plan_.planned; }
    /// Forward position of the first kept layer; SIZE_MAX when none is kept.
    [[nodiscard]] std::size_t first_kept() const noexcept { return first_kept_; }
    /// Whether a tensor of `nbytes` saved in the layer at forward position `position` is
    /// written to the tier (false: it stays in memory).
    [[nodiscard]] bool offloads(std::size_t nbytes, std::size_t position) const noexcept {
        if (nbytes == 0 || nbytes < keep_below_bytes_) return false;
        switch (mode_) {
            case split_mode::keep_all:
                return false;
            case split_mode::offload_all:
                return true;
            case split_mode::adaptive:
                if (!plan_.planned) return true;  // the profiling step offloads everything
                return position < first_kept_;
            case split_mode::fixed:
                return position < first_kept_;
        }
        return false;
    }

    /// Plans from a profiling step: its layers, its forward time and the tier's bandwidth.
    void plan(std::vector<layer_profile> layers, double forward_seconds, double bandwidth) {
        plan_ = plan_split(std::move(layers), forward_seconds, bandwidth);
        first_kept_ = plan_.first_kept_layer;
    }
    /// Re-plans from a step that ended, given the bandwidth the tier delivered during it
    /// (delivered_bandwidth); does nothing when `observed` is not positive.
    void replan(std::vector<layer_profile> layers, double forward_seconds, double observed) {
        if (observed <= 0) return;  // nothing moved: nothing learned
        plan(std::move(layers), forward_seconds, next_bandwidth(plan_.tier_bandwidth, observed));
    }
    /// split_mode::adaptive: the next step profiles again.
    void forget() noexcept {
        if (mode_ == split_mode::adaptive) plan_.planned = false;
    }
    /// The plan in use (split_plan); in split_mode::fixed its first_kept_layer is the user's.
    [[nodiscard]] split_plan snapshot() const {
        split_plan p = plan_;
        p.first_kept_layer = first_kept_;
        return p;
    }

private:
    split_mode mode_;
    std::size_t keep_below_bytes_;
    std::size_t first_kept_;
    split_plan plan_;
};

}  // namespace spillway::detail
