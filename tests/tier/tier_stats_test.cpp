// SPDX-License-Identifier: Apache-2.0
// tier_stats: since() subtracts every counter of two snapshots, so that what a tier did over
// an interval (and the bandwidth it delivered then) needs no field-by-field arithmetic at the
// caller; checked on values set by hand and on a real tier's snapshots.
#include <doctest/doctest.h>

#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/tier_stats.hpp>

#include <cstddef>
#include <cstring>
#include <vector>

using namespace spillway;

namespace {

bool same_bits(const tier_stats& a, const tier_stats& b) {
    return a.bytes_read == b.bytes_read && a.bytes_written == b.bytes_written &&
           a.reads == b.reads && a.writes == b.writes && a.failed_reads == b.failed_reads &&
           a.failed_writes == b.failed_writes &&
           std::memcmp(&a.read_busy_seconds, &b.read_busy_seconds, sizeof(double)) == 0 &&
           std::memcmp(&a.write_busy_seconds, &b.write_busy_seconds, sizeof(double)) == 0;
}

}  // namespace

TEST_CASE("tier_stats::since subtracts every counter, field by field") {
    const tier_stats before{.bytes_read = 1000,
                            .bytes_written = 3000,
                            .reads = 2,
                            .writes = 5,
                            .failed_reads = 1,
                            .failed_writes = 0,
                            .read_busy_seconds = 0.25,
                            .write_busy_seconds = 1.5};
    const tier_stats after{.bytes_read = 5000,
                           .bytes_written = 3000,
                           .reads = 6,
                           .writes = 5,
                           .failed_reads = 3,
                           .failed_writes = 7,
                           .read_busy_seconds = 2.25,
                           .write_busy_seconds = 1.5};
    const tier_stats d = after.since(before);
    CHECK(d.bytes_read == 4000);
    CHECK(d.bytes_written == 0);
    CHECK(d.reads == 4);
    CHECK(d.writes == 0);
    CHECK(d.failed_reads == 2);
    CHECK(d.failed_writes == 7);
    CHECK(d.read_busy_seconds == 2.0);
    CHECK(d.write_busy_seconds == 0.0);
    // The rates of the difference are those of the interval, not of the tier's whole life.
    CHECK(d.read_bandwidth() == 2000.0);
    CHECK(after.read_bandwidth() == 5000.0 / 2.25);
    CHECK(d.write_bandwidth() == 0.0);  // nothing written in between
    // Nothing happened between a snapshot and itself; since() of an empty `before` is the
    // snapshot.
    CHECK(same_bits(after.since(after), tier_stats{}));
    CHECK(same_bits(after.since(tier_stats{}), after));
}

TEST_CASE("tier_stats::since over a real tier counts exactly the operations in between") {
    host_tier tier;
    std::vector<std::byte> blob(4096, std::byte{7}), back(4096);
    tier.write("warm-up", blob).wait();
    const tier_stats before = tier.stats();
    tier.write("a", blob).wait();
    tier.write("b", std::span<const std::byte>(blob).first(1000)).wait();
    tier.read("a", back).wait();
    const tier_stats after = tier.stats();
    const tier_stats d = after.since(before);
    CHECK(d.writes == 2);
    CHECK(d.bytes_written == 4096 + 1000);
    CHECK(d.reads == 1);
    CHECK(d.bytes_read == 4096);
    CHECK(d.failed_reads == 0);
    CHECK(d.failed_writes == 0);
    CHECK(d.read_busy_seconds >= 0);
    CHECK(d.write_busy_seconds >= 0);
    CHECK(d.write_busy_seconds <= after.write_busy_seconds);
    CHECK(after.since(before).since(tier_stats{}).bytes_written == d.bytes_written);
}
