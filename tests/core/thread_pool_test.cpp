// SPDX-License-Identifier: Apache-2.0
// thread_pool: parallel_for covers [0, count) exactly once in chunks whose boundaries depend
// only on (count, size(), grain); chunks go to whichever thread is free, so a busy or
// delayed worker neither holds the call up nor deadlocks a call made from inside the pool.
#include <doctest/doctest.h>

#include <spillway/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

using namespace spillway;

namespace {

using chunk_set = std::set<std::pair<std::size_t, std::size_t>>;

/// The chunks one parallel_for call made, after checking that they tile [0, count).
chunk_set chunks_of(thread_pool& pool, std::size_t count, std::size_t grain) {
    std::vector<std::atomic<int>> seen(count);
    std::mutex m;
    chunk_set chunks;
    pool.parallel_for(
        count,
        [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) seen[i].fetch_add(1);
            std::lock_guard lock(m);
            chunks.insert({b, e});
        },
        grain);
    for (std::size_t i = 0; i < count; ++i) REQUIRE(seen[i].load() == 1);
    return chunks;
}

}  // namespace

TEST_CASE("parallel_for runs every index once, in chunks that depend only on count, size and grain") {
    for (std::size_t workers : {0u, 1u, 3u}) {
        thread_pool pool(workers);
        for (std::size_t count : {1u, 2u, 7u, 64u, 1000u, 4099u}) {
            for (std::size_t grain : {1u, 16u, 5000u}) {
                CAPTURE(workers);
                CAPTURE(count);
                CAPTURE(grain);
                auto first = chunks_of(pool, count, grain);
                // At most 2 chunks per thread, each of at least `grain` items but the last.
                CHECK(first.size() <= 2 * (workers + 1));
                for (auto [b, e] : first) {
                    CHECK(e > b);
                    if (e != count) CHECK(e - b >= std::min(grain, count));
                }
                for (int run = 0; run < 3; ++run) CHECK(chunks_of(pool, count, grain) == first);
            }
        }
        chunks_of(pool, 0, 1);  // nothing to do: fn is never called
    }
}

TEST_CASE("parallel_for rethrows a chunk's exception after every chunk ran") {
    thread_pool pool(2);
    std::atomic<std::size_t> ran{0};
    CHECK_THROWS_WITH_AS(pool.parallel_for(
                             1200,
                             [&](std::size_t b, std::size_t e) {
                                 ran += e - b;
                                 if (b == 0) throw std::runtime_error("chunk 0 failed");
                             },
                             1),
                         "chunk 0 failed", std::runtime_error);
    CHECK(ran.load() == 1200);
    // The pool is still usable.
    CHECK(chunks_of(pool, 100, 1).size() > 1);
}

TEST_CASE("a busy worker does not hold parallel_for up: the caller takes the chunks") {
    thread_pool pool(1);
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();
    std::atomic<bool> worker_busy{false};
    pool.submit([&, gate] {
        worker_busy = true;
        gate.wait();
    });
    while (!worker_busy) std::this_thread::yield();
    // The only worker is blocked: the caller runs every chunk itself and returns.
    std::set<std::thread::id> threads;
    std::mutex m;
    pool.parallel_for(
        1000,
        [&](std::size_t, std::size_t) {
            std::lock_guard lock(m);
            threads.insert(std::this_thread::get_id());
        },
        1);
    CHECK(threads == std::set<std::thread::id>{std::this_thread::get_id()});
    release.set_value();
}

TEST_CASE("parallel_for from a task of the same pool finishes (no deadlock with one worker)") {
    thread_pool pool(1);
    std::promise<std::size_t> sum;
    auto result = sum.get_future();
    pool.submit([&] {
        std::atomic<std::size_t> total{0};
        pool.parallel_for(500, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) total += i;
        });
        sum.set_value(total.load());
    });
    REQUIRE(result.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    CHECK(result.get() == 500u * 499u / 2u);
}

TEST_CASE("a pool whose threads poll before they sleep: same chunks, and no poll outlasts its reason") {
    // A poll long enough that any wait on it would show: 10 s against bounds of 5 s.
    using clock = std::chrono::steady_clock;
    const auto long_spin = std::chrono::microseconds(10'000'000);
    const auto bound = std::chrono::seconds(5);
    thread_pool plain(2);
    auto pool = std::make_unique<thread_pool>(2, "spw-pool", long_spin);
    // The chunks depend only on (count, size, grain), not on how threads wait.
    CHECK(chunks_of(*pool, 1000, 7) == chunks_of(plain, 1000, 7));

    SUBCASE("parallel_for returns once the helpers' chunks are done (the caller's poll sees them finish)") {
        for (int round = 0; round < 20; ++round) {
            auto t0 = clock::now();
            std::atomic<std::size_t> sum{0};
            pool->parallel_for(64, [&](std::size_t b, std::size_t e) {
                std::this_thread::sleep_for(std::chrono::microseconds(200));  // helpers take chunks too
                for (std::size_t i = b; i < e; ++i) sum += i;
            });
            CHECK(sum.load() == 64u * 63u / 2u);
            CHECK(clock::now() - t0 < bound);
        }
    }
    SUBCASE("a task submitted while the workers poll runs at once") {
        pool->parallel_for(8, [](std::size_t, std::size_t) {});  // the workers are now polling
        std::promise<void> ran;
        auto t0 = clock::now();
        pool->submit([&] { ran.set_value(); });
        REQUIRE(ran.get_future().wait_for(bound) == std::future_status::ready);
        CHECK(clock::now() - t0 < bound);
    }
    SUBCASE("destroying the pool stops polling workers") {
        pool->parallel_for(8, [](std::size_t, std::size_t) {});
        auto t0 = clock::now();
        pool.reset();
        CHECK(clock::now() - t0 < bound);
    }
}
