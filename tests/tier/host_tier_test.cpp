// SPDX-License-Identifier: Apache-2.0
// host_tier specifics (the shared behaviour is in the conformance suite).
#include <doctest/doctest.h>

#include <spillway/tier/host_tier.hpp>

#include <algorithm>
#include <atomic>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "support/random_bytes.hpp"

using spillway::host_tier;

TEST_CASE("host_tier refuses a write past its capacity and keeps the old blob") {
    host_tier tier(100);
    auto a = spillway::test::random_bytes(60, 1);
    tier.write("a", a).wait();
    auto b = spillway::test::random_bytes(50, 2);
    auto c = tier.write("b", b);
    try {
        c.wait();
        FAIL("write past capacity succeeded");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ENOSPC);
        std::string msg = e.what();
        CHECK(msg.find("'b'") != std::string::npos);
        CHECK(msg.find("50 bytes") != std::string::npos);
        CHECK(msg.find("100 bytes") != std::string::npos);
    }
    CHECK(tier.used() == 60);
    CHECK_FALSE(tier.contains("b"));
    // Rewriting a with a blob that fits once its old copy is gone is fine.
    auto a2 = spillway::test::random_bytes(100, 3);
    tier.write("a", a2).wait();
    CHECK(tier.used() == 100);
    std::vector<std::byte> back(100);
    tier.read("a", back).wait();
    CHECK(back == a2);
}

TEST_CASE("host_tier stats count bytes and operations") {
    host_tier tier;
    auto a = spillway::test::random_bytes(4096, 7);
    tier.write("k", a).wait();
    std::vector<std::byte> back(4096);
    tier.read("k", back).wait();
    auto s = tier.stats();
    CHECK(s.bytes_written == 4096);
    CHECK(s.bytes_read == 4096);
    CHECK(s.writes == 1);
    CHECK(s.reads == 1);
    CHECK(s.failed_reads == 0);
}

TEST_CASE("host_tier key errors name the tier and cut a long key") {
    host_tier tier(1000, "ram");
    std::vector<std::byte> one(1);
    CHECK_THROWS_WITH_AS(tier.write("a/b", one), doctest::Contains("ram: key 'a/b'"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(tier.read("..", one), doctest::Contains("ram: key '..'"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(tier.erase(""), doctest::Contains("ram: key ''"), std::invalid_argument);
    const std::string huge(5000, 'k');
    const std::string cut = "ram: key '" + std::string(100, 'k') + "...' (5000 bytes) is longer";
    CHECK_THROWS_WITH_AS(tier.write(huge, one), doctest::Contains(cut.c_str()),
                         std::invalid_argument);
}

// ---- Spare blocks: a rewrite copies into a replaced block instead of allocating ----------

namespace {
constexpr std::size_t KiB = 1024;

std::vector<std::byte> read_back(host_tier& tier, std::string_view key) {
    std::vector<std::byte> out(tier.size_of(key).value());
    tier.read(key, out).wait();
    return out;
}
}  // namespace

TEST_CASE("host_tier rewrites of the same size reuse the replaced block") {
    host_tier tier;
    auto a = spillway::test::random_bytes(256 * KiB, 1),
         b = spillway::test::random_bytes(256 * KiB, 2);
    tier.write("k", a).wait();
    CHECK(tier.allocations() == 1);
    tier.write("k", b).wait();  // the new blob needs a second block; the first is kept
    CHECK(tier.allocations() == 2);
    CHECK(tier.spare_blocks_held() == 1);
    CHECK(tier.spare_bytes() == 256 * KiB);
    CHECK(tier.used() == 256 * KiB);
    for (int i = 0; i < 10; ++i) {
        const auto& v = i % 2 ? b : a;
        tier.write("k", v).wait();
        CHECK(read_back(tier, "k") == v);
    }
    CHECK(tier.allocations() == 2);  // steady state: no allocation
    // Any key of the same allocation size takes the spare; so does a size that rounds to the
    // same whole pages.
    auto c = spillway::test::random_bytes(256 * KiB - 100, 3);
    tier.write("other", c).wait();
    CHECK(tier.allocations() == 2);
    CHECK(tier.spare_blocks_held() == 0);
    CHECK(read_back(tier, "other") == c);
    CHECK(read_back(tier, "k") == b);
    // Another size allocates.
    auto d = spillway::test::random_bytes(512 * KiB, 4);
    tier.write("k", d).wait();
    CHECK(tier.allocations() == 3);
    CHECK(read_back(tier, "k") == d);
    CHECK(tier.used() == 512 * KiB + c.size());
}

TEST_CASE("host_tier keeps at most spare_blocks spares, none for small blobs, none with 0") {
    SUBCASE("the default keeps two, the newest") {
        host_tier tier;
        for (std::size_t kib : {128, 256, 384}) {
            auto v = spillway::test::random_bytes(kib * KiB, kib);
            const std::string key = std::to_string(kib);
            tier.write(key, v).wait();
            tier.write(key, v).wait();
        }
        CHECK(tier.spare_blocks_held() == host_tier::default_spare_blocks);
        CHECK(tier.spare_bytes() == (256 + 384) * KiB);
    }
    SUBCASE("blocks under spare_min_bytes are freed") {
        host_tier tier;
        auto v = spillway::test::random_bytes(host_tier::spare_min_bytes - 1, 5);
        for (int i = 0; i < 3; ++i) tier.write("k", v).wait();
        CHECK(tier.spare_blocks_held() == 0);
        CHECK(tier.allocations() == 3);
    }
    SUBCASE("spare_blocks 0: every write allocates") {
        host_tier tier(std::numeric_limits<std::size_t>::max(), "host", 0);
        auto v = spillway::test::random_bytes(256 * KiB, 6);
        for (int i = 0; i < 3; ++i) tier.write("k", v).wait();
        CHECK(tier.spare_blocks_held() == 0);
        CHECK(tier.allocations() == 3);
        CHECK(read_back(tier, "k") == v);
    }
}

TEST_CASE("host_tier frees its spares when a write needs their room, on erase and on request") {
    host_tier tier(3 * 128 * KiB);
    auto v = spillway::test::random_bytes(128 * KiB, 7);
    auto invariant = [&] { CHECK(tier.used() + tier.spare_bytes() <= tier.capacity()); };
    tier.write("a", v).wait();
    tier.write("a", v).wait();
    CHECK(tier.spare_blocks_held() == 1);
    invariant();
    tier.write("b", v).wait();  // takes the spare (same size)
    CHECK(tier.spare_blocks_held() == 0);
    tier.write("b", v).wait();  // b's replaced block is the spare now
    CHECK(tier.spare_blocks_held() == 1);
    invariant();
    // A third blob of another size: the spare cannot serve it and must make room.
    auto w = spillway::test::random_bytes(128 * KiB - 8192, 8);
    tier.write("c", w).wait();
    invariant();
    CHECK(tier.used() == 2 * v.size() + w.size());
    CHECK(read_back(tier, "a") == v);
    CHECK(read_back(tier, "b") == v);
    CHECK(read_back(tier, "c") == w);
    // A rewrite keeps its replaced block only where it fits beside the blobs.
    tier.write("c", w).wait();
    invariant();
    // Past the capacity: ENOSPC, and the spares do not hide the room the blobs leave.
    auto big = spillway::test::random_bytes(128 * KiB + 1, 9);
    CHECK_THROWS_AS(tier.write("c", big).wait(), std::system_error);
    CHECK(read_back(tier, "c") == w);
    invariant();

    host_tier t2;
    t2.write("a", v).wait();
    t2.write("a", v).wait();
    CHECK(t2.spare_blocks_held() == 1);
    t2.release_spares();
    CHECK(t2.spare_blocks_held() == 0);
    CHECK(t2.spare_bytes() == 0);
    t2.write("a", v).wait();
    CHECK(t2.spare_blocks_held() == 1);
    CHECK(t2.erase("a"));
    CHECK(t2.spare_blocks_held() == 0);
    CHECK(t2.spare_bytes() == 0);
    CHECK(t2.used() == 0);
}

TEST_CASE("host_tier keeps the old blob when the new block cannot be allocated") {
    host_tier tier;
    auto a = spillway::test::random_bytes(256 * KiB, 10);
    tier.write("k", a).wait();
    tier.write("k", a).wait();
    // A span no memory holds (never read: the allocation fails first).
    const std::span<const std::byte> huge(a.data(), std::size_t{1} << 60);
    CHECK_THROWS_AS(tier.write("k", huge).wait(), std::bad_alloc);
    CHECK(read_back(tier, "k") == a);
    CHECK(tier.used() == a.size());
    CHECK(tier.stats().failed_writes == 1);
    // The tier is usable and still recycles.
    const auto before = tier.allocations();
    tier.write("k", a).wait();
    CHECK(tier.allocations() == before);
}

TEST_CASE("host_tier readers of a key being rewritten see the old or the new blob, never a mix") {
    // Two values that differ in every byte: a torn read would show both.
    const std::size_t n = 1024 * KiB;
    std::vector<std::byte> x(n, std::byte{0x11}), y(n, std::byte{0x22});
    host_tier tier;
    tier.write("k", x).wait();
    std::atomic<bool> stop{false};
    std::atomic<int> torn{0}, reads{0};
    std::vector<std::thread> readers;
    for (int r = 0; r < 2; ++r)
        readers.emplace_back([&] {
            std::vector<std::byte> out(n);
            while (!stop.load()) {
                tier.read("k", out).wait();
                const bool all_x = std::all_of(out.begin(), out.end(),
                                               [](std::byte b) { return b == std::byte{0x11}; });
                const bool all_y = std::all_of(out.begin(), out.end(),
                                               [](std::byte b) { return b == std::byte{0x22}; });
                if (!all_x && !all_y) torn.fetch_add(1);
                reads.fetch_add(1);
            }
        });
    for (int i = 0; i < 200 || reads.load() < 50; ++i) tier.write("k", i % 2 ? x : y).wait();
    stop.store(true);
    for (auto& t : readers) t.join();
    CHECK(torn.load() == 0);
    MESSAGE(reads.load() << " reads during the rewrites; " << tier.allocations()
                         << " blocks allocated");
    CHECK(tier.spare_blocks_held() <= host_tier::default_spare_blocks);
}
