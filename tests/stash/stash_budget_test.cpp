// SPDX-License-Identifier: Apache-2.0
// stash/stash_budget: the smallest budget a layer_stash names runs a step with every layer
// offloaded, whatever the split, and one byte less does not; the footprint bounds what the
// stash and the trainer's buffers hold.
#include <doctest/doctest.h>

#include <spillway/stash/layer_stash.hpp>
#include <spillway/stash/stash_budget.hpp>
#include <spillway/tier/host_tier.hpp>

#include <stdexcept>
#include <vector>

using spillway::dtype;
using spillway::layer_stash;
using spillway::layer_tensor;

namespace {

// A block's tensors: "x" and "h" large, "stat" small (kept), "y" the output the next layer
// saves in its scope; "r" recomputed in backward.
const std::vector<layer_tensor> tensors = {
    {"x", 3000}, {"stat", 20}, {"h", 5000}, {"r", 2000}, {"y", 3000}};
const spillway::layer_stash_use use{{"r"}, {"y"}};
constexpr std::size_t layers = 4;

spillway::stash_options options_with(std::size_t budget, spillway::split_mode split) {
    spillway::stash_options o;
    o.keep_below_bytes = 1024;
    o.memory_budget = budget;
    o.split = split;
    o.first_kept_layer = 1;  // (split_mode::fixed)
    o.huge_page_arena = false;
    o.prefetch_layers = 1;
    return o;
}

/// One step of forward and backward as the protocol in stash_budget.hpp runs it; the peak
/// of the stash's resident bytes plus the buffers held outside it.
std::size_t one_step(layer_stash<spillway::host_tier>& ls,
                     spillway::activation_stash<spillway::host_tier>& stash) {
    std::size_t peak = 0;
    auto sample = [&] {
        const auto s = stash.stats();
        peak = std::max(peak, s.resident_bytes + s.arena_slack_bytes + ls.held_bytes());
    };
    ls.begin_step();
    for (std::size_t l = 0; l < layers; ++l) {
        if (l > 0) ls.release(l - 1, "y");
        ls.acquire(l);
        for (const auto& t : tensors) {
            auto out = ls.output<float>(l, t.name);
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(l + i);
        }
        if (l > 0) ls.save(l - 1, "y", l);
        ls.save(l, "x");
        ls.save(l, "stat");
        ls.save(l, "h");
        ls.recycle(l, "r");
        sample();
    }
    ls.save(layers - 1, "y");
    for (std::size_t l = layers; l-- > 0;) {
        // (Loaded outside CHECK, so that a load's error leaves one_step.)
        const float input = l > 0 ? ls.load<float>(l - 1, "y")[0] : 0.0f;
        const float x = ls.load<float>(l, "x")[1];
        const float h = ls.load<float>(l, "h")[2];
        const float stat = ls.load<float>(l, "stat")[3];
        const float y = l == layers - 1 ? ls.load<float>(l, "y")[0] : static_cast<float>(l);
        CHECK(input == (l > 0 ? static_cast<float>(l - 1) : 0.0f));
        CHECK(x == static_cast<float>(l + 1));
        CHECK(h == static_cast<float>(l + 2));
        CHECK(stat == static_cast<float>(l + 3));
        CHECK(y == static_cast<float>(l));
        auto scratch = ls.spare<float>("r");
        scratch[0] = 1;
        sample();
        if (l > 0) ls.release(l - 1, "y");
        ls.release_layer(l);
        sample();
    }
    return peak;
}

}  // namespace

TEST_CASE("smallest_stash_budget: a layer scope and every layer's kept tensors") {
    const auto o = options_with(0, spillway::split_mode::offload_all);
    // Scope: x 12000 -> 12288, stat 80 -> 4096, h 20000 -> 20480, y 12288, and y carried in
    // 12288; kept: stat 4096 of each other layer.
    CHECK(spillway::smallest_stash_budget(tensors, layers, use, o) ==
          12288 + 4096 + 20480 + 12288 + 12288 + 3 * 4096);
    CHECK(spillway::layer_buffer_bytes(tensors) == 12288 + 4096 + 20480 + 8192 + 12288);
    auto with_arena = o;
    with_arena.memory_budget = 100000;
    with_arena.huge_page_arena = true;
    CHECK(spillway::stash_footprint(tensors, with_arena) ==
          100000 + 2 * spillway::layer_buffer_bytes(tensors) + spillway::stash_arena_allowance);
}

TEST_CASE("the smallest budget runs every split; below a layer scope a load cannot fit") {
    const auto all = options_with(0, spillway::split_mode::offload_all);
    const std::size_t least = spillway::smallest_stash_budget(tensors, layers, use, all);
    const std::size_t kept = 4096;  // "stat", of each layer but the last
    const std::size_t scope = least - (layers - 1) * kept;
    for (auto split : {spillway::split_mode::offload_all, spillway::split_mode::fixed,
                       spillway::split_mode::keep_all}) {
        INFO("split " << static_cast<int>(split));
        {
            spillway::host_tier tier;
            const auto o = options_with(least, split);
            spillway::activation_stash<spillway::host_tier> stash(tier, o);
            layer_stash<spillway::host_tier> ls(stash, tensors, layers);
            for (int step = 0; step < 3; ++step) {
                const std::size_t peak = one_step(ls, stash);
                CHECK(peak <= spillway::stash_footprint(tensors, o));
                CHECK(stash.stats().peak_resident_bytes <= least);
            }
            // Offloading every layer, the kept tensors never had to be written to make room.
            if (split == spillway::split_mode::offload_all) CHECK(stash.stats().forced_writes == 0);
        }
        spillway::host_tier tier;
        spillway::activation_stash<spillway::host_tier> stash(tier, options_with(scope - 1, split));
        layer_stash<spillway::host_tier> ls(stash, tensors, layers);
        CHECK_THROWS_AS(one_step(ls, stash), std::length_error);
    }
}
