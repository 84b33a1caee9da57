// SPDX-License-Identifier: Apache-2.0
// plan/memory_plan: one budget split into fixed parts and stream windows: the smallest
// budget is accepted and one byte less refused, naming it; the surplus is shared by weight,
// capped at each stream's whole, and what one cannot take goes to the others; the figures
// never exceed the budget; a refusal names every part.
#include <doctest/doctest.h>

#include <spillway/plan/memory_plan.hpp>
#include <spillway/plan/process_baseline.hpp>

#include <string>

using spillway::memory_request;
using spillway::plan_memory;

namespace {

memory_request three_streams(std::size_t budget) {
    memory_request r;
    r.budget = budget;
    r.fixed = {{"the process", 1000}, {"buffers", 500}};
    r.streams = {{"params", 100, 1000, 4}, {"m|v", 200, 2000, 8}, {"fp16 gradients", 50, 500, 2}};
    return r;
}

}  // namespace

TEST_CASE("the smallest budget is accepted, one byte less is refused naming it and its parts") {
    memory_request r = three_streams(0);
    CHECK(r.fixed_bytes() == 1500);
    CHECK(r.smallest_budget() == 1850);
    r.budget = 1850;
    const auto p = plan_memory(r);
    CHECK(p.smallest_budget == 1850);
    CHECK(p.windows == std::vector<std::size_t>{100, 200, 50});
    CHECK(p.planned_bytes() == 1850);
    r.budget = 1849;
    try {
        (void)plan_memory(r);
        FAIL("a budget one byte below the smallest was accepted");
    } catch (const spillway::budget_too_small& e) {
        CHECK(e.smallest_budget() == 1850);
        const std::string m = e.what();
        CHECK(m.find("1849 bytes") != std::string::npos);
        CHECK(m.find("the smallest budget that works is 1850 bytes") != std::string::npos);
        for (const char* part : {"the process", "buffers", "params", "m|v", "fp16 gradients"})
            CHECK_MESSAGE(m.find(part) != std::string::npos, part << " not named in " << m);
    }
}

TEST_CASE("the surplus is shared by weight, each window capped at its whole") {
    auto p = plan_memory(three_streams(1850 + 1400));  // 1400 shared 4 : 8 : 2
    CHECK(p.windows == std::vector<std::size_t>{500, 1000, 250});
    CHECK(p.planned_bytes() == 1850 + 1400);
    p = plan_memory(three_streams(1850 + 100000));  // everything fits
    CHECK(p.windows == std::vector<std::size_t>{1000, 2000, 500});
    CHECK(p.planned_bytes() <= 1850 + 100000);
    // Two streams, 1 : 2.
    memory_request r = three_streams(1800 + 1200);
    r.streams.pop_back();
    p = plan_memory(r);
    CHECK(p.windows == std::vector<std::size_t>{500, 1000});
}

TEST_CASE("what a capped window cannot take goes to the others, in request order") {
    memory_request r;
    r.fixed = {{"fixed", 10}};
    // params are whole at 150: their share (4/12 of 1200 = 400) is cut to 50, the rest goes
    // to m|v up to its whole.
    r.streams = {{"params", 100, 150, 4}, {"m|v", 200, 5000, 8}};
    r.budget = 310 + 1200;
    const auto p = plan_memory(r);
    CHECK(p.windows[0] == 150);
    CHECK(p.windows[1] == 200 + 1150);
    CHECK(p.planned_bytes() == r.budget);
}

TEST_CASE("no window below its smallest or above its whole, and never above the budget") {
    for (std::size_t budget = 1850; budget < 1850 + 5000; budget += 37) {
        const auto p = plan_memory(three_streams(budget));
        const auto r = three_streams(budget);
        CHECK(p.planned_bytes() <= budget);
        for (std::size_t i = 0; i < r.streams.size(); ++i) {
            CHECK(p.windows[i] >= r.streams[i].smallest);
            CHECK(p.windows[i] <= r.streams[i].whole);
        }
    }
}

TEST_CASE("the process's baseline is the allowance unless the measured peak exceeds it") {
    const std::size_t mib = std::size_t{1} << 20;
    // Peaks that differ between identical runs give one figure.
    CHECK(spillway::reproducible_baseline(11 * mib, 24 * mib) == 24 * mib);
    CHECK(spillway::reproducible_baseline(11 * mib + 170 * 1024, 24 * mib) == 24 * mib);
    // Above the allowance: rounded up to the granule.
    CHECK(spillway::reproducible_baseline(24 * mib + 1, 24 * mib) == 32 * mib);
    CHECK(spillway::reproducible_baseline(33 * mib, 24 * mib, 8 * mib) == 40 * mib);
    // This process has a peak, and it is not below a few pages.
    CHECK(spillway::peak_rss_bytes() > 4096);
}

TEST_CASE("layer_stream: a param_stream's smallest window and its whole model") {
    const std::vector<std::size_t> layers = {3 << 20, 5 << 20, 4 << 20};
    spillway::param_stream_options o;
    o.held_layers = 2;
    const auto d = spillway::layer_stream("params", layers, 4, o);
    CHECK(d.name == "params");
    CHECK(d.weight == 4);
    CHECK(d.smallest == spillway::smallest_budget(layers, o));
    CHECK(d.whole == spillway::charge_of(3 << 20) + spillway::charge_of(5 << 20) +
                         spillway::charge_of(4 << 20));
    // A budget of fixed + the smallest window plans the stream at exactly what it accepts.
    memory_request r;
    r.fixed = {{"fixed", 1 << 20}};
    r.streams = {d};
    r.budget = r.smallest_budget();
    CHECK(plan_memory(r).windows[0] == spillway::smallest_budget(layers, o));
}
