// spillway/io/completion.hpp: the move-only handle every asynchronous operation returns.
//
// Guarantees:
// - wait() blocks until the operation finished and rethrows its error, once; after wait()
//   returned or threw, the handle is empty (valid() == false).
// - ready() never blocks.
// - Destroying a handle whose operation is still in flight waits for it (like the future of
//   std::async) and swallows its error: a caller that drops a handle can free its buffer
//   right after, with no use-after-free. Call wait() to see errors.
// - The producer side (completion_source) completes exactly once; completing twice is a
//   logic error caught by an assert.
#pragma once

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
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
class io_completion {
public:
    io_completion() = default;
    explicit io_completion(std::shared_ptr<detail::completion_state> state) : state_(std::move(state)) {}
    io_completion(io_completion&&) noexcept = default;
    io_completion& operator=(io_completion&& other) noexcept {
        if (this != &other) {
            drain();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    io_completion(const io_completion&) = delete;
    io_completion& operator=(const io_completion&) = delete;
    ~io_completion() { drain(); }

    /// True while the handle refers to an operation not yet waited for.
    [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }

    /// True when the operation has finished (successfully or not). Never blocks.
    /// An empty handle is ready.
    [[nodiscard]] bool ready() const noexcept {
        return !state_ || state_->done.load(std::memory_order_acquire);
    }

    /// Blocks until the operation finishes; returns the bytes transferred or rethrows the
    /// operation's exception. Throws std::logic_error on an empty handle.
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

    /// A handle that is already complete (used by tiers that finish synchronously).
    static io_completion completed(std::size_t nbytes) {
        auto s = std::make_shared<detail::completion_state>();
        s->finish(nbytes, nullptr);
        return io_completion(std::move(s));
    }
    /// A handle that is already failed with `error`.
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
class completion_source {
public:
    completion_source() : state_(std::make_shared<detail::completion_state>()) {}
    /// The consumer handle; call once.
    io_completion handle() { return io_completion(state_); }
    void succeed(std::size_t nbytes) { state_->finish(nbytes, nullptr); }
    void fail(std::exception_ptr error) { state_->finish(0, std::move(error)); }
    [[nodiscard]] bool done() const noexcept { return state_->done.load(std::memory_order_acquire); }

private:
    std::shared_ptr<detail::completion_state> state_;
};

}  // namespace spillway
