// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/tier_stats.hpp: counters every storage tier keeps, and the recorder that
/// maintains them.
///
/// Guarantees: counters are monotonic over a tier's life; busy time counts wall time during
/// which at least one operation of that direction was in flight (overlapping operations are
/// not double-counted), so bytes / busy seconds is the bandwidth the tier delivered while it
/// worked. stats_recorder is thread-safe.
///
/// What a tier did over an interval is `after.since(before)` of two snapshots: the one helper
/// that subtracts them, instead of field by field at each caller (update_stats' child_io::since
/// builds on it).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace spillway {

/// A snapshot of a tier's counters since it was created (stats() of every storage_tier).
/// A plain value: copying it is the way to compare two moments.
struct tier_stats {
    std::uint64_t bytes_read = 0;     ///< bytes delivered by successful reads
    std::uint64_t bytes_written = 0;  ///< bytes stored by successful writes
    std::uint64_t reads = 0;          ///< completed read operations
    std::uint64_t writes = 0;         ///< completed write operations
    std::uint64_t failed_reads = 0;   ///< read operations that ended in an error
    std::uint64_t failed_writes = 0;  ///< write operations that ended in an error
    double read_busy_seconds = 0;     ///< wall time with >= 1 read in flight, seconds
    double write_busy_seconds = 0;    ///< wall time with >= 1 write in flight, seconds

    /// What the tier did between the snapshot `before` and this one: every field (bytes,
    /// operations, failures and busy seconds: all are counters) is this one's minus
    /// `before`'s. tier_stats keeps no measured rate of its own: read_bandwidth() and
    /// write_bandwidth() of the result are the bandwidths delivered in between (0 when
    /// nothing moved that way). Precondition: `before` is an earlier snapshot of the same
    /// tier (counters never decrease; the unsigned ones would wrap otherwise). Pure.
    [[nodiscard]] tier_stats since(const tier_stats& before) const noexcept {
        tier_stats d = *this;
        d.bytes_read -= before.bytes_read;
        d.bytes_written -= before.bytes_written;
        d.reads -= before.reads;
        d.writes -= before.writes;
        d.failed_reads -= before.failed_reads;
        d.failed_writes -= before.failed_writes;
        d.read_busy_seconds -= before.read_busy_seconds;
        d.write_busy_seconds -= before.write_busy_seconds;
        return d;
    }

    /// Bytes per second delivered while reads were in flight (0 before any read).
    [[nodiscard]] double read_bandwidth() const noexcept {
        return read_busy_seconds > 0 ? static_cast<double>(bytes_read) / read_busy_seconds : 0.0;
    }
    /// Bytes per second delivered while writes were in flight (0 before any write).
    [[nodiscard]] double write_bandwidth() const noexcept {
        return write_busy_seconds > 0 ? static_cast<double>(bytes_written) / write_busy_seconds
                                      : 0.0;
    }
};

/// The two directions of a transfer.
enum class io_direction {
    read,   ///< from the tier into the caller's buffer
    write,  ///< from the caller's buffer into the tier
};

/// Thread-safe bookkeeping behind tier_stats. Call begin() when an operation is issued and
/// end() exactly once when it completes.
class stats_recorder {
public:
    /// The clock behind the busy times: monotonic, unaffected by changes of the wall clock.
    using clock = std::chrono::steady_clock;

    /// Records that an operation of direction `dir` was issued; the busy time of that
    /// direction starts running if none was in flight.
    void begin(io_direction dir) {
        std::lock_guard lock(mutex_);
        auto& d = side(dir);
        if (d.in_flight++ == 0) d.busy_since = clock::now();
    }
    /// Records that an operation begun with begin(dir) finished, once per begin().
    /// @param dir    the direction given to begin()
    /// @param nbytes bytes transferred; counted only when `ok`
    /// @param ok     false when the operation ended in an error (counted in failed_reads or
    ///               failed_writes)
    void end(io_direction dir, std::uint64_t nbytes, bool ok) {
        std::lock_guard lock(mutex_);
        auto& d = side(dir);
        if (--d.in_flight == 0) d.busy += clock::now() - d.busy_since;
        if (dir == io_direction::read) {
            if (ok) {
                stats_.bytes_read += nbytes;
                ++stats_.reads;
            } else {
                ++stats_.failed_reads;
            }
        } else {
            if (ok) {
                stats_.bytes_written += nbytes;
                ++stats_.writes;
            } else {
                ++stats_.failed_writes;
            }
        }
    }
    /// The counters now; the busy time of a direction with operations in flight includes the
    /// time up to this call.
    [[nodiscard]] tier_stats snapshot() const {
        std::lock_guard lock(mutex_);
        tier_stats s = stats_;
        auto now = clock::now();
        auto busy = [&](const direction& d) {
            auto t = d.busy;
            if (d.in_flight > 0) t += now - d.busy_since;
            return std::chrono::duration<double>(t).count();
        };
        s.read_busy_seconds = busy(read_);
        s.write_busy_seconds = busy(write_);
        return s;
    }

private:
    struct direction {
        int in_flight = 0;
        clock::time_point busy_since{};
        clock::duration busy{};
    };
    direction& side(io_direction dir) { return dir == io_direction::read ? read_ : write_; }
    mutable std::mutex mutex_;
    tier_stats stats_;
    direction read_, write_;
};

}  // namespace spillway
