// SPDX-License-Identifier: Apache-2.0
// The lock_policy concept and its in-process models: null_lock, thread_lock, path_locks,
// make_lock. node_lock has its own tests (node_lock_test.cpp).
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <spillway/lock/lock_policy.hpp>
#include <spillway/lock/node_lock.hpp>

using namespace spillway;

namespace {
// Counts how often two threads were inside the critical section at once, and how many
// increments of a relaxed read-then-write counter were lost (both are zero under exclusion).
template <class Lock>
std::pair<int, long> hammer(Lock& lock, int threads, int iterations) {
    std::atomic<int> inside{0}, overlaps{0};
    std::atomic<long> counter{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&] {
            for (int i = 0; i < iterations; ++i) {
                std::scoped_lock guard(lock);
                if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
                long c = counter.load(std::memory_order_relaxed);
                std::this_thread::yield();
                counter.store(c + 1, std::memory_order_relaxed);
                inside.fetch_sub(1);
            }
        });
    }
    for (auto& th : pool) th.join();
    return {overlaps.load(), static_cast<long>(threads) * iterations - counter.load()};
}
}  // namespace

// Every model satisfies lock_policy; std::mutex does too, a plain int does not. Checked at
// compile time: a model that stops satisfying the concept fails the build of this file.
static_assert(lock_policy<null_lock>);
static_assert(lock_policy<thread_lock>);
static_assert(lock_policy<node_lock>);
static_assert(lock_policy<std::mutex>);
static_assert(!lock_policy<int>);

TEST_CASE("null_lock never excludes") {
    null_lock l;
    CHECK(l.try_lock());
    CHECK(l.try_lock());  // a second holder is let in at once
    l.unlock();
    std::scoped_lock guard(l);
    null_lock named("anything", lock_options{});
    CHECK(named.try_lock());
}

TEST_CASE("thread_lock excludes the threads of one process") {
    thread_lock l;
    CHECK(l.try_lock());
    bool other = true;
    std::thread([&] { other = l.try_lock(); }).join();
    CHECK_FALSE(other);
    l.unlock();
    auto [overlaps, lost] = hammer(l, 4, 500);
    CHECK(overlaps == 0);
    CHECK(lost == 0);
}

TEST_CASE("the overlap detector sees overlaps when nothing excludes") {
    // Proves that the hammer above can fail: with null_lock and a yield inside the critical
    // section, four threads do overlap.
    null_lock l;
    int overlaps = 0;
    for (int attempt = 0; attempt < 20 && overlaps == 0; ++attempt) overlaps = hammer(l, 4, 500).first;
    CHECK(overlaps > 0);
}

TEST_CASE("path_locks keeps reads and writes apart but lets one of each in") {
    path_locks<thread_lock> p("disk0");
    std::scoped_lock r(p.read_lock);
    bool write_free = false, read_free = true;
    std::thread([&] {
        write_free = p.write_lock.try_lock();
        if (write_free) p.write_lock.unlock();
        read_free = p.read_lock.try_lock();
        if (read_free) p.read_lock.unlock();
    }).join();
    CHECK(write_free);
    CHECK_FALSE(read_free);
}

TEST_CASE("std::scoped_lock takes several policies at once") {
    thread_lock a;
    path_locks<null_lock> b("x");
    {
        std::scoped_lock all(a, b.read_lock, b.write_lock);
        bool got = true;
        std::thread([&] {
            got = a.try_lock();
            if (got) a.unlock();
        }).join();
        CHECK_FALSE(got);
    }
    CHECK(a.try_lock());
    a.unlock();
}

TEST_CASE("make_lock passes the name only to policies that take one") {
    auto n = make_lock<null_lock>("n");
    CHECK(n.try_lock());
    auto t = make_lock<thread_lock>("t");  // non-movable: built in place
    CHECK(t.try_lock());
    t.unlock();
}
