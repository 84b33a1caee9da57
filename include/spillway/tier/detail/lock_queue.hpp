// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/detail/lock_queue.hpp: a queue of operations that each need one lock out of
/// a fixed set, served by a pool of workers that prefer an operation whose lock is free.
///
/// A worker calls take() and gets the first queued operation whose lock try_lock() grants,
/// so a worker that finds one lock busy serves an operation on a free lock first. When no
/// lock can be taken, the worker sleeps in the lock() of a queued operation's lock that no
/// worker holds or sleeps on (so it is held outside the pool, e.g. by another process) and
/// is woken by its release, with no polling; it then takes the first operation still queued
/// on that lock. One worker sleeps per lock and one always stays awake: it waits on the
/// queue with a back-off from 20 us up to the poll interval, and notify_all() (a lock of the
/// pool was released, or work was added) wakes it. The steps are in docs/design.md
/// ("Multi-path offload", operation protocol, steps 2-4).
///
/// Guarantees:
///  - every member is called with the owner's mutex held, through the std::unique_lock the
///    owner passes to take(); take() releases it only while waiting or sleeping in a lock;
///  - an operation returned without an error holds its lock, counted until release(op);
///    an operation returned with an error (its lock threw) holds nothing;
///  - take() returns an empty result only when the queue is empty and stop() was called.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "spillway/lock/lock_policy.hpp"

namespace spillway::detail {

/// The queue of the file comment.
/// @tparam Op        the operation type, owned through std::unique_ptr while queued
/// @tparam Lock      a lock_policy; the queue keeps pointers to locks its owner keeps alive
/// @tparam LockIndex a function object: LockIndex{}(const Op&) is the index of the lock the
///                   operation needs, as add_lock() returned it
template <class Op, lock_policy Lock, class LockIndex>
class lock_queue {
public:
    /// What take() hands a worker.
    struct taken {
        std::unique_ptr<Op> op;         ///< null when the queue stopped and is empty
        std::exception_ptr lock_error;  ///< the lock's exception; then no lock is held
    };

    /// Registers a lock; the owner keeps it alive longer than the queue's workers.
    /// @return its index
    std::size_t add_lock(Lock& lock) {
        locks_.push_back(lock_state{&lock});
        return locks_.size() - 1;
    }
    /// Sets the number of workers calling take() and the longest back-off of the one that
    /// stays awake; before any operation is pushed.
    void set_workers(std::size_t count, std::chrono::microseconds poll_interval) noexcept {
        workers_ = count;
        poll_interval_ = poll_interval;
    }

    void push_back(std::unique_ptr<Op> op) { queue_.push_back(std::move(op)); }
    /// Queues an operation ahead of the others (it keeps its turn).
    void push_front(std::unique_ptr<Op> op) { queue_.push_front(std::move(op)); }
    /// Workers return from take() once the queue is empty.
    void stop() noexcept { stopping_ = true; }

    void notify_one() noexcept { cv_.notify_one(); }
    void notify_all() noexcept { cv_.notify_all(); }

    /// Waits until an operation can run (see the file comment). `guard` holds the owner's
    /// mutex on entry and on return.
    taken take(std::unique_lock<std::mutex>& guard) {
        using namespace std::chrono;
        const microseconds min_backoff{20};
        microseconds backoff = min_backoff;
        for (;;) {
            if (queue_.empty()) {
                if (stopping_) return {};
                cv_.wait(guard);
                continue;
            }
            taken out;
            for (auto it = queue_.begin(); it != queue_.end(); ++it) {
                bool got = false;
                try {
                    got = lock_of(**it).try_lock();
                } catch (...) {
                    out.lock_error = std::current_exception();
                    got = true;
                }
                if (got) {
                    out.op = std::move(*it);
                    queue_.erase(it);
                    break;
                }
            }
            if (!out.op) {
                // Every wanted lock is taken. A lock that no worker holds is held outside the
                // pool: sleep in its lock() and be woken by its release. A lock a worker holds
                // wakes us through cv_ when released.
                auto it = sleepers_ + 1 < workers_
                              ? std::find_if(queue_.begin(), queue_.end(),
                                             [&](const auto& o) {
                                                 const auto& l = state(*o);
                                                 return l.holders == 0 && !l.awaited;
                                             })
                              : queue_.end();
                if (it == queue_.end()) {
                    cv_.wait_for(guard, backoff);
                    backoff =
                        std::min<microseconds>(backoff * 2, std::max(min_backoff, poll_interval_));
                    continue;
                }
                const std::size_t index = LockIndex{}(**it);
                lock_state& wanted = locks_[index];
                wanted.awaited = true;
                ++sleepers_;
                guard.unlock();
                try {
                    wanted.lock->lock();
                } catch (...) {
                    out.lock_error = std::current_exception();
                }
                guard.lock();
                wanted.awaited = false;
                --sleepers_;
                // With node_lock no other worker could take operations on that lock while this
                // one slept (their try_lock() fails on the lock's own mutex), so they are
                // still queued. A policy whose try_lock() can win against a sleeping lock()
                // may have let another worker serve them all; then the lock goes back.
                auto mine = std::find_if(queue_.begin(), queue_.end(),
                                         [&](const auto& o) { return LockIndex{}(*o) == index; });
                if (mine == queue_.end()) {
                    if (!out.lock_error) wanted.lock->unlock();
                    continue;
                }
                out.op = std::move(*mine);
                queue_.erase(mine);
            }
            if (!out.lock_error) ++state(*out.op).holders;
            return out;
        }
    }

    /// Releases the lock of an operation take() returned without an error.
    void release(const Op& op) {
        auto& l = state(op);
        --l.holders;
        l.lock->unlock();
    }

private:
    struct lock_state {
        Lock* lock = nullptr;
        std::size_t holders = 0;  // workers holding the lock
        bool awaited = false;     // a worker sleeps in its lock()
    };
    lock_state& state(const Op& op) { return locks_[LockIndex{}(op)]; }
    Lock& lock_of(const Op& op) { return *state(op).lock; }

    std::vector<lock_state> locks_;
    std::deque<std::unique_ptr<Op>> queue_;
    std::condition_variable cv_;
    std::size_t workers_ = 0;
    std::size_t sleepers_ = 0;  // workers asleep in a lock's lock()
    std::chrono::microseconds poll_interval_{500};
    bool stopping_ = false;
};

}  // namespace spillway::detail
