// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/throttled_tier.hpp: a decorator that caps the bandwidth of any storage tier
/// with a token bucket. Used to emulate slower storage (a parallel file system behind a
/// node-local NVMe drive) and for quality of service between tenants of one device.
///
/// Guarantees:
/// - write() and read() never block on the throttle: they issue the inner operation at once
///   and return a completion that becomes ready no earlier than (a) the inner operation
///   finished and (b) the token bucket released the operation's bytes.
/// - The bucket gains `bytes_per_second` tokens per second and holds at most `burst_bytes`
///   of them (or, while an operation larger than the burst waits at the head, that
///   operation's size). Operations of one bucket are released in the order they were issued
///   (FIFO); an operation of n bytes is released when the bucket holds n tokens and takes
///   them. So after a quiet period up to burst_bytes pass at once, a single operation of n
///   bytes takes (n - burst_bytes) / rate, and the long-run rate never exceeds the limit.
/// - throttle_scope::separate gives reads and writes a bucket each; throttle_scope::joint
///   makes them share one bucket (one device, one budget).
/// - set_rate() is thread-safe and takes effect at once, also for operations already queued
///   (tokens earned so far are kept, later tokens accrue at the new rate).
/// - stats() measure the decorated tier as its callers see it (issue to release), so the
///   reported bandwidth is the throttled one; errors of the inner tier pass through unchanged
///   (a failed operation still spends its tokens).
/// - Destruction releases every queued operation at once (the throttle no longer holds
///   them) and waits for all inner operations before the inner tier is destroyed.
///
/// Release protocol (per throttled tier one timer thread, and one finisher thread per bucket):
///  1. write()/read() issue the inner operation, then append {bytes, inner completion,
///     outer completion source} to their bucket's queue and wake the timer thread.
///  2. The timer thread refills each bucket for the time elapsed, moves every head entry the
///     bucket can pay for to that bucket's released queue (waking its finisher), and sleeps
///     until the earliest time a head becomes payable (or until set_rate() or a new entry
///     wakes it). It never waits for an inner operation, so a slow one delays no payment.
///  3. Each bucket's finisher takes its released entries in order, waits for the inner
///     completion outside the lock and completes the outer one with the inner result (bytes
///     or the inner exception). A slow inner read so delays later reads only, never writes
///     (in separate scope).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "spillway/detail/thread_name.hpp"
#include "spillway/error.hpp"
#include "spillway/tier/host_tier.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway {

/// One token bucket's settings.
struct bandwidth_limit {
    /// Sustained rate in bytes per second; infinity (the default) means no limit.
    double bytes_per_second = std::numeric_limits<double>::infinity();
    /// Most tokens the bucket holds: bytes that may pass at once after a quiet period.
    std::size_t burst_bytes = std::size_t{1} << 20;

    /// True when the rate is infinite: the bucket never holds an operation back.
    [[nodiscard]] bool unlimited() const noexcept { return std::isinf(bytes_per_second); }
};

/// Whether reads and writes draw from separate buckets or share one.
enum class throttle_scope {
    separate,  ///< a read bucket and a write bucket, each with its own limit
    joint,     ///< one bucket for both directions: one device, one budget
};

/// A throttle's configuration. In joint scope `read` and `write` must be equal (use joint()).
struct throttle_config {
    throttle_scope scope = throttle_scope::separate;  ///< fixed for the life of a throttle
    bandwidth_limit read{};   ///< the read bucket (in joint scope: the shared one)
    bandwidth_limit write{};  ///< the write bucket (in joint scope: equal to `read`)

    /// Reads and writes share one bucket with the given limit.
    static throttle_config joint(bandwidth_limit both) { return {throttle_scope::joint, both, both}; }
    /// Reads and writes are limited independently.
    static throttle_config separate(bandwidth_limit read_limit, bandwidth_limit write_limit) {
        return {throttle_scope::separate, read_limit, write_limit};
    }
};

namespace detail {
inline void validate_limit(const bandwidth_limit& limit, std::string_view which) {
    expect_argument(limit.bytes_per_second > 0 && !std::isnan(limit.bytes_per_second),
                    std::string("throttled_tier: ") + std::string(which) +
                        " rate must be a positive number of bytes per second (infinity for no limit), got " +
                        std::to_string(limit.bytes_per_second));
    expect_argument(limit.burst_bytes > 0, std::string("throttled_tier: ") + std::string(which) +
                                               " burst_bytes must be positive, got 0");
}
inline void validate_throttle(const throttle_config& c) {
    validate_limit(c.read, "read");
    validate_limit(c.write, "write");
    if (c.scope == throttle_scope::joint) {
        expect_argument(c.read.bytes_per_second == c.write.bytes_per_second && c.read.burst_bytes == c.write.burst_bytes,
                        "throttled_tier: a joint throttle has one bucket, but the read and write limits differ "
                        "(read " + std::to_string(c.read.bytes_per_second) + " bytes/s, burst " +
                            std::to_string(c.read.burst_bytes) + "; write " + std::to_string(c.write.bytes_per_second) +
                            " bytes/s, burst " + std::to_string(c.write.burst_bytes) +
                            "; use throttle_config::joint(limit))");
    }
}
}  // namespace detail

/// A storage_tier decorator that releases the completions of `Inner` no faster than a token
/// bucket allows (the guarantees and the release protocol are in the file comment).
///
/// Owns its inner tier (built in place) and one timer thread. Thread-safe as far as the
/// inner tier is: operations on different keys may be issued from several threads; set_rate()
/// may be called from any thread at any time. Not copyable, not movable.
/// @tparam Inner any storage_tier; its properties pass through unchanged
template <storage_tier Inner>
class throttled_tier {
public:
    /// The inner tier's properties: throttling changes timing, not abilities.
    static constexpr tier_properties properties = Inner::properties;
    /// The decorated tier's type.
    using inner_type = Inner;

    /// Builds the inner tier in place from `args` and throttles it with `config`; starts the
    /// timer thread.
    /// @throws std::invalid_argument naming the direction and the value for a rate that is not
    ///         a positive number, a zero burst, or a joint config whose read and write limits
    ///         differ
    template <class... Args>
    throttled_tier(throttle_config config, std::in_place_t, Args&&... args)
        : inner_(std::forward<Args>(args)...), scope_(config.scope) {
        detail::validate_throttle(config);
        auto now = clock::now();
        buckets_[0].reset(config.read, now);
        buckets_[1].reset(config.write, now);
        name_ = std::string("throttled(") + std::string(inner_.name()) + ")";
        for (int i = 0; i < 2; ++i) {
            finishers_[i] = std::thread([this, i] { finish_released(i); });
            detail::name_thread(finishers_[i], "spw-throttle-done");
        }
        timer_ = std::thread([this] { run(); });
        detail::name_thread(timer_, "spw-throttle");
    }
    /// A throttle over a default-constructed inner tier.
    explicit throttled_tier(throttle_config config = {})
        requires std::default_initializable<Inner>
        : throttled_tier(config, std::in_place) {}

    /// Owns a thread and a tier: not copyable.
    throttled_tier(const throttled_tier&) = delete;
    /// Owns a thread and a tier: not copyable.
    throttled_tier& operator=(const throttled_tier&) = delete;

    /// Releases every queued operation at once, waits for all inner operations, stops the
    /// timer thread, then destroys the inner tier.
    ~throttled_tier() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        timer_.join();  // every queued entry released (stopping_)
        {
            std::lock_guard lock(mutex_);
            timer_done_ = true;
        }
        finish_cv_.notify_all();
        for (auto& f : finishers_) f.join();  // and finished
    }

    /// Issues the inner write at once; the returned completion becomes ready when the inner
    /// write finished and the bucket paid for bytes.size() bytes. The caller keeps `bytes`
    /// alive until then (storage_tier contract).
    /// Errors through the completion: the inner tier's, unchanged (the bytes are still paid).
    /// @throws std::invalid_argument at once for a bad key, naming this tier; whatever the
    ///         inner write() throws at once
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        check_key(key);
        return issue(io_direction::write, bytes.size(), [&] { return inner_.write(key, bytes); });
    }
    /// Issues the inner read at once; the returned completion becomes ready when the inner
    /// read finished and the bucket paid for bytes.size() bytes.
    /// Errors through the completion: the inner tier's, unchanged (the bytes are still paid).
    /// @throws std::invalid_argument at once for a bad key, naming this tier; whatever the
    ///         inner read() throws at once
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        check_key(key);
        return issue(io_direction::read, bytes.size(), [&] { return inner_.read(key, bytes); });
    }

    /// Forwards to the inner tier, unthrottled (metadata costs no bandwidth).
    /// @throws std::invalid_argument naming this tier for a bad key; what the inner erase throws
    bool erase(std::string_view key) {
        check_key(key);
        return inner_.erase(key);
    }
    /// Forwards to the inner tier.
    [[nodiscard]] bool contains(std::string_view key) const { return inner_.contains(key); }
    /// Forwards to the inner tier: the blob's size in bytes, or std::nullopt.
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const { return inner_.size_of(key); }
    /// The inner tier's capacity, in bytes.
    [[nodiscard]] std::size_t capacity() const { return inner_.capacity(); }
    /// The inner tier's bytes stored.
    [[nodiscard]] std::size_t used() const { return inner_.used(); }
    /// Counters as the decorator's callers see them: busy time runs from issue to release.
    [[nodiscard]] tier_stats stats() const { return stats_.snapshot(); }
    /// `"throttled(<inner name>)"`.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// The decorated tier, for its own statistics and settings. Operations issued on it
    /// directly bypass the throttle.
    [[nodiscard]] Inner& inner() noexcept { return inner_; }
    /// @copydoc inner()
    [[nodiscard]] const Inner& inner() const noexcept { return inner_; }

    /// The current configuration.
    [[nodiscard]] throttle_config config() const {
        std::lock_guard lock(mutex_);
        return {scope_, buckets_[0].limit, buckets_[1].limit};
    }

    /// Replaces both limits. The scope is fixed at construction: a different scope throws
    /// std::invalid_argument, as does a non-positive rate.
    void set_rate(throttle_config config) {
        detail::validate_throttle(config);
        expect_argument(config.scope == scope_, "throttled_tier::set_rate: the throttle scope is fixed at construction");
        {
            std::lock_guard lock(mutex_);
            auto now = clock::now();
            buckets_[0].change(config.read, now);
            buckets_[1].change(config.write, now);
        }
        cv_.notify_all();
    }
    /// Sets the same limit for reads and writes (in joint scope: the shared bucket's limit).
    void set_rate(bandwidth_limit limit) { set_rate(throttle_config{scope_, limit, limit}); }
    /// Sets the limit of one direction; only in separate scope.
    void set_rate(io_direction dir, bandwidth_limit limit) {
        expect_argument(scope_ == throttle_scope::separate,
                        "throttled_tier::set_rate(direction, limit) needs a separate throttle; this one is joint");
        auto c = config();
        (dir == io_direction::read ? c.read : c.write) = limit;
        set_rate(c);
    }

private:
    using clock = std::chrono::steady_clock;

    // validate_key() with the tier's name in front of its message: "<name>: key '...' ...",
    // as the base tiers say it (the name is added only when the key is refused).
    void check_key(std::string_view key) const {
        try {
            validate_key(key);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(name_ + ": " + e.what());
        }
    }

    struct entry {
        io_direction dir;
        std::size_t nbytes;
        io_completion inner;
        completion_source outer;
    };

    struct bucket {
        bandwidth_limit limit;
        double tokens = 0;
        clock::time_point last{};
        std::deque<entry> queue;
        std::deque<entry> released;  // paid for, waiting for their inner completion (step 3)

        // The bucket holds up to burst_bytes, or the head operation's size when that is
        // larger, so that a large operation waits exactly for its own bytes.
        [[nodiscard]] double cap() const noexcept {
            std::size_t c = limit.burst_bytes;
            if (!queue.empty()) c = std::max(c, queue.front().nbytes);
            return static_cast<double>(c);
        }
        void reset(const bandwidth_limit& l, clock::time_point now) {
            limit = l;
            tokens = static_cast<double>(l.burst_bytes);
            last = now;
        }
        void refill(clock::time_point now) {
            if (limit.unlimited()) {
                tokens = cap();
            } else {
                double dt = std::chrono::duration<double>(now - last).count();
                tokens = std::min(cap(), tokens + dt * limit.bytes_per_second);
            }
            last = now;
        }
        void change(const bandwidth_limit& l, clock::time_point now) {
            refill(now);  // tokens earned at the old rate are kept
            limit = l;
            tokens = std::min(tokens, cap());
        }
    };

    template <class Issue>
    io_completion issue(io_direction dir, std::size_t nbytes, Issue&& issue_inner) {
        stats_.begin(dir);
        io_completion inner;
        try {
            inner = issue_inner();
        } catch (...) {
            stats_.end(dir, nbytes, false);
            throw;
        }
        completion_source source;
        io_completion outer = source.handle();
        {
            std::lock_guard lock(mutex_);
            auto& b = bucket_of(dir);
            b.refill(clock::now());  // settle the quiet time under the current cap first
            b.queue.push_back(entry{dir, nbytes, std::move(inner), std::move(source)});
        }
        cv_.notify_all();
        return outer;
    }

    bucket& bucket_of(io_direction dir) {
        return scope_ == throttle_scope::joint || dir == io_direction::read ? buckets_[0] : buckets_[1];
    }

    void run() {
        std::unique_lock lock(mutex_);
        for (;;) {
            auto now = clock::now();
            auto wake = clock::time_point::max();
            bool pending = false, released = false;
            for (auto& b : buckets_) {
                b.refill(now);
                while (!b.queue.empty() &&
                       (stopping_ || b.tokens >= static_cast<double>(b.queue.front().nbytes))) {
                    b.tokens = std::max(0.0, b.tokens - static_cast<double>(b.queue.front().nbytes));
                    b.released.push_back(std::move(b.queue.front()));
                    b.queue.pop_front();
                    released = true;
                }
                if (!b.queue.empty()) {
                    pending = true;
                    double missing = static_cast<double>(b.queue.front().nbytes) - b.tokens;
                    // Capped at an hour so that a tiny rate cannot overflow the clock.
                    auto dt = std::chrono::duration<double>(std::min(missing / b.limit.bytes_per_second, 3600.0));
                    auto at = now + std::chrono::ceil<clock::duration>(dt);
                    wake = std::min(wake, at);
                }
            }
            if (released) finish_cv_.notify_all();
            if (stopping_ && !pending) return;
            if (wake == clock::time_point::max()) cv_.wait(lock);
            else cv_.wait_until(lock, wake);
        }
    }

    // Step 3 for bucket i: completes its released entries in order, until the timer thread
    // has ended and nothing is left.
    void finish_released(int i) {
        auto& b = buckets_[i];
        std::unique_lock lock(mutex_);
        for (;;) {
            finish_cv_.wait(lock, [&] { return !b.released.empty() || timer_done_; });
            if (b.released.empty()) return;  // (timer_done_: it released everything)
            entry e = std::move(b.released.front());
            b.released.pop_front();
            lock.unlock();
            finish(std::move(e));
            lock.lock();
        }
    }

    // Completes one released entry and drops every reference it holds at once, so that the
    // caller, who is woken by the completion, normally holds the last reference to the
    // operation's state and error (and frees them on its own thread).
    void finish(entry&& released) noexcept {
        entry e = std::move(released);
        std::exception_ptr error;
        std::size_t n = 0;
        try {
            n = e.inner.wait();
        } catch (...) {
            error = std::current_exception();
        }
        stats_.end(e.dir, error ? e.nbytes : n, !error);
        completion_source outer = std::move(e.outer);
        if (error) outer.fail(std::move(error));
        else outer.succeed(n);
    }

    Inner inner_;
    throttle_scope scope_;
    std::string name_;
    stats_recorder stats_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    bucket buckets_[2];  // [0] reads (or both, joint), [1] writes
    bool stopping_ = false;
    bool timer_done_ = false;             // the timer thread has released everything and ended
    std::condition_variable finish_cv_;   // wakes the finishers
    std::thread finishers_[2];            // step 3, one per bucket
    std::thread timer_;  // last: started after every other member exists
};

static_assert(storage_tier<throttled_tier<host_tier>>);
}  // namespace spillway
