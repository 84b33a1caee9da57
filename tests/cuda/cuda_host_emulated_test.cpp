// SPDX-License-Identifier: Apache-2.0
// The CUDA pieces on the CPU (label cuda; built by the host compiler and linked with the host
// emulation of the CUDA runtime, tests/cuda/host_cudart.cpp, not with cudart): streams are
// worker threads, device memory is host memory, so the logic of device_tier, the staged
// copies and device_stash runs (and ThreadSanitizer sees its use of streams) without a GPU.
// - The emulation keeps stream order, event records and cross-stream waits, and the
//   per-thread last error, as CUDA specifies them.
// - device_tier passes the storage_tier conformance suite (pageable and pinned buffers,
//   decorated, the fault cases); a failed pool allocation is ENOSPC naming key and size with
//   the previous blob intact; the capacity bound; a failed stream reported by the callback
//   names key and size.
// - stage_from_device/stage_to_device round-trip sizes around the chunk size and random ones
//   through a host tier and a file tier; a mismatched size is refused naming the chunk;
//   copy_to_device/copy_from_device are exact; one ring on two streams keeps its slots.
// - device_stash saves, waits, prefetches and loads tensors exactly through a host and a file
//   tier; a prefetch neither overtakes the compute work before it nor writes its destination
//   after release() or after a newer prefetch's load().
// The GPU versions (device_tier_test.cu, cuda_path_test.cu) also check timing and Thrust.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include <spillway/cuda/device_stash.hpp>
#include <spillway/cuda/device_tier.hpp>
#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/staged_copy.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include "cuda/emulated_test_support.hpp"
#include "cuda/host_cudart.hpp"
#include "support/random_bytes.hpp"
#include "support/temp_dir.hpp"
#include "cuda/device_test_support.hpp"
#include "tier/conformance_cases.hpp"

static_assert(spillway::storage_tier<spillway::cuda::device_tier>);

SPILLWAY_CONFORMANCE_SUITE(device_factory, throttled_of<device_factory>, faulty_of<device_factory>,
                           device_pinned_factory);
SPILLWAY_CONFORMANCE_FAULT_SUITE(device_factory, device_pinned_factory);

namespace sc = spillway::cuda;
namespace emu = spillway::test::host_cudart;
namespace test = spillway::test;
using spillway::activation_stash;
using spillway::dtype;
using spillway::file_tier;
using spillway::host_tier;
using spillway::split_mode;
using spillway::tensor_desc;
using spillway::test::conformance::check_system_error;
using spillway::test::conformance::run;

namespace {
using spillway::test::device_bytes;
using spillway::test::to_host;
using spillway::test::emulated::float_tensor;
using spillway::test::emulated::gate;
using spillway::test::emulated::spin;
using spillway::test::emulated::stream_owner;
constexpr std::size_t MiB = std::size_t{1} << 20;

template <class Tier>
void staged_round_trips(Tier& tier, std::size_t slots) {
    CAPTURE(slots);
    constexpr std::size_t chunk = 64 * 1024;
    sc::staging_ring ring(chunk, slots);
    stream_owner stream;
    std::mt19937_64 rng(slots);
    std::vector<std::size_t> sizes = {0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk, 7 * chunk + 5};
    for (int i = 0; i < 6; ++i) sizes.push_back(rng() % (20 * chunk));
    for (std::size_t n : sizes) {
        CAPTURE(n);
        auto data = test::random_bytes(n, n + slots);
        device_bytes src(n), dst(n);
        REQUIRE(cudaMemcpyAsync(src.ptr, data.data(), n, cudaMemcpyHostToDevice, stream.s) ==
                cudaSuccess);
        sc::stage_from_device(tier, "blob", src.ptr, n, stream.s, ring);
        CHECK(tier.contains(sc::chunk_key("blob", 0)) == (n > 0));
        CHECK_FALSE(tier.contains(
            sc::chunk_key("blob", sc::chunk_count(n, chunk))));  // longer blobs' chunks erased
        sc::stage_to_device(tier, "blob", dst.ptr, n, stream.s, ring);
        cudaStreamSynchronize(stream.s);
        CHECK(to_host(dst) == data);
    }
    // A size that does not match the staged blob is refused, naming the chunk, before
    // anything is read: a missing chunk, a longer blob, a last chunk of another size.
    device_bytes three(3 * chunk), dst(5 * chunk);
    sc::stage_from_device(tier, "blob", three.ptr, 3 * chunk, stream.s, ring);
    CHECK_THROWS_WITH_AS(sc::stage_to_device(tier, "blob", dst.ptr, 5 * chunk, stream.s, ring),
                         doctest::Contains("no chunk 'blob.3'"), std::system_error);
    CHECK_THROWS_WITH_AS(sc::stage_to_device(tier, "blob", dst.ptr, 2 * chunk, stream.s, ring),
                         doctest::Contains("'blob.2' exists"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sc::stage_to_device(tier, "blob", dst.ptr, 3 * chunk - 1, stream.s, ring),
                         doctest::Contains("chunk 'blob.2' has"), std::invalid_argument);
    CHECK(sc::erase_staged(tier, "blob") == 3);
    CHECK_FALSE(tier.contains("blob.0"));
    cudaStreamSynchronize(stream.s);
}

template <class Tier>
void stash_round_trips(Tier& tier) {
    activation_stash<Tier> host(tier, {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<Tier> stash(host, {.chunk_bytes = 64 * 1024});
    stream_owner compute;
    constexpr int layers = 4;
    const std::size_t count = 50000 + 3;  // floats per activation: 4 chunks and a bit
    std::vector<std::vector<std::byte>> originals;
    std::deque<device_bytes> acts;
    std::vector<sc::device_handle> handles;
    for (int l = 0; l < layers; ++l) {
        acts.emplace_back(count * sizeof(float));
        originals.push_back(
            test::random_bytes(count * sizeof(float), 100 + static_cast<std::uint64_t>(l)));
        cudaMemcpyAsync(acts[l].ptr, originals[l].data(), count * sizeof(float),
                        cudaMemcpyHostToDevice, compute.s);
        stash.begin_layer(static_cast<std::uint32_t>(l));
        std::optional<gate> held;
        if (l == 0) held.emplace(compute.s);  // the activation is "still being computed"
        handles.push_back(stash.save(
            float_tensor("act" + std::to_string(l), static_cast<std::uint64_t>(l + 1), count),
            acts[l].ptr, compute.s));
        if (l == 0) {
            CHECK_FALSE(stash.copied(handles[0]));  // save() returned; the copy waits for compute
            held->open();
        }
        stash.end_layer();
    }
    for (auto& h : handles) stash.wait_copied(h);
    stash.flush();  // every tensor on the tier: the loads below read it back (none forwarded)
    const std::size_t total = layers * count * sizeof(float);
    CHECK(host.stats().bytes_offloaded == total);
    for (auto& a : acts)
        cudaMemsetAsync(a.ptr, 0, a.size, compute.s);  // the copies in are ordered after these
    stash.start_backward();
    for (int l = layers - 1; l >= 0; --l) {
        if (l > 0) stash.prefetch(handles[l - 1], acts[l - 1].ptr, compute.s);  // one layer ahead
        stash.load(handles[l], acts[l].ptr, compute.s);
        cudaStreamSynchronize(compute.s);
        CHECK(to_host(acts[l]) == originals[l]);
        stash.release(handles[l]);
        CHECK_FALSE(handles[l].valid());
    }
    stash.flush();
    CHECK(host.stats().bytes_loaded == total);
    CHECK_THROWS_AS(stash.load(handles[0], acts[0].ptr, compute.s), std::invalid_argument);
}
}  // namespace

// ---- the emulation itself ------------------------------------------------------------------

TEST_CASE(
    "host_cudart: stream order, events, cross-stream waits and the last error behave as CUDA "
    "specifies") {
    stream_owner a, b;
    cudaEvent_t e = nullptr, never = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventCreate(&never) == cudaSuccess);
    CHECK(cudaEventQuery(never) == cudaSuccess);  // unrecorded: complete, and waits for nothing
    CHECK(cudaEventSynchronize(never) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(b.s, never, 0) == cudaSuccess);
    int x = 1, y = 0, z = 0;
    const int two = 2, three = 3;  // sources of copies that run after the block
    {
        gate held(a.s);
        cudaMemcpyAsync(&x, &two, sizeof x, cudaMemcpyDefault, a.s);
        REQUIRE(cudaEventRecord(e, a.s) == cudaSuccess);
        CHECK(cudaEventQuery(e) == cudaErrorNotReady);
        CHECK(cudaGetLastError() ==
              cudaErrorNotReady);  // the runtime keeps a not-ready answer as the last error
        REQUIRE(cudaStreamWaitEvent(b.s, e, 0) == cudaSuccess);
        cudaMemcpyAsync(&y, &x, sizeof y, cudaMemcpyDefault, b.s);  // after the record: reads 2
        REQUIRE(cudaEventRecord(e, b.s) ==
                cudaSuccess);  // a newer record; b's wait keeps the old one
        cudaMemcpyAsync(&z, &three, sizeof z, cudaMemcpyDefault,
                        0);  // the legacy stream is not held by a
        cudaStreamSynchronize(0);
        CHECK(z == 3);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        CHECK(cudaEventQuery(e) == cudaErrorNotReady);
        held.open();
    }
    CHECK(cudaEventSynchronize(e) == cudaSuccess);
    CHECK(cudaEventQuery(e) == cudaSuccess);
    cudaStreamSynchronize(b.s);
    CHECK(x == 2);
    CHECK(y == 2);
    CHECK(cudaEventDestroy(e) == cudaSuccess);
    CHECK(cudaEventDestroy(never) == cudaSuccess);

    CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice);
    CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
    CHECK(cudaGetLastError() == cudaSuccess);
    int count = 0, device = -1;
    CHECK(cudaGetDeviceCount(&count) == cudaSuccess);
    CHECK(cudaGetDevice(&device) == cudaSuccess);
    CHECK((count == 1 && device == 0));
    CHECK(sc::cuda_category().message(cudaErrorMemoryAllocation) ==
          "cudaErrorMemoryAllocation: out of memory");
    CHECK(sc::cuda_category().message(12345) == "cudaError 12345: unrecognized error code");
}

// ---- device_tier ---------------------------------------------------------------------------

TEST_CASE(
    "device_tier (emulated): a failed pool allocation is ENOSPC naming key and size; the old blob "
    "stays") {
    sc::device_tier tier;
    auto old = test::random_bytes(100, 1);
    REQUIRE(tier.write("k", old).wait() == 100);
    emu::fail_malloc_async(1);
    auto bigger = test::random_bytes(5000, 2);
    check_system_error(
        run([&] { return tier.write("k", bigger); }), ENOSPC,
        {"'k'", "5000 bytes", "cudaMallocFromPoolAsync", "cudaErrorMemoryAllocation"});
    CHECK(cudaPeekAtLastError() == cudaSuccess);  // the allocation error was cleared
    CHECK(tier.size_of("k") == 100u);
    CHECK(tier.used() == 100);
    std::vector<std::byte> back(100);
    CHECK(tier.read("k", back).wait() == 100);
    CHECK(back == old);
    // A failed first write leaves no key behind.
    emu::fail_malloc_async(1);
    check_system_error(run([&] { return tier.write("fresh", bigger); }), ENOSPC,
                       {"'fresh'", "5000 bytes"});
    CHECK_FALSE(tier.contains("fresh"));
    CHECK(tier.write("fresh", bigger).wait() == 5000);  // the next one succeeds
    CHECK(tier.used() == 5100);
}

TEST_CASE(
    "device_tier (emulated): writes past capacity are ENOSPC; a rewrite counts the old size once") {
    sc::device_tier tier({.capacity = 1000});
    CHECK(tier.capacity() == 1000);
    auto a = test::random_bytes(600, 3);
    REQUIRE(tier.write("a", a).wait() == 600);
    check_system_error(run([&] { return tier.write("b", test::random_bytes(500, 4)); }), ENOSPC,
                       {"'b'", "500 bytes", "capacity of 1000 bytes", "600 bytes used"});
    CHECK_FALSE(tier.contains("b"));
    CHECK(tier.used() == 600);
    auto a2 = test::random_bytes(1000, 5);
    CHECK(tier.write("a", a2).wait() == 1000);  // replaces the 600 bytes: fits exactly
    CHECK(tier.used() == 1000);
    std::vector<std::byte> back(1000);
    CHECK(tier.read("a", back).wait() == 1000);
    CHECK(back == a2);
    CHECK(tier.erase("a"));
    CHECK(tier.used() == 0);
}

TEST_CASE("device_tier (emulated): a stream error reaches the completion, naming key and size") {
    sc::device_tier tier;
    auto data = test::random_bytes(4096, 6);
    emu::set_callback_status(cudaErrorIllegalAddress);
    auto w = run([&] { return tier.write("bad", data); });
    emu::set_callback_status(cudaSuccess);
    REQUIRE(w.error);
    try {
        std::rethrow_exception(w.error);
    } catch (const std::system_error& e) {
        INFO(e.what());
        CHECK(&e.code().category() == &sc::cuda_category());
        CHECK(e.code().value() == static_cast<int>(cudaErrorIllegalAddress));
        CHECK(std::string(e.what()).find("'bad'") != std::string::npos);
        CHECK(std::string(e.what()).find("4096 bytes") != std::string::npos);
        CHECK(std::string(e.what()).find("cudaErrorIllegalAddress") != std::string::npos);
    }
    CHECK(tier.stats().failed_writes == 1);
    // The tier goes on working (the emulation has no sticky errors).
    CHECK(tier.write("good", data).wait() == 4096);
}

TEST_CASE("device_tier (emulated): every blob is freed by the time the tier is gone") {
    const std::size_t before = emu::device_bytes_in_use();
    {
        sc::device_tier tier;
        for (int i = 0; i < 10; ++i)
            tier.write("k", test::random_bytes(1000 + static_cast<std::size_t>(i), 7)).wait();
        tier.write("other", test::random_bytes(77, 8)).wait();
        CHECK(tier.device_pointer("other") != nullptr);
        CHECK(tier.device_pointer("absent") == nullptr);
    }
    CHECK(emu::device_bytes_in_use() == before);
}

// ---- staged copies -------------------------------------------------------------------------

TEST_CASE(
    "staged transfers (emulated): sizes around the chunk and random ones round-trip through a host "
    "and a file tier") {
    host_tier host;
    staged_round_trips(host, 2);
    test::temp_dir dir("cuda-emu-staged");
    file_tier<> files(dir.path());
    staged_round_trips(files, 2);
    staged_round_trips(files, 3);
}

TEST_CASE(
    "copy_to_device and copy_from_device (emulated): pageable memory through the ring, exact") {
    sc::staging_ring ring(64 * 1024, 2);
    stream_owner s;
    for (std::size_t n :
         {std::size_t{0}, std::size_t{7}, std::size_t{64 * 1024}, std::size_t{1000003}}) {
        CAPTURE(n);
        auto data = test::random_bytes(n, n);
        device_bytes dev(n);
        sc::copy_to_device(dev.ptr, data, s.s, ring);
        std::vector<std::byte> back(n);
        sc::copy_from_device(back, dev.ptr, s.s, ring);
        CHECK(back == data);
    }
}

TEST_CASE(
    "staging ring on two streams (emulated): a device-to-host copy waits for the earlier call's "
    "copy out of the slot") {
    const std::size_t chunk = 64 * 1024, n = 2 * chunk;  // one chunk per slot
    sc::staging_ring ring(chunk, 2);
    stream_owner a, b;
    auto first = test::random_bytes(n, 31), second = test::random_bytes(n, 32);
    device_bytes src(n);
    cudaMemcpyAsync(src.ptr, second.data(), n, cudaMemcpyHostToDevice, b.s);
    {
        device_bytes dst(n);
        spin(a.s, 30);  // a's copies out of the slots start late: they still need them below
        sc::copy_to_device(dst.ptr, first, a.s, ring);
        std::vector<std::byte> back(n);
        sc::copy_from_device(back, src.ptr, b.s, ring);
        cudaStreamSynchronize(a.s);
        CHECK(back == second);
        CHECK(to_host(dst) == first);
    }
    {
        host_tier tier;
        device_bytes staged(n), dst(n);
        cudaMemcpyAsync(staged.ptr, first.data(), n, cudaMemcpyHostToDevice, a.s);
        sc::stage_from_device(tier, "first", staged.ptr, n, a.s, ring);
        spin(a.s, 30);
        sc::stage_to_device(tier, "first", dst.ptr, n, a.s, ring);
        sc::stage_from_device(tier, "second", src.ptr, n, b.s, ring);
        cudaStreamSynchronize(a.s);
        CHECK(to_host(dst) == first);
        device_bytes again(n);
        sc::stage_to_device(tier, "second", again.ptr, n, b.s, ring);
        cudaStreamSynchronize(b.s);
        CHECK(to_host(again) == second);
    }
}

// ---- device_stash --------------------------------------------------------------------------

TEST_CASE(
    "device_stash (emulated): save, wait_copied, prefetch, load and release round-trip exactly") {
    SUBCASE("host tier") {
        host_tier tier;
        stash_round_trips(tier);
    }
    SUBCASE("file tier") {
        test::temp_dir dir("cuda-emu-stash");
        file_tier<> tier(dir.path());
        stash_round_trips(tier);
    }
}

TEST_CASE(
    "device_stash (emulated): a prefetch never writes its destination after release() or after a "
    "newer prefetch's load()") {
    host_tier tier;
    activation_stash<host_tier> host(tier,
                                     {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<host_tier> stash(host, {.chunk_bytes = 64 * 1024});
    stream_owner compute;
    const std::size_t count = 100000;
    const std::size_t n = count * sizeof(float);
    const auto original = test::random_bytes(n, 77);
    device_bytes act(n), dst(n);
    cudaMemcpyAsync(act.ptr, original.data(), n, cudaMemcpyHostToDevice, compute.s);
    auto save = [&](int id) {
        auto h = stash.save(
            float_tensor("t" + std::to_string(id), static_cast<std::uint64_t>(id), count), act.ptr,
            compute.s);
        stash.wait_copied(h);
        return h;
    };
    stash.begin_layer(0);
    auto h1 = save(1), h2 = save(2);
    stash.end_layer();
    stash.start_backward();
    const std::vector<std::byte> marker(n, std::byte{0xAB});

    spin(stash.side_stream(), 30);  // the copy in is still pending when release() is called
    stash.prefetch(h1, dst.ptr, compute.s);
    stash.release(h1);
    cudaMemsetAsync(dst.ptr, 0xAB, n, compute.s);
    cudaStreamSynchronize(compute.s);
    stash.flush();
    cudaStreamSynchronize(stash.side_stream());
    CHECK(to_host(dst) == marker);

    spin(stash.side_stream(), 30);
    stash.prefetch(h2, dst.ptr, compute.s);
    stash.prefetch(h2, dst.ptr, compute.s);
    stash.load(h2, dst.ptr, compute.s);
    cudaStreamSynchronize(compute.s);
    CHECK(to_host(dst) == original);
    cudaMemsetAsync(dst.ptr, 0xAB, n, compute.s);
    cudaStreamSynchronize(compute.s);
    stash.flush();
    cudaStreamSynchronize(stash.side_stream());
    CHECK(to_host(dst) == marker);
    stash.release(h2);
    stash.flush();
}

TEST_CASE(
    "device_stash (emulated): a copy in runs after the compute work enqueued before its prefetch "
    "or load") {
    host_tier tier;
    activation_stash<host_tier> host(tier,
                                     {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<host_tier> stash(host,
                                      {.chunk_bytes = 64 * 1024});  // 7 chunks through 2 slots
    stream_owner compute;
    const std::size_t count = 100000;
    const std::size_t n = count * sizeof(float);
    const auto original = test::random_bytes(n, 91);
    device_bytes act(n), dst(n), other(n);
    cudaMemcpyAsync(act.ptr, original.data(), n, cudaMemcpyHostToDevice, compute.s);
    stash.begin_layer(0);
    auto h = stash.save(float_tensor("t", 1, count), act.ptr, compute.s);
    stash.end_layer();
    stash.wait_copied(h);
    stash.start_backward();

    // The destination's last user before the prefetch is a memset held back by a gate: the
    // copy in must land after it.
    {
        gate held(compute.s);
        cudaMemsetAsync(dst.ptr, 0xAB, n, compute.s);
        stash.prefetch(h, dst.ptr, compute.s);  // returns with compute still held
        std::this_thread::sleep_for(
            std::chrono::milliseconds(20));  // give a wrong copy time to land early
        held.open();
    }
    stash.load(h, dst.ptr, compute.s);
    cudaStreamSynchronize(compute.s);
    CHECK(to_host(dst) == original);

    // load() into a destination no prefetch went to starts the copy in itself: the same order.
    spin(compute.s, 20);
    cudaMemsetAsync(other.ptr, 0xAB, n, compute.s);
    stash.load(h, other.ptr, compute.s);
    cudaStreamSynchronize(compute.s);
    CHECK(to_host(other) == original);
    stash.release(h);
    stash.flush();
}
