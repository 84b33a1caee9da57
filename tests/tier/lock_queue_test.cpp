// SPDX-License-Identifier: Apache-2.0
// The virtual tier's lock-aware work queue on its own: a worker serves an operation whose
// lock is free before one whose lock is busy, sleeps in a lock held outside the pool until
// it is released, and hands back a lock's exception; no tier, no I/O.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <spillway/tier/detail/lock_queue.hpp>

namespace {
// A lock the test opens and closes from outside; it counts how often it was waited on.
class gate_lock {
public:
    void lock() {
        std::unique_lock g(m_);
        ++lock_calls_;
        cv_.notify_all();
        if (fail_) throw std::runtime_error("gate broken");
        cv_.wait(g, [&] { return !held_; });
        held_ = true;
    }
    bool try_lock() {
        std::lock_guard g(m_);
        if (held_) return false;
        held_ = true;
        return true;
    }
    void unlock() {
        std::lock_guard g(m_);
        held_ = false;
        cv_.notify_all();
    }
    bool held() {
        std::lock_guard g(m_);
        return held_;
    }
    void break_it() {
        std::lock_guard g(m_);
        fail_ = true;
    }
    // Waits until a worker sleeps in lock().
    void wait_for_sleeper() {
        std::unique_lock g(m_);
        cv_.wait(g, [&] { return lock_calls_ > 0; });
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    bool held_ = false;
    bool fail_ = false;
    int lock_calls_ = 0;
};

struct op {
    std::size_t lock = 0;
    int id = 0;
};
struct lock_of_op {
    std::size_t operator()(const op& o) const noexcept { return o.lock; }
};
using queue_type = spillway::detail::lock_queue<op, gate_lock, lock_of_op>;

std::unique_ptr<op> make_op(std::size_t lock, int id) {
    return std::make_unique<op>(op{lock, id});
}
}  // namespace

TEST_CASE("lock_queue: the first operation whose lock is free goes first") {
    gate_lock a, b;
    queue_type q;
    CHECK(q.add_lock(a) == 0u);
    CHECK(q.add_lock(b) == 1u);
    q.set_workers(2, std::chrono::microseconds(500));
    std::mutex m;
    std::unique_lock g(m);
    REQUIRE(a.try_lock());  // held outside the pool
    q.push_back(make_op(0, 1));
    q.push_back(make_op(1, 2));
    q.push_back(make_op(1, 3));
    auto t = q.take(g);
    REQUIRE(t.op);
    CHECK_FALSE(t.lock_error);
    CHECK(t.op->id == 2);  // op 1 waits for lock a
    CHECK(b.held());
    q.release(*t.op);
    CHECK_FALSE(b.held());
    t = q.take(g);
    REQUIRE(t.op);
    CHECK(t.op->id == 3);
    q.release(*t.op);
    a.unlock();
    t = q.take(g);
    REQUIRE(t.op);
    CHECK(t.op->id == 1);
    CHECK(a.held());
    q.release(*t.op);
    q.stop();
    CHECK_FALSE(q.take(g).op);  // stopped and empty
}

TEST_CASE("lock_queue: a worker sleeps in a lock held outside the pool until its release") {
    gate_lock a;
    queue_type q;
    (void)q.add_lock(a);
    q.set_workers(2, std::chrono::seconds(60));  // polling alone would take a minute
    REQUIRE(a.try_lock());
    std::mutex m;
    std::unique_lock g(m);
    q.push_back(make_op(0, 7));
    std::thread releaser([&] {
        a.wait_for_sleeper();  // the worker is in lock(), the queue's mutex released
        std::lock_guard check(m);
        a.unlock();
    });
    auto t = q.take(g);
    releaser.join();
    REQUIRE(t.op);
    CHECK(t.op->id == 7);
    CHECK_FALSE(t.lock_error);
    CHECK(a.held());
    q.release(*t.op);
}

TEST_CASE("lock_queue: a lock that throws hands its operation back with the error") {
    gate_lock a;
    queue_type q;
    (void)q.add_lock(a);
    q.set_workers(2, std::chrono::microseconds(500));
    REQUIRE(a.try_lock());
    a.break_it();
    std::mutex m;
    std::unique_lock g(m);
    q.push_back(make_op(0, 9));
    auto t = q.take(g);
    REQUIRE(t.op);
    CHECK(t.op->id == 9);
    CHECK(t.lock_error);
    a.unlock();
}
