// SPDX-License-Identifier: Apache-2.0
// bench/support/op_log_tier.hpp: a storage-tier decorator for benchmarks that logs every
// read and write (direction, start, end, bytes) so that a slow call can be taken apart
// operation by operation.
//
// Guarantees:
// - write() and read() run the inner operation to completion before they return (the
//   completion they return is already ready). That is what a virtual tier's worker does
//   with a child's completion anyway, so as a child of a virtual tier the decorator changes
//   no timing; anywhere else it makes the tier synchronous.
// - take_log() hands over the operations finished since the last take (thread-safe).
// - summarize_ops() condenses a log: per direction the count, the duration percentiles, the
//   median of the operations' rates, and the idle gaps between one operation's end and the next
//   one's start.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <spillway/tier/storage_tier.hpp>

namespace spillway::bench {

/// One finished operation of an op_log_tier.
struct logged_op {
    bool write = false;                                 ///< write (true) or read
    std::chrono::steady_clock::time_point start, end;   ///< issue and completion
    std::size_t bytes = 0;                              ///< size of the transfer
    std::string key;                                    ///< the tier key
    bool ok = true;                                     ///< false when the operation failed
};

/// A storage_tier that runs each operation of `Inner` synchronously and logs it.
template <spillway::storage_tier Inner>
class op_log_tier {
public:
    /// The inner tier's properties.
    static constexpr spillway::tier_properties properties = Inner::properties;

    /// Builds the inner tier in place from `args`.
    template <class... A>
    explicit op_log_tier(std::in_place_t, A&&... args) : inner_(std::forward<A>(args)...) {}

    /// The decorated tier.
    Inner& inner() noexcept { return inner_; }

    /// Writes through the inner tier and waits; the returned completion is ready.
    spillway::io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        return logged(true, key, bytes.size(), [&] { return inner_.write(key, bytes); });
    }
    /// Reads through the inner tier and waits; the returned completion is ready.
    spillway::io_completion read(std::string_view key, std::span<std::byte> bytes) {
        return logged(false, key, bytes.size(), [&] { return inner_.read(key, bytes); });
    }
    /// As the inner tier's.
    bool erase(std::string_view key) { return inner_.erase(key); }
    /// As the inner tier's.
    [[nodiscard]] bool contains(std::string_view key) const { return inner_.contains(key); }
    /// As the inner tier's.
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const { return inner_.size_of(key); }
    /// As the inner tier's.
    [[nodiscard]] std::size_t capacity() const { return inner_.capacity(); }
    /// As the inner tier's.
    [[nodiscard]] std::size_t used() const { return inner_.used(); }
    /// As the inner tier's.
    [[nodiscard]] spillway::tier_stats stats() const { return inner_.stats(); }
    /// As the inner tier's.
    [[nodiscard]] std::string name() const { return std::string(inner_.name()); }

    /// The operations finished since the last call, in completion order.
    std::vector<logged_op> take_log() {
        std::lock_guard lock(mutex_);
        return std::exchange(log_, {});
    }

private:
    template <class Issue>
    spillway::io_completion logged(bool write, std::string_view key, std::size_t bytes, Issue issue) {
        logged_op op{write, std::chrono::steady_clock::now(), {}, bytes, std::string(key), true};
        std::exception_ptr error;
        std::size_t n = 0;
        try {
            n = issue().wait();
        } catch (...) {
            error = std::current_exception();
        }
        op.end = std::chrono::steady_clock::now();
        op.ok = !error;
        {
            std::lock_guard lock(mutex_);
            log_.push_back(std::move(op));
        }
        return error ? spillway::io_completion::failed(error) : spillway::io_completion::completed(n);
    }

    Inner inner_;
    std::mutex mutex_;
    std::vector<logged_op> log_;
};

/// One line per direction: count, duration percentiles, the median operation rate, and
/// the idle gaps between consecutive operations of that direction.
inline std::string summarize_ops(const std::vector<logged_op>& ops) {
    using secs = std::chrono::duration<double>;
    std::string out;
    for (bool write : {false, true}) {
        std::vector<const logged_op*> v;
        for (const auto& op : ops)
            if (op.write == write) v.push_back(&op);
        if (v.empty()) continue;
        std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->start < b->start; });
        std::vector<double> dur, rate, gap;
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < v.size(); ++i) {
            dur.push_back(secs(v[i]->end - v[i]->start).count());
            if (dur.back() > 0) rate.push_back(static_cast<double>(v[i]->bytes) / dur.back());
            bytes += v[i]->bytes;
            if (i > 0) gap.push_back(std::max(0.0, secs(v[i]->start - v[i - 1]->end).count()));
        }
        auto pct = [](std::vector<double> x, double q) {
            if (x.empty()) return 0.0;
            std::sort(x.begin(), x.end());
            return x[static_cast<std::size_t>(q * static_cast<double>(x.size() - 1) + 0.5)];
        };
        double busy = 0, idle = 0;
        for (double d : dur) busy += d;
        for (double g : gap) idle += g;
        char line[320];
        std::snprintf(line, sizeof line,
                      "%s %zu ops, ms p10 %.1f p50 %.1f p90 %.1f max %.1f (median op %.0f MB/s, all %.0f MB/s busy), "
                      "gaps ms p50 %.1f p90 %.1f sum %.0f; ",
                      write ? "write" : "read", v.size(), 1e3 * pct(dur, 0.1), 1e3 * pct(dur, 0.5), 1e3 * pct(dur, 0.9),
                      1e3 * pct(dur, 1.0), pct(rate, 0.5) / 1e6,
                      busy > 0 ? static_cast<double>(bytes) / busy / 1e6 : 0.0, 1e3 * pct(gap, 0.5), 1e3 * pct(gap, 0.9),
                      1e3 * idle);
        out += line;
    }
    return out;
}

/// Writes a log as CSV (direction, start and end in seconds from `origin`, bytes, ok, key).
inline void save_ops_csv(const std::filesystem::path& file, const std::vector<logged_op>& ops,
                         std::chrono::steady_clock::time_point origin) {
    std::ofstream f(file);
    f << "dir,start_s,end_s,bytes,ok,key\n";
    for (const auto& op : ops)
        f << (op.write ? "write" : "read") << ',' << std::chrono::duration<double>(op.start - origin).count() << ','
          << std::chrono::duration<double>(op.end - origin).count() << ',' << op.bytes << ',' << (op.ok ? 1 : 0) << ','
          << op.key << '\n';
}

}  // namespace spillway::bench
