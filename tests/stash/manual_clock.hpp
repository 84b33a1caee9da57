// SPDX-License-Identifier: Apache-2.0
// tests/stash/manual_clock.hpp: a clock the test moves by hand, and a host tier whose
// transfers move it as a tier of a set bandwidth would take, so that what the stash times
// (layers, forward, the bandwidth probe) is exactly what the test says, however loaded the
// machine is.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ratio>
#include <span>
#include <string_view>

#include <spillway/tier/storage_tier.hpp>

#include "support/host_tier_wrapper.hpp"

namespace spillway::test {

/// A steady clock that stands still until advance() moves it (one time line per process).
struct manual_clock {
    using rep = std::int64_t;
    using period = std::nano;
    using duration = std::chrono::nanoseconds;
    using time_point = std::chrono::time_point<manual_clock>;
    static constexpr bool is_steady = true;

    static time_point now() noexcept { return time_point(duration(ticks().load())); }
    /// Moves the clock on by `seconds` (rounded to nanoseconds).
    static void advance(double seconds) noexcept {
        ticks() +=
            std::chrono::duration_cast<duration>(std::chrono::duration<double>(seconds)).count();
    }

private:
    static std::atomic<rep>& ticks() noexcept {
        static std::atomic<rep> t{0};
        return t;
    }
};

/// A host tier whose transfers of the keys that end in `suffix` (by default the stash's
/// probe blob, "<prefix>-<serial>-probe") move manual_clock on by bytes / bytes_per_second;
/// other transfers take no time on it, so the stash's own writes on its threads cannot shift
/// the layer times the test sets.
class clocked_tier : public host_tier_wrapper {
public:
    explicit clocked_tier(double bytes_per_second, std::string_view suffix = "-probe")
        : rate_(bytes_per_second), suffix_(suffix) {}

    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        auto done = inner.write(key, bytes);
        take_time(key, bytes.size());
        return done;
    }
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        auto done = inner.read(key, bytes);
        take_time(key, bytes.size());
        return done;
    }

private:
    void take_time(std::string_view key, std::size_t nbytes) const noexcept {
        if (key.ends_with(suffix_)) manual_clock::advance(static_cast<double>(nbytes) / rate_);
    }
    double rate_;
    std::string_view suffix_;
};
static_assert(storage_tier<clocked_tier>);

}  // namespace spillway::test
