// SPDX-License-Identifier: Apache-2.0
// spillway/thread_pool.hpp: a small fixed-size thread pool.
//
// Guarantees:
// - submit(fn) runs fn on one worker, FIFO; the destructor finishes every queued task, then
//   joins (nothing submitted is dropped). A task must not throw: an exception leaving a task
//   on a worker ends the process (std::terminate, as for any thread's function); with no
//   workers the task runs on the caller and its exception reaches the caller.
// - parallel_for(count, fn) splits [0, count) into at most 2 x (size()+1) contiguous chunks
//   of at least `grain` items (the last may be shorter) and calls fn(begin, end) once for
//   each; it returns when all chunks finished and rethrows the first exception a chunk threw
//   (every chunk still runs).
//   Chunk boundaries are a pure function of (count, size(), grain), so results that depend
//   on the split are reproducible run to run.
// - Who runs a chunk is decided as the call goes: the calling thread and up to size()
//   workers each take the next chunk not yet taken until none is left. A worker that the
//   scheduler delays (on a small machine, an I/O thread took its core) or that is busy with
//   another task costs the call at most the chunk it holds; the caller alone can finish the
//   call, so parallel_for from inside a task of the same pool does not deadlock.
// - A pool of size 0 runs everything on the caller.
// - Waiting (optional, `spin`): a worker out of tasks, and a parallel_for caller waiting for
//   the helpers' last chunks, first poll for up to `spin` (pausing between polls), then block.
//   Waking a blocked thread is slow on a virtual machine (an interrupt to a halted virtual
//   CPU), and a compute loop that calls parallel_for many times a step pays it at every call;
//   a short spin keeps the workers awake between calls, at the price of that much CPU time
//   when no call follows. Default 0: block at once (for I/O pools).
// - Workers carry the pool's name (default "spw-pool"; see thread_name.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "spillway/detail/thread_name.hpp"

namespace spillway {
namespace detail {
/// One spin-wait hint to the CPU (x86 PAUSE; elsewhere nothing).
inline void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}
}  // namespace detail

/// A fixed-size pool of named worker threads with a deterministic parallel_for (see the
/// guarantees above). Not copyable; destroy it only after every task it ran has returned.
class thread_pool {
public:
    /// Starts `threads` workers (0: none; the caller does all the work), each named `name`;
    /// `spin`: how long a waiting thread polls before it blocks (see the guarantees above).
    explicit thread_pool(std::size_t threads, std::string_view name = "spw-pool",
                         std::chrono::microseconds spin = std::chrono::microseconds{0})
        : spin_(spin) {
        workers_.reserve(threads);
        for (std::size_t i = 0; i < threads; ++i)
            detail::name_thread(workers_.emplace_back([this] { run(); }), name);
    }
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    ~thread_pool() {
        {
            std::lock_guard lock(mutex_);
            stopping_.store(true, std::memory_order_release);
        }
        cv_.notify_all();
        for (auto& w : workers_) w.join();
    }

    /// Worker threads (the caller of parallel_for() works too, so size() + 1 chunks run at once).
    [[nodiscard]] std::size_t size() const noexcept { return workers_.size(); }

    /// Queues `task` for one worker (FIFO); with no workers it runs on the caller, now. The
    /// task must not throw on a worker (see the guarantees above).
    void submit(std::function<void()> task) {
        if (workers_.empty()) {
            task();
            return;
        }
        {
            std::lock_guard lock(mutex_);
            queue_.push_back(std::move(task));
            queued_.fetch_add(1, std::memory_order_release);
        }
        cv_.notify_one();
    }

    /// Calls fn(begin, end) over [0, count) in chunks of at least `grain` items (see the
    /// guarantees above).
    template <class Fn>
    void parallel_for(std::size_t count, Fn&& fn, std::size_t grain = 1) {
        if (count == 0) return;
        grain = std::max<std::size_t>(grain, 1);
        const std::size_t max_chunks = std::max<std::size_t>(1, count / grain);
        std::size_t chunks = std::min((workers_.size() + 1) * chunks_per_thread, max_chunks);
        if (workers_.empty() || chunks <= 1) {
            fn(std::size_t{0}, count);
            return;
        }
        const std::size_t per = (count + chunks - 1) / chunks;
        chunks = (count + per - 1) / per;  // no empty chunk
        // The call's state outlives the call for helpers that start after it returned (they
        // find no chunk left and never touch fn).
        auto call = std::make_shared<call_state>();
        call->count = count;
        call->per = per;
        call->chunks = chunks;
        using F = std::remove_reference_t<Fn>;
        call->fn = const_cast<void*>(static_cast<const void*>(std::addressof(fn)));
        call->run = [](void* f, std::size_t b, std::size_t e) { (*static_cast<F*>(f))(b, e); };
        // Helpers are a speed-up, not a need: if one cannot be queued (memory exhausted), the
        // ones queued and this thread take every chunk, and the call waits for them all
        // before it returns (a throw here would free fn while a helper runs it).
        for (std::size_t h = 0; h < std::min(workers_.size(), chunks - 1); ++h) {
            try {
                submit([call] { call->drain(); });
            } catch (...) {
                break;
            }
        }
        call->drain();
        spin_until([&] { return call->all_done.load(std::memory_order_acquire); });
        std::unique_lock lock(call->m);
        call->cv.wait(lock, [&] { return call->finished == call->chunks; });
        // The error leaves the call state, which a helper may hold after this call returns, so
        // that the exception's last owner is this thread (a helper dropping the last reference
        // after the handler read it is ordered only by libstdc++'s reference count, which
        // ThreadSanitizer cannot see, so it would report a race).
        if (std::exception_ptr error = std::exchange(call->error, nullptr)) {
            lock.unlock();
            std::rethrow_exception(error);
        }
    }

    /// A process-wide pool with hardware_concurrency() - 1 workers, created on first use.
    static thread_pool& shared_pool() {
        static thread_pool pool(std::max(1u, std::thread::hardware_concurrency()) - 1);
        return pool;
    }

    /// Chunks per participant (caller and workers): enough for the others to absorb one
    /// delayed thread, few enough that each chunk stays a sizeable piece of work.
    static constexpr std::size_t chunks_per_thread = 2;

private:
    /// One parallel_for call, shared with the helpers it submitted.
    struct call_state {
        std::atomic<std::size_t> next{0};  // the next chunk to take
        std::size_t count = 0, per = 0, chunks = 0;
        void* fn = nullptr;  // the caller's callable
        void (*run)(void*, std::size_t, std::size_t) = nullptr;
        std::mutex m;
        std::condition_variable cv;
        std::size_t finished = 0;  // chunks done (guarded by m)
        std::atomic<bool> all_done{
            false};                // finished == chunks (set under m; polled by a spinning caller)
        std::exception_ptr error;  // the first a chunk threw (guarded by m)

        /// Takes chunks until none is left; each is counted once it has run.
        void drain() {
            for (std::size_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
                const std::size_t b = c * per, e = std::min(count, b + per);
                std::exception_ptr err;
                try {
                    run(fn, b, e);
                } catch (...) {
                    err = std::current_exception();
                }
                std::lock_guard lock(m);
                // This thread lets go of the exception under the lock, before the caller can
                // wake: the caller may be the one to free it.
                if (err && !error) error = std::move(err);
                err = nullptr;
                if (++finished == chunks) {
                    all_done.store(true, std::memory_order_release);
                    cv.notify_all();
                }
            }
        }
    };

    void run() {
        for (;;) {
            std::function<void()> task;
            spin_until([&] {
                return queued_.load(std::memory_order_acquire) > 0 ||
                       stopping_.load(std::memory_order_acquire);
            });
            {
                std::unique_lock lock(mutex_);
                cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) return;  // stopping and drained
                task = std::move(queue_.front());
                queue_.pop_front();
                queued_.fetch_sub(1, std::memory_order_relaxed);
            }
            task();
        }
    }

    /// Polls `ready` for up to spin_ (none when spin_ is 0), pausing between polls.
    template <class Ready>
    void spin_until(const Ready& ready) const {
        if (spin_.count() <= 0 || ready()) return;
        const auto until = std::chrono::steady_clock::now() + spin_;
        for (unsigned n = 1;; ++n) {
            for (int i = 0; i < 16; ++i) detail::cpu_pause();
            if (ready()) return;
            if (n % 8 == 0 && std::chrono::steady_clock::now() >= until) return;
        }
    }
    const std::chrono::microseconds spin_;
    std::atomic<std::size_t> queued_{
        0};  // queue_.size(), for spinning workers (changed under mutex_)
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    std::atomic<bool> stopping_{false};  // set under mutex_; atomic for spinning workers
    std::vector<std::thread> workers_;
};

}  // namespace spillway
