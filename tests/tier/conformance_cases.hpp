// SPDX-License-Identifier: Apache-2.0
// tests/tier/conformance_cases.hpp: the cases of the storage_tier conformance suite, defined
// once and instantiated by each test executable for its list of tier factories:
//
//   #include "tier/conformance_cases.hpp"
//   SPILLWAY_CONFORMANCE_SUITE(host_factory, throttled_of<host_factory>);   // every case
//   SPILLWAY_CONFORMANCE_FAULT_SUITE(host_factory);   // fault cases, on faulty_of<base>
//
// Include it in exactly one translation unit per executable. The contract the cases check
// is written in include/spillway/tier/storage_tier.hpp; factories and helpers are in
// conformance.hpp. Every buffer a case hands the tier is a buffer_of<F> (the factory's
// buffer_type, std::vector<std::byte> by default).
#pragma once

#include "tier/conformance.hpp"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>

namespace spillway::test::conformance::cases {
using namespace spillway;
using namespace spillway::test::conformance;

// ---- Round trips -------------------------------------------------------------------------

TEST_CASE_TEMPLATE_DEFINE("conformance: round trips of sizes from 1 byte to the largest blob", F, spillway_conformance_1) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    if constexpr (requires { tier->direct_io(); tier->direct_io_note(); }) {
        if (!tier->direct_io()) MESSAGE(F::name() << " runs without O_DIRECT here: " << tier->direct_io_note());
    }
    std::vector<std::size_t> sizes = {1, 2, 3, 511, 512, 4095, 4096, 4097, 8191, 65536 + 13, MiB - 1, MiB + 1};
    std::mt19937_64 rng(42);
    const std::size_t random_cap = sanitized ? MiB : 4 * MiB;
    for (int i = 0; i < 6; ++i) sizes.push_back(1 + rng() % random_cap);  // unaligned, almost surely
    sizes.push_back(largest_blob);  // once per tier: the suite's time budget
    std::uint64_t seed = 100;
    std::size_t total = 0;
    for (std::size_t n : sizes) {
        CAPTURE(n);
        auto key = std::string("blob-") + std::to_string(n);
        auto data = blob<buffer>(n, seed++);
        put(*tier, key, data);
        CHECK(tier->size_of(key) == n);
        CHECK(get<buffer>(*tier, key, n) == data);
        total += n;
        if (n == largest_blob) {  // do not keep the big one around
            CHECK(tier->erase(key));
            total -= n;
        }
    }
    CHECK(tier->used() == total);
}

TEST_CASE_TEMPLATE_DEFINE("conformance: a rewrite with a different size replaces the blob", F, spillway_conformance_2) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto other = blob<buffer>(777, 1);
    put(*tier, "other", other);
    std::uint64_t seed = 2;
    for (std::size_t n : {10 * KiB, std::size_t{3}, 100 * KiB + 5, std::size_t{4096 * 3}, std::size_t{1}}) {
        CAPTURE(n);
        auto data = blob<buffer>(n, seed++);
        put(*tier, "k", data);
        CHECK(tier->size_of("k") == n);
        CHECK(tier->used() == n + 777);
        CHECK(get<buffer>(*tier, "k", n) == data);
    }
    CHECK(get<buffer>(*tier, "other", 777) == other);
}

TEST_CASE_TEMPLATE_DEFINE("conformance: erase removes the blob and its bytes", F, spillway_conformance_3) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto a = blob<buffer>(5000, 3), b = blob<buffer>(123, 4);
    put(*tier, "a", a);
    put(*tier, "b", b);
    CHECK(tier->erase("a"));
    CHECK_FALSE(tier->contains("a"));
    CHECK_FALSE(tier->size_of("a").has_value());
    CHECK(tier->used() == 123);
    CHECK_FALSE(tier->erase("a"));
    buffer back(5000);
    check_system_error(run([&] { return tier->read("a", back); }), ENOENT, {"'a'"});
    CHECK(get<buffer>(*tier, "b", 123) == b);
    put(*tier, "a", b);  // the key is usable again
    CHECK(tier->size_of("a") == 123u);
}

TEST_CASE_TEMPLATE_DEFINE("conformance: contains, size_of and used keep account", F, spillway_conformance_4) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    CHECK(tier->used() == 0);
    CHECK(tier->capacity() > 0);
    CHECK_FALSE(std::string(tier->name()).empty());
    std::size_t total = 0;
    for (std::size_t i = 1; i <= 20; ++i) {
        auto key = std::string("key") + std::to_string(i);
        CHECK_FALSE(tier->contains(key));
        std::size_t n = i * 997;
        put(*tier, key, blob<buffer>(n, i));
        total += n;
        CHECK(tier->contains(key));
        CHECK(tier->size_of(key) == n);
        CHECK(tier->used() == total);
    }
    for (std::size_t i = 1; i <= 20; i += 2) {
        CHECK(tier->erase(std::string("key") + std::to_string(i)));
        total -= i * 997;
    }
    CHECK(tier->used() == total);
    CHECK(tier->contains("key2"));
    CHECK_FALSE(tier->contains("key3"));
    CHECK_FALSE(tier->contains("never-written"));
}

// ---- Concurrency -------------------------------------------------------------------------

TEST_CASE_TEMPLATE_DEFINE("conformance: many operations in flight at once", F, spillway_conformance_5) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    constexpr std::size_t count = sanitized ? 32 : 64;
    std::mt19937_64 rng(7);
    std::vector<buffer> blobs;
    for (std::size_t i = 0; i < count; ++i) blobs.push_back(blob<buffer>(1 + rng() % (256 * KiB), 1000 + i));
    std::vector<io_completion> writes;
    for (std::size_t i = 0; i < count; ++i) writes.push_back(tier->write(std::string("k") + std::to_string(i), blobs[i]));
    for (std::size_t i = 0; i < count; ++i) CHECK(writes[i].wait() == blobs[i].size());

    // Reads of every key in flight together, with rewrites of other keys mixed in.
    std::vector<buffer> backs;
    for (auto& b : blobs) backs.emplace_back(b.size());
    auto fresh = blob<buffer>(100 * KiB, 5);
    std::vector<io_completion> ops;
    for (std::size_t i = 0; i < count; ++i) {
        ops.push_back(tier->read(std::string("k") + std::to_string(i), backs[i]));
        ops.push_back(tier->write(std::string("new") + std::to_string(i), fresh));
    }
    for (auto& c : ops) c.wait();
    for (std::size_t i = 0; i < count; ++i) CHECK(backs[i] == blobs[i]);
    CHECK(tier->size_of("new0") == fresh.size());
}

TEST_CASE_TEMPLATE_DEFINE("conformance: several threads on different keys", F, spillway_conformance_6) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    constexpr int threads = 4, rounds = sanitized ? 15 : 40;
    std::vector<std::size_t> kept(threads, 0);
    std::atomic<int> mismatches{0}, errors{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            std::mt19937_64 rng(static_cast<std::uint64_t>(t));
            for (int r = 0; r < rounds; ++r) {
                auto key = std::string("t") + std::to_string(t) + "-" + std::to_string(r % 5);
                auto data = blob<buffer>(1 + rng() % (64 * KiB), rng());
                buffer back(data.size());
                try {
                    tier->write(key, data).wait();
                    tier->read(key, back).wait();
                    if (back != data) mismatches.fetch_add(1);
                    if (r % 7 == 3) tier->erase(key);
                } catch (...) {
                    errors.fetch_add(1);
                }
            }
        });
    }
    for (auto& th : pool) th.join();
    CHECK(mismatches.load() == 0);
    CHECK(errors.load() == 0);
    std::size_t total = 0;
    for (int t = 0; t < threads; ++t)
        for (int k = 0; k < 5; ++k) total += tier->size_of(std::string("t") + std::to_string(t) + "-" + std::to_string(k)).value_or(0);
    CHECK(tier->used() == total);
}

TEST_CASE_TEMPLATE_DEFINE("conformance: destroying a tier with operations in flight waits for them", F, spillway_conformance_7) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto data = blob<buffer>(512 * KiB + 3, 9);
    std::vector<buffer> backs(16, buffer(data.size()));
    std::vector<io_completion> ops;
    {
        auto tier = make<F>(env);
        for (int i = 0; i < 16; ++i) put(*tier, std::string("r") + std::to_string(i), data);
        for (int i = 0; i < 16; ++i) {
            ops.push_back(tier->write(std::string("w") + std::to_string(i), data));
            ops.push_back(tier->read(std::string("r") + std::to_string(i), backs[static_cast<std::size_t>(i)]));
        }
    }  // the tier is destroyed here, operations possibly still in flight
    for (auto& c : ops) {
        CHECK(c.ready());
        CHECK(c.wait() == data.size());
    }
    for (auto& b : backs) CHECK(b == data);
}

// ---- Limits and bad input ----------------------------------------------------------------

TEST_CASE_TEMPLATE_DEFINE("conformance: a write past the capacity fails with ENOSPC and loses nothing", F, spillway_conformance_8) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    if constexpr (!has_capacity_bound<F>) {
        MESSAGE(F::name() << " has no capacity bound; capacity checks skipped");
    } else {
        tier_env env;
        auto tier = make_bounded<F>(env, MiB);
        CHECK(tier->capacity() == MiB);
        auto a = blob<buffer>(600 * KiB, 11), b = blob<buffer>(500 * KiB, 12);
        put(*tier, "a", a);
        check_system_error(run([&] { return tier->write("b", b); }), ENOSPC,
                           {"'b'", std::to_string(b.size()), std::to_string(MiB)});
        CHECK_FALSE(tier->contains("b"));
        CHECK(tier->used() == a.size());
        auto b2 = blob<buffer>(400 * KiB, 13);
        put(*tier, "b", b2);
        auto a2 = blob<buffer>(700 * KiB, 14);  // a rewrite that would not fit
        check_system_error(run([&] { return tier->write("a", a2); }), ENOSPC, {"'a'"});
        CHECK(tier->size_of("a") == a.size());
        CHECK(get<buffer>(*tier, "a", a.size()) == a);  // the previous blob is intact
        CHECK(a2 == blob<buffer>(700 * KiB, 14));  // and the caller's buffer untouched
        CHECK(tier->erase("b"));
        auto full = blob<buffer>(MiB, 15);
        put(*tier, "a", full);  // a rewrite that fits once its own old copy is gone
        CHECK(tier->used() == MiB);
        CHECK(get<buffer>(*tier, "a", MiB) == full);
    }
}

TEST_CASE_TEMPLATE_DEFINE("conformance: a missing key is ENOENT naming the key", F, spillway_conformance_9) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    buffer back(100, std::byte{0x33});
    check_system_error(run([&] { return tier->read("no-such-key", back); }), ENOENT, {"'no-such-key'"});
    put(*tier, "present", blob<buffer>(10, 1));
    check_system_error(run([&] { return tier->read("no-such-key", back); }), ENOENT, {"'no-such-key'"});
    CHECK(get<buffer>(*tier, "present", 10) == blob<buffer>(10, 1));
}

TEST_CASE_TEMPLATE_DEFINE("conformance: a buffer of the wrong size is refused naming both sizes", F, spillway_conformance_10) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto data = blob<buffer>(10007, 21);
    put(*tier, "k", data);
    for (std::size_t n : {std::size_t{10006}, std::size_t{10008}, std::size_t{1}, std::size_t{4096 * 3}}) {
        CAPTURE(n);
        buffer back(n);
        check_invalid_argument(run([&] { return tier->read("k", back); }), {"'k'", std::to_string(n), "10007"});
    }
    CHECK(get<buffer>(*tier, "k", data.size()) == data);  // the blob is intact and the tier usable
}

TEST_CASE_TEMPLATE_DEFINE("conformance: invalid keys are refused and store nothing", F, spillway_conformance_11) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto data = blob<buffer>(16, 1);
    buffer back(16);
    // Each bad key and what its message must hold: the key, quoted, and why it is refused.
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"", "is empty"},
        {".", "is a relative directory name"},
        {"..", "is a relative directory name"},
        {"a/b", "contains '/'"},
        {"../escape", "contains '/'"},
        {"/abs", "contains '/'"},
        {std::string(256, 'x'), "is longer than 255 bytes"},
        // (quoted() writes the NUL as \x00: the message is a C string that must not end there.)
        {std::string("nul\0byte", 8), "contains a NUL byte"},
    };
    // The message starts with the tier's own name (a decorator's, not its inner tier's), so a
    // user of several tiers knows which one refused the key.
    const std::string named = std::string(tier->name()) + ": key ";
    auto starts_with_name = [&](const outcome& o) {
        try {
            std::rethrow_exception(o.error);
        } catch (const std::exception& e) {
            CHECK_MESSAGE(std::string_view(e.what()).starts_with(named),
                          "does not start with '" << named << "': " << std::string(e.what()));
        }
    };
    for (const auto& entry : bad) {
        // Not a structured binding: clang 14 cannot capture one (CAPTURE's lambda).
        const std::string& key = entry.first;
        CAPTURE(key);
        const std::string shown = spillway::quoted(key) + " " + entry.second;
        const auto wrote = run([&] { return tier->write(key, data); });
        check_invalid_argument(wrote, {shown});
        if (wrote.error) starts_with_name(wrote);
        const auto read = run([&] { return tier->read(key, back); });
        check_invalid_argument(read, {shown});
        if (read.error) starts_with_name(read);
        try {
            (void)tier->erase(key);
            FAIL("erase of a bad key succeeded");
        } catch (const std::invalid_argument& e) {
            CHECK_MESSAGE(contains_text(e.what(), shown), "missing '" << shown << "' in: " << e.what());
            CHECK_MESSAGE(std::string_view(e.what()).starts_with(named),
                          "does not start with '" << named << "': " << std::string(e.what()));
        }
    }
    CHECK(tier->used() == 0);
    put(*tier, std::string(255, 'y'), data);  // the longest valid key
    CHECK(get<buffer>(*tier, std::string(255, 'y'), 16) == data);
}

TEST_CASE_TEMPLATE_DEFINE("conformance: stats count bytes, operations and failures", F, spillway_conformance_12) {
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto s0 = tier->stats();
    CHECK(s0.bytes_written == 0);
    CHECK(s0.reads == 0);
    std::vector<std::size_t> sizes = {1, 4096, 100000, 3 * MiB + 1};
    std::size_t written = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        put(*tier, std::string("k") + std::to_string(i), blob<buffer>(sizes[i], i));
        written += sizes[i];
    }
    std::size_t read = 0;
    for (std::size_t i = 1; i < sizes.size(); ++i) {
        get<buffer>(*tier, std::string("k") + std::to_string(i), sizes[i]);
        read += sizes[i];
    }
    buffer back(10);
    CHECK(run([&] { return tier->read("missing", back); }).error);
    auto s = tier->stats();
    CHECK(s.bytes_written == written);
    CHECK(s.writes == sizes.size());
    CHECK(s.bytes_read == read);
    CHECK(s.reads == sizes.size() - 1);
    CHECK(s.failed_reads == 1);
    CHECK(s.failed_writes == 0);
    CHECK(s.write_busy_seconds > 0);
    CHECK(s.read_busy_seconds > 0);
    CHECK(s.write_bandwidth() > 0);
    CHECK(s.read_bandwidth() > 0);
}

// ---- Faults (faulty_tier wrapped around each base tier) ------------------------------------

TEST_CASE_TEMPLATE_DEFINE("conformance faults: an injected errno fails one write and loses nothing", B, spillway_conformance_fault_1) {
    using F = faulty_of<B>;
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto old_blob = blob<buffer>(9000, 1), new_blob = blob<buffer>(20000, 2);
    put(*tier, "k", old_blob);
    for (int err : {EIO, ENOSPC, EFBIG}) {
        CAPTURE(err);
        tier->fail_nth(fault_op::write, 2, err);
        put(*tier, "other", old_blob);  // the first write passes
        check_system_error(run([&] { return tier->write("k", new_blob); }), err,
                           {"'k'", "20000 bytes", errno_name(err)});
        CHECK(new_blob == blob<buffer>(20000, 2));
        CHECK(tier->size_of("k") == 9000u);
        CHECK(get<buffer>(*tier, "k", 9000) == old_blob);
    }
    CHECK(tier->counters().injected_errors == 3);
    CHECK(tier->stats().failed_writes == 3);
}

TEST_CASE_TEMPLATE_DEFINE("conformance faults: an injected read error leaves the buffer untouched", B, spillway_conformance_fault_2) {
    using F = faulty_of<B>;
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto data = blob<buffer>(70000, 3);
    put(*tier, "k", data);
    tier->fail_nth(fault_op::any, 1, EIO);
    buffer back(70000, std::byte{0xee});
    check_system_error(run([&] { return tier->read("k", back); }), EIO, {"'k'", "70000 bytes", "EIO"});
    CHECK(back == buffer(70000, std::byte{0xee}));
    CHECK(get<buffer>(*tier, "k", 70000) == data);
}

TEST_CASE_TEMPLATE_DEFINE("conformance faults: a dead path fails everything until cleared", B, spillway_conformance_fault_3) {
    using F = faulty_of<B>;
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto data = blob<buffer>(5000, 4);
    put(*tier, "k", data);
    tier->fail_always(fault_op::any, EIO);
    buffer back(5000);
    for (int i = 0; i < 3; ++i) {
        check_system_error(run([&] { return tier->write(std::string("x") + std::to_string(i), data); }), EIO, {"EIO"});
        check_system_error(run([&] { return tier->read("k", back); }), EIO, {"'k'"});
    }
    CHECK(tier->used() == 5000);
    tier->clear_faults();
    CHECK(get<buffer>(*tier, "k", 5000) == data);
    put(*tier, "x0", data);
    CHECK(tier->counters().injected_errors == 6);
}

TEST_CASE_TEMPLATE_DEFINE("conformance faults: EAGAIN and short transfers are retried inside", B, spillway_conformance_fault_4) {
    using F = faulty_of<B>;
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    auto data = blob<buffer>(3 * MiB + 17, 5);
    tier->inject_transient(fault_op::write, transient_fault::eagain, 2);
    tier->inject_transient(fault_op::write, transient_fault::short_transfer, 2);
    put(*tier, "k", data);
    tier->inject_transient(fault_op::read, transient_fault::short_transfer, 3);
    CHECK(get<buffer>(*tier, "k", data.size()) == data);
    CHECK(tier->counters().retries == 7);
    CHECK(tier->stats().failed_writes == 0);
    CHECK(tier->stats().failed_reads == 0);

    // Past the retry budget the caller sees the fault, and the previous blob stays.
    auto other = blob<buffer>(1000, 6);
    tier->inject_transient(fault_op::write, transient_fault::eagain, tier->max_retries() + 1);
    check_system_error(run([&] { return tier->write("k", other); }), EAGAIN, {"'k'", "1000 bytes", "EAGAIN"});
    tier->inject_transient(fault_op::write, transient_fault::short_transfer, tier->max_retries() + 1);
    check_system_error(run([&] { return tier->write("k", other); }), EIO, {"'k'", "short transfer"});
    CHECK(get<buffer>(*tier, "k", data.size()) == data);
    CHECK(tier->counters().gave_up == 2);
}

TEST_CASE_TEMPLATE_DEFINE("conformance faults: a torn write is detected by the next read, never returned as data", B, spillway_conformance_fault_5) {
    using F = faulty_of<B>;
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    for (std::size_t n : {std::size_t{1}, std::size_t{4097}, MiB + 3}) {
        CAPTURE(n);
        auto key = std::string("k") + std::to_string(n);
        auto data = blob<buffer>(n, n);
        tier->inject_torn_write();
        CHECK(run([&] { return tier->write(key, data); }).nbytes == n);  // the device lied
        buffer back(n);
        auto o = run([&] { return tier->read(key, back); });
        CHECK_MESSAGE(o.error, "a torn blob was returned as data");
        check_invalid_argument(o, {std::string("'") + key + "'", std::to_string(n), std::to_string(n / 2)});
        put(*tier, key, data);  // a clean rewrite repairs it
        CHECK(get<buffer>(*tier, key, n) == data);
    }
    CHECK(tier->counters().torn_writes == 3);
}

TEST_CASE_TEMPLATE_DEFINE("conformance faults: other keys stay usable while one path misbehaves", B, spillway_conformance_fault_6) {
    using F = faulty_of<B>;
    INFO("tier: " << F::name());
    using buffer = buffer_of<F>;  // the caller buffers F's tier is tested with
    tier_env env;
    auto tier = make<F>(env);
    // Every third write fails; the ones that succeeded read back intact.
    for (std::uint64_t n = 3; n <= 30; n += 3) tier->fail_nth(fault_op::write, n, EIO);
    std::vector<int> stored;
    std::vector<io_completion> ops;
    std::vector<buffer> blobs;
    for (int i = 0; i < 30; ++i) blobs.push_back(blob<buffer>(10000 + static_cast<std::size_t>(i), static_cast<std::uint64_t>(i)));
    for (int i = 0; i < 30; ++i) ops.push_back(tier->write(std::string("k") + std::to_string(i), blobs[static_cast<std::size_t>(i)]));
    int failed = 0;
    for (int i = 0; i < 30; ++i) {
        try {
            ops[static_cast<std::size_t>(i)].wait();
            stored.push_back(i);
        } catch (const std::system_error& e) {
            CHECK(e.code().value() == EIO);
            ++failed;
        }
    }
    CHECK(failed == 10);
    for (int i : stored) CHECK(get<buffer>(*tier, std::string("k") + std::to_string(i), 10000 + static_cast<std::size_t>(i)) == blobs[static_cast<std::size_t>(i)]);
    std::size_t total = 0;
    for (int i : stored) total += 10000 + static_cast<std::size_t>(i);
    CHECK(tier->used() == total);
}

}  // namespace spillway::test::conformance::cases

// The instantiation macros: one argument list of factories each (names are looked up from
// namespace spillway::test::conformance).
#define SPILLWAY_CONFORMANCE_SUITE(...) \
    namespace spillway::test::conformance::cases { \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_1, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_2, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_3, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_4, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_5, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_6, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_7, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_8, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_9, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_10, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_11, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_12, __VA_ARGS__); \
    } \
    static_assert(true, "")

#define SPILLWAY_CONFORMANCE_FAULT_SUITE(...) \
    namespace spillway::test::conformance::cases { \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_fault_1, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_fault_2, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_fault_3, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_fault_4, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_fault_5, __VA_ARGS__); \
    TEST_CASE_TEMPLATE_INVOKE(spillway_conformance_fault_6, __VA_ARGS__); \
    } \
    static_assert(true, "")
