// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/bandwidth_estimate.hpp: a moving average of one path's bandwidth in one
/// direction, over busy time, that an early instant transfer cannot dominate.
///
/// Each sample is a bandwidth (bytes over the busy seconds it took) weighted by
/// alpha = 1 - exp(-busy / window): avg = avg * (1 - alpha) + alpha * sample, and
/// norm = norm * (1 - alpha) + alpha. The estimate is avg / norm, the weighted mean of the
/// samples so far with older ones decayed and the start-up bias divided out, so a first
/// transfer that finished at once (a throttle's burst allowance) barely counts.
///
/// Guarantees:
///  - bytes_per_second() is 0 until a sample with a positive weight was added; after that it
///    lies between the smallest and the largest sample added (to within rounding), and one
///    sample on a fresh estimate gives that sample;
///  - a pure function of the samples and the window: no clock, no threads. Not thread-safe;
///    the owner guards it.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "spillway/error.hpp"

namespace spillway {

/// The moving average of the file comment.
class bandwidth_estimate {
public:
    /// @param window_seconds time constant, in seconds of busy time
    /// @throws std::invalid_argument unless window_seconds is finite and positive
    explicit bandwidth_estimate(double window_seconds) : window_(window_seconds) {
        expect_argument(window_seconds > 0 && std::isfinite(window_seconds),
                        "bandwidth_estimate: the window must be a finite number of seconds > 0, "
                        "not " +
                            std::to_string(window_seconds));
    }

    /// Adds one sample: `bytes_per_second` measured over `busy_seconds` of busy time.
    void add(double bytes_per_second, double busy_seconds) noexcept {
        const double alpha = 1.0 - std::exp(-busy_seconds / window_);
        avg_ = avg_ * (1 - alpha) + alpha * bytes_per_second;
        norm_ = norm_ * (1 - alpha) + alpha;
        if (norm_ > 0) value_ = avg_ / norm_;
    }

    /// Adds the transfers since the last update as one sample, from a counter's running
    /// totals (tier_stats: bytes moved and busy seconds in one direction). Nothing happens
    /// when no bytes or no busy time were added since.
    /// @return whether a sample was added
    bool update(std::uint64_t total_bytes, double total_busy_seconds) noexcept {
        const double busy = total_busy_seconds - seen_busy_;
        const std::uint64_t bytes = total_bytes - seen_bytes_;
        if (busy <= 0 || bytes == 0) return false;
        add(static_cast<double>(bytes) / busy, busy);
        seen_busy_ = total_busy_seconds;
        seen_bytes_ = total_bytes;
        return true;
    }

    /// The estimate in the unit of the samples (bytes per second); 0 when not measured yet.
    [[nodiscard]] double bytes_per_second() const noexcept { return value_; }
    /// The time constant given at construction, in seconds.
    [[nodiscard]] double window_seconds() const noexcept { return window_; }

private:
    double window_;
    double avg_ = 0;
    double norm_ = 0;
    double value_ = 0;
    std::uint64_t seen_bytes_ = 0;
    double seen_busy_ = 0;
};

}  // namespace spillway
