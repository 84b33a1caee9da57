// host_tier specifics (the shared behaviour is in the conformance suite).
#include <doctest/doctest.h>

#include <spillway/tier/host_tier.hpp>

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
