// SPDX-License-Identifier: Apache-2.0
// The stash's split planner on its own, no real tier and no real clock: what it decides from
// the bandwidths, forward times and layer profiles the test supplies, and what the probe
// measures on a clock the test moves.
#include <doctest/doctest.h>

#include <cstddef>
#include <limits>
#include <vector>

#include <spillway/stash/detail/split_planner.hpp>

#include "stash/manual_clock.hpp"

using namespace spillway;
using detail::split_planner;

namespace {

constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
constexpr std::size_t KiB = 1024;

// 4 layers of 256 KiB, one every 30 ms: a forward of 120 ms. TBA's rule needs about
// 1.5, 2.6, 4.4 and 7.3 MB/s to hide layers 0 to 3.
std::vector<layer_profile> four_layers() {
    return {{256 * KiB, 0.00}, {256 * KiB, 0.03}, {256 * KiB, 0.06}, {256 * KiB, 0.09}};
}
constexpr double forward = 0.12;

stash_options adaptive() {
    stash_options o;
    o.keep_below_bytes = 4096;
    return o;
}

}  // namespace

TEST_CASE("delivered bandwidth: bytes over busy seconds, the slower direction") {
    tier_stats before;
    before.bytes_written = 1000;
    before.write_busy_seconds = 1;
    tier_stats after = before;
    CHECK(detail::delivered_bandwidth(before, after) == 0.0);  // nothing moved
    after.bytes_written += 100'000'000;
    after.write_busy_seconds += 1.0;
    CHECK(detail::delivered_bandwidth(before, after) == doctest::Approx(100e6));
    after.bytes_read += 50'000'000;
    after.read_busy_seconds += 1.0;
    CHECK(detail::delivered_bandwidth(before, after) == doctest::Approx(50e6));
    after.bytes_read += 150'000'000;  // reads now faster than writes
    CHECK(detail::delivered_bandwidth(before, after) == doctest::Approx(100e6));
}

TEST_CASE("a slower tier is believed at once, a faster one half way") {
    CHECK(detail::next_bandwidth(100e6, 10e6) == 10e6);
    CHECK(detail::next_bandwidth(100e6, 300e6) == 200e6);
    CHECK(detail::next_bandwidth(100e6, 100e6) == 100e6);
}

TEST_CASE("a probe round: the slower direction, times under a nanosecond count as one") {
    CHECK(detail::round_bandwidth(1000, 1.0, 2.0) == 500.0);
    CHECK(detail::round_bandwidth(1000, 0.5, 0.25) == 2000.0);
    CHECK(detail::round_bandwidth(1000, 0.0, 0.0) == doctest::Approx(1e12));
}

TEST_CASE("the probe times its transfers with the clock it is given") {
    // Each transfer of the probe key moves the clock on by bytes / 50 MB/s: every round
    // measures exactly that, whatever else the machine is doing.
    test::clocked_tier tier(50e6);
    std::vector<std::byte> buffer(1 << 20);
    const double bw = detail::probe_bandwidth<test::manual_clock>(tier, "act-1-probe", buffer);
    CHECK(bw == doctest::Approx(50e6));
    CHECK(tier.contains("act-1-probe"));  // the caller erases it
}

TEST_CASE("plan_split applies TBA's rule and says what it was computed from") {
    auto p = detail::plan_split(four_layers(), forward, 4e6);
    CHECK(p.planned);
    CHECK(p.first_kept_layer == 2);  // layer 2 needs 4.4 MB/s
    CHECK(p.tier_bandwidth == 4e6);
    CHECK(p.forward_seconds == forward);
    CHECK(p.layers.size() == 4);
    CHECK(detail::plan_split(four_layers(), forward, 1e9).first_kept_layer == none);
    CHECK(detail::plan_split(four_layers(), forward, 1e3).first_kept_layer == 0);
    CHECK(detail::plan_split({}, forward, 1e3).first_kept_layer == none);
}

TEST_CASE("adaptive: the profiling step offloads everything, then the plan decides") {
    split_planner p(adaptive());
    CHECK(p.profiling());
    CHECK_FALSE(p.planned());
    CHECK(p.offloads(4096, 3));
    CHECK_FALSE(p.offloads(4095, 0));  // under keep_below_bytes: always kept
    CHECK_FALSE(p.offloads(0, 0));
    CHECK_FALSE(p.snapshot().planned);

    p.plan(four_layers(), forward, 4e6);
    CHECK_FALSE(p.profiling());
    CHECK(p.first_kept() == 2);
    CHECK(p.offloads(4096, 1));
    CHECK_FALSE(p.offloads(4096, 2));
    CHECK_FALSE(p.offloads(4096, 3));
    auto s = p.snapshot();
    CHECK(s.planned);
    CHECK(s.first_kept_layer == 2);
    CHECK(s.tier_bandwidth == 4e6);

    p.forget();  // replan(): the next step profiles again
    CHECK(p.profiling());
    CHECK(p.offloads(4096, 3));
}

TEST_CASE("adaptive: the split follows a tier that slows down and speeds up again") {
    split_planner p(adaptive());
    p.plan(four_layers(), forward, 1e9);  // the probe: a fast tier
    CHECK(p.first_kept() == none);

    p.replan(four_layers(), forward, 4e6);  // the tier delivered 4 MB/s in the last step
    CHECK(p.snapshot().tier_bandwidth == 4e6);
    CHECK(p.first_kept() == 2);
    p.replan(four_layers(), forward, 1e3);
    CHECK(p.first_kept() == 0);

    p.replan(four_layers(), forward, 0);  // nothing moved: nothing learned
    CHECK(p.snapshot().tier_bandwidth == 1e3);
    CHECK(p.first_kept() == 0);

    p.replan(four_layers(), forward, 16e6 - 1e3);  // half way: 8 MB/s, every layer hidden
    CHECK(p.snapshot().tier_bandwidth == doctest::Approx(8e6));
    CHECK(p.first_kept() == none);
}

TEST_CASE("fixed, offload_all and keep_all ignore the plan") {
    stash_options o = adaptive();
    o.split = split_mode::fixed;
    o.first_kept_layer = 1;
    split_planner fixed(o);
    CHECK_FALSE(fixed.profiling());
    CHECK(fixed.first_kept() == 1);
    CHECK(fixed.offloads(4096, 0));
    CHECK_FALSE(fixed.offloads(4096, 1));
    CHECK(fixed.snapshot().first_kept_layer == 1);
    CHECK_FALSE(fixed.snapshot().planned);

    o.split = split_mode::offload_all;
    split_planner all(o);
    CHECK(all.offloads(4096, 100));
    CHECK_FALSE(all.offloads(4095, 0));
    CHECK(all.first_kept() == none);

    o.split = split_mode::keep_all;
    split_planner keep(o);
    CHECK_FALSE(keep.offloads(std::size_t{1} << 30, 0));
    keep.forget();
    CHECK_FALSE(keep.profiling());
}
