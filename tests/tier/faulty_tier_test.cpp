// SPDX-License-Identifier: Apache-2.0
// faulty_tier specifics: how faults are counted, armed and cleared, and the counters under
// concurrent use. The conformance suite runs every fault against every base tier.
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include "support/random_bytes.hpp"

using namespace spillway;

namespace {
/// Runs op().wait() and returns the errno of the std::system_error it threw (0: none).
template <class Op>
int error_of(Op&& op, std::string* message = nullptr) {
    try {
        op().wait();
        return 0;
    } catch (const std::system_error& e) {
        if (message) *message = e.what();
        return e.code().value();
    }
}
std::string key_of(int t, int i) {
    std::string k = "t";
    k += std::to_string(t);
    k += '-';
    k += std::to_string(i);
    return k;
}
bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}
}  // namespace

TEST_CASE("faulty_tier: fail_nth counts only the matching operations, from the call on") {
    faulty_tier<host_tier> tier;
    auto data = test::random_bytes(100, 1);
    std::vector<std::byte> back(100);
    tier.write("k", data).wait();  // before arming: not counted
    tier.fail_nth(fault_op::write, 3, EIO);
    CHECK(error_of([&] { return tier.write("k", data); }) == 0);
    CHECK(error_of([&] { return tier.read("k", back); }) == 0);  // reads do not count
    CHECK(error_of([&] { return tier.write("k", data); }) == 0);
    std::string msg;
    CHECK(error_of([&] { return tier.write("third", data); }, &msg) == EIO);
    CHECK(contains(msg, "faulty(host)"));
    CHECK(contains(msg, "write of key 'third'"));
    CHECK(contains(msg, "100 bytes"));
    CHECK(contains(msg, "EIO"));
    CHECK(error_of([&] { return tier.write("k", data); }) == 0);  // it fired once

    tier.fail_nth(fault_op::any, 2, ENOSPC);
    tier.fail_nth(fault_op::read, 1, EIO);
    CHECK(error_of([&] { return tier.read("k", back); }) == EIO);     // read #1, any #1
    CHECK(error_of([&] { return tier.write("k", data); }) == ENOSPC);  // any #2
    CHECK(error_of([&] { return tier.read("k", back); }) == 0);
    auto c = tier.counters();
    CHECK(c.injected_errors == 3);
    CHECK(c.operations == 9);  // the write before arming counts as an operation too
    CHECK(tier.stats().failed_writes == 2);
    CHECK(tier.stats().failed_reads == 1);
}

TEST_CASE("faulty_tier: an injected failure leaves the stored blob and the caller's buffers untouched") {
    faulty_tier<host_tier> tier;
    auto old_blob = test::random_bytes(4097, 2);
    tier.write("k", old_blob).wait();
    auto new_blob = test::random_bytes(5000, 3);
    auto new_copy = new_blob;
    tier.fail_nth(fault_op::write, 1, ENOSPC);
    CHECK(error_of([&] { return tier.write("k", new_blob); }) == ENOSPC);
    CHECK(new_blob == new_copy);
    CHECK(tier.size_of("k") == 4097u);

    std::vector<std::byte> back(4097, std::byte{0x5a});
    tier.fail_nth(fault_op::read, 1, EIO);
    CHECK(error_of([&] { return tier.read("k", back); }) == EIO);
    CHECK(back == std::vector<std::byte>(4097, std::byte{0x5a}));
    tier.read("k", back).wait();
    CHECK(back == old_blob);
}

TEST_CASE("faulty_tier: a dead path fails every matching operation until cleared") {
    faulty_tier<host_tier> tier(std::in_place, 1 << 20, "nvme0");
    auto data = test::random_bytes(10, 4);
    std::vector<std::byte> back(10);
    tier.write("k", data).wait();
    tier.fail_always(fault_op::write, EROFS);
    for (int i = 0; i < 5; ++i) CHECK(error_of([&] { return tier.write(std::string("k") + std::to_string(i), data); }) == EROFS);
    CHECK(error_of([&] { return tier.read("k", back); }) == 0);  // reads still work
    tier.fail_always(fault_op::any, EIO);
    std::string msg;
    CHECK(error_of([&] { return tier.read("k", back); }, &msg) == EIO);
    CHECK(contains(msg, "faulty(nvme0): read of key 'k' (10 bytes): injected EIO"));
    tier.clear_faults();
    CHECK(error_of([&] { return tier.write("k2", data); }) == 0);
    CHECK(tier.counters().injected_errors == 6);
    CHECK(tier.contains("k2"));
    CHECK_FALSE(tier.contains("k0"));
}

TEST_CASE("faulty_tier: transient faults are retried inside up to max_retries") {
    faulty_tier<host_tier> tier;
    auto data = test::random_bytes(300, 5);
    std::vector<std::byte> back(300);

    SUBCASE("EAGAIN within the budget: success, retries counted") {
        tier.inject_transient(fault_op::write, transient_fault::eagain, 3);
        CHECK(error_of([&] { return tier.write("k", data); }) == 0);
        CHECK(tier.counters().retries == 3);
        CHECK(tier.counters().transient_faults == 3);
        tier.read("k", back).wait();
        CHECK(back == data);
        CHECK(tier.stats().failed_writes == 0);
    }
    SUBCASE("short transfers within the budget: success") {
        tier.write("k", data).wait();
        tier.inject_transient(fault_op::read, transient_fault::short_transfer, 4);
        CHECK(error_of([&] { return tier.read("k", back); }) == 0);
        CHECK(back == data);
        CHECK(tier.counters().retries == 4);
    }
    SUBCASE("EAGAIN past the budget: the caller sees EAGAIN, the old blob stays") {
        tier.write("k", data).wait();
        auto other = test::random_bytes(20, 6);
        tier.inject_transient(fault_op::any, transient_fault::eagain, 10);
        std::string msg;
        CHECK(error_of([&] { return tier.write("k", other); }, &msg) == EAGAIN);  // 5 attempts
        CHECK(contains(msg, "'k'"));
        CHECK(contains(msg, "20 bytes"));
        CHECK(contains(msg, "after 4 retries"));
        CHECK(error_of([&] { return tier.write("k", other); }) == EAGAIN);  // 5 more
        CHECK(tier.size_of("k") == 300u);
        CHECK(error_of([&] { return tier.write("k", other); }) == 0);  // faults used up
        CHECK(tier.counters().gave_up == 2);
        CHECK(tier.counters().transient_faults == 10);
        CHECK(tier.counters().retries == 8);
    }
    SUBCASE("short transfer past the budget gives EIO; max_retries is adjustable") {
        tier.write("k", data).wait();
        tier.set_max_retries(0);
        tier.inject_transient(fault_op::read, transient_fault::short_transfer, 1);
        std::string msg;
        CHECK(error_of([&] { return tier.read("k", back); }, &msg) == EIO);
        CHECK(contains(msg, "short transfer"));
        CHECK(tier.counters().gave_up == 1);
        CHECK(tier.stats().failed_reads == 1);
    }
}

TEST_CASE("faulty_tier: a torn write is caught by the next read's size check") {
    faulty_tier<host_tier> tier;
    auto data = test::random_bytes(1000, 7);
    tier.inject_torn_write();
    CHECK(tier.write("k", data).wait() == 1000);  // the device claims success
    CHECK(tier.counters().torn_writes == 1);
    CHECK(tier.size_of("k") == 500u);
    std::vector<std::byte> back(1000);
    try {
        tier.read("k", back).wait();
        FAIL("a torn blob was returned as data");
    } catch (const std::invalid_argument& e) {
        CHECK(contains(e.what(), "'k'"));
        CHECK(contains(e.what(), "1000 bytes"));
        CHECK(contains(e.what(), "500 bytes"));
    }
    tier.write("k", data).wait();  // armed once only
    tier.read("k", back).wait();
    CHECK(back == data);
}

TEST_CASE("faulty_tier: counters stay exact under concurrent use") {
    faulty_tier<host_tier> tier;
    for (std::uint64_t n = 2; n <= 100; n += 2) tier.fail_nth(fault_op::any, n, EIO);  // 50 faults
    constexpr int threads = 4, per_thread = 50;
    std::atomic<int> failures{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            auto data = test::random_bytes(64, static_cast<std::uint64_t>(t));
            for (int i = 0; i < per_thread; ++i) {
                if (error_of([&] { return tier.write(key_of(t, i), data); }))
                    failures.fetch_add(1);
            }
        });
    }
    for (auto& th : pool) th.join();
    CHECK(failures.load() == 50);
    auto c = tier.counters();
    CHECK(c.operations == threads * per_thread);
    CHECK(c.injected_errors == 50);
    CHECK(tier.stats().failed_writes == 50);
    CHECK(tier.stats().writes == threads * per_thread - 50);
    CHECK(tier.inner().used() == 64u * (threads * per_thread - 50));
}

TEST_CASE("faulty_tier: bad arming arguments are refused; invalid keys are refused before any fault") {
    faulty_tier<host_tier> tier;
    CHECK_THROWS_AS(tier.fail_nth(fault_op::any, 0, EIO), std::invalid_argument);
    CHECK_THROWS_AS(tier.fail_nth(fault_op::any, 1, 0), std::invalid_argument);
    CHECK_THROWS_AS(tier.fail_always(fault_op::any, -5), std::invalid_argument);
    tier.fail_always(fault_op::any, EIO);
    std::vector<std::byte> b(4);
    CHECK_THROWS_AS(tier.write("../x", b), std::invalid_argument);
    CHECK(tier.counters().operations == 0);
    CHECK(errno_name(ENOSPC) == "ENOSPC");
    CHECK(errno_name(12345) == "errno 12345");
}
