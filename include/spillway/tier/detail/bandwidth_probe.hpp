// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/detail/bandwidth_probe.hpp: the virtual tier's measurement of one child at
/// construction, when no bandwidths are given.
///
/// Protocol, for one child:
///  1. Pick a key "spillway-probe-<pid>-<n>" the child does not hold.
///  2. Under the child's write lock: one warm-up write of the buffer, then three timed ones;
///     report the write bandwidth: bytes over busy seconds of the three writes as the
///     child's stats() count them, or, for a child whose stats() counted none of it, bytes
///     over the three writes' wall time.
///  3. Under the child's read lock: one warm-up read, then three timed ones; report the read
///     bandwidth, measured as in step 2.
///  4. Erase the key.
/// The warm-up absorbs first-touch costs and a throttle's burst allowance, which would
/// flatter one lone transfer. The child's own count comes first so that the figure is the
/// path's (a throttle counts issue to release), and so that a test child reporting a
/// bandwidth it is told to makes the probe's result exact on any machine.
///
/// Guarantees: a sample is reported as soon as its direction is measured (a failed read phase
/// leaves the write sample reported); when a transfer throws a std::exception the probe key
/// is erased (best effort) and probe_child() returns the exception's text.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "spillway/lock/lock_policy.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway::detail {

/// A key for the probe that `child` does not hold (step 1).
template <class Child>
std::string probe_key(Child& child) {
    std::string key;
    for (int n = 0;; ++n) {
        key = std::string("spillway-probe-") + std::to_string(::getpid()) + "-" + std::to_string(n);
        if (!child.contains(key)) return key;
    }
}

/// The transfers of direction `dir` in `d` (a difference of stats() snapshots, see
/// tier_stats::since) as a bandwidth and its busy seconds; std::nullopt when no bytes or no
/// busy time were counted that way.
inline std::optional<std::pair<double, double>> rate_of(const tier_stats& d,
                                                        io_direction dir) noexcept {
    const bool rd = dir == io_direction::read;
    const std::uint64_t bytes = rd ? d.bytes_read : d.bytes_written;
    const double busy = rd ? d.read_busy_seconds : d.write_busy_seconds;
    if (bytes == 0 || !(busy > 0)) return std::nullopt;
    return std::pair<double, double>(static_cast<double>(bytes) / busy, busy);
}

/// Steps 2-4 of the file comment on `key`, with transfers of `pattern`, reading into `back`
/// (at least as large).
/// @param report called as report(io_direction, bytes_per_second, busy_seconds) per direction
/// @throws what the child's operations throw, after erasing the probe key
template <class Child, class Lock, class Report>
void probe_bandwidth(Child& child, path_locks<Lock>& locks, const std::string& key,
                     std::span<const std::byte> pattern, std::span<std::byte> back,
                     Report&& report) {
    using clock = std::chrono::steady_clock;
    constexpr int timed = 3;
    auto secs = [](auto d) { return std::max(1e-9, std::chrono::duration<double>(d).count()); };
    // Times `transfer` (timed + 1 calls, the first a warm-up) and reports the rate.
    auto measure = [&](io_direction dir, auto&& transfer) {
        clock::time_point t0;
        tier_stats before;
        for (int r = 0; r <= timed; ++r) {
            if (r == 1) {
                before = child.stats();
                t0 = clock::now();
            }
            transfer();
        }
        const double wall = secs(clock::now() - t0);
        if (auto counted = rate_of(child.stats().since(before), dir))
            report(dir, counted->first, counted->second);
        else
            report(dir, static_cast<double>(timed * pattern.size()) / wall, wall);
    };
    try {
        {
            std::scoped_lock guard(locks.write_lock);
            measure(io_direction::write, [&] { child.write(key, pattern).wait(); });
        }
        {
            std::scoped_lock guard(locks.read_lock);
            measure(io_direction::read,
                    [&] { child.read(key, back.first(pattern.size())).wait(); });
        }
        (void)child.erase(key);
    } catch (const std::exception&) {
        try {
            (void)child.erase(key);
        } catch (...) {
        }
        throw;
    }
}

/// The bytes probe transfers write: `nbytes` of a fixed pattern.
inline std::vector<std::byte> probe_pattern(std::size_t nbytes) {
    std::vector<std::byte> pattern(nbytes);
    for (std::size_t i = 0; i < pattern.size(); ++i)
        pattern[i] = static_cast<std::byte>(i * 131 + 7);
    return pattern;
}

/// The whole protocol for one child: transfers of `pattern`, cut to half the child's free
/// room (a rewrite may hold an old and a new copy for a moment); a full child is not probed.
/// `back` is at least as large as `pattern`.
/// @return the text of the std::exception a transfer threw, or std::nullopt
/// @throws what the child's capacity(), used() and contains() throw
template <class Child, class Lock, class Report>
std::optional<std::string> probe_child(Child& child, path_locks<Lock>& locks,
                                       std::span<const std::byte> pattern,
                                       std::span<std::byte> back, Report&& report) {
    const std::size_t cap = child.capacity(), used = child.used();
    const std::size_t room = cap - std::min(cap, used);
    std::span<const std::byte> buf = pattern.first(std::min(room / 2, pattern.size()));
    if (buf.empty()) return std::nullopt;
    const std::string key = probe_key(child);
    try {
        probe_bandwidth(child, locks, key, buf, back, report);
    } catch (const std::exception& e) {
        return std::string(e.what());
    }
    return std::nullopt;
}

}  // namespace spillway::detail
