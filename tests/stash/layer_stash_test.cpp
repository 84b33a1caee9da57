// SPDX-License-Identifier: Apache-2.0
// layer_stash: a layer's tensors declared once, then computed into, saved, loaded (typed)
// and released by name over an activation_stash; exact round trips, one stored copy for a
// shared save, recycled buffers, and errors that name the tensor.
#include <doctest/doctest.h>

#include <spillway/stash/layer_stash.hpp>
#include <spillway/tier/host_tier.hpp>

#include <cstdint>
#include <stdexcept>
#include <vector>

using spillway::dtype;
using spillway::layer_stash;
using spillway::layer_tensor;

namespace {
using stash_type = spillway::activation_stash<spillway::host_tier>;

spillway::stash_options offload_everything() {
    spillway::stash_options o;
    o.keep_below_bytes = 0;
    o.split = spillway::split_mode::offload_all;
    return o;
}

const std::vector<layer_tensor> tensors = {
    {"x", 1000, dtype::f32}, {"idx", 300, dtype::i32}, {"y", 1000}};

float value(std::size_t step, std::size_t layer, std::size_t i) {
    return static_cast<float>(step * 100000 + layer * 10000 + i);
}

/// One step's forward over `layers` layers: each tensor filled with known values and saved
/// (y in the next layer's scope, as a block's output is the next block's input).
void forward(layer_stash<spillway::host_tier>& ls, std::size_t step, std::size_t layers) {
    ls.begin_step();
    for (std::size_t l = 0; l < layers; ++l) {
        ls.acquire(l);
        auto x = ls.output<float>(l, "x");
        auto idx = ls.output<std::int32_t>(l, "idx");
        auto y = ls.output<float>(l, "y");
        REQUIRE(x.size() == 1000);
        REQUIRE(idx.size() == 300);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = value(step, l, i);
        for (std::size_t i = 0; i < idx.size(); ++i)
            idx[i] = static_cast<std::int32_t>(step + l + i);
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = -value(step, l, i);
        ls.save(l, "x");
        ls.save(l, "idx");
        if (l > 0) ls.save(l - 1, "y", l);
    }
    ls.save(layers - 1, "y");
}
}  // namespace

TEST_CASE("round trips by name, typed, over several steps") {
    spillway::host_tier tier;
    stash_type stash(tier, offload_everything());
    const std::size_t L = 3;
    layer_stash<spillway::host_tier> ls(stash, tensors, L);
    CHECK(ls.nbytes("x") == 4000);
    CHECK(ls.index("y") == 2);
    for (std::size_t step = 1; step <= 3; ++step) {
        forward(ls, step, L);
        stash.flush();  // every write has finished: backward cannot cancel one still queued
        for (std::size_t l = L; l-- > 0;) {
            CHECK(ls.saved(l, "x"));
            std::span<const float> x = ls.load<float>(l, "x");
            std::span<const std::int32_t> idx = ls.load<std::int32_t>(l, "idx");
            std::span<const float> y = ls.load<float>(l, "y");
            REQUIRE(x.size() == 1000);
            REQUIRE(idx.size() == 300);
            bool exact = true;
            for (std::size_t i = 0; i < x.size(); ++i)
                exact = exact && x[i] == value(step, l, i) && y[i] == -value(step, l, i);
            for (std::size_t i = 0; i < idx.size(); ++i)
                exact = exact && idx[i] == static_cast<std::int32_t>(step + l + i);
            CHECK(exact);
            ls.release(l, "x");
            CHECK_FALSE(ls.saved(l, "x"));
            ls.release_layer(l);
            CHECK_FALSE(ls.saved(l, "y"));
        }
        stash.flush();
        CHECK(tier.used() == 0);  // every tensor released: the tier holds nothing
    }
    CHECK(stash.stats().bytes_offloaded > 0);
}

TEST_CASE("a shared save stores the tensor once and is released with it") {
    spillway::host_tier tier;
    stash_type stash(tier, offload_everything());
    layer_stash<spillway::host_tier> ls(stash, tensors, 1);
    ls.begin_step();
    ls.acquire(0);
    auto x = ls.output<float>(0, "x");
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    ls.save(0, "x");
    ls.share(0, "x", "x (as the next op's input)");
    CHECK(stash.stats().bytes_deduplicated == 4000);
    CHECK(ls.load<float>(0, "x")[999] == 999.0f);
    ls.release(0, "x");
    CHECK_FALSE(ls.saved(0, "x"));
    ls.release_layer(0);
    stash.flush();
    CHECK(tier.used() == 0);
}

TEST_CASE("buffers are recycled for the next layer, and a spare is lent as scratch") {
    spillway::host_tier tier;
    stash_type stash(tier, offload_everything());
    layer_stash<spillway::host_tier> ls(stash, tensors, 2);
    ls.begin_step();
    ls.acquire(0);
    const std::size_t held = ls.held_bytes();
    CHECK(held >= 2 * 4000 + 1200);
    const float* x0 = ls.output<float>(0, "x").data();
    ls.recycle(0, "x");  // not saved (backward would recompute it)
    CHECK(ls.held_bytes() == held);
    ls.acquire(1);
    CHECK(ls.output<float>(1, "x").data() == x0);  // the recycled buffer, not a new one
    // A spare is allocated on demand and counted; the next acquire takes it.
    ls.recycle(1, "x");
    std::span<float> scratch = ls.spare<float>("x");
    CHECK(scratch.data() == x0);
    CHECK(scratch.size() == 1000);
    ls.release_layer(0);
    ls.release_layer(1);
    // Left: the spares (x's, and none for the tensors never saved or recycled).
    CHECK(ls.held_bytes() == spillway::align_up(ls.nbytes("x")));
}

TEST_CASE("storage ids are the declared range, the scope the one given to save()") {
    spillway::host_tier tier;
    stash_type stash(tier, offload_everything());
    spillway::layer_stash_options o;
    o.first_storage_id = 100;
    layer_stash<spillway::host_tier> a(stash, {{"t", 10}}, 2, o);
    layer_stash<spillway::host_tier> b(stash, {{"t", 10}}, 2);  // ids 1, 2: disjoint from a's
    a.begin_step();
    b.begin_step();
    a.acquire(1);
    b.acquire(1);
    a.save(1, "t");
    b.save(1, "t");  // same layer, tensor and version, other storage: no dedup
    CHECK(stash.stats().bytes_deduplicated == 0);
}

TEST_CASE("misuse is refused with the tensor named") {
    spillway::host_tier tier;
    stash_type stash(tier, offload_everything());
    CHECK_THROWS_AS(layer_stash<spillway::host_tier>(stash, {{"a", 1}, {"a", 2}}, 1),
                    std::invalid_argument);
    CHECK_THROWS_AS(layer_stash<spillway::host_tier>(stash, {}, 1), std::invalid_argument);
    layer_stash<spillway::host_tier> ls(stash, tensors, 2);
    ls.begin_step();
    CHECK_THROWS_WITH_AS((void)ls.index("z"), doctest::Contains("'z'"), std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)ls.output<float>(0, "x"), doctest::Contains("acquire"),
                         std::invalid_argument);
    ls.acquire(0);
    CHECK_THROWS_WITH_AS((void)ls.output<double>(0, "x"), doctest::Contains("f32"),
                         std::invalid_argument);
    CHECK_THROWS_AS((void)ls.output<float>(2, "x"), std::invalid_argument);  // no layer 2
    CHECK_THROWS_WITH_AS((void)ls.load<float>(0, "x"), doctest::Contains("not saved"),
                         std::invalid_argument);
    CHECK_THROWS_AS(ls.share(0, "x", "again"), std::invalid_argument);
    ls.save(0, "x");
    CHECK_THROWS_AS(ls.save(0, "x"), std::invalid_argument);  // its buffer went to the stash
    ls.release(0, "x");
    ls.release(0, "x");  // nothing held: nothing to do
}
