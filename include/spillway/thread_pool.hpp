// spillway/thread_pool.hpp: a small fixed-size thread pool.
//
// Guarantees:
// - submit(fn) runs fn on one worker, FIFO; the destructor finishes every queued task, then
//   joins (nothing submitted is dropped).
// - parallel_for(count, fn) splits [0, count) into at most size()+1 contiguous chunks and
//   calls fn(begin, end) for each, the calling thread taking one chunk; it returns when all
//   chunks finished and rethrows the first exception a chunk threw. Chunk boundaries are a
//   pure function of (count, size(), grain), so results that depend on the split are
//   reproducible run to run.
// - A pool of size 0 runs everything on the caller.
// - Workers carry the pool's name (default "spw-pool"; see thread_name.hpp).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "spillway/detail/thread_name.hpp"

namespace spillway {

/// A fixed-size pool of named worker threads with a deterministic parallel_for (see the
/// guarantees above). Not copyable; destroy it only after every task it ran has returned.
class thread_pool {
public:
    /// Starts `threads` workers (0: none; the caller does all the work), each named `name`.
    explicit thread_pool(std::size_t threads, std::string_view name = "spw-pool") {
        workers_.reserve(threads);
        for (std::size_t i = 0; i < threads; ++i) detail::name_thread(workers_.emplace_back([this] { run(); }), name);
    }
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    ~thread_pool() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        for (auto& w : workers_) w.join();
    }

    /// Worker threads (the caller of parallel_for() works too, so size() + 1 chunks run at once).
    [[nodiscard]] std::size_t size() const noexcept { return workers_.size(); }

    /// Queues `task` for one worker (FIFO); with no workers it runs on the caller, now.
    void submit(std::function<void()> task) {
        if (workers_.empty()) {
            task();
            return;
        }
        {
            std::lock_guard lock(mutex_);
            queue_.push_back(std::move(task));
        }
        cv_.notify_one();
    }

    /// Calls fn(begin, end) over [0, count) in chunks of at least `grain` items.
    template <class Fn>
    void parallel_for(std::size_t count, Fn&& fn, std::size_t grain = 1) {
        if (count == 0) return;
        grain = std::max<std::size_t>(grain, 1);
        std::size_t max_chunks = (count + grain - 1) / grain;
        std::size_t chunks = std::min(workers_.size() + 1, max_chunks);
        if (chunks <= 1) {
            fn(std::size_t{0}, count);
            return;
        }
        std::size_t per = (count + chunks - 1) / chunks;
        struct shared {
            std::mutex m;
            std::condition_variable cv;
            std::size_t pending;
            std::exception_ptr error;
        } st;
        st.pending = chunks - 1;
        for (std::size_t c = 1; c < chunks; ++c) {
            std::size_t b = std::min(count, c * per), e = std::min(count, b + per);
            submit([&, b, e] {
                std::exception_ptr err;
                try {
                    fn(b, e);
                } catch (...) {
                    err = std::current_exception();
                }
                std::lock_guard lock(st.m);
                if (err && !st.error) st.error = err;
                if (--st.pending == 0) st.cv.notify_one();
            });
        }
        std::exception_ptr mine;
        try {
            fn(std::size_t{0}, std::min(count, per));
        } catch (...) {
            mine = std::current_exception();
        }
        std::unique_lock lock(st.m);
        st.cv.wait(lock, [&] { return st.pending == 0; });
        if (mine) std::rethrow_exception(mine);
        if (st.error) std::rethrow_exception(st.error);
    }

    /// A process-wide pool with hardware_concurrency() - 1 workers, created on first use.
    static thread_pool& shared_pool() {
        static thread_pool pool(std::max(1u, std::thread::hardware_concurrency()) - 1);
        return pool;
    }

private:
    void run() {
        for (;;) {
            std::function<void()> task;
            {
                std::unique_lock lock(mutex_);
                cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) return;  // stopping and drained
                task = std::move(queue_.front());
                queue_.pop_front();
            }
            task();
        }
    }
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    bool stopping_ = false;
    std::vector<std::thread> workers_;
};

}  // namespace spillway
