/// @file
/// spillway/tier/detail/bandwidth_probe.hpp: the virtual tier's measurement of one child at
/// construction, when no bandwidths are given.
///
/// Protocol, for one child:
///  1. Pick a key "spillway-probe-<pid>-<n>" the child does not hold.
///  2. Under the child's write lock: one warm-up write of the buffer, then three timed ones;
///     report the write bandwidth (bytes over the three writes' wall time).
///  3. Under the child's read lock: one warm-up read, then three timed ones; report the read
///     bandwidth.
///  4. Erase the key.
/// The warm-up absorbs first-touch costs and a throttle's burst allowance, which would
/// flatter one lone transfer.
///
/// Guarantees: a sample is reported as soon as its direction is measured (a failed read phase
/// leaves the write sample reported); when a transfer throws a std::exception the probe key
/// is erased (best effort) and probe_child() returns the exception's text.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
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
    try {
        clock::time_point t0;
        {
            std::scoped_lock guard(locks.write_lock);
            for (int r = 0; r <= timed; ++r) {
                if (r == 1) t0 = clock::now();
                child.write(key, pattern).wait();
            }
        }
        double busy = secs(clock::now() - t0);
        report(io_direction::write, static_cast<double>(timed * pattern.size()) / busy, busy);
        {
            std::scoped_lock guard(locks.read_lock);
            for (int r = 0; r <= timed; ++r) {
                if (r == 1) t0 = clock::now();
                child.read(key, back.first(pattern.size())).wait();
            }
        }
        busy = secs(clock::now() - t0);
        report(io_direction::read, static_cast<double>(timed * pattern.size()) / busy, busy);
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
