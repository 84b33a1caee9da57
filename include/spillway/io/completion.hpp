// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/io/completion.hpp: the move-only handle every asynchronous operation returns.
///
/// Guarantees:
/// - wait() blocks until the operation finished and rethrows its error, once; after wait()
///   returned or threw, the handle is empty (valid() == false).
/// - ready() never blocks.
/// - Destroying a handle whose operation is still in flight waits for it (like the future of
///   std::async) and swallows its error: a caller that drops a handle can free its buffer
///   right after, with no use-after-free. Call wait() to see errors.
/// - The producer side (completion_source) completes exactly once; completing twice is a
///   logic error caught by an assert. If every copy of a source is destroyed before it
///   completed (a producer that failed or gave up), the operation fails with
///   std::system_error(ECANCELED) saying so: a handle never waits for a producer that is gone.
#pragma once

#include <atomic>
#include <cassert>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace spillway {

namespace detail {
/// Shared state between a completion_source and its io_completion.
struct completion_state {
    std::mutex mutex;
    std::condition_variable cv;
    std::atomic<bool> done{false};
    std::exception_ptr error;
    std::size_t nbytes = 0;  // bytes transferred, valid once done

    void finish(std::size_t transferred, std::exception_ptr err) {
        {
            std::lock_guard lock(mutex);
            assert(!done.load(std::memory_order_relaxed) && "completion finished twice");
            nbytes = transferred;
            error = std::move(err);
            done.store(true, std::memory_order_release);
        }
        cv.notify_all();
    }
    void block() {
        if (done.load(std::memory_order_acquire)) return;
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return done.load(std::memory_order_acquire); });
    }
};
}  // namespace detail

/// Move-only handle to one asynchronous operation (a tier or engine read or write).
///
/// The caller must keep the operation's buffer alive until the handle is waited for or
/// destroyed; destruction waits, so a handle that goes out of scope before its buffer is
/// always safe. One handle is used by one thread at a time; the producer completes it from
/// any thread (a completion_source).
class io_completion {
public:
    /// An empty handle: valid() is false and ready() is true.
    io_completion() = default;
    /// Wraps the shared state a completion_source created; completion_source::handle() is
    /// the way to get one.
    explicit io_completion(std::shared_ptr<detail::completion_state> state) : state_(std::move(state)) {}
    /// Takes over `other`'s operation; `other` becomes empty.
    io_completion(io_completion&&) noexcept = default;
    /// First waits for the operation this handle refers to (its error is dropped, as in the
    /// destructor), then takes over `other`'s; `other` becomes empty.
    io_completion& operator=(io_completion&& other) noexcept {
        if (this != &other) {
            drain();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    /// One operation has one consumer: not copyable.
    io_completion(const io_completion&) = delete;
    /// One operation has one consumer: not copyable.
    io_completion& operator=(const io_completion&) = delete;
    /// Waits for an operation still in flight and drops its error; never throws. After it,
    /// the operation's buffer may be freed.
    ~io_completion() { drain(); }

    /// True while the handle refers to an operation not yet waited for.
    [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }

    /// True when the operation has finished (successfully or not). Never blocks.
    /// An empty handle is ready.
    [[nodiscard]] bool ready() const noexcept {
        return !state_ || state_->done.load(std::memory_order_acquire);
    }

    /// Blocks until the operation finishes; the handle is empty afterwards, whether it
    /// returns or throws, so an error is seen once.
    /// @return the bytes transferred
    /// @throws std::exception whatever the operation failed with, rethrown here
    ///         (std::system_error naming the call and the path or key, std::out_of_range for
    ///         a missing key, ...)
    /// @throws std::logic_error on an empty handle (never started, or already waited for)
    std::size_t wait() {
        if (!state_) throw std::logic_error("io_completion::wait on an empty handle");
        auto state = std::move(state_);
        state->block();
        // The error is taken out of the shared state, so the exception object is released on
        // this thread even when the producer drops the state last (its reference counts live
        // in the uninstrumented runtime, where ThreadSanitizer cannot see the ordering).
        if (state->error) std::rethrow_exception(std::exchange(state->error, nullptr));
        return state->nbytes;
    }

    /// A handle that is already complete with `nbytes` transferred (used by tiers that finish
    /// synchronously).
    static io_completion completed(std::size_t nbytes) {
        auto s = std::make_shared<detail::completion_state>();
        s->finish(nbytes, nullptr);
        return io_completion(std::move(s));
    }
    /// A handle that is already failed: wait() rethrows `error` (must not be null). Tiers
    /// use it to report an error through the same path as an asynchronous one.
    static io_completion failed(std::exception_ptr error) {
        auto s = std::make_shared<detail::completion_state>();
        s->finish(0, std::move(error));
        return io_completion(std::move(s));
    }

private:
    void drain() noexcept {
        if (state_) {
            state_->block();
            state_.reset();
        }
    }
    std::shared_ptr<detail::completion_state> state_;
};

/// Producer side: created by whoever performs the operation, completed exactly once.
///
/// Copies share one operation (the engine keeps one while the caller's handle holds the
/// other end). succeed() or fail() may be called from any thread; the waiting consumer is
/// woken. Completing twice is a logic error, caught by an assert in debug builds.
class completion_source {
public:
    /// A new, unfinished operation.
    completion_source()
        : state_(std::make_shared<detail::completion_state>()), guard_(std::make_shared<abandon_guard>(state_)) {}
    /// The consumer handle; call once.
    io_completion handle() { return io_completion(state_); }
    /// Completes the operation with `nbytes` transferred; the consumer's wait() returns it.
    void succeed(std::size_t nbytes) { state_->finish(nbytes, nullptr); }
    /// Completes the operation with an error; the consumer's wait() rethrows `error`.
    void fail(std::exception_ptr error) { state_->finish(0, std::move(error)); }
    /// True once succeed() or fail() was called. Never blocks.
    [[nodiscard]] bool done() const noexcept { return state_->done.load(std::memory_order_acquire); }

private:
    // Shared by the copies of one source; the last one gone fails an unfinished operation.
    struct abandon_guard {
        std::shared_ptr<detail::completion_state> state;
        explicit abandon_guard(std::shared_ptr<detail::completion_state> s) : state(std::move(s)) {}
        abandon_guard(const abandon_guard&) = delete;
        abandon_guard& operator=(const abandon_guard&) = delete;
        ~abandon_guard() {
            if (state->done.load(std::memory_order_acquire)) return;
            try {
                state->finish(0, std::make_exception_ptr(std::system_error(
                                     ECANCELED, std::generic_category(),
                                     "spillway: an asynchronous operation was abandoned: its producer ended "
                                     "without completing it")));
            } catch (...) {
                state->finish(0, std::current_exception());  // (the message could not be built)
            }
        }
    };
    std::shared_ptr<detail::completion_state> state_;
    std::shared_ptr<abandon_guard> guard_;
};

}  // namespace spillway
