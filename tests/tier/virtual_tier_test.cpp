// SPDX-License-Identifier: Apache-2.0
// virtual_tier specifics (the shared storage_tier behaviour is in the conformance suite):
// both ways of naming children, placement by bandwidth (given and probed), adaptation to a
// child that slows down, interleaving around a busy child, fail-over, per-child reports.
// No test asserts on the machine's speed: the probe and the adaptation are driven by
// children whose stats() report a bandwidth the test sets (rated_tier), and the waits have
// bounds only a hang could break.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <spillway/lock/lock_policy.hpp>
#include <spillway/lock/node_lock.hpp>
#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include "support/host_tier_wrapper.hpp"
#include "support/random_bytes.hpp"
#include "support/tier_io.hpp"
#include "support/temp_dir.hpp"

using namespace spillway;
using spillway::test::random_bytes;
using namespace spillway::test;

namespace {
constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

using throttled_host = throttled_tier<host_tier>;
throttle_config limit(double bytes_per_second, std::size_t burst) {
    return throttle_config::separate({bytes_per_second, burst}, {bytes_per_second, burst});
}

/// A host tier whose stats() count each transfer as taking nbytes / rate seconds, for rates
/// the test sets (and changes at any time): the bandwidth the virtual tier measures is the
/// test's, exactly, however busy the machine is. Transfers themselves run at memory speed.
class rated_tier : public test::host_tier_wrapper {
public:
    rated_tier(double read_rate, double write_rate, std::string name)
        : read_rate_(read_rate), write_rate_(write_rate), name_(std::move(name)) {}
    io_completion write(std::string_view k, std::span<const std::byte> b) {
        return count(io_direction::write, b.size(), inner.write(k, b));
    }
    io_completion read(std::string_view k, std::span<std::byte> b) {
        return count(io_direction::read, b.size(), inner.read(k, b));
    }
    [[nodiscard]] tier_stats stats() const {
        std::lock_guard lock(mutex_);
        return stats_;
    }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    void set_rates(double read_rate, double write_rate) {
        std::lock_guard lock(mutex_);
        read_rate_ = read_rate;
        write_rate_ = write_rate;
    }

private:
    io_completion count(io_direction dir, std::size_t n, io_completion inner_done) {
        inner_done.wait();  // (errors are not counted: the tests here make none)
        std::lock_guard lock(mutex_);
        const double secs =
            static_cast<double>(n) / (dir == io_direction::read ? read_rate_ : write_rate_);
        if (dir == io_direction::read) {
            stats_.bytes_read += n;
            ++stats_.reads;
            stats_.read_busy_seconds += secs;
        } else {
            stats_.bytes_written += n;
            ++stats_.writes;
            stats_.write_busy_seconds += secs;
        }
        return io_completion::completed(n);
    }
    mutable std::mutex mutex_;
    double read_rate_, write_rate_;
    tier_stats stats_;
    std::string name_;
};
static_assert(storage_tier<rated_tier>);

/// A host tier whose stats() count nothing, as a user's tier might.
struct uncounted_tier : test::host_tier_wrapper {
    io_completion write(std::string_view k, std::span<const std::byte> b) {
        return inner.write(k, b);
    }
    io_completion read(std::string_view k, std::span<std::byte> b) { return inner.read(k, b); }
    [[nodiscard]] tier_stats stats() const { return {}; }
};
static_assert(storage_tier<uncounted_tier>);
}  // namespace

static_assert(storage_tier<virtual_tier<null_lock, host_tier, throttled_host>>);
static_assert(storage_tier<virtual_tier<node_lock, std::vector<host_tier>>>);
static_assert(storage_tier<virtual_tier<thread_lock, host_tier&, faulty_tier<host_tier>&>>);
static_assert(!virtual_tier<null_lock, host_tier>::properties.persistent);

TEST_CASE("virtual_tier: compile-time children built in place, borrowed, or default") {
    auto data = random_bytes(5000, 1);
    SUBCASE("built in place from child_args") {
        virtual_tier<thread_lock, host_tier, throttled_host> vt(
            fixed({1, 1}), child_args(std::size_t{1} << 30, "fast"),
            child_args(limit(1e9, MiB), std::in_place, std::size_t{1} << 30, "slow"));
        put(vt, "a", data);
        CHECK(get(vt, "a", data.size()) == data);
        CHECK(vt.child<0>().name() == "fast");
        CHECK(vt.child<1>().name() == "throttled(slow)");
        CHECK(vt.child_count() == 2);
    }
    SUBCASE("borrowed") {
        host_tier a(SIZE_MAX, "a"), b(SIZE_MAX, "b");
        {
            virtual_tier<null_lock, host_tier&, host_tier&> vt(fixed({1, 1}), a, b);
            put(vt, "x", data);
            put(vt, "y", data);
        }
        CHECK(a.contains("x"));  // the blobs stay in the borrowed children
        CHECK(b.contains("y"));
    }
    SUBCASE("default-constructed") {
        virtual_tier<null_lock, host_tier, host_tier, host_tier> vt(fixed({1, 1, 1}));
        for (std::size_t i = 0; i < 6; ++i) put(vt, key_of(i), data);
        CHECK(keys_per_child(vt) == std::vector<std::size_t>{2, 2, 2});
    }
}

TEST_CASE("virtual_tier: a run-time list of children of one type") {
    auto data = random_bytes(777, 2);
    SUBCASE("from a range of constructor arguments") {
        std::vector<std::tuple<std::size_t, std::string>> args{
            {MiB, "p0"}, {MiB, "p1"}, {MiB, "p2"}, {MiB, "p3"}};
        virtual_tier<thread_lock, std::vector<host_tier>> vt(fixed({1, 1, 1, 1}), args);
        REQUIRE(vt.child_count() == 4);
        for (std::size_t i = 0; i < 8; ++i) put(vt, key_of(i), data);
        for (std::size_t i = 0; i < 4; ++i) CHECK(vt.child(i).used() == 2 * data.size());
        CHECK(vt.child(3).name() == "p3");
        CHECK_THROWS_AS(vt.child(4), std::out_of_range);
    }
    SUBCASE("from a count and a factory") {
        virtual_tier<null_lock, std::vector<host_tier>> vt(fixed({2, 1}), 2, [](std::size_t i) {
            return host_tier(SIZE_MAX, std::string("path") + std::to_string(i));
        });
        for (std::size_t i = 0; i < 9; ++i) put(vt, key_of(i), data);
        CHECK(keys_per_child(vt) == std::vector<std::size_t>{6, 3});
    }
    SUBCASE("from children built by the caller") {
        std::vector<std::unique_ptr<host_tier>> kids;
        kids.push_back(std::make_unique<host_tier>());
        virtual_tier<null_lock, std::vector<host_tier>> vt(fixed({1}), std::move(kids));
        put(vt, "only", data);
        CHECK(vt.child(0).contains("only"));
    }
}

TEST_CASE("virtual_tier: placement follows the given bandwidth ratio exactly") {
    auto data = random_bytes(1000, 3);
    virtual_tier<null_lock, host_tier, host_tier, host_tier> vt(fixed({3, 0, 1}));
    for (std::size_t i = 0; i < 40; ++i) put(vt, key_of(i), data);
    CHECK(keys_per_child(vt) == std::vector<std::size_t>{30, 0, 10});  // 40 * 3/4, 0, 40 * 1/4
    CHECK(vt.child<1>().used() == 0);  // the zero-bandwidth child got nothing
    // The blobs are where the index says, and each child holds exactly its own keys.
    std::size_t on0 = 0;
    for (std::size_t i = 0; i < 40; ++i) {
        auto c = vt.child_of(key_of(i));
        REQUIRE(c.has_value());
        if (*c == 0) {
            CHECK(vt.child<0>().contains(key_of(i)));
            ++on0;
        } else {
            CHECK(vt.child<2>().contains(key_of(i)));
        }
    }
    CHECK(on0 == 30);
    CHECK(vt.target_split(40) == split_by_bandwidth(40, {3.0, 0.0, 1.0}));
    // Erasing keeps the count; a rewrite under a fixed ratio moves nothing.
    CHECK(vt.erase(key_of(0)));
    CHECK_FALSE(vt.contains(key_of(0)));
    for (std::size_t i = 1; i < 40; ++i) put(vt, key_of(i), data);
    auto r = vt.report();
    CHECK(r[0].keys + r[2].keys == 39);
    CHECK(vt.used() == 39 * data.size());
}

TEST_CASE("virtual_tier: the construction probe measures each child") {
    SUBCASE("it takes the bandwidth each child reports, and places by it") {
        // Children at 4:1 (write) and 2:1 (read), as their stats() report them.
        virtual_tier_options o;
        o.probe_nbytes = 64 * KiB;
        virtual_tier<thread_lock, rated_tier, rated_tier> vt(o, child_args(40e6, 10e6, "fast"),
                                                             child_args(20e6, 2.5e6, "slow"));
        auto r = vt.report();
        CHECK(r[0].write_bandwidth == doctest::Approx(10e6).epsilon(1e-9));
        CHECK(r[1].write_bandwidth == doctest::Approx(2.5e6).epsilon(1e-9));
        CHECK(r[0].read_bandwidth == doctest::Approx(40e6).epsilon(1e-9));
        CHECK(r[1].read_bandwidth == doctest::Approx(20e6).epsilon(1e-9));
        // weight = 1 / (1/read + 1/write): 8e6 and 2.2222e6.
        CHECK(r[0].weight == doctest::Approx(8e6).epsilon(1e-9));
        CHECK(r[1].weight == doctest::Approx(20e6 / 9).epsilon(1e-9));
        CHECK(vt.target_split(20) == split_by_bandwidth(20, {8e6, 20e6 / 9}));
        CHECK(vt.target_split(20) == std::vector<std::size_t>{16, 4});
        CHECK(vt.child<0>().used() == 0);  // the probe blob is gone
        CHECK(vt.child<1>().used() == 0);
        CHECK(vt.child<0>().stats().writes == 4);  // one warm-up and three timed, each way
        CHECK(vt.child<0>().stats().reads == 4);
    }
    SUBCASE("throttled children: the probe never reads more than their limits") {
        // A throttle counts issue to release. The bucket's burst is small beside the probe
        // transfer, so a pause between transfers (a busy machine) cannot flatter one. Only
        // upper bounds: a busy machine can make a path look slower, never faster.
        const double fast = 20e6, slow = 5e6;
        virtual_tier_options o;
        o.probe_nbytes = 128 * KiB;
        virtual_tier<thread_lock, throttled_host, throttled_host> vt(
            o, child_args(limit(fast, 8 * KiB), std::in_place),
            child_args(limit(slow, 8 * KiB), std::in_place));
        auto r = vt.report();
        MESSAGE("probed: " << r[0].write_bandwidth / 1e6 << " and " << r[1].write_bandwidth / 1e6
                           << " MB/s written, " << r[0].read_bandwidth / 1e6 << " and "
                           << r[1].read_bandwidth / 1e6 << " MB/s read");
        for (std::size_t i = 0; i < 2; ++i) {
            const double cap = 1.1 * (i == 0 ? fast : slow);
            CHECK(r[i].write_bandwidth > 0);
            CHECK(r[i].write_bandwidth <= cap);
            CHECK(r[i].read_bandwidth > 0);
            CHECK(r[i].read_bandwidth <= cap);
            CHECK(r[i].health == child_health::healthy);
        }
        CHECK(vt.child<0>().used() == 0);
        CHECK(vt.child<1>().used() == 0);
    }
    SUBCASE("a child whose stats() count nothing is timed by the tier") {
        virtual_tier_options o;
        o.probe_nbytes = 64 * KiB;
        virtual_tier<null_lock, uncounted_tier> vt(o, child_args());
        CHECK(vt.report()[0].write_bandwidth > 0);
        CHECK(vt.report()[0].read_bandwidth > 0);
        auto data = random_bytes(4 * KiB, 11);
        put(vt, "k", data);
        CHECK(get(vt, "k", data.size()) == data);
    }
}

namespace {
// Writes every key once with write_batch and waits for all of them.
template <class Tier>
void pass(Tier& vt, std::size_t keys, const std::vector<std::byte>& data) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < keys; ++i) names.push_back(key_of(i));
    std::vector<write_request> reqs;
    for (auto& n : names) reqs.push_back({n, data});
    for (auto& c : vt.write_batch(reqs)) CHECK(c.wait() == data.size());
}
}  // namespace

TEST_CASE("virtual_tier: after a child slows down, the next pass moves keys off it") {
    // Two children that report 1 MB/s each, then one of them a quarter of that. A transfer
    // counts 65 ms (262 ms slowed) of busy time against the estimate's 0.5 s window, so one
    // pass at the new rate carries the estimate to within 2% of it. Every figure is the
    // test's: the decisions below come out the same on any machine.
    const std::size_t blob = 64 * KiB, keys = 20;
    const double rate = 1e6;
    auto data = random_bytes(blob, 4);
    auto make_opts = [&](placement_mode mode) {
        virtual_tier_options o = fixed({1, 1});
        o.placement = mode;
        return o;
    };
    virtual_tier<thread_lock, rated_tier, rated_tier> vt(make_opts(placement_mode::adaptive),
                                                         child_args(rate, rate, "a"),
                                                         child_args(rate, rate, "b"));
    virtual_tier<thread_lock, rated_tier, rated_tier> still(
        make_opts(placement_mode::fixed), child_args(rate, rate, "a"), child_args(rate, rate, "b"));
    for (int p = 0; p < 2; ++p) {
        pass(vt, keys, data);
        pass(still, keys, data);
    }
    CHECK(keys_per_child(vt) == std::vector<std::size_t>{10, 10});
    CHECK(vt.report()[1].write_bandwidth == doctest::Approx(rate).epsilon(1e-9));

    // Path b slows to a quarter. write_batch places at submission, so the pass during which
    // the estimate learns it still runs on the old split; the next one moves keys.
    vt.child<1>().set_rates(rate, rate / 4);
    still.child<1>().set_rates(rate, rate / 4);
    pass(vt, keys, data);
    CHECK(keys_per_child(vt) == std::vector<std::size_t>{10, 10});
    auto r = vt.report();
    MESSAGE("estimates after one slow pass: " << r[0].write_bandwidth / 1e6 << " and "
                                              << r[1].write_bandwidth / 1e6 << " MB/s");
    CHECK(r[0].write_bandwidth == doctest::Approx(rate).epsilon(1e-9));
    // Exactly the moving average of the samples the child reported: 20 transfers at the
    // full rate, 10 at a quarter, one sample each.
    bandwidth_estimate expected(virtual_tier_options{}.bandwidth_window_seconds);
    for (int i = 0; i < 20; ++i) expected.add(rate, static_cast<double>(blob) / rate);
    for (int i = 0; i < 10; ++i) expected.add(rate / 4, static_cast<double>(blob) / (rate / 4));
    CHECK(r[1].write_bandwidth == doctest::Approx(expected.bytes_per_second()).epsilon(1e-9));
    CHECK(r[1].write_bandwidth == doctest::Approx(rate / 4).epsilon(0.02));
    pass(vt, keys, data);
    CHECK(keys_per_child(vt) == split_by_bandwidth(keys, {r[0].weight, r[1].weight}));
    CHECK(keys_per_child(vt) == std::vector<std::size_t>{16, 4});  // 20 at 4:1
    pass(vt, keys, data);                                          // and it stays there
    CHECK(keys_per_child(vt) == std::vector<std::size_t>{16, 4});

    // Without adaptation the split stays 1:1 (proves that the checks above measure
    // something).
    pass(still, keys, data);
    pass(still, keys, data);
    CHECK(keys_per_child(still) == std::vector<std::size_t>{10, 10});

    // The moves cost no extra I/O: every byte written was one pass's rewrite, and each key
    // has exactly one copy (old copies were erased after the new write completed).
    std::uint64_t written = 0;
    for (auto& c : vt.report()) written += c.moved.bytes_written;
    CHECK(written == 5 * keys * blob);
    CHECK(vt.child<0>().used() + vt.child<1>().used() == keys * blob);
    for (std::size_t i = 0; i < keys; ++i)
        CHECK(vt.child<0>().contains(key_of(i)) != vt.child<1>().contains(key_of(i)));
    for (std::size_t i = 0; i < keys; ++i) CHECK(get(vt, key_of(i), blob) == data);
}

TEST_CASE("virtual_tier: adaptation over throttled children moves keys off a slowed one") {
    // The same story over real throttles, for the path a user takes, with only a bound a
    // hang could break: the slowed child (an eighth of the rate) ends with fewer keys than
    // the other. Transfers are throttle-bound (26 ms, 210 ms slowed): the fast child would
    // have to look 6 times slower than it is, 150 ms lost per transfer, to fail it.
    const std::size_t blob = 64 * KiB, keys = 10;
    const double rate = 2.5e6;
    auto data = random_bytes(blob, 6);
    virtual_tier_options o = fixed({1, 1});
    o.placement = placement_mode::adaptive;
    virtual_tier<thread_lock, throttled_host, throttled_host> vt(
        o, child_args(limit(rate, 8 * KiB), std::in_place, SIZE_MAX, "a"),
        child_args(limit(rate, 8 * KiB), std::in_place, SIZE_MAX, "b"));
    pass(vt, keys, data);
    vt.child<1>().set_rate(bandwidth_limit{rate / 8, 8 * KiB});
    pass(vt, keys, data);
    pass(vt, keys, data);
    auto split = keys_per_child(vt);
    MESSAGE("split after the slow-down: " << split[0] << "/" << split[1]);
    CHECK(split[1] < split[0]);
    CHECK(split[0] + split[1] == keys);
    for (std::size_t i = 0; i < keys; ++i) CHECK(get(vt, key_of(i), blob) == data);
}

TEST_CASE("virtual_tier: a worker serves a free child while another child's lock is taken") {
    test::temp_dir dir("vt-locks");
    virtual_tier_options o = fixed({1, 1}, "busy");
    o.locks.directory = dir.path();
    o.workers = 2;
    virtual_tier<node_lock, host_tier, host_tier> vt(o);
    auto data = random_bytes(4 * KiB, 5);
    // Another party (its own node_lock object: another open file description, as another
    // process would have) holds child 0's write lock.
    node_lock other("busy.0.write", o.locks);
    other.lock();
    std::vector<std::string> names;
    for (std::size_t i = 0; i < 6; ++i) names.push_back(key_of(i));
    std::vector<write_request> reqs;
    for (auto& n : names) reqs.push_back({n, data});
    auto done = vt.write_batch(reqs);  // placed 0, 1, 0, 1, 0, 1
    for (std::size_t i = 1; i < 6; i += 2)
        CHECK(done[i].wait() == data.size());  // child 1 served first
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (std::size_t i = 0; i < 6; i += 2)
        CHECK_FALSE(done[i].ready());  // child 0 waits for its lock
    // Reads and writes are excluded separately: child 1's read lock taken does not stop a
    // write there (k1 stays on child 1: it is not above its share).
    node_lock reader("busy.1.read", o.locks);
    reader.lock();
    CHECK(vt.write("k1", data).wait() == data.size());
    CHECK(vt.child_of("k1") == std::size_t{1});
    std::vector<std::byte> back(data.size());
    auto blocked_read = vt.read("k3", back);  // child 1's reader is locked out
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK_FALSE(blocked_read.ready());
    reader.unlock();
    CHECK(blocked_read.wait() == data.size());
    other.unlock();
    for (std::size_t i = 0; i < 6; i += 2) CHECK(done[i].wait() == data.size());
    for (auto& n : names) CHECK(get(vt, n, data.size()) == data);
}

TEST_CASE(
    "virtual_tier: a lock held outside the tier wakes its waiter when released, without polling") {
    test::temp_dir dir("vt-wake");
    virtual_tier_options o = fixed({1, 1}, "wake");
    o.locks.directory = dir.path();
    o.workers = 2;
    // A poll this slow would finish the write below more than a second after the release
    // (the awake worker's back-off doubles from 20 us: its scans fall at 0.33, 0.66, 1.31
    // and 2.62 s; the release comes after 1.5 s).
    o.poll_interval = std::chrono::seconds(5);
    virtual_tier<node_lock, host_tier, host_tier> vt(o);
    auto data = random_bytes(4 * KiB, 9);
    node_lock other("wake.0.write", o.locks);  // another process, as far as the tier can tell
    other.lock();
    auto waiting =
        vt.write_batch(std::vector<write_request>{{"w0", data}, {"w1", data}});  // placed 0, 1
    CHECK(waiting[1].wait() == data.size());  // the other child is served meanwhile
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK_FALSE(waiting[0].ready());
    auto released = std::chrono::steady_clock::now();
    other.unlock();
    CHECK(waiting[0].wait() == data.size());
    auto delay = std::chrono::steady_clock::now() - released;
    MESSAGE("woken " << std::chrono::duration<double, std::milli>(delay).count()
                     << " ms after the release");
    // Generous (a wake takes well under a ms): only a missed wake, left to the poll at
    // 2.62 s, or a hang breaks it.
    CHECK(delay < std::chrono::milliseconds(500));
    CHECK(get(vt, "w0", data.size()) == data);
    // The tier's own release wakes its other workers too (no external holder involved).
    auto batch = vt.write_batch(
        std::vector<write_request>{{"a", data}, {"b", data}, {"c", data}, {"d", data}});
    for (auto& d : batch) CHECK(d.wait() == data.size());
}

TEST_CASE("virtual_tier: a failed write goes to another child and the failed child is degraded") {
    using faulty_host = faulty_tier<host_tier>;
    virtual_tier<thread_lock, faulty_host, host_tier> vt(
        fixed({1, 1}, "fo"), child_args(std::in_place, SIZE_MAX, "flaky"),
        child_args(SIZE_MAX, "steady"));
    std::vector<std::vector<std::byte>> blobs;
    for (std::size_t i = 0; i < 10; ++i) {
        blobs.push_back(random_bytes(10 * KiB + i, 100 + i));
        put(vt, key_of(i), blobs[i]);
    }
    CHECK(keys_per_child(vt) == std::vector<std::size_t>{5, 5});

    SUBCASE("EIO: every write fails over, nothing is lost") {
        vt.child<0>().fail_always(fault_op::write, EIO);
        for (std::size_t i = 0; i < 10; ++i) {
            blobs[i] = random_bytes(10 * KiB + i, 200 + i);
            auto copy = blobs[i];
            put(vt, key_of(i), blobs[i]);
            CHECK(blobs[i] == copy);  // the caller's buffer is untouched
        }
        auto r = vt.report();
        CHECK(r[0].health == child_health::degraded);
        CHECK(has(r[0].fault, "EIO"));
        CHECK(r[1].health == child_health::healthy);
        CHECK(keys_per_child(vt) == std::vector<std::size_t>{0, 10});
        CHECK(vt.child<0>().used() == 0);  // old copies erased after the new writes landed
        for (std::size_t i = 0; i < 10; ++i) CHECK(get(vt, key_of(i), blobs[i].size()) == blobs[i]);
        CHECK(r[0].moved.failed_writes >= 1);
        // restore() lets the child take keys again once it works.
        vt.child<0>().clear_faults();
        vt.restore(0);
        for (std::size_t i = 0; i < 10; ++i) put(vt, key_of(i), blobs[i]);
        CHECK(keys_per_child(vt) == std::vector<std::size_t>{5, 5});
    }
    SUBCASE("ENOSPC on one write") {
        vt.child<0>().fail_nth(fault_op::write, 1, ENOSPC);
        put(vt, key_of(0), blobs[0]);  // was on child 0
        CHECK(vt.child_of(key_of(0)) == std::size_t{1});
        CHECK(vt.report()[0].health == child_health::degraded);
        CHECK(has(vt.report()[0].fault, "ENOSPC"));
        CHECK(get(vt, key_of(0), blobs[0].size()) == blobs[0]);
    }
    SUBCASE("a read whose only copy is on a failing child names the key and the child") {
        vt.child<0>().fail_always(fault_op::read, EIO);
        auto on0 = key_of(0);
        REQUIRE(vt.child_of(on0) == std::size_t{0});
        std::vector<std::byte> back(blobs[0].size());
        auto msg = message_of(vt.read(on0, back));
        CHECK(has(msg, "'k0'"));
        CHECK(has(msg, "child 0"));
        CHECK(has(msg, "faulty(flaky)"));
        CHECK(has(msg, "EIO"));
        try {
            vt.read(on0, back).wait();
        } catch (const std::system_error& e) {
            CHECK(e.code().value() == EIO);
        }
        CHECK(vt.report()[0].health == child_health::degraded);
        CHECK(get(vt, key_of(1), blobs[1].size()) == blobs[1]);  // child 1's keys are fine
    }
    SUBCASE("when every child fails, the write fails naming each, and the old blob stays") {
        auto fresh = random_bytes(10 * KiB, 9);
        virtual_tier<thread_lock, faulty_host, faulty_host> both(
            fixed({1, 1}, "dead"), child_args(std::in_place), child_args(std::in_place));
        put(both, "k", blobs[0]);
        both.child<0>().fail_always(fault_op::write, EIO);
        both.child<1>().fail_always(fault_op::write, ENOSPC);
        auto msg = message_of(both.write("k", fresh));
        CHECK(has(msg, "'k'"));
        CHECK(has(msg, "child 0"));
        CHECK(has(msg, "child 1"));
        CHECK(has(msg, "EIO"));
        CHECK(has(msg, "ENOSPC"));
        CHECK(get(both, "k", blobs[0].size()) == blobs[0]);
        CHECK(both.stats().failed_writes == 1);
        // With both degraded, a new key is refused at once with the health of each.
        auto refused = message_of(both.write("new", fresh));
        CHECK(has(refused, "degraded"));
        CHECK_FALSE(both.contains("new"));
    }
}

TEST_CASE("virtual_tier: blobs a child already holds are found and adopted") {
    host_tier a(SIZE_MAX, "a"), b(SIZE_MAX, "b");
    auto old = random_bytes(300, 7);
    b.write("old", old).wait();
    virtual_tier<null_lock, host_tier&, host_tier&> vt(fixed({1, 1}), a, b);
    CHECK(vt.contains("old"));
    CHECK(vt.size_of("old") == old.size());
    CHECK(get(vt, "old", old.size()) == old);
    CHECK(vt.child_of("old") == std::size_t{1});
    CHECK(vt.erase("old"));
    CHECK_FALSE(b.contains("old"));
    CHECK_FALSE(vt.erase("old"));
}

namespace {
/// A host tier that can turn read-only, as a file system remounted read-only after errors:
/// writes fail with EROFS and erase() throws, while reads still work.
struct read_only_able_tier : test::host_tier_wrapper {
    static constexpr tier_properties properties{
        .persistent = true, .direct_io = false, .host_accessible = true};
    bool read_only = false;
    io_completion write(std::string_view k, std::span<const std::byte> b) {
        if (read_only)
            return io_completion::failed(std::make_exception_ptr(std::system_error(
                EROFS, std::generic_category(), "disk: write of " + std::string(k))));
        return inner.write(k, b);
    }
    io_completion read(std::string_view k, std::span<std::byte> b) { return inner.read(k, b); }
    bool erase(std::string_view k) {
        if (read_only)
            throw std::system_error(EROFS, std::generic_category(),
                                    "disk: erase of " + std::string(k));
        return inner.erase(k);
    }
};
static_assert(storage_tier<read_only_able_tier>);
}  // namespace

TEST_CASE("virtual_tier: a stale copy that its child refused to erase never comes back") {
    // A rewrite fails over from a child gone read-only; erasing the old copy there fails too.
    // The old copy must not be adopted again (after erase(key), contains() looked the key up
    // in the children and found it), and is erased once the child allows it.
    read_only_able_tier disk;
    host_tier other(SIZE_MAX, "other");
    virtual_tier<null_lock, read_only_able_tier&, host_tier&> vt(fixed({1, 0}), disk, other);
    const auto v1 = random_bytes(4 * KiB, 1), v2 = random_bytes(4 * KiB, 2);
    put(vt, "k", v1);
    REQUIRE(vt.child_of("k") == std::size_t{0});
    disk.read_only = true;
    put(vt, "k", v2);  // fails over to child 1; child 0 keeps v1
    CHECK(vt.child_of("k") == std::size_t{1});
    CHECK(disk.inner.contains("k"));
    CHECK(get(vt, "k", v2.size()) == v2);
    CHECK(vt.erase("k"));
    CHECK_FALSE(vt.contains("k"));  // not adopted from child 0
    CHECK_FALSE(vt.size_of("k"));
    std::vector<std::byte> back(v1.size());
    CHECK(has(message_of(vt.read("k", back)), "no such key"));
    // Writable again: the next erase of the key takes the stale copy with it.
    disk.read_only = false;
    vt.restore(0);
    CHECK_FALSE(vt.erase("k"));
    CHECK_FALSE(disk.inner.contains("k"));
    CHECK(vt.used() == 0);

    SUBCASE("a later write of the key to that child replaces the stale copy") {
        put(vt, "j", v1);
        disk.read_only = true;
        put(vt, "j", v2);  // child 1; child 0 keeps a stale v1
        disk.read_only = false;
        vt.restore(0);
        put(vt, "j", v1);  // back on child 0 (its share): the stale copy is now the current one
        CHECK(vt.child_of("j") == std::size_t{0});
        CHECK(get(vt, "j", v1.size()) == v1);
        CHECK(vt.erase("j"));
        CHECK_FALSE(vt.contains("j"));
        CHECK(vt.used() == 0);
    }
}

TEST_CASE("virtual_tier: a key whose file vanished from its child is forgotten by the tier too") {
    test::temp_dir dir("vt-vanished");
    std::filesystem::create_directories(dir.path() / "a");
    std::filesystem::create_directories(dir.path() / "b");
    virtual_tier<null_lock, file_tier<>, file_tier<>> vt(
        fixed({1, 0}), child_args(dir.path() / "a"), child_args(dir.path() / "b"));
    const auto blob = random_bytes(4 * KiB, 3);
    put(vt, "k", blob);
    std::filesystem::remove(dir.path() / "a" / "k");  // deleted behind the tiers' backs
    std::vector<std::byte> back(blob.size());
    auto msg = message_of(vt.read("k", back));
    CHECK(has(msg, "'k'"));
    CHECK(has(msg, "deleted behind the tier's back"));
    CHECK_FALSE(vt.contains("k"));
    CHECK(keys_per_child(vt) == std::vector<std::size_t>{0, 0});
    CHECK(vt.report()[0].health == child_health::healthy);  // a missing file is not a failing path
    CHECK_FALSE(vt.erase("k"));
    put(vt, "k", blob);  // and the key can be written again
    CHECK(get(vt, "k", blob.size()) == blob);
}

TEST_CASE("virtual_tier: bad options are refused with a sentence naming the problem") {
    auto msg = [](auto&& fn) {
        try {
            fn();
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("no exception");
    };
    using vt2 = virtual_tier<null_lock, host_tier, host_tier>;
    CHECK(has(msg([] { vt2 v(fixed({1, 1, 1})); }), "3 bandwidths given for 2 children"));
    CHECK(has(msg([] { vt2 v(fixed({1, -1})); }), "path 1"));
    CHECK(has(msg([] { vt2 v(fixed({0, 0})); }), "bandwidth 0"));
    CHECK(has(msg([] {
                  auto o = fixed({1, 1});
                  o.lock_names = {"x"};
                  vt2 v(o);
              }),
              "1 lock names given for 2 children"));
    CHECK(has(msg([] {
                  auto o = fixed({1, 1});
                  o.bandwidth_window_seconds = 0;
                  vt2 v(o);
              }),
              "bandwidth_window_seconds"));
    CHECK(has(msg([] {
                  test::temp_dir dir(
                      "vt-lock-names");  // the lock "ok" opens before "../bad" is refused
                  auto o = fixed({1, 1});
                  o.lock_names = {"ok", "../bad"};
                  o.locks.directory = dir.path();
                  virtual_tier<node_lock, host_tier, host_tier> v(o);
              }),
              "'../bad.read'"));
}

TEST_CASE("virtual_tier: many threads, mixed sizes, every blob round-trips; stats add up") {
    virtual_tier<thread_lock, host_tier, throttled_host, host_tier> vt(
        fixed({2, 1, 1}), child_args(), child_args(limit(2e9, MiB), std::in_place), child_args());
    constexpr int threads = 4, per = 25;
    std::vector<std::thread> ts;
    std::atomic<int> bad{0};
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            for (int k = 0; k < per; ++k) {
                std::string key = "t";
                key.append(std::to_string(t)).append("-").append(std::to_string(k));
                auto data = random_bytes(1 + static_cast<std::size_t>(t * 977 + k * 131),
                                         static_cast<std::uint64_t>(t * 100 + k));
                vt.write(key, data).wait();
                std::vector<std::byte> back(data.size());
                vt.read(key, back).wait();
                if (back != data) bad.fetch_add(1);
            }
        });
    for (auto& t : ts) t.join();
    CHECK(bad.load() == 0);
    auto s = vt.stats();
    CHECK(s.writes == threads * per);
    CHECK(s.reads == threads * per);
    std::uint64_t moved = 0, stored = 0;
    for (auto& r : vt.report()) moved += r.moved.bytes_written;
    CHECK(moved == s.bytes_written);
    stored = vt.used();
    CHECK(stored == s.bytes_written);
    // Placement balances bytes over weights (finish times), key by key as they arrive: each
    // child ends within one blob below and n - 1 blobs above its ideal share of the bytes
    // (the child that finishes last took its last key when no other would have finished it
    // sooner).
    const double w[] = {2, 1, 1};
    const std::size_t largest = 1 + (threads - 1) * 977 + (per - 1) * 131;
    std::size_t total_bytes = 0;
    for (auto& r : vt.report()) total_bytes += r.bytes;
    CHECK(total_bytes == stored);
    const std::size_t used[] = {vt.child<0>().used(), vt.child<1>().used(), vt.child<2>().used()};
    for (auto& r : vt.report()) {
        const double ideal = static_cast<double>(stored) * w[r.index] / 4;
        CAPTURE(r.index);
        CHECK(static_cast<double>(r.bytes) + static_cast<double>(largest) >= ideal);
        CHECK(static_cast<double>(r.bytes) <= ideal + 2.0 * static_cast<double>(largest));
        CHECK(r.bytes == used[r.index]);
    }
}
