// SPDX-License-Identifier: Apache-2.0
// virtual_tier with placement_mode::striped: numbered keys ("<prefix>-<n>") land on child
// n mod the children and stay there when rewritten; other keys are placed by finish time; a
// failed write fails over to another child and a full child's numbered keys go elsewhere;
// striped_child() parses only a trailing "-<digits>". (The storage_tier conformance suite
// runs the striped virtual tier too: conformance_test.cpp.)
#include <doctest/doctest.h>

#include <cerrno>
#include <string>
#include <vector>

#include <spillway/lock/lock_policy.hpp>
#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include "support/random_bytes.hpp"

using namespace spillway;
using spillway::test::random_bytes;

namespace {
virtual_tier_options striped(std::size_t children) {
    virtual_tier_options o;
    o.name = "striped";
    o.placement = placement_mode::striped;
    o.bandwidths.assign(children, 1.0);
    return o;
}
}  // namespace

TEST_CASE("striped_child: the number after the last dash, modulo the children") {
    CHECK(detail::striped_child("params-0", 3) == std::size_t{0});
    CHECK(detail::striped_child("params-7", 3) == std::size_t{1});
    CHECK(detail::striped_child("a-b-12", 5) == std::size_t{2});
    CHECK_FALSE(detail::striped_child("params", 3).has_value());
    CHECK_FALSE(detail::striped_child("params-", 3).has_value());
    CHECK_FALSE(detail::striped_child("params-1x", 3).has_value());
    CHECK_FALSE(detail::striped_child("params-99999999999999999999999", 3).has_value());
}

TEST_CASE(
    "virtual_tier striped: layer l on child l mod P, rewrites stay, other keys by finish time") {
    host_tier a, b, c;
    virtual_tier<thread_lock, host_tier&, host_tier&, host_tier&> vt(striped(3), a, b, c);
    const auto blob = random_bytes(4096, 1);
    // Uneven sizes would move keys under placement by finish time; striping ignores them.
    for (std::size_t l = 0; l < 7; ++l) {
        const auto bytes = random_bytes(1024 * (l + 1), l);
        REQUIRE(vt.write("params-" + std::to_string(l), bytes).wait() == bytes.size());
        CHECK(vt.child_of("params-" + std::to_string(l)) == l % 3);
    }
    REQUIRE(vt.write("params-4", blob).wait() == blob.size());  // a rewrite
    CHECK(vt.child_of("params-4") == std::size_t{1});
    CHECK(b.contains("params-4"));
    CHECK_FALSE(a.contains("params-4"));
    CHECK_FALSE(c.contains("params-4"));
    // An unnumbered key goes to the child that finishes first: child 1 holds the least
    // (2 + 4 KiB, against 1 + 4 + 7 and 3 + 6).
    REQUIRE(vt.write("manifest", blob).wait() == blob.size());
    CHECK(vt.child_of("manifest") == std::size_t{1});
    std::vector<std::byte> back(blob.size());
    CHECK(vt.read("params-4", back).wait() == blob.size());
    CHECK(back == blob);
}

TEST_CASE("virtual_tier striped: a failed write fails over, a full child's keys go elsewhere") {
    faulty_tier<host_tier> a;
    host_tier b, small(8192, "small");
    virtual_tier<thread_lock, faulty_tier<host_tier>&, host_tier&, host_tier&> vt(striped(3), a, b,
                                                                                  small);
    const auto blob = random_bytes(4096, 2);
    // Child 2 has room for two blobs: the third of its keys goes to another child.
    REQUIRE(vt.write("params-2", blob).wait() == blob.size());
    REQUIRE(vt.write("params-5", blob).wait() == blob.size());
    CHECK(vt.child_of("params-2") == std::size_t{2});
    CHECK(vt.child_of("params-5") == std::size_t{2});
    REQUIRE(vt.write("params-8", blob).wait() == blob.size());
    CHECK(vt.child_of("params-8") != std::size_t{2});
    // Child 0 fails: its key fails over, and the child, degraded, receives no numbered key.
    a.fail_always(fault_op::write, EIO);
    REQUIRE(vt.write("params-3", blob).wait() == blob.size());
    CHECK(vt.child_of("params-3") == std::size_t{1});
    CHECK(vt.report()[0].health == child_health::degraded);
    REQUIRE(vt.write("params-6", blob).wait() == blob.size());
    CHECK(vt.child_of("params-6") == std::size_t{1});
    std::vector<std::byte> back(blob.size());
    for (const char* k : {"params-3", "params-6", "params-8"}) {
        CHECK(vt.read(k, back).wait() == blob.size());
        CHECK(back == blob);
    }
}
