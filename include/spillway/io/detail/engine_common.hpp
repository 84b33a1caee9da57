// SPDX-License-Identifier: Apache-2.0
// spillway/io/detail/engine_common.hpp: what the I/O engines share: the configuration, the
// backend names, the request record, the counters, the fault hook, and the bookkeeping of
// one request split into block-size pieces.
//
// Guarantees:
// - io_engine_config::validate() throws std::invalid_argument naming the bad field and its
//   value; every engine calls it in its constructor, before it starts anything.
// - Inside this folder results follow liburing's convention (bytes >= 0, or -errno); they
//   become a std::system_error exactly once, in make_io_error(), whose message names the
//   call, the label (a path), the request's size and offset, the piece that failed and the
//   errno text.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include "spillway/error.hpp"
#include "spillway/io/completion.hpp"

namespace spillway {

/// Which engine performs file I/O. `automatic` picks io_uring when the run-time probe passes
/// (liburing compiled in, io_uring_setup allowed, READ and WRITE opcodes present), else POSIX.
enum class io_backend { automatic, io_uring, posix };

/// "automatic", "io_uring" or "posix".
constexpr std::string_view backend_name(io_backend b) noexcept {
    switch (b) {
        case io_backend::automatic: return "automatic";
        case io_backend::io_uring: return "io_uring";
        case io_backend::posix: return "posix";
    }
    return "?";
}

/// io_uring resource registration (ignored by the POSIX engine).
/// - files: each request's fd is placed in the ring's sparse file table for the request's
///   life, so its pieces skip the per-piece file lookup.
/// - buffers: buffers passed to register_buffers() are read and written with the FIXED
///   opcodes (no per-piece page pinning) when a piece lies inside one of them.
enum class io_registration { none, files, buffers, files_and_buffers };

/// True when `r` registers files.
constexpr bool registers_files(io_registration r) noexcept {
    return r == io_registration::files || r == io_registration::files_and_buffers;
}
/// True when `r` registers buffers.
constexpr bool registers_buffers(io_registration r) noexcept {
    return r == io_registration::buffers || r == io_registration::files_and_buffers;
}

/// The direction of one engine request.
enum class io_op { read, write };

/// "read" or "write".
constexpr std::string_view op_name(io_op op) noexcept { return op == io_op::read ? "read" : "write"; }

/// A fault hook for tests: called with every raw result of a piece (bytes transferred or
/// -errno) and the bytes that piece asked for; returns the result the engine acts on. A
/// hook can turn a full transfer into a short one (return fewer bytes) or into -EAGAIN; the
/// engine must then retry, exactly as for a real short transfer. Empty: no hook. It runs
/// on the engine's threads and must not throw (an exception there ends the process).
/// (Held through a shared pointer: copying a config shares one hook.)
class io_result_filter {
public:
    /// The hook's signature.
    using function = std::function<long(io_op op, long result, std::size_t requested)>;
    /// No hook.
    io_result_filter() = default;
    /// Wraps `f`.
    template <class F>
        requires std::is_invocable_r_v<long, F&, io_op, long, std::size_t>
    io_result_filter(F f) : fn_(std::make_shared<const function>(std::move(f))) {}  // NOLINT: implicit by design
    /// True when a hook is set.
    explicit operator bool() const noexcept { return fn_ != nullptr; }
    /// Calls the hook (only when one is set).
    long operator()(io_op op, long result, std::size_t requested) const { return (*fn_)(op, result, requested); }

private:
    std::shared_ptr<const function> fn_;
};

/// Engine settings, validated eagerly by every engine.
struct io_engine_config {
    /// Pieces kept in flight per engine (io_uring: ring entries; POSIX: worker threads,
    /// capped by max_threads). 1..4096.
    unsigned queue_depth = 32;
    /// A request larger than this is split into pieces of this size. A multiple of 4096,
    /// 4 KiB..1 GiB (so pieces of O_DIRECT requests stay aligned).
    std::size_t block_size = std::size_t{1} << 20;
    /// POSIX engine: at most this many worker threads (0: min(queue_depth, 16)).
    unsigned max_threads = 0;
    /// io_uring registration; see io_registration.
    io_registration registration = io_registration::none;
    /// Test hook; see io_result_filter.
    io_result_filter result_filter;

    /// Throws std::invalid_argument naming the first field out of range and its value.
    void validate() const {
        expect_argument(queue_depth >= 1 && queue_depth <= 4096,
                        "io_engine_config: queue_depth " + std::to_string(queue_depth) + " is outside 1..4096");
        expect_argument(block_size >= 4096 && block_size <= (std::size_t{1} << 30) && block_size % 4096 == 0,
                        "io_engine_config: block_size " + std::to_string(block_size) +
                            " must be a multiple of 4096 between 4 KiB and 1 GiB");
        expect_argument(max_threads <= 1024,
                        "io_engine_config: max_threads " + std::to_string(max_threads) + " is above 1024");
    }
    /// Worker threads of the POSIX engine.
    [[nodiscard]] unsigned posix_threads() const noexcept {
        unsigned cap = max_threads == 0 ? 16u : max_threads;
        return queue_depth < cap ? queue_depth : cap;
    }
};

/// What an engine did, for tests and reports. Monotonic.
struct io_engine_counters {
    std::uint64_t requests = 0;        ///< requests completed (success or failure)
    std::uint64_t pieces = 0;          ///< pieces submitted (first submissions, not retries)
    std::uint64_t short_retries = 0;   ///< resubmissions after a short transfer
    std::uint64_t again_retries = 0;   ///< resubmissions after EAGAIN / EINTR
    std::uint64_t failures = 0;        ///< requests that ended in an error
    std::uint64_t max_in_flight = 0;   ///< the most pieces in flight at once
};

/// One engine request: `nbytes` at `data` from or to `fd` at `offset`. `label` (usually the
/// path) names the file in error messages; it is copied. The caller keeps `data` alive and
/// (for writes) unchanged until the request completes.
struct io_request {
    io_op op = io_op::read;      ///< read or write
    int fd = -1;                 ///< the file descriptor
    std::byte* data = nullptr;   ///< the caller's buffer
    std::size_t nbytes = 0;      ///< bytes to transfer
    std::uint64_t offset = 0;    ///< file offset of the first byte
    std::string_view label;      ///< the file's name in messages (copied)
};

/// Called once per request with the bytes transferred (the full size on success) and the
/// error (null on success). Runs on an engine thread; it must not destroy the engine.
using io_callback = std::function<void(std::size_t nbytes, std::exception_ptr error)>;

namespace detail {

/// The error of a failed request, built once from -errno (or a positive errno). Never
/// throws (it runs on the engines' threads): if the message cannot be built, the error is
/// the std::bad_alloc that stopped it.
inline std::exception_ptr make_io_error(int err, std::string_view call, io_op op, std::string_view label,
                                        std::size_t nbytes, std::uint64_t offset, std::size_t piece_bytes,
                                        std::uint64_t piece_offset, std::string_view extra = {}) noexcept {
    if (err < 0) err = -err;
    try {
        std::string what(label.empty() ? std::string_view("<fd>") : label);
        what += ": ";
        what += op_name(op);
        what += " of " + bytes_str(nbytes) + " at offset " + std::to_string(offset);
        if (piece_bytes != nbytes || piece_offset != offset)
            what += " (piece of " + bytes_str(piece_bytes) + " at offset " + std::to_string(piece_offset) + ")";
        what += ": ";
        what += call;
        what += " failed";
        if (!extra.empty()) {
            what += " (";
            what += extra;
            what += ")";
        }
        return std::make_exception_ptr(std::system_error(err, std::generic_category(), what));
    } catch (...) {
        return std::current_exception();
    }
}

/// One request split into pieces: the shared bookkeeping of both engines. Guarded by the
/// engine's mutex except where noted.
struct request_state {
    io_op op = io_op::read;
    int fd = -1;
    std::byte* data = nullptr;
    std::size_t nbytes = 0;
    std::uint64_t offset = 0;
    std::string label;
    io_callback callback;
    std::size_t next = 0;           // first byte not yet handed to a piece
    std::size_t pieces_open = 0;    // pieces handed out and not finished
    std::exception_ptr error;       // the first error; later pieces are not started
    int fixed_file = -1;            // io_uring: slot in the registered file table, or -1
    std::exception_ptr outcome;     // the error handed to the callback, set by retire()

    /// True when every byte was handed out (or the request failed) and no piece is open.
    [[nodiscard]] bool finished() const noexcept {
        return pieces_open == 0 && (next >= nbytes || error != nullptr);
    }
    /// True while there is a piece left to hand out.
    [[nodiscard]] bool has_piece() const noexcept { return error == nullptr && next < nbytes; }
    /// Called under the engine's lock once finished(): no piece is handed out again, and the
    /// error moves to `outcome`, which only the finishing thread reads (in deliver()).
    void retire() noexcept {
        next = nbytes;
        outcome = std::move(error);
    }
};

/// Atomic counters behind io_engine_counters.
struct engine_counters {
    std::atomic<std::uint64_t> requests{0}, pieces{0}, short_retries{0}, again_retries{0}, failures{0},
        max_in_flight{0};
    void note_in_flight(std::uint64_t n) noexcept {
        auto cur = max_in_flight.load(std::memory_order_relaxed);
        while (n > cur && !max_in_flight.compare_exchange_weak(cur, n, std::memory_order_relaxed)) {
        }
    }
    [[nodiscard]] io_engine_counters snapshot() const noexcept {
        return {requests.load(), pieces.load(), short_retries.load(), again_retries.load(), failures.load(),
                max_in_flight.load()};
    }
};

/// Rejects a request whose offset + size overflows off_t.
inline void check_request(io_op op, std::size_t nbytes, std::uint64_t offset, std::string_view label) {
    constexpr std::uint64_t max_off = static_cast<std::uint64_t>(INT64_MAX);
    if (offset > max_off || nbytes > max_off - offset)
        throw std::invalid_argument(std::string(label) + ": " + std::string(op_name(op)) + " of " +
                                    bytes_str(nbytes) + " at offset " + std::to_string(offset) +
                                    " runs past the largest file offset");
}

/// The start every engine shares:
///  1. reject a request whose offset range overflows (std::invalid_argument);
///  2. finish an empty request at once, on the calling thread, and return null;
///  3. otherwise return the request's bookkeeping, owning the callback.
inline std::shared_ptr<request_state> begin_request(const io_request& req, io_callback& callback,
                                                    engine_counters& counters) {
    check_request(req.op, req.nbytes, req.offset, req.label);
    if (req.nbytes == 0) {
        counters.requests.fetch_add(1, std::memory_order_relaxed);
        callback(0, nullptr);
        return nullptr;
    }
    auto state = std::make_shared<request_state>();
    state->op = req.op;
    state->fd = req.fd;
    state->data = req.data;
    state->nbytes = req.nbytes;
    state->offset = req.offset;
    state->label = std::string(req.label);
    state->callback = std::move(callback);
    return state;
}

/// Hands a retired request to its callback, once. The engine keeps no reference to the
/// error afterwards: the exception is released by whoever consumes it, never later by an
/// engine thread dropping its bookkeeping. A callback must not throw; there is nobody to
/// report to, so an exception from it is dropped.
inline void deliver(request_state& r, engine_counters& counters) noexcept {
    counters.requests.fetch_add(1, std::memory_order_relaxed);
    if (r.outcome) counters.failures.fetch_add(1, std::memory_order_relaxed);
    auto callback = std::move(r.callback);
    std::exception_ptr error = std::move(r.outcome);
    const std::size_t nbytes = error ? 0 : r.nbytes;
    try {
        callback(nbytes, std::move(error));
    } catch (...) {
    }
}

/// read()/write() of an engine: its submit() with a callback that completes a handle. A
/// submit() that throws (a request past the largest offset, memory exhaustion) fails the
/// handle with the same error before it is rethrown, so the handle, destroyed while the
/// exception unwinds, does not wait for a completion that will never come.
template <class Engine>
io_completion start_request(Engine& engine, const io_request& req) {
    completion_source src;
    auto handle = src.handle();
    try {
        engine.submit(req, [src](std::size_t n, std::exception_ptr err) mutable {
            if (err) src.fail(std::move(err));
            else src.succeed(n);
        });
    } catch (...) {
        if (!src.done()) src.fail(std::current_exception());
        throw;
    }
    return handle;
}

}  // namespace detail
}  // namespace spillway
