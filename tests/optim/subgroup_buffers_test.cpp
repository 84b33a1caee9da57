// SPDX-License-Identifier: Apache-2.0
// The update pipeline's buffer machine on its own, over an in-memory tier: each transition
// keeps the step every location holds, a failed write keeps the newest state resident, and
// errors name the subgroup, its key and the tier.
#include <doctest/doctest.h>

#include <spillway/optim/detail/subgroup_buffers.hpp>
#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <system_error>

using namespace spillway;
using detail::buffer_use;

namespace {

// 3 subgroups of 64 parameters (the last 32), 3 floats each, pieces of one page.
pipeline_config shape() {
    return pipeline_config{
        .param_count = 160, .subgroup_size = 64, .host_buffers = 4, .piece_bytes = 4096};
}

template <class Tier>
detail::subgroup_buffers<Tier> make(Tier& tier, update_stats& stats) {
    return detail::subgroup_buffers<Tier>(tier, shape(), "sg", 3, 3 * sizeof(float) * 64, &stats);
}

// Fills buffer b with subgroup s at `step` (dirty) and writes it out.
template <class Tier>
void put(detail::subgroup_buffers<Tier>& bufs, std::size_t b, std::size_t s, std::int64_t step) {
    auto& buf = bufs[b];
    std::memset(buf.mem.data(), static_cast<int>(s + 1), bufs.blob_bytes(s));
    buf.sg = static_cast<std::ptrdiff_t>(s);
    buf.version = step;
    buf.dirty = true;
    bufs.start_write(b);
}

}  // namespace

TEST_CASE("subgroup buffers: keys, sizes and a write-read round trip keep the step") {
    host_tier tier;
    update_stats stats;
    auto bufs = make(tier, stats);
    CHECK(bufs.size() == 4);
    CHECK(bufs.subgroup_count() == 3);
    CHECK(bufs.key(1) == "sg-1");
    CHECK(bufs.blob_bytes(2) == 3 * sizeof(float) * 32);
    CHECK(bufs.piece_count(0) == 1);
    CHECK(bufs.count(buffer_use::free) == 4);
    for (std::size_t s = 0; s < 3; ++s) put(bufs, bufs.take_free(nullptr), s, 5);
    bufs.wait_all_writes(nullptr);
    bufs.rethrow_pending();
    CHECK(bufs.count(buffer_use::free) == 4);
    CHECK(stats.subgroups_written == 3);
    for (std::size_t s = 0; s < 3; ++s) CHECK(bufs.version_of(s) == 5);
    // free -> reading -> ready: the buffer holds the tier's step, clean.
    const std::size_t b = *bufs.find_free();
    bufs.start_read(b, 1);
    CHECK(bufs[b].use == buffer_use::reading);
    bufs.wait_read(b);
    CHECK(bufs[b].use == buffer_use::ready);
    CHECK(bufs[b].version == 5);
    CHECK_FALSE(bufs[b].dirty);
    CHECK(static_cast<unsigned char>(bufs[b].mem.bytes()[0]) == 2);
    CHECK(stats.subgroups_read == 1);
    CHECK(stats.bytes_read == bufs.blob_bytes(1));
    // ready -> resident -> ready: version_of follows the resident buffer.
    bufs[b].version = 6;
    bufs[b].dirty = true;
    bufs.keep_resident(b);
    CHECK(bufs.resident_of(1) == static_cast<std::ptrdiff_t>(b));
    CHECK(bufs.version_of(1) == 6);
    // make_room writes out the resident subgroup visited last, committing its step.
    bufs.make_room(ascending_order(3), 0);
    CHECK(bufs.resident_of(1) == -1);
    CHECK(bufs[b].use == buffer_use::free);
    CHECK(bufs.version_of(1) == 6);
}

TEST_CASE("subgroup buffers: a prefetch is taken over or cancelled") {
    host_tier tier;
    update_stats stats;
    auto bufs = make(tier, stats);
    for (std::size_t s = 0; s < 3; ++s) put(bufs, bufs.take_free(nullptr), s, 1);
    bufs.wait_all_writes(nullptr);
    CHECK(bufs.prefetch(ascending_order(3), 2, 0) == 2);
    CHECK(bufs.prefetched_count() == 2);
    CHECK(bufs.prefetch(ascending_order(3), 9, 1) == 1);  // one more, one buffer kept free
    CHECK(bufs.count(buffer_use::free) == 1);
    const auto b = bufs.take_prefetch(0);
    REQUIRE(b >= 0);
    CHECK(bufs.take_prefetch(0) == -1);
    bufs.wait_read(static_cast<std::size_t>(b));
    CHECK(bufs.cancel_prefetch());
    CHECK(bufs.prefetched_count() == 0);
    CHECK(bufs.count(buffer_use::free) == 3);
    CHECK_FALSE(bufs.cancel_prefetch());
}

TEST_CASE("subgroup buffers: a failed write keeps the newest state resident and names it") {
    faulty_tier<host_tier> tier;
    update_stats stats;
    auto bufs = make(tier, stats);
    for (std::size_t s = 0; s < 3; ++s) put(bufs, bufs.take_free(nullptr), s, 1);
    bufs.wait_all_writes(nullptr);
    tier.fail_nth(fault_op::write, 1, EIO);
    const std::size_t b = bufs.take_free(nullptr);
    put(bufs, b, 2, 2);
    bufs.wait_all_writes(nullptr);
    CHECK(bufs[b].use == buffer_use::resident);
    CHECK(bufs.resident_of(2) == static_cast<std::ptrdiff_t>(b));
    CHECK(bufs.version_of(2) == 2);  // the newest state is in the buffer
    try {
        bufs.rethrow_pending();
        FAIL("the failed write was not reported");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == EIO);
        const std::string what = e.what();
        CHECK(what.rfind("update_pipeline: writing subgroup 2 (key 'sg-2') on tier '", 0) == 0);
    }
    bufs.rethrow_pending();  // reported once
    tier.clear_faults();
    // recover() keeps a dirty ready buffer as resident and frees a clean one.
    const std::size_t r = *bufs.find_free();
    bufs.start_read(r, 0);
    bufs.wait_read(r);
    bufs.recover();
    CHECK(bufs[r].use == buffer_use::free);
    CHECK(bufs[b].use == buffer_use::resident);
}
