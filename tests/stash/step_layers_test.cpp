// SPDX-License-Identifier: Apache-2.0
// A step's layers on their own: forward positions, profiles and the prefetch window.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>

#include <spillway/stash/detail/step_layers.hpp>

using spillway::detail::step_layers;

TEST_CASE("positions follow the order layers first appear; the start time is read once") {
    step_layers l;
    int clock_reads = 0;
    auto at = [&](double t) {
        return [&clock_reads, t] {
            ++clock_reads;
            return t;
        };
    };
    CHECK(l.position_of(7, at(0.0)) == 0);
    CHECK(l.position_of(3, at(1.0)) == 1);
    CHECK(l.position_of(7, at(2.0)) == 0);
    CHECK(clock_reads == 2);
    l.add_offload_bytes(0, 100);
    l.add_offload_bytes(0, 50);
    l.add_offload_bytes(5, 50);  // no such layer: ignored
    auto p = l.profiles();
    REQUIRE(p.size() == 2);
    CHECK(p[0].offload_bytes == 150);
    CHECK(p[1].start_seconds == 1.0);
    l.clear();
    CHECK(l.size() == 0);
    CHECK(l.position_of(3, at(0.5)) == 0);
}

TEST_CASE(
    "the prefetch window spans the current layer and prefetch_layers offloading layers below") {
    step_layers l;
    for (std::uint32_t id = 0; id < 6; ++id) l.position_of(id, [] { return 0.0; });
    // Layers 1 and 3 keep everything in memory; 0, 2, 4 and 5 offload.
    for (std::size_t pos : {0u, 2u, 4u, 5u}) l.mark_offloads(pos);
    CHECK(l.window_low(6, 2) == 4);  // backward before layer 5: layers 5 and 4
    CHECK(l.window_low(5, 2) == 2);  // in layer 5: 4 and (3 is kept) 2
    CHECK(l.window_low(4, 1) == 2);
    CHECK(l.window_low(3, 5) == 0);  // fewer offloading layers below than asked: all
    CHECK(l.window_low(100, 1) == 5);
    CHECK(l.window_low(2, 0) == 2);
}
