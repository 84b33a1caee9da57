// SPDX-License-Identifier: Apache-2.0
// The activation stash: round trips, deduplication, forwarding, prefetch order, the memory
// budget, tier failures, handle misuse, the adaptive split and concurrent use.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <spillway/stash/activation_stash.hpp>
#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>

#include "stash/manual_clock.hpp"
#include "stash/stash_support.hpp"
#include "support/host_tier_wrapper.hpp"
#include "support/random_bytes.hpp"

using namespace spillway;
using spillway::test::make_desc;
using spillway::test::random_bytes;

namespace {

stash_options offload_everything() {
    stash_options o;
    o.split = split_mode::offload_all;
    o.keep_below_bytes = 0;
    o.pool_limit = 0;
    return o;
}

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

template <class Fn>
std::string error_of(Fn&& fn) {
    try {
        fn();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no exception)";
}

bool same_bytes(std::span<const std::byte> a, const std::vector<std::byte>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

/// A host tier whose stats() report the bandwidth the test sets (set_rate): each transfer
/// counts its bytes over bytes / rate busy seconds, however long it really took.
class rated_tier : public spillway::test::host_tier_wrapper {
public:
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        auto done = inner.write(key, bytes);
        record(bytes.size(), stats_.bytes_written, stats_.write_busy_seconds);
        return done;
    }
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        auto done = inner.read(key, bytes);
        record(bytes.size(), stats_.bytes_read, stats_.read_busy_seconds);
        return done;
    }
    [[nodiscard]] tier_stats stats() const {
        std::lock_guard lock(mutex_);
        return stats_;
    }
    void set_rate(double bytes_per_second) {
        std::lock_guard lock(mutex_);
        rate_ = bytes_per_second;
    }

private:
    void record(std::size_t nbytes, std::uint64_t& bytes, double& busy) {
        std::lock_guard lock(mutex_);
        bytes += nbytes;
        busy += static_cast<double>(nbytes) / rate_;
    }
    mutable std::mutex mutex_;
    tier_stats stats_;
    double rate_ = 1e9;
};
static_assert(storage_tier<rated_tier>);

}  // namespace

TEST_CASE("round trips are exact for every dtype and size, kept or offloaded") {
    const std::int64_t counts[] = {0, 1, 3, 1023, 1025, 4097, 70001};
    for (const auto& run :
         {std::pair{split_mode::offload_all, true}, std::pair{split_mode::keep_all, true},
          std::pair{split_mode::offload_all, false}}) {
        const split_mode mode = run.first;
        const bool arena = run.second;  // not a structured binding: clang 14 cannot CAPTURE one
        CAPTURE(arena);
        host_tier tier;
        auto opts = offload_everything();
        opts.split = mode;
        opts.huge_page_arena = arena;
        activation_stash stash(tier, opts);
        struct saved {
            stash_handle handle;
            std::vector<std::byte> bytes;
        };
        std::vector<saved> all;
        std::uint64_t id = 0;
        for (auto type : all_dtypes) {
            for (auto count : counts) {
                ++id;
                auto d = make_desc(std::string("t").append(std::to_string(id)), id, {count}, type);
                auto bytes = random_bytes(static_cast<std::size_t>(count) * dtype_size(type), id);
                REQUIRE(extent_bytes(d) == bytes.size());
                all.push_back({stash.save(d, bytes), bytes});
                std::fill(bytes.begin(), bytes.end(), std::byte{0});  // the stash kept its own copy
            }
        }
        stash.flush();
        auto s = stash.stats();
        std::uint64_t total = 0, nonempty = 0;
        for (auto& a : all) {
            total += a.bytes.size();
            nonempty += a.bytes.empty() ? 0 : a.bytes.size();
        }
        CHECK(s.bytes_saved == total);
        if (mode == split_mode::offload_all) {
            CHECK(s.bytes_offloaded == nonempty);
            CHECK(s.resident_bytes ==
                  s.pooled_bytes);  // nothing held; empty tensors hold no buffer
            CHECK(tier.stats().bytes_written == nonempty);
        } else {
            CHECK(s.bytes_offloaded == 0);
            CHECK(s.bytes_kept == nonempty);
            CHECK(tier.stats().writes == 0);
        }
        for (auto it = all.rbegin(); it != all.rend(); ++it) {
            CHECK(same_bytes(stash.load(it->handle), it->bytes));
            stash.release(it->handle);
        }
        stash.flush();            // erases run on the writer thread
        CHECK(tier.used() == 0);  // every blob erased with its last reference
        CHECK(stash.stats().resident_bytes == stash.stats().pooled_bytes);
        auto pooled = stash.stats().pooled_bytes;
        CHECK(stash.trim() == pooled);
        CHECK(stash.stats().resident_bytes == 0);
        CHECK(stash.stats().arena_slack_bytes == 0);  // no buffer left: every slab unmapped
    }
}

TEST_CASE("buffers under 2 MiB come from the huge-page arena, and its slack is reported") {
    host_tier tier;
    auto opts = offload_everything();
    activation_stash stash(tier, opts);
    std::vector<aligned_buffer> mine;
    for (int i = 0; i < 3; ++i) mine.push_back(stash.allocate(512 << 10));
    CHECK_FALSE(mine[0].fork_inherited());  // a piece of an arena slab (MADV_DONTFORK)
    CHECK(mine[1].data() == mine[0].data() + (512 << 10));  // three pieces of one 2 MiB slab
    CHECK(stash.stats().arena_slack_bytes == (512 << 10));

    // Saved, written and loaded back through arena buffers: the bytes are exact.
    auto bytes = random_bytes(512 << 10, 77);
    std::memcpy(mine[2].data(), bytes.data(), bytes.size());
    auto h = stash.save(make_desc("small", 1, {128 << 10}), std::move(mine[2]));
    stash.flush();
    CHECK(same_bytes(stash.load(h), bytes));
    stash.release(h);

    opts.huge_page_arena = false;
    activation_stash plain(tier, opts);
    CHECK(plain.allocate(512 << 10).fork_inherited());  // from malloc
    CHECK(plain.stats().arena_slack_bytes == 0);
}

TEST_CASE("a strided view round-trips its exact extent") {
    host_tier tier;
    activation_stash stash(tier, offload_everything());
    // A (3, 5) f32 view with row stride 8 of an (3, 8) storage: 2*8 + 4 + 1 = 21 elements.
    tensor_desc d = make_desc("view", 1, {3, 5});
    d.strides = {8, 1};
    CHECK(extent_bytes(d) == 21 * 4);
    auto bytes = random_bytes(21 * 4, 5);
    auto h = stash.save(d, bytes);
    stash.flush();
    CHECK(same_bytes(stash.load(h), bytes));
    stash.release(h);
}

TEST_CASE(
    "deduplication: the same tensor is stored once; transposes and new versions are not merged") {
    test::gated_tier tier;
    activation_stash stash(tier, offload_everything());
    const std::size_t n = 64 * 32 * 4;
    auto bytes = random_bytes(n, 1);
    auto d = make_desc("x", 7, {64, 32});
    auto h1 = stash.save(d, bytes);
    auto h2 = stash.save(d, bytes);
    tensor_desc explicit_strides = d;
    explicit_strides.strides = {32, 1};  // the same contiguous layout spelled out
    auto h3 = stash.save(explicit_strides, bytes);
    tensor_desc transposed = d;  // the transpose: same storage and bytes, other strides
    transposed.name = "x.T";
    transposed.shape = {32, 64};
    transposed.strides = {1, 32};
    auto h4 = stash.save(transposed, bytes);
    tensor_desc bumped = d;  // mutated in place: new version
    bumped.name = "x'";
    bumped.version = 1;
    auto h5 = stash.save(bumped, bytes);
    tensor_desc other = d;  // equal bytes, another storage: never merged by content
    other.name = "y";
    other.storage_id = 8;
    auto h6 = stash.save(other, bytes);
    stash.flush();

    auto s = stash.stats();
    CHECK(s.saves == 6);
    CHECK(s.tensors == 4);
    CHECK(s.bytes_saved == 6 * n);
    CHECK(s.bytes_deduplicated == 2 * n);
    CHECK(s.bytes_offloaded == 4 * n);
    CHECK(tier.write_log().size() == 4);

    // Releasing one of three references keeps the tensor; the last one frees it.
    stash.release(h1);
    CHECK(same_bytes(stash.load(h2), bytes));
    CHECK(same_bytes(stash.load(h3), bytes));
    CHECK(same_bytes(stash.load(h4), bytes));
    stash.release(h2);
    stash.release(h3);
    stash.release(h4);
    stash.release(h5);
    stash.release(h6);
    stash.flush();  // erases run on the writer thread
    CHECK(tier.inner.used() == 0);
    // One layer: backward's first load prefetched all four; x was read once for h2 and h3.
    CHECK(stash.stats().bytes_loaded == 4 * n);

    // Saved again after the last release: a new tensor.
    auto h7 = stash.save(d, bytes);
    CHECK(stash.stats().tensors == 5);
    stash.release(h7);
}

TEST_CASE(
    "a released tensor's blob is rewritten by a later write, and flush() erases what is left") {
    test::gated_tier tier;
    activation_stash stash(tier, offload_everything());
    const std::size_t n = 64 * 1024, small = 16 * 1024;
    std::vector<std::string> step_keys[2];
    for (int step = 0; step < 2; ++step) {
        auto a = random_bytes(n, 10 + step), b = random_bytes(small, 20 + step);
        auto ha = stash.save(make_desc("a" + std::to_string(step), 1, {16 * 1024}), a);
        auto hb = stash.save(make_desc("b" + std::to_string(step), 2, {4 * 1024}), b);
        while (stash.stats().bytes_offloaded < (step + 1) * (n + small)) std::this_thread::yield();
        auto log = tier.write_log();
        step_keys[step].assign(log.end() - 2, log.end());
        CHECK(same_bytes(stash.load(ha), a));  // the rewritten blobs hold this step's bytes
        CHECK(same_bytes(stash.load(hb), b));
        stash.release(ha);
        stash.release(hb);
        // Retired, not erased: the blobs wait for the next step's writes.
        CHECK(test::eventually([&] { return tier.inner.used() == n + small; }));
    }
    // Each key went to the tensor of its own size: no blob changed size, none was created.
    CHECK(step_keys[1] == step_keys[0]);
    CHECK(step_keys[0][0] != step_keys[0][1]);
    stash.flush();
    CHECK(tier.inner.used() == 0);
    // After an erase a key is never used again.
    auto c = random_bytes(n, 30);
    auto hc = stash.save(make_desc("c", 3, {16 * 1024}), c);
    stash.flush();
    CHECK(std::find(step_keys[0].begin(), step_keys[0].end(), tier.write_log().back()) ==
          step_keys[0].end());
    CHECK(same_bytes(stash.load(hc), c));
    stash.release(hc);
}

TEST_CASE("save_and_exchange hands back the buffer a completed write frees instead of freeing it") {
    test::gated_tier tier;
    auto opts = offload_everything();
    const std::size_t n = 64 * 1024;
    opts.memory_budget = n;  // one tensor: the second save waits for the first one's write
    activation_stash stash(tier, opts);
    auto a = random_bytes(n, 1), b = random_bytes(n, 2);
    auto filled = [&](const std::vector<std::byte>& bytes) {
        aligned_buffer buffer = stash.allocate(n);
        std::memcpy(buffer.data(), bytes.data(), n);
        return buffer;
    };
    aligned_buffer first = filled(a);
    const std::byte* first_memory = first.data();
    tier.close_writes();
    auto ha = stash.save_and_exchange(make_desc("a", 1, {16 * 1024}), first);
    CHECK(first.data() == nullptr);  // nothing free to hand back, and room without waiting
    aligned_buffer second = filled(b);
    std::thread opener([&] {
        tier.wait_writes_entered(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        tier.open_writes();
    });
    auto hb = stash.save_and_exchange(make_desc("b", 2, {16 * 1024}), second);
    opener.join();
    CHECK(second.data() == first_memory);  // a's buffer, free once written, came back
    CHECK(second.size() == n);
    CHECK(stash.stats().peak_resident_bytes <= n);
    CHECK(same_bytes(stash.load(hb), b));
    stash.release(hb);
    CHECK(same_bytes(stash.load(ha), a));
    stash.release(ha);
}

TEST_CASE("forwarding: backward takes tensors still in memory; unstarted writes are skipped") {
    test::gated_tier tier;
    auto opts = offload_everything();
    opts.prefetch_layers = 0;
    activation_stash stash(tier, opts);
    const std::size_t n = 256 * 1024;
    auto x = random_bytes(n, 1), y = random_bytes(n, 2);
    tier.close_writes();
    stash.begin_layer(0);
    auto hx = stash.save(make_desc("x", 1, {64 * 1024}), x);
    stash.end_layer();
    tier.wait_writes_entered(1);  // x's write is in flight, held at the gate
    stash.begin_layer(1);
    auto hy = stash.save(make_desc("y", 2, {64 * 1024}), y);  // queued behind it
    stash.end_layer();

    CHECK(stash.ready(hy));
    CHECK(same_bytes(stash.load(hy), y));  // write not started: skipped, served from memory
    CHECK(stash.ready(hx));
    CHECK(same_bytes(stash.load(hx), x));  // write in flight: served from memory, no read
    auto s = stash.stats();
    CHECK(s.write_skips == 1);
    CHECK(s.bytes_forwarded == 2 * n);
    CHECK(s.bytes_loaded == 0);

    tier.open_writes();
    stash.flush();
    s = stash.stats();
    CHECK(s.bytes_offloaded == n);  // only x was ever written
    CHECK(tier.write_log().size() == 1);
    CHECK(tier.read_log().empty());
    CHECK(same_bytes(stash.load(hx), x));  // still resident after its write completed
    stash.release(hx);
    stash.release(hy);
    stash.flush();  // erases run on the writer thread
    CHECK(tier.inner.used() == 0);
}

TEST_CASE("offloaded tensors leave memory and are read back exactly") {
    host_tier tier;
    activation_stash stash(tier, offload_everything());
    const std::size_t n = 1 << 20;
    std::vector<std::vector<std::byte>> data;
    std::vector<stash_handle> handles;
    for (int i = 0; i < 4; ++i) {
        data.push_back(random_bytes(n, 10 + i));
        handles.push_back(
            stash.save(make_desc("a" + std::to_string(i), 100 + i, {1 << 18}), data.back()));
    }
    stash.flush();
    auto s = stash.stats();
    CHECK(s.resident_bytes == s.pooled_bytes);  // no tensor is held any more
    CHECK(s.peak_resident_bytes >= n);
    CHECK(s.peak_resident_bytes <= 4 * n);
    stash.trim();
    CHECK(stash.stats().resident_bytes == 0);
    CHECK_FALSE(stash.ready(handles[0]));
    for (int i = 3; i >= 0; --i) {
        CHECK(same_bytes(stash.load(handles[i]), data[i]));
        stash.release(handles[i]);
    }
    s = stash.stats();
    CHECK(s.bytes_loaded == 4 * n);
    CHECK(s.bytes_forwarded == 0);
}

TEST_CASE("prefetch reads in reverse order of saving, a set number of layers ahead") {
    test::gated_tier tier;
    auto opts = offload_everything();
    opts.prefetch_layers = 2;
    activation_stash stash(tier, opts);
    const int layers = 6;
    std::vector<std::vector<std::byte>> data;
    std::vector<stash_handle> handles;
    for (int l = 0; l < layers; ++l) {
        stash.begin_layer(static_cast<std::uint32_t>(100 + l));  // ids need not be positions
        data.push_back(random_bytes(64 * 1024, l));
        handles.push_back(
            stash.save(make_desc("h" + std::to_string(l), l + 1, {16 * 1024}), data.back()));
        stash.end_layer();
    }
    stash.flush();
    stash.reset_peak();  // no high-water room: prefetch reads only its window
    auto writes = tier.write_log();
    REQUIRE(writes.size() == layers);

    stash.start_backward();  // the last two layers come back at once
    CHECK(test::eventually([&] { return tier.read_log().size() == 2; }));
    CHECK(test::eventually([&] { return stash.ready(handles[4]); }));
    for (int l = layers - 1; l >= 0; --l) {
        CHECK(same_bytes(stash.load(handles[l]), data[l]));
        // Loading layer l brings back layers down to l - 2.
        auto expect = static_cast<std::size_t>(std::min(layers, layers - l + 2));
        CHECK(test::eventually([&] { return tier.read_log().size() == expect; }));
        stash.release(handles[l]);
    }
    auto reads = tier.read_log();
    std::vector<std::string> reversed(writes.rbegin(), writes.rend());
    CHECK(reads == reversed);
}

TEST_CASE("prefetch reads further ahead into memory the step already used, never past its peak") {
    test::gated_tier tier;
    auto opts = offload_everything();
    opts.prefetch_layers = 1;
    activation_stash stash(tier, opts);
    const std::size_t n = 64 * 1024;
    std::vector<std::vector<std::byte>> data;
    std::vector<stash_handle> handles;
    tier.close_writes();  // forward outruns the tier: three tensors are held at once
    for (int l = 0; l < 6; ++l) {
        stash.begin_layer(static_cast<std::uint32_t>(l));
        data.push_back(random_bytes(n, l));
        handles.push_back(
            stash.save(make_desc("f" + std::to_string(l), l + 1, {16 * 1024}), data.back()));
        stash.end_layer();
        if (l == 2) {
            tier.wait_writes_entered(1);
            tier.open_writes();
            stash.flush();
        }
    }
    stash.flush();
    auto peak = stash.stats().peak_resident_bytes;
    CHECK(peak >= 3 * n);
    stash.start_backward();
    // The window is two layers (5 and 4); the high-water mark leaves room for more.
    CHECK(test::eventually([&] { return tier.read_log().size() >= 3; }));
    for (int l = 5; l >= 0; --l) {
        CHECK(same_bytes(stash.load(handles[static_cast<std::size_t>(l)]),
                         data[static_cast<std::size_t>(l)]));
        stash.release(handles[static_cast<std::size_t>(l)]);
    }
    auto writes = tier.write_log();
    CHECK(tier.read_log() == std::vector<std::string>(writes.rbegin(), writes.rend()));
    CHECK(stash.stats().peak_resident_bytes == peak);
}

TEST_CASE("the memory budget is never exceeded") {
    const std::size_t n = 256 * 1024;
    const std::size_t budget = 3 * n;
    SUBCASE("offloaded tensors: save waits for writes to make room") {
        // 13 ms per write: saving 12 tensors at memory speed must wait for room.
        throttled_tier<host_tier> tier(
            throttle_config::joint({.bytes_per_second = 20e6, .burst_bytes = 4096}));
        auto opts = offload_everything();
        opts.memory_budget = budget;
        opts.pool_limit = n;  // the pool is inside the budget too
        activation_stash stash(tier, opts);
        std::vector<std::vector<std::byte>> data;
        for (int i = 0; i < 12; ++i) data.push_back(random_bytes(n, i));
        std::vector<stash_handle> handles;
        for (int i = 0; i < 12; ++i) {
            stash.begin_layer(static_cast<std::uint32_t>(i));
            handles.push_back(
                stash.save(make_desc("b" + std::to_string(i), i + 1, {64 * 1024}), data[i]));
            stash.end_layer();
            CHECK(stash.stats().resident_bytes <= budget);
        }
        auto s = stash.stats();
        CHECK(s.budget_wait_seconds > 0);
        for (int i = 11; i >= 0; --i) {
            CHECK(same_bytes(stash.load(handles[i]), data[i]));
            stash.release(handles[i]);
            CHECK(stash.stats().resident_bytes <= budget);
        }
        CHECK(stash.stats().peak_resident_bytes <= budget);
        CHECK(stash.stats().peak_resident_bytes >= 2 * n);
    }
    SUBCASE("kept tensors: the budget forces writes of kept tensors") {
        host_tier tier;
        stash_options opts;
        opts.split = split_mode::keep_all;
        opts.memory_budget = budget;
        opts.pool_limit = 0;
        activation_stash stash(tier, opts);
        std::vector<std::vector<std::byte>> data;
        std::vector<stash_handle> handles;
        for (int i = 0; i < 8; ++i) {
            data.push_back(random_bytes(n, i));
            handles.push_back(
                stash.save(make_desc("k" + std::to_string(i), i + 1, {64 * 1024}), data.back()));
        }
        auto s = stash.stats();
        CHECK(s.forced_writes >= 5);
        CHECK(s.peak_resident_bytes <= budget);
        for (int i = 7; i >= 0; --i) {
            CHECK(same_bytes(stash.load(handles[i]), data[i]));
            stash.release(handles[i]);
        }
        CHECK(stash.stats().peak_resident_bytes <= budget);
    }
    SUBCASE("a tensor larger than the budget is written synchronously and cannot be loaded") {
        host_tier tier;
        auto opts = offload_everything();
        opts.memory_budget = n;
        activation_stash stash(tier, opts);
        auto big = random_bytes(2 * n, 3);
        auto h = stash.save(make_desc("big", 1, {128 * 1024}), big);
        auto s = stash.stats();
        CHECK(s.forced_writes == 1);
        CHECK(s.peak_resident_bytes == 0);
        CHECK(tier.used() == 2 * n);
        auto msg = error_of([&] { (void)stash.load(h); });
        CHECK(contains(msg, "'big'"));
        CHECK(contains(msg, "budget"));
        CHECK_THROWS_AS((void)stash.load(h), std::length_error);
        stash.release(h);
        stash.flush();  // erases run on the writer thread
        CHECK(tier.used() == 0);
    }
}

TEST_CASE("a tier failure during save raises an error naming the tensor") {
    faulty_tier<host_tier> tier;
    activation_stash stash(tier, offload_everything());
    const std::size_t n = 64 * 1024;
    auto a = random_bytes(n, 1), b = random_bytes(n, 2);
    tier.fail_nth(fault_op::write, 1, EIO);
    auto ha = stash.save(make_desc("act.a", 1, {16 * 1024}), a);
    try {
        stash.flush();
        FAIL("flush after a failed write did not throw");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == EIO);
        CHECK(contains(e.what(), "'act.a'"));
        CHECK(contains(e.what(), "offloading"));
    }
    stash.flush();  // reported once
    auto msg = error_of([&] { (void)stash.load(ha); });
    CHECK(contains(msg, "'act.a'"));
    CHECK_THROWS_AS((void)stash.load(ha), std::system_error);  // never data
    auto hb = stash.save(make_desc("act.b", 2, {16 * 1024}), b);
    stash.flush();
    CHECK(same_bytes(stash.load(hb), b));
    stash.release(ha);
    stash.release(hb);

    SUBCASE("the next save reports the failure and stores nothing") {
        tier.fail_nth(fault_op::write, 1, ENOSPC);
        auto hc = stash.save(make_desc("act.c", 3, {16 * 1024}), a);
        CHECK(test::eventually([&] { return stash.stats().failed_writes == 2; }));
        auto before = stash.stats().tensors;
        auto m = error_of([&] { (void)stash.save(make_desc("act.d", 4, {16 * 1024}), b); });
        CHECK(contains(m, "'act.c'"));
        CHECK(stash.stats().tensors == before);
        auto hd = stash.save(make_desc("act.d", 4, {16 * 1024}), b);
        stash.flush();
        CHECK(same_bytes(stash.load(hd), b));
        stash.release(hc);
        stash.release(hd);
    }
    SUBCASE("a synchronous write forced by the budget throws from save") {
        activation_stash small(tier, [] {
            auto o = offload_everything();
            o.memory_budget = 4096;
            return o;
        }());
        tier.fail_nth(fault_op::write, 1, EIO);
        auto m = error_of([&] { (void)small.save(make_desc("act.e", 5, {16 * 1024}), a); });
        CHECK(contains(m, "'act.e'"));
        CHECK(small.stats().tensors == 0);
    }
}

TEST_CASE("a tier failure during load raises an error naming the tensor, never wrong data") {
    faulty_tier<host_tier> tier;
    auto opts = offload_everything();
    opts.prefetch_layers = 0;
    activation_stash stash(tier, opts);
    const std::size_t n = 64 * 1024;
    auto a = random_bytes(n, 1);
    SUBCASE("a read error; the next load retries") {
        auto h = stash.save(make_desc("act.r", 1, {16 * 1024}), a);
        stash.flush();
        tier.fail_nth(fault_op::read, 1, EIO);
        try {
            (void)stash.load(h);
            FAIL("load after a failed read did not throw");
        } catch (const std::system_error& e) {
            CHECK(e.code().value() == EIO);
            CHECK(contains(e.what(), "'act.r'"));
            CHECK(contains(e.what(), "loading"));
        }
        CHECK(stash.stats().failed_reads == 1);
        CHECK(same_bytes(stash.load(h), a));
        stash.release(h);
    }
    SUBCASE("a torn write is caught by the read's size check") {
        tier.inject_torn_write(1);
        auto h = stash.save(make_desc("act.torn", 2, {16 * 1024}), a);
        stash.flush();  // the tier lied: the write "succeeded"
        auto m = error_of([&] { (void)stash.load(h); });
        CHECK(contains(m, "'act.torn'"));
        CHECK_THROWS((void)stash.load(h));
        stash.release(h);
    }
    SUBCASE("a prefetched read error is raised by the load that needs it") {
        activation_stash ahead(tier, offload_everything());
        auto h0 = ahead.save(make_desc("p0", 10, {16 * 1024}, dtype::f32, 0), a);
        auto h1 = ahead.save(make_desc("p1", 11, {16 * 1024}, dtype::f32, 1), a);
        ahead.flush();
        tier.fail_always(fault_op::read, EIO);
        ahead.start_backward();
        CHECK(test::eventually([&] { return ahead.stats().failed_reads == 2; }));
        CHECK(contains(error_of([&] { (void)ahead.load(h1); }), "'p1'"));
        CHECK(contains(error_of([&] { (void)ahead.load(h0); }), "'p0'"));
        tier.clear_faults();
        CHECK(same_bytes(ahead.load(h0), a));
        ahead.release(h0);
        ahead.release(h1);
    }
}

TEST_CASE("misuse of handles and descriptions is a clear error naming the tensor") {
    host_tier tier;
    activation_stash stash(tier, offload_everything());
    auto bytes = random_bytes(400, 1);
    auto h = stash.save(make_desc("w1.out", 1, {100}), bytes);

    stash_handle moved = std::move(h);
    CHECK(contains(error_of([&] { (void)stash.load(h); }), "moved from"));
    CHECK(contains(error_of([&] { (void)stash.load(h); }), "'w1.out'"));
    stash.release(moved);
    CHECK_FALSE(moved.valid());
    auto m = error_of([&] { (void)stash.load(moved); });
    CHECK(contains(m, "already released"));
    CHECK(contains(m, "'w1.out'"));
    CHECK(contains(error_of([&] { stash.release(moved); }), "already released"));
    CHECK_THROWS_AS(stash.release(moved), std::invalid_argument);

    stash_handle empty;
    CHECK(contains(error_of([&] { (void)stash.load(empty); }), "empty handle"));
    CHECK_THROWS_AS(stash.release(empty), std::invalid_argument);

    host_tier tier2;
    activation_stash other(tier2, offload_everything());
    auto foreign = other.save(make_desc("foreign", 9, {100}), bytes);
    m = error_of([&] { (void)stash.load(foreign); });
    CHECK(contains(m, "another activation_stash"));
    CHECK(contains(m, "'foreign'"));

    auto h2 = stash.save(make_desc("kept.over.reset", 2, {100}), bytes);
    stash.reset();
    m = error_of([&] { (void)stash.load(h2); });
    CHECK(contains(m, "unknown handle"));
    CHECK(contains(m, "'kept.over.reset'"));
    CHECK(tier.used() == 0);

    // Bad descriptions: nothing is stored.
    m = error_of([&] { (void)stash.save(make_desc("short", 3, {101}), bytes); });
    CHECK(contains(m, "'short'"));
    CHECK(contains(m, "404 bytes"));
    CHECK(contains(m, "400 bytes"));
    tensor_desc neg = make_desc("neg", 4, {10, 10});
    neg.strides = {-10, 1};
    CHECK(contains(error_of([&] { (void)stash.save(neg, bytes); }), "negative stride"));
    tensor_desc rank = make_desc("rank", 5, {10, 10});
    rank.strides = {1};
    CHECK(contains(error_of([&] { (void)stash.save(rank, bytes); }), "'rank'"));
    CHECK_THROWS_AS((void)stash.save(rank, bytes), std::invalid_argument);

    stash_options bad;
    bad.key_prefix = "../up";
    CHECK_THROWS_WITH_AS(activation_stash(tier, bad),
                         doctest::Contains("key_prefix '../up' contains '/'"),
                         std::invalid_argument);
    bad = {};
    bad.write_threads = 0;
    CHECK_THROWS_WITH_AS(
        activation_stash(tier, bad),
        doctest::Contains("write_threads and read_threads must be at least 1, got 0 and "),
        std::invalid_argument);
    other.release(foreign);
}

TEST_CASE("TBA's split rule") {
    std::vector<layer_profile> layers = {{100, 0.0}, {100, 1.0}, {100, 2.0}, {100, 3.0}};
    // required(N) = (before + 2 x bytes of N) / (3 x 4 - 2 x start of N)
    CHECK(required_bandwidth(layers, 0, 4.0) == doctest::Approx(200.0 / 12.0));
    CHECK(required_bandwidth(layers, 1, 4.0) == doctest::Approx(300.0 / 10.0));
    CHECK(required_bandwidth(layers, 2, 4.0) == doctest::Approx(400.0 / 8.0));
    CHECK(required_bandwidth(layers, 3, 4.0) == doctest::Approx(500.0 / 6.0));
    CHECK(tba_split(layers, 4.0, 10.0) == 0);
    CHECK(tba_split(layers, 4.0, 40.0) == 2);
    CHECK(tba_split(layers, 4.0, 60.0) == 3);
    CHECK(tba_split(layers, 4.0, 100.0) == 4);
    std::vector<layer_profile> with_empty = {{0, 0.0}, {100, 1.0}};
    CHECK(required_bandwidth(with_empty, 0, 2.0) == 0.0);
}

TEST_CASE("fixed split: layers from the split on stay in memory") {
    host_tier tier;
    stash_options opts;
    opts.split = split_mode::fixed;
    opts.first_kept_layer = 2;
    opts.keep_below_bytes = 8192;
    activation_stash stash(tier, opts);
    const std::size_t n = 64 * 1024;
    std::vector<stash_handle> handles;
    auto bytes = random_bytes(n, 1);
    auto small = random_bytes(4096, 2);
    for (std::uint32_t l = 0; l < 4; ++l) {
        stash.begin_layer(l);
        handles.push_back(
            stash.save(make_desc("big" + std::to_string(l), l + 1, {16 * 1024}), bytes));
        handles.push_back(
            stash.save(make_desc("small" + std::to_string(l), l + 11, {1024}), small));
        stash.end_layer();
    }
    stash.flush();
    auto s = stash.stats();
    CHECK(s.bytes_offloaded == 2 * n);                // big0, big1
    CHECK(s.bytes_kept == 2 * n + 4 * small.size());  // big2, big3 and every small tensor
    for (auto& h : handles) stash.release(h);
}

TEST_CASE("adaptive split: a profiling step offloads everything, then TBA's rule picks the split") {
    // 4 layers of 1 MiB, 10 ms each, and a tier whose probe runs at 40 MB/s, all on a clock
    // the test moves: TBA's rule needs 17.5, 31.5, 52.4 and 87.4 MB/s to hide layers 0 to 3,
    // so it offloads layers 0 and 1 and keeps 2 and 3, however loaded the machine is.
    using test::manual_clock;
    test::clocked_tier tier(40e6);
    stash_options opts;
    opts.keep_below_bytes = 4096;
    opts.probe_bytes = 2 << 20;
    activation_stash<test::clocked_tier, manual_clock> stash(tier, opts);
    const std::size_t n = 1 << 20;
    auto bytes = random_bytes(n, 1);
    auto step = [&](std::uint64_t version) {
        std::vector<stash_handle> handles;
        for (std::uint32_t l = 0; l < 4; ++l) {
            stash.begin_layer(l);
            manual_clock::advance(0.010);  // the layer's compute
            auto d = make_desc("l" + std::to_string(l), l + 1, {1 << 18});
            d.version = version;
            handles.push_back(stash.save(d, bytes));
            stash.end_layer();
        }
        for (auto it = handles.rbegin(); it != handles.rend(); ++it) {
            CHECK(same_bytes(stash.load(*it), bytes));
            stash.release(*it);
        }
    };
    CHECK_FALSE(stash.plan().planned);
    step(0);
    auto s0 = stash.stats();
    CHECK(s0.bytes_kept == 0);
    CHECK(s0.tensors == 4);
    auto plan = stash.plan();
    REQUIRE(plan.planned);
    REQUIRE(plan.layers.size() == 4);
    CHECK(plan.forward_seconds == doctest::Approx(0.04));
    for (std::size_t l = 0; l < 4; ++l) {
        CHECK(plan.layers[l].start_seconds == doctest::Approx(0.01 * static_cast<double>(l)));
        CHECK(plan.layers[l].offload_bytes == n);
    }
    CHECK(plan.tier_bandwidth == doctest::Approx(40e6));  // the probe's 2 MiB each way
    CHECK(plan.first_kept_layer == 2);
    CHECK(tba_split(plan.layers, plan.forward_seconds, plan.tier_bandwidth) == 2);

    step(1);
    auto d1 = stash.stats().since(s0);
    CHECK(d1.bytes_kept == 2 * n);  // layers 2 and 3
    CHECK(d1.bytes_offloaded + d1.bytes_forwarded >= 2 * n);
}

TEST_CASE("adaptive split follows a tier that slows down") {
    // The tier reports the bandwidth the test sets; the plan must follow it. 4 layers of
    // 256 KiB over a forward of at least 20 ms need well under 100 MB/s to be hidden, and
    // far more than 1 kB/s.
    rated_tier tier;
    stash_options opts;
    opts.keep_below_bytes = 4096;
    opts.probe_bytes = 1 << 20;
    activation_stash stash(tier, opts);
    const std::size_t n = 256 * 1024;
    auto bytes = random_bytes(n, 1);
    auto step = [&](std::uint64_t version) {
        std::vector<stash_handle> handles;
        for (std::uint32_t l = 0; l < 4; ++l) {
            stash.begin_layer(l);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            auto d = make_desc("l" + std::to_string(l), l + 1, {64 * 1024});
            d.version = version;
            handles.push_back(stash.save(d, bytes));
            stash.end_layer();
        }
        stash.start_backward();
        for (auto it = handles.rbegin(); it != handles.rend(); ++it) {
            CHECK(same_bytes(stash.load(*it), bytes));
            stash.release(*it);
        }
        stash.flush();  // every transfer of this step is counted at this step's rate
    };
    // A plan is made when a step begins, from the step before; the step right after the
    // profiling step keeps the probe's plan.
    tier.set_rate(1e12);
    step(0);  // profiling: the probe plans (its figure is this machine's; not checked)
    REQUIRE(stash.plan().planned);
    step(1);
    step(2);  // re-planned from step 1, which the tier says ran at 1 TB/s: nothing kept
    auto fast = stash.plan();
    CHECK(fast.tier_bandwidth >= 0.5e12);
    CHECK(fast.first_kept_layer == std::numeric_limits<std::size_t>::max());
    tier.set_rate(1e3);
    step(3);
    step(4);  // re-planned from step 3, which ran at 1 kB/s: a slower tier is believed at once
    auto slow = stash.plan();
    CHECK(slow.tier_bandwidth == doctest::Approx(1e3));
    CHECK(slow.first_kept_layer == 0);
    CHECK(slow.first_kept_layer == tba_split(slow.layers, slow.forward_seconds, 1e3));
}

TEST_CASE("adaptive split with a stated bandwidth: fast keeps nothing, slow keeps everything") {
    for (double bw : {1e15, 1.0}) {
        host_tier tier;
        stash_options opts;
        opts.keep_below_bytes = 0;
        opts.tier_bandwidth = bw;
        activation_stash stash(tier, opts);
        auto bytes = random_bytes(8192, 1);
        for (int step = 0; step < 2; ++step) {
            std::vector<stash_handle> handles;
            for (std::uint32_t l = 0; l < 3; ++l) {
                stash.begin_layer(l);
                handles.push_back(stash.save(make_desc("l", l + 1, {2048}), bytes));
                stash.end_layer();
            }
            stash.flush();
            for (auto& h : handles) {
                CHECK(same_bytes(stash.load(h), bytes));
                stash.release(h);
            }
        }
        auto plan = stash.plan();
        // The profiling step offloaded its 3 tensors; the second step follows the plan.
        if (bw > 1) {
            CHECK(plan.first_kept_layer == std::numeric_limits<std::size_t>::max());
            CHECK(stash.stats().bytes_offloaded == 6 * 8192);
            CHECK(stash.stats().bytes_kept == 0);
        } else {
            CHECK(plan.first_kept_layer == 0);
            CHECK(stash.stats().bytes_offloaded == 3 * 8192);
            CHECK(stash.stats().bytes_kept == 3 * 8192);
        }
    }
}

TEST_CASE("concurrent saves, loads and releases from several threads") {
#ifdef SPILLWAY_SANITIZED
    const int per_thread = 40;
#else
    const int per_thread = 200;
#endif
    host_tier tier;
    auto opts = offload_everything();
    opts.write_threads = 2;
    opts.read_threads = 2;
    opts.pool_limit = 1 << 20;
    opts.memory_budget = 4 << 20;
    activation_stash stash(tier, opts);
    auto shared = random_bytes(32 * 1024, 99);
    std::atomic<int> failures{0};
    auto worker = [&](int t) {
        std::vector<std::pair<stash_handle, std::vector<std::byte>>> mine;
        for (int i = 0; i < per_thread; ++i) {
            auto n = static_cast<std::size_t>(4096 * (1 + (i * 7 + t) % 8));
            auto bytes = random_bytes(n, static_cast<std::uint64_t>(t * 1000 + i));
            auto d = make_desc(
                std::string("t").append(std::to_string(t)).append(".").append(std::to_string(i)),
                static_cast<std::uint64_t>(t * 1000 + i + 1), {static_cast<std::int64_t>(n)},
                dtype::u8);
            mine.emplace_back(stash.save(d, bytes), bytes);
            // Every thread also saves one tensor all threads share: deduplicated concurrently.
            mine.emplace_back(
                stash.save(make_desc("shared", 424242, {32 * 1024}, dtype::u8), shared), shared);
            if (i % 5 == 4) {  // a little backward while others still run forward
                for (int k = 0; k < 4; ++k) {
                    auto& [h, b] = mine.back();
                    if (!same_bytes(stash.load(h), b)) ++failures;
                    stash.release(h);
                    mine.pop_back();
                }
            }
        }
        while (!mine.empty()) {
            auto& [h, b] = mine.back();
            if (!same_bytes(stash.load(h), b)) ++failures;
            stash.release(h);
            mine.pop_back();
        }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
    for (auto& th : threads) th.join();
    CHECK(failures == 0);
    auto s = stash.stats();
    CHECK(s.peak_resident_bytes <= opts.memory_budget);
    CHECK(s.bytes_deduplicated > 0);
    stash.flush();
    CHECK(tier.used() == 0);
}

namespace {
/// A host tier whose reads take `read_delay` (a slow path): a load then waits in the stash.
struct slow_read_tier : test::host_tier_wrapper {
    std::atomic<int> read_delay_ms{0};
    io_completion write(std::string_view k, std::span<const std::byte> b) {
        return inner.write(k, b);
    }
    io_completion read(std::string_view k, std::span<std::byte> b) {
        std::this_thread::sleep_for(std::chrono::milliseconds(read_delay_ms.load()));
        return inner.read(k, b);
    }
};
static_assert(storage_tier<slow_read_tier>);
}  // namespace

TEST_CASE(
    "a reset() from another thread while load() waits for the read makes load() throw, not read "
    "freed memory") {
    slow_read_tier tier;
    activation_stash stash(tier, offload_everything());
    const auto bytes = random_bytes(64 << 10, 31);
    auto h = stash.save(make_desc("a", 1, {16 << 10}), bytes);
    stash.flush();
    stash.trim();
    tier.read_delay_ms = 300;
    std::string error;
    std::thread loader([&] { error = error_of([&] { (void)stash.load(h); }); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the loader waits for its read
    stash.reset();
    loader.join();
    CHECK(contains(error, "activation_stash::load: unknown handle of tensor 'a'"));
    CHECK(contains(error, "reset"));
    CHECK(tier.used() == 0);
}

TEST_CASE("a load waits for a prefetch read that holds the budget instead of refusing") {
    // One tensor's room: backward asks for a, while prefetch already reads b (the newest)
    // into that room. b becomes droppable once read; load(a) must wait for that, not throw
    // length_error ("held by loaded tensors": nothing was loaded).
    host_tier tier;
    stash_options o = offload_everything();
    const std::size_t n = 256 << 10;
    o.memory_budget = n;
    activation_stash stash(tier, o);
    const auto a = random_bytes(n, 32), b = random_bytes(n, 33);
    auto ha = stash.save(make_desc("a", 1, {static_cast<std::int64_t>(n / 4)}), a);
    auto hb = stash.save(make_desc("b", 2, {static_cast<std::int64_t>(n / 4)}), b);
    stash.flush();
    stash.trim();
    CHECK(same_bytes(stash.load(ha), a));
    stash.release(ha);
    CHECK(same_bytes(stash.load(hb), b));
    stash.release(hb);
    CHECK(stash.stats().resident_bytes <= n);
}

TEST_CASE(
    "the bandwidth probe stays within the budget and leaves nothing on the tier when it fails") {
    faulty_tier<host_tier> tier;
    stash_options o;  // adaptive, bandwidth 0: the profiling step's backward probes the tier
    o.keep_below_bytes = 0;
    o.memory_budget = 1 << 20;
    o.probe_bytes = 64 << 20;  // larger than the budget: the probe uses the room left
    const auto bytes = random_bytes(256 << 10, 34);
    {
        activation_stash stash(tier, o);
        auto h = stash.save(make_desc("a", 1, {64 << 10}), bytes);
        stash.flush();
        tier.fail_nth(fault_op::read, 1, EIO);  // the probe's first read
        const std::string error = error_of([&] { stash.start_backward(); });
        CHECK(contains(error, "measuring the bandwidth of tier"));
        CHECK(contains(error, "EIO"));
        CHECK_FALSE(tier.contains("act-" + std::to_string(1) + "-probe"));
        CHECK(tier.inner().used() == bytes.size());  // the tensor's blob alone
        stash.release(h);
        stash.reset();
        CHECK(tier.inner().used() == 0);  // nothing left: no probe blob, no tensor
    }
    {
        activation_stash stash(tier, o);
        auto h = stash.save(make_desc("b", 2, {64 << 10}), bytes);
        stash.flush();
        stash.start_backward();  // probes with at most the budget's free room
        CHECK(stash.stats().resident_bytes <= o.memory_budget);
        CHECK(same_bytes(stash.load(h), bytes));
        stash.release(h);
    }
    CHECK(tier.inner().used() == 0);
}

TEST_CASE("the bandwidth probe waits for room when the budget is full, never going above it") {
    // The profiling step's tensor fills the budget and its write is held at the gate when
    // backward starts: the probe once took 4 KiB anyway (resident 260 KiB of 256).
    test::gated_tier tier;
    stash_options o;  // adaptive, bandwidth 0: the profiling step's backward probes the tier
    o.keep_below_bytes = 0;
    o.memory_budget = 256 << 10;
    const auto bytes = random_bytes(256 << 10, 36);
    activation_stash stash(tier, o);
    tier.close_writes();
    auto h = stash.save(make_desc("a", 1, {64 << 10}), bytes);
    std::size_t resident_while_held = 0;
    std::thread opener([&] {
        tier.wait_writes_entered(1);                                  // the tensor's write, held
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // backward reaches the probe
        resident_while_held = stash.stats().resident_bytes;
        tier.open_writes();
    });
    stash.start_backward();
    opener.join();
    CHECK(resident_while_held <= o.memory_budget);
    CHECK(stash.stats().peak_resident_bytes <= o.memory_budget);
    CHECK(same_bytes(stash.load(h), bytes));
    stash.release(h);
}

TEST_CASE("a key_prefix too long for the keys made from it is refused at construction, naming it") {
    host_tier tier;
    stash_options o = offload_everything();
    o.key_prefix = std::string(201, 'k');
    CHECK_THROWS_WITH_AS(activation_stash(tier, o),
                         doctest::Contains("is longer than 200 bytes (201)"),
                         std::invalid_argument);
    o.key_prefix = std::string(200, 'k');
    activation_stash stash(tier, o);  // the longest prefix: its keys fit
    const auto bytes = random_bytes(4096, 35);
    auto h = stash.save(make_desc("a", 1, {1024}), bytes);
    stash.flush();
    CHECK(same_bytes(stash.load(h), bytes));
    stash.release(h);
}

TEST_CASE(
    "extent_bytes refuses a shape whose extent overflows, without signed overflow on the way") {
    // 2 x 2^62 bytes is representable (2^63); 4 x 2^62 is not. The strides on the way
    // multiply past INT64_MAX for the second and saturate there.
    CHECK(extent_bytes(make_desc("big", 1, {2, std::int64_t{1} << 62}, dtype::u8)) == std::size_t{1}
                                                                                          << 63);
    tensor_desc d = make_desc("huge", 1, {4, std::int64_t{1} << 62}, dtype::u8);
    CHECK_THROWS_AS((void)extent_bytes(d), std::invalid_argument);
    CHECK(contiguous_strides({2, std::int64_t{1} << 62, 3}) ==
          std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::max(), 3, 1});
}
