// SPDX-License-Identifier: Apache-2.0
// throttled_tier specifics: the token bucket's timing, scopes, run-time rate changes,
// shutdown. The shared tier behaviour is in the conformance suite.
//
// No check here depends on the machine being fast: a loaded machine only makes operations
// take longer, so the checks are lower bounds on time (the bucket holds an operation back at
// least so long), decisions (an operation is not done yet, or is done), and upper bounds
// only where the wrong behaviour would take hundreds of seconds or for ever; those are
// within_limit (60 s), which only a hang or an ignored rate change can exceed.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>

#include "support/host_tier_wrapper.hpp"
#include "support/random_bytes.hpp"

using namespace spillway;
using clock_type = std::chrono::steady_clock;

namespace {
double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}
constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;
/// The bound for what must happen "at once": far beyond any scheduling delay, far below the
/// time the wrong behaviour takes (hours at the rates these tests set).
constexpr std::chrono::seconds within_limit{60};

/// Whether `c` completes within `limit` (polled; the tier's own wait() has no timeout).
bool ready_within(const io_completion& c, std::chrono::seconds limit = within_limit) {
    const auto end = clock_type::now() + limit;
    while (!c.ready()) {
        if (clock_type::now() > end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}
}  // namespace

TEST_CASE(
    "throttled_tier: a large write returns at once but completes no earlier than the bucket "
    "allows") {
    // The caller is not blocked: at 1 KB/s the write is held back for 17 minutes, and write()
    // returns at once with a completion that is not ready (run on a thread, so a write()
    // that blocked fails the check instead of hanging the test).
    auto data = test::random_bytes(MiB, 1);
    {
        throttled_tier<host_tier> tier(throttle_config::joint({1e3, 64 * KiB}));
        auto issued = std::async(std::launch::async, [&] { return tier.write("k", data); });
        REQUIRE(issued.wait_for(within_limit) == std::future_status::ready);
        auto c = issued.get();
        CHECK_FALSE(c.ready());
        tier.set_rate(bandwidth_limit{1e9, 64 * KiB});
        CHECK(ready_within(c));
    }
    // It completes no earlier than the bucket allows: 1 MiB at 2 MB/s with a 64 KiB burst
    // takes at least (1 MiB - 64 KiB) / 2e6 = 0.49 s (a slower machine only takes longer).
    const double expected = (1.0 * MiB - 64 * KiB) / 2e6;
    throttled_tier<host_tier> tier(throttle_config::joint({2e6, 64 * KiB}));
    auto t0 = clock_type::now();
    auto c = tier.write("k", data);
    CHECK(c.wait() == MiB);
    double done_s = seconds_since(t0);
    CHECK(done_s >= 0.95 * expected);
    // The inner tier already holds the data; only the completion was held back.
    std::vector<std::byte> back(MiB);
    tier.inner().read("k", back).wait();
    CHECK(back == data);
}

TEST_CASE("throttled_tier: stats report the throttled bandwidth") {
    // Slow enough that the inner tier's copies stay well inside the throttled intervals even
    // under ThreadSanitizer on a loaded machine, where a faster rate lets the copies outlast
    // the throttled time.
    constexpr double rate = 10e6;
    throttled_tier<host_tier> tier(throttle_config::separate({}, {rate, 64 * KiB}));
    auto data = test::random_bytes(256 * KiB, 2);
    std::vector<io_completion> in_flight;
    auto t0 = clock_type::now();
    for (int i = 0; i < 16; ++i)
        in_flight.push_back(tier.write(std::string("k") + std::to_string(i), data));
    for (auto& c : in_flight) c.wait();
    double elapsed = seconds_since(t0);
    auto s = tier.stats();
    CHECK(s.writes == 16);
    CHECK(s.bytes_written == 16 * 256 * KiB);
    // 4 MiB less the 64 KiB burst at 10 MB/s: at least 0.41 s.
    CHECK(elapsed >= 0.95 * (4.0 * MiB - 64 * KiB) / rate);
    MESSAGE("throttled write bandwidth / limit = " << s.write_bandwidth() / rate << " ("
                                                   << s.write_bandwidth() / 1e6 << " MB/s against "
                                                   << rate / 1e6 << " MB/s)");
    // The limit holds (a loaded machine only lowers the bandwidth; no lower bound is checked).
    CHECK(s.write_bandwidth() <= 1.10 * rate);
    CHECK(s.write_bandwidth() > 0);
    // The inner tier's own stats count only its copies, which run inside the throttled
    // intervals: never more busy time than the decorated tier shows.
    CHECK(tier.inner().stats().bytes_written == s.bytes_written);
    CHECK(tier.inner().stats().write_busy_seconds <= s.write_busy_seconds);
}

TEST_CASE("throttled_tier: separate scope leaves reads free while writes are throttled") {
    // The write takes about 17 minutes at 1 KB/s: a read throttled with it never finishes
    // within the limit, and a read left free finishes at once.
    throttled_tier<host_tier> tier(throttle_config::separate({}, {1e3, 4 * KiB}));
    auto data = test::random_bytes(MiB, 3);
    tier.inner().write("r", data).wait();
    auto slow = tier.write("w", data);
    std::vector<std::byte> back(MiB);
    auto read = tier.read("r", back);
    CHECK(ready_within(read));
    CHECK(read.wait() == MiB);
    CHECK(back == data);
    CHECK_FALSE(slow.ready());
    tier.set_rate(io_direction::write, {});  // lift the limit: the write finishes promptly
    CHECK(ready_within(slow));
}

TEST_CASE("throttled_tier: joint scope makes reads and writes share one budget") {
    constexpr double rate = 20e6;
    throttled_tier<host_tier> tier(throttle_config::joint({rate, 64 * KiB}));
    auto data = test::random_bytes(512 * KiB, 4);
    tier.inner().write("r", data).wait();
    std::vector<std::vector<std::byte>> backs(4, std::vector<std::byte>(512 * KiB));
    std::vector<io_completion> ops;
    auto t0 = clock_type::now();
    for (int i = 0; i < 4; ++i) {
        ops.push_back(tier.write(std::string("w") + std::to_string(i), data));
        ops.push_back(tier.read("r", backs[static_cast<std::size_t>(i)]));
    }
    for (auto& c : ops) c.wait();
    // 4 MiB in all through one 20 MB/s bucket: at least (4 MiB - 64 KiB) / rate = 0.206 s.
    CHECK(seconds_since(t0) >= 0.95 * (4.0 * MiB - 64 * KiB) / rate);
    for (auto& b : backs) CHECK(b == data);
}

TEST_CASE("throttled_tier: set_rate takes effect at once, also for queued operations") {
    throttled_tier<host_tier> tier(throttle_config::joint({1e3, 4 * KiB}));
    auto data = test::random_bytes(MiB, 5);
    auto c = tier.write("k", data);  // about 17 minutes at 1 KB/s
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(c.ready());
    tier.set_rate(bandwidth_limit{1e9, 4 * KiB});
    CHECK(ready_within(c));  // the queued write was released at the new rate
    c.wait();
    auto t0 = clock_type::now();

    // Lowering the rate mid-run slows the operations that follow.
    tier.set_rate(bandwidth_limit{1e9, 4 * KiB});
    auto small = test::random_bytes(64 * KiB, 6);
    for (int i = 0; i < 4; ++i) tier.write(std::string("a") + std::to_string(i), small).wait();
    tier.set_rate(bandwidth_limit{2e6, 4 * KiB});
    CHECK(tier.config().read.bytes_per_second == 2e6);
    t0 = clock_type::now();
    for (int i = 0; i < 4; ++i) tier.write(std::string("b") + std::to_string(i), small).wait();
    double slow = seconds_since(t0);
    // 4 x 64 KiB at 2 MB/s, less one burst: at least 0.12 s.
    CHECK(slow >= 0.95 * (4.0 * 64 * KiB - 4 * KiB) / 2e6);
}

TEST_CASE("throttled_tier: set_rate from another thread while operations are issued") {
    throttled_tier<host_tier> tier(throttle_config::joint({50e6, 64 * KiB}));
    auto data = test::random_bytes(32 * KiB, 7);
    std::atomic<bool> done{false};
    std::thread changer([&] {
        double r = 50e6;
        while (!done.load()) {
            r = r > 100e6 ? 50e6 : r * 1.5;
            tier.set_rate(bandwidth_limit{r, 64 * KiB});
            std::this_thread::sleep_for(std::chrono::microseconds(500));
        }
    });
    std::vector<std::byte> back(data.size());
    for (int i = 0; i < 64; ++i) {
        auto key = std::string("k") + std::to_string(i % 8);
        tier.write(key, data).wait();
        tier.read(key, back).wait();
        REQUIRE(back == data);
    }
    done = true;
    changer.join();
    CHECK(tier.stats().writes == 64);
    CHECK(tier.stats().reads == 64);
}

TEST_CASE("throttled_tier: destruction releases queued operations and waits for them") {
    auto data = test::random_bytes(256 * KiB, 8);
    std::vector<io_completion> ops;
    auto t0 = clock_type::now();
    {
        throttled_tier<host_tier> tier(throttle_config::joint({1e3, KiB}));  // hours for all of it
        for (int i = 0; i < 8; ++i)
            ops.push_back(tier.write(std::string("k") + std::to_string(i), data));
        CHECK_FALSE(ops.back().ready());
    }
    CHECK(seconds_since(t0) < within_limit.count());  // not the hours the bucket asked for
    for (auto& c : ops) {
        CHECK(c.ready());
        CHECK(c.wait() == data.size());
    }
}

TEST_CASE("throttled_tier: errors of the inner tier pass through and are counted") {
    throttled_tier<host_tier> tier(throttle_config::joint({100e6, MiB}), std::in_place, 1000,
                                   "small");
    CHECK(tier.name() == "throttled(small)");
    CHECK(tier.capacity() == 1000);
    std::vector<std::byte> back(10);
    try {
        tier.read("missing", back).wait();
        FAIL("read of a missing key succeeded");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ENOENT);
        CHECK(std::string(e.what()).find("'missing'") != std::string::npos);
    }
    auto big = test::random_bytes(2000, 9);
    try {
        tier.write("big", big).wait();
        FAIL("a write past the capacity succeeded");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ENOSPC);
        const std::string w = e.what();
        CHECK(w.find("'big'") != std::string::npos);
        CHECK(w.find("2000 bytes") != std::string::npos);
        CHECK(w.find("capacity of 1000 bytes") != std::string::npos);
    }
    auto s = tier.stats();
    CHECK(s.failed_reads == 1);
    CHECK(s.failed_writes == 1);
    CHECK(s.reads == 0);
    CHECK(s.writes == 0);
}

TEST_CASE("throttled_tier: a bad configuration is refused with a clear message") {
    using std::invalid_argument;
    CHECK_THROWS_WITH_AS(
        throttled_tier<host_tier>(throttle_config::joint({0.0, KiB})),
        doctest::Contains("read rate must be a positive number of bytes per second"),
        invalid_argument);
    CHECK_THROWS_WITH_AS(
        throttled_tier<host_tier>(throttle_config::joint({-5.0, KiB})),
        doctest::Contains("read rate must be a positive number of bytes per second"),
        invalid_argument);
    CHECK_THROWS_WITH_AS(throttled_tier<host_tier>(throttle_config::joint({-5.0, KiB})),
                         doctest::Contains("got -5"), invalid_argument);
    // The write limit is named as such, with its value.
    CHECK_THROWS_WITH_AS(
        throttled_tier<host_tier>(throttle_config::separate({1e6, KiB}, {-7.0, KiB})),
        doctest::Contains(
            "write rate must be a positive number of bytes per second (infinity for no "
            "limit), got -7"),
        invalid_argument);
    CHECK_THROWS_WITH_AS(throttled_tier<host_tier>(throttle_config::joint({1e6, 0})),
                         doctest::Contains("read burst_bytes must be positive, got 0"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(throttled_tier<host_tier>(throttle_config::separate({1e6, KiB}, {1e6, 0})),
                         doctest::Contains("write burst_bytes must be positive, got 0"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(
        (throttled_tier<host_tier>(throttle_config{throttle_scope::joint, {1e6, KiB}, {2e6, KiB}})),
        doctest::Contains("a joint throttle has one bucket, but the read and write limits differ "
                          "(read 1000000.000000 bytes/s, burst 1024; write 2000000.000000 bytes/s"),
        invalid_argument);
    try {
        throttled_tier<host_tier> t(throttle_config::joint({std::nan(""), KiB}));
        FAIL("NaN rate accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("read rate") != std::string::npos);
        CHECK(std::string(e.what()).find("got " + std::to_string(std::nan(""))) !=
              std::string::npos);
    }
    throttled_tier<host_tier> joint(throttle_config::joint({1e6, KiB}));
    CHECK_THROWS_WITH_AS(joint.set_rate(io_direction::read, {2e6, KiB}),
                         doctest::Contains("needs a separate throttle; this one is joint"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(joint.set_rate(throttle_config::separate({}, {})),
                         doctest::Contains("the throttle scope is fixed at construction"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(joint.set_rate(bandwidth_limit{0.0, KiB}), doctest::Contains("read rate"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(joint.set_rate(bandwidth_limit{0.0, KiB}), doctest::Contains("got 0"),
                         invalid_argument);
    CHECK(joint.config().read.bytes_per_second == 1e6);  // unchanged by the refused calls
}

TEST_CASE("throttled_tier composes with faulty_tier in either order") {
    throttled_tier<faulty_tier<host_tier>> a(throttle_config::joint({1e9, MiB}), std::in_place,
                                             std::in_place);
    a.inner().fail_nth(fault_op::write, 1, EIO);
    auto data = test::random_bytes(100, 10);
    CHECK_THROWS_AS(a.write("k", data).wait(), std::system_error);
    a.write("k", data).wait();
    CHECK(a.size_of("k") == 100u);

    faulty_tier<throttled_tier<host_tier>> b(std::in_place, throttle_config::joint({1e9, MiB}));
    CHECK(b.name() == "faulty(throttled(host))");
    b.fail_always(fault_op::read, EIO);
    b.write("k", data).wait();
    std::vector<std::byte> back(100);
    CHECK_THROWS_AS(b.read("k", back).wait(), std::system_error);
    b.clear_faults();
    b.read("k", back).wait();
    CHECK(back == data);
    CHECK(b.inner().inner().contains("k"));
}

namespace {
/// A host tier whose reads complete only once open() is called (a device as slow as the test
/// wants, with no clock involved); its writes complete at once.
struct slow_read_inner : test::host_tier_wrapper {
    std::promise<void> gate;
    std::shared_future<void> opened = gate.get_future().share();
    std::vector<std::thread> pending;
    void open() { gate.set_value(); }
    ~slow_read_inner() {
        for (auto& t : pending) t.join();
    }
    io_completion write(std::string_view k, std::span<const std::byte> b) {
        return inner.write(k, b);
    }
    io_completion read(std::string_view k, std::span<std::byte> b) {
        completion_source source;
        auto handle = source.handle();
        pending.emplace_back([this, source, k = std::string(k), b]() mutable {
            opened.wait();
            try {
                source.succeed(inner.read(k, b).wait());
            } catch (...) {
                source.fail(std::current_exception());
            }
        });
        return handle;
    }
};
}  // namespace

TEST_CASE("throttled_tier: in separate scope a slow inner read never holds up a write") {
    // The release of an operation must not wait for another operation's inner completion:
    // a write (unlimited here) behind a read whose device does not answer until the test
    // opens it completes all the same.
    throttled_tier<slow_read_inner> t(throttle_config::separate({}, {}), std::in_place);
    std::vector<std::byte> blob(4096, std::byte{1}), back(4096);
    t.write("k", blob).wait();
    auto slow = t.read("k", back);
    auto write = t.write("k2", blob);
    const bool write_done = ready_within(write);  // (a write held by the read: never)
    CHECK(write_done);
    CHECK_FALSE(slow.ready());  // the read is still on its device
    t.inner().open();
    CHECK(slow.wait() == 4096);
    CHECK(back == blob);
}
