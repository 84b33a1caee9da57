// SPDX-License-Identifier: Apache-2.0
// spillway/io/io_engine.hpp: the I/O engine concept and `io_engine`, the engine that picks
// io_uring or POSIX at run time.
//
// The contract every engine keeps (uring_engine, posix_engine, io_engine):
// 1. read(fd, buf, offset, label) and write(fd, buf, offset, label) start a transfer of
//    buf.size() bytes and return an io_completion at once; wait() returns buf.size() or
//    rethrows. The caller keeps `buf` alive (and, for writes, unchanged) until completion,
//    and keeps `fd` open until then. `label` (usually the path) is copied for messages.
// 2. A request is split into config().block_size pieces with up to queue_depth in flight.
//    For O_DIRECT fds the caller passes aligned buffers, offsets and sizes; pieces keep the
//    alignment because block_size is a multiple of 4096.
// 3. Short transfers and EAGAIN/EINTR are retried inside; end of file during a read is
//    ENODATA. A failure is one std::system_error naming the call, the label, the size, the
//    offset (and the failing piece) and the errno.
// 4. submit(request, callback) is the callback form the tiers build on: the callback runs
//    exactly once, on an engine thread, and must neither throw nor destroy the engine.
// 5. Thread-safe: any number of threads may submit at once.
// 6. Destruction waits for every request in flight.
// 7. backend() / backend_name() say which engine does the work; io_engine in `automatic`
//    mode also says why io_uring was not used (fallback_reason()).
#pragma once

#include <concepts>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "spillway/io/completion.hpp"
#include "spillway/io/detail/engine_common.hpp"
#include "spillway/io/posix_engine.hpp"
#include "spillway/io/uring_engine.hpp"

namespace spillway {

/// What a file tier needs from an engine.
template <class E>
concept io_engine_model = std::constructible_from<E, io_engine_config> &&
    requires(E& e, const E& ce, int fd, std::span<std::byte> out, std::span<const std::byte> in,
             std::uint64_t offset, std::string_view label, const io_request& req, io_callback cb) {
        { e.read(fd, out, offset, label) } -> std::same_as<io_completion>;
        { e.write(fd, in, offset, label) } -> std::same_as<io_completion>;
        e.submit(req, std::move(cb));
        { ce.backend() } -> std::same_as<io_backend>;
        { ce.backend_name() } -> std::convertible_to<std::string_view>;
        { ce.config() } -> std::convertible_to<const io_engine_config&>;
        { ce.counters() } -> std::same_as<io_engine_counters>;
    };

static_assert(io_engine_model<posix_engine>);
#if SPILLWAY_HAS_LIBURING
static_assert(io_engine_model<uring_engine>);
#endif

/// The engine chosen at run time: io_uring or POSIX.
/// - io_backend::automatic: io_uring when uring_probe() passes, else POSIX; the reason is
///   kept in fallback_reason().
/// - io_backend::io_uring: io_uring or a std::system_error(ENOSYS) carrying the probe's
///   reason.
/// - io_backend::posix: POSIX.
class io_engine {
public:
    /// Throws std::invalid_argument for a bad config.
    explicit io_engine(io_engine_config config = {}, io_backend backend = io_backend::automatic) {
        config.validate();
        const auto& probe = uring_probe();
        if (backend == io_backend::io_uring && !probe.available)
            throw std::system_error(ENOSYS, std::generic_category(),
                                    "io_engine: io_uring was asked for but is unavailable: " + probe.reason);
#if SPILLWAY_HAS_LIBURING
        if (backend != io_backend::posix && probe.available) {
            try {
                uring_ = std::make_unique<uring_engine>(config);
                return;
            } catch (const std::system_error& e) {
                // The probe passed but this ring could not be set up (e.g. a queue depth
                // beyond RLIMIT_MEMLOCK on old kernels): automatic mode still falls back.
                if (backend == io_backend::io_uring) throw;
                fallback_reason_ = e.what();
            }
        }
#endif
        if (backend == io_backend::automatic && fallback_reason_.empty()) fallback_reason_ = probe.reason;
        posix_ = std::make_unique<posix_engine>(std::move(config));
    }

    /// The engine doing the work: io_backend::io_uring or io_backend::posix (never automatic).
    [[nodiscard]] io_backend backend() const noexcept {
        return posix_ ? io_backend::posix : io_backend::io_uring;
    }
    /// "io_uring" or "posix".
    [[nodiscard]] std::string_view backend_name() const noexcept { return spillway::backend_name(backend()); }
    /// Why automatic mode fell back to POSIX; empty otherwise.
    [[nodiscard]] const std::string& fallback_reason() const noexcept { return fallback_reason_; }

    /// The validated settings the engine runs with.
    [[nodiscard]] const io_engine_config& config() const noexcept {
#if SPILLWAY_HAS_LIBURING
        if (uring_) return uring_->config();
#endif
        return posix_->config();
    }
    /// A snapshot of the chosen engine's counters.
    [[nodiscard]] io_engine_counters counters() const noexcept {
#if SPILLWAY_HAS_LIBURING
        if (uring_) return uring_->counters();
#endif
        return posix_->counters();
    }
    /// Starts `req`; `callback` runs once when it finished (contract point 4 above).
    void submit(const io_request& req, io_callback callback) {
#if SPILLWAY_HAS_LIBURING
        if (uring_) return uring_->submit(req, std::move(callback));
#endif
        posix_->submit(req, std::move(callback));
    }
    /// Reads buf.size() bytes of `fd` at `offset` into `buf`. Keep `buf` alive until done.
    io_completion read(int fd, std::span<std::byte> buf, std::uint64_t offset, std::string_view label = {}) {
#if SPILLWAY_HAS_LIBURING
        if (uring_) return uring_->read(fd, buf, offset, label);
#endif
        return posix_->read(fd, buf, offset, label);
    }
    /// Writes `buf` to `fd` at `offset`. Keep `buf` alive and unchanged until done.
    io_completion write(int fd, std::span<const std::byte> buf, std::uint64_t offset, std::string_view label = {}) {
#if SPILLWAY_HAS_LIBURING
        if (uring_) return uring_->write(fd, buf, offset, label);
#endif
        return posix_->write(fd, buf, offset, label);
    }

private:
#if SPILLWAY_HAS_LIBURING
    std::unique_ptr<uring_engine> uring_;
#endif
    std::unique_ptr<posix_engine> posix_;
    std::string fallback_reason_;
};

static_assert(io_engine_model<io_engine>);

}  // namespace spillway
