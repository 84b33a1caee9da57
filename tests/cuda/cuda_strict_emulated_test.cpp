// SPDX-License-Identifier: Apache-2.0
// The CUDA pieces under the strict rules of the host emulation (tests/cuda/host_cudart.cpp,
// label cuda): the places where a lenient emulation lets a wrong program pass.
// - The emulation itself: a not-ready query sets the last error; sticky errors; a CUDA call
//   in a stream callback is cudaErrorNotPermitted; a pageable copy blocks the caller; the
//   legacy default stream waits for blocking streams; a range freed on a stream is handed
//   again at once; allocations and event records respect the current device;
//   cudaHostRegister checks its flags.
// - Each case below "the library:" holds a guarantee of spillway/cuda/ that depends on one
//   of those rules: no not-ready code left behind by the staged copies; an error in the
//   device stash's mover thread reaches the caller naming the tensor; a reader on another
//   stream orders a device_tier blob's free after its work; a device_stash and a
//   device_tier on a device that is not current; a failed stream callback reported only
//   after the copy before it stopped reading the caller's buffer.
#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include <spillway/cuda/device_stash.hpp>
#include <spillway/cuda/device_tier.hpp>
#include <spillway/cuda/host_registration.hpp>
#include <spillway/cuda/memory_pools.hpp>
#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/staged_copy.hpp>
#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include "cuda/device_test_support.hpp"
#include "cuda/emulated_test_support.hpp"
#include "cuda/host_cudart.hpp"
#include "support/random_bytes.hpp"

namespace sc = spillway::cuda;
namespace emu = spillway::test::host_cudart;
namespace test = spillway::test;
using spillway::activation_stash;
using spillway::dtype;
using spillway::host_tier;
using spillway::split_mode;
using spillway::tensor_desc;
using spillway::test::device_bytes;
using spillway::test::to_host;

namespace {
using spillway::test::emulated::float_tensor;
using spillway::test::emulated::gate;
using spillway::test::emulated::spin;
using spillway::test::emulated::stream_owner;

template <class Future>
bool finishes_within(Future& f, int ms) {
    return f.wait_for(std::chrono::milliseconds(ms)) == std::future_status::ready;
}

}  // namespace

// ---- the emulation's rules -----------------------------------------------------------------

TEST_CASE("host_cudart (strict): a not-ready query sets the last error; sticky errors stay") {
    stream_owner a;
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    {
        gate held(a.s);
        REQUIRE(cudaEventRecord(e, a.s) == cudaSuccess);
        CHECK(cudaEventQuery(e) == cudaErrorNotReady);
        CHECK(cudaPeekAtLastError() == cudaErrorNotReady);
        CHECK(cudaGetLastError() == cudaErrorNotReady);
        CHECK(cudaStreamQuery(a.s) == cudaErrorNotReady);
        CHECK(cudaGetLastError() == cudaErrorNotReady);
    }
    cudaStreamSynchronize(a.s);
    CHECK(cudaStreamQuery(a.s) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    cudaEventDestroy(e);

    emu::make_sticky(cudaErrorIllegalAddress);
    void* p = nullptr;
    CHECK(cudaMallocAsync(&p, 16, a.s) == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // cannot be cleared
    emu::make_sticky(cudaSuccess);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // the thread's last one
    CHECK(cudaGetLastError() == cudaSuccess);
}

namespace {
std::atomic<cudaError_t> seen_in_callback{cudaSuccess};
void CUDART_CB calls_cuda(cudaStream_t, cudaError_t, void*) {
    int device = 0;
    seen_in_callback.store(cudaGetDevice(&device));
}
}  // namespace

TEST_CASE("host_cudart (strict): a CUDA call inside a stream callback is cudaErrorNotPermitted") {
    stream_owner a;
    const int before = emu::calls_in_callbacks();
    REQUIRE(cudaStreamAddCallback(a.s, calls_cuda, nullptr, 0) == cudaSuccess);
    cudaStreamSynchronize(a.s);
    CHECK(seen_in_callback.load() == cudaErrorNotPermitted);
    CHECK(emu::calls_in_callbacks() == before + 1);
    emu::fail_stream_add_callback(1);
    CHECK(cudaStreamAddCallback(a.s, calls_cuda, nullptr, 0) == cudaErrorLaunchFailure);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
}

TEST_CASE("host_cudart (strict): a pageable copy blocks until it ran; a pinned one enqueues") {
    stream_owner a;
    device_bytes dev(4096);
    std::vector<std::byte> pageable(4096, std::byte{1});
    sc::pinned_buffer pinned(4096);
    {
        gate held(a.s);
        CHECK(cudaMemcpyAsync(dev.ptr, pinned.data(), 4096, cudaMemcpyHostToDevice, a.s) ==
              cudaSuccess);  // returns
        auto copy = std::async(std::launch::async, [&] {
            return cudaMemcpyAsync(dev.ptr, pageable.data(), 4096, cudaMemcpyHostToDevice, a.s);
        });
        CHECK_FALSE(finishes_within(copy, 30));  // waits behind the held stream
        held.open();
        CHECK(copy.get() == cudaSuccess);
    }
    cudaStreamSynchronize(a.s);
    CHECK(to_host(dev) == pageable);
}

TEST_CASE(
    "host_cudart (strict): the legacy default stream waits for blocking streams, not for "
    "non-blocking ones") {
    stream_owner blocking(cudaStreamDefault), nonblocking;
    int x = 0, y = 0;
    const int one = 1;
    {
        gate held(blocking.s);
        cudaMemcpyAsync(&x, &one, sizeof x, cudaMemcpyDefault, 0);
        spin(0, 20);
        CHECK(x == 0);  // the legacy stream waits for the held blocking stream
        held.open();
        cudaStreamSynchronize(0);
        CHECK(x == 1);
    }
    {
        gate held(nonblocking.s);
        cudaMemcpyAsync(&y, &one, sizeof y, cudaMemcpyDefault, 0);
        cudaStreamSynchronize(0);  // would hang if it waited for the held stream
        CHECK(y == 1);
    }
    {
        // Work on a blocking stream after legacy work waits for it.
        int z = 0;
        const int two = 2;
        gate legacy_held(nullptr);
        cudaMemcpyAsync(&z, &two, sizeof z, cudaMemcpyDefault, blocking.s);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        CHECK(z == 0);
        legacy_held.open();
        cudaStreamSynchronize(blocking.s);
        CHECK(z == 2);
    }
}

TEST_CASE(
    "host_cudart (strict): a range freed on a stream is handed again at once; the pool keeps its "
    "threshold") {
    stream_owner a, b;
    void* p = nullptr;
    void* q = nullptr;
    REQUIRE(cudaMallocAsync(&p, 1000, a.s) == cudaSuccess);
    REQUIRE(cudaFreeAsync(p, a.s) == cudaSuccess);
    REQUIRE(cudaMallocAsync(&q, 1000, a.s) == cudaSuccess);
    CHECK(q == p);  // same stream: reused before the free ran
    cudaFreeAsync(q, a.s);
    {
        gate held(a.s);
        void* r = nullptr;
        cudaFreeAsync(nullptr, a.s);
        void* s = nullptr;
        REQUIRE(cudaMallocAsync(&s, 1000, a.s) == cudaSuccess);  // takes the freed range back
        cudaFreeAsync(s, a.s);  // freed again, pending behind the gate
        REQUIRE(cudaMallocAsync(&r, 1000, b.s) == cudaSuccess);
        CHECK(r != s);  // another stream: not until the free ran
        cudaFreeAsync(r, b.s);
    }
    cudaStreamSynchronize(a.s);
    cudaStreamSynchronize(b.s);
    cudaMemPool_t pool = nullptr;
    REQUIRE(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess);
    CHECK(emu::reserved_bytes(pool) == 0);  // threshold 0: everything went back at the sync
}

TEST_CASE("host_cudart (strict): allocations and event records respect the current device") {
    emu::set_device_count(2);
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    cudaStream_t on1 = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&on1, cudaStreamNonBlocking) == cudaSuccess);
    cudaEvent_t e1 = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    void* p = nullptr;
    CHECK(cudaMallocAsync(&p, 64, on1) == cudaErrorInvalidValue);
    cudaGetLastError();
    cudaEvent_t e0 = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e0, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventRecord(e0, on1) == cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    CHECK(cudaEventRecord(e1, on1) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(0, e1, 0) == cudaSuccess);  // waiting across devices is allowed
    cudaSetDevice(1);
    CHECK(cudaMallocAsync(&p, 64, on1) == cudaSuccess);
    CHECK(emu::device_of_allocation(p) == 1);
    cudaFreeAsync(p, on1);
    cudaStreamSynchronize(on1);
    cudaStreamDestroy(on1);
    cudaEventDestroy(e1);
    cudaSetDevice(0);
    cudaEventDestroy(e0);
    emu::set_device_count(1);
}

TEST_CASE("host_cudart (strict): cudaHostRegister checks its flags and overlaps") {
    std::vector<std::byte> memory(3 * 4096);
    CHECK(cudaHostRegister(memory.data(), 4096, 0x100) == cudaErrorInvalidValue);
    cudaGetLastError();
    REQUIRE(cudaHostRegister(memory.data(), 4096,
                             cudaHostRegisterPortable | cudaHostRegisterMapped) == cudaSuccess);
    CHECK(emu::registration_flags(memory.data()) ==
          (cudaHostRegisterPortable | cudaHostRegisterMapped));
    CHECK(cudaHostRegister(memory.data() + 100, 4096, 0) == cudaErrorHostMemoryAlreadyRegistered);
    cudaGetLastError();
    emu::set_read_only_supported(false);
    CHECK(cudaHostRegister(memory.data() + 4096, 4096, cudaHostRegisterReadOnly) ==
          cudaErrorNotSupported);
    cudaGetLastError();
    {
        sc::host_registration reg(std::span<std::byte>(memory.data() + 4096, 4096),
                                  sc::registration_mode::read_only);
        CHECK(reg.mode() == sc::registration_mode::portable);  // the library's fallback
        CHECK(emu::registration_flags(memory.data() + 4096) == cudaHostRegisterPortable);
    }
    emu::set_read_only_supported(true);
    CHECK(emu::registration_flags(memory.data() + 4096) == -1);
    CHECK(cudaHostUnregister(memory.data() + 4096) == cudaErrorHostMemoryNotRegistered);
    cudaGetLastError();
    CHECK(cudaHostUnregister(memory.data()) == cudaSuccess);
}

// ---- the library under those rules --------------------------------------------------------

TEST_CASE(
    "the library: a staged copy leaves no cudaErrorNotReady behind for the next Thrust launch") {
    host_tier tier;
    constexpr std::size_t chunk = 64 * 1024, n = 6 * chunk;
    sc::staging_ring ring(chunk, 2);
    stream_owner s;
    auto data = test::random_bytes(n, 5);
    device_bytes src(n), dst(n);
    cudaMemcpyAsync(src.ptr, data.data(), n, cudaMemcpyHostToDevice, s.s);
    sc::stage_from_device(tier, "blob", src.ptr, n, s.s, ring);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    spin(s.s, 20);  // the slots' copies are still queued when the reads ahead poll them
    sc::stage_to_device(tier, "blob", dst.ptr, n, s.s, ring);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    cudaStreamSynchronize(s.s);
    CHECK(to_host(dst) == data);
}

TEST_CASE(
    "the library: an error in the device stash's mover thread reaches the caller, naming the "
    "tensor") {
    spillway::faulty_tier<host_tier> tier;
    activation_stash<spillway::faulty_tier<host_tier>> host(
        tier, {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<spillway::faulty_tier<host_tier>> stash(host, {.chunk_bytes = 64 * 1024});
    stream_owner compute;
    const std::size_t count = 20000, n = count * sizeof(float);
    const auto data = test::random_bytes(n, 9);
    device_bytes act(n), dst(n);
    cudaMemcpyAsync(act.ptr, data.data(), n, cudaMemcpyHostToDevice, compute.s);
    tier.fail_nth(spillway::fault_op::write, 1, ENOSPC);
    stash.begin_layer(0);
    auto h = stash.save(float_tensor("attn.out", 1, count), act.ptr, compute.s);
    stash.end_layer();
    stash.wait_copied(h);  // the copy out succeeded; the tier write fails after it
    while (tier.counters().injected_errors == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(
        std::chrono::milliseconds(200));  // the host stash has seen the failed write
    stash.begin_layer(1);  // the host stash reports the failed write here, on the mover thread
    auto h2 = stash.save(float_tensor("mlp.out", 2, count), act.ptr, compute.s);
    try {
        stash.wait_copied(h2);
        FAIL("wait_copied did not report the mover thread's error");
    } catch (const std::system_error& e) {
        INFO(e.what());
        CHECK(e.code().value() == ENOSPC);
        CHECK(std::string(e.what()).find("mlp.out") != std::string::npos);
    }
    // The stash goes on: a tensor saved now round-trips.
    stash.begin_layer(2);
    auto h3 = stash.save(float_tensor("ln.out", 3, count), act.ptr, compute.s);
    stash.end_layer();
    stash.wait_copied(h3);
    stash.start_backward();
    stash.load(h3, dst.ptr, compute.s);
    cudaStreamSynchronize(compute.s);
    CHECK(to_host(dst) == data);
    stash.release(h3);
    stash.flush();
}

TEST_CASE("the library: a device_tier blob read on another stream is not freed under the reader") {
    sc::device_tier tier;
    stream_owner reader;
    constexpr std::size_t n = 4096;
    const auto first = test::random_bytes(n, 1), second = test::random_bytes(n, 2),
               third = test::random_bytes(n, 3);
    sc::pinned_buffer a(n), b(n), c(n);  // pinned: the writes only enqueue
    std::memcpy(a.data(), first.data(), n);
    std::memcpy(b.data(), second.data(), n);
    std::memcpy(c.data(), third.data(), n);
    auto span_of = [](sc::pinned_buffer& p) {
        return std::span<const std::byte>(p.data(), p.size());
    };
    REQUIRE(tier.write("w", span_of(a)).wait() == n);
    device_bytes out(n);
    {
        gate held(reader.s);  // the reader's kernel is still queued when the key is rewritten
        const void* p = tier.device_pointer("w", reader.s);
        REQUIRE(p != nullptr);
        cudaMemcpyAsync(out.ptr, p, n, cudaMemcpyDeviceToDevice, reader.s);
        auto rewrite = tier.write("w", span_of(b));  // frees the first blob
        auto other = tier.write("x", span_of(c));  // the same size: the pool's freed range, if free
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        held.open();
        CHECK(rewrite.wait() == n);
        CHECK(other.wait() == n);
    }
    cudaStreamSynchronize(reader.s);
    CHECK(to_host(out) == first);
}

TEST_CASE("the library: device_stash and device_tier on a device that is not current") {
    emu::set_device_count(2);
    cudaStream_t compute = nullptr;
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
    const std::size_t count = 30000, n = count * sizeof(float);
    const auto data = test::random_bytes(n, 17);
    void* act = nullptr;
    void* dst = nullptr;
    REQUIRE(cudaMalloc(&act, n) == cudaSuccess);
    REQUIRE(cudaMalloc(&dst, n) == cudaSuccess);
    cudaMemcpyAsync(act, data.data(), n, cudaMemcpyHostToDevice, compute);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);  // the caller's current device is another one
    {
        host_tier tier;
        activation_stash<host_tier> host(
            tier, {.keep_below_bytes = 4096, .split = split_mode::offload_all});
        sc::device_stash<host_tier> stash(host, {.device = 1, .chunk_bytes = 64 * 1024});
        stash.begin_layer(0);
        auto h = stash.save(float_tensor("act", 1, count), act, compute);
        stash.end_layer();
        stash.wait_copied(h);
        stash.start_backward();
        stash.prefetch(h, dst, compute);
        stash.load(h, dst, compute);
        cudaStreamSynchronize(compute);
        std::vector<std::byte> back(n);
        cudaMemcpy(back.data(), dst, n, cudaMemcpyDeviceToHost);
        CHECK(back == data);
        stash.release(h);
        stash.flush();

        sc::device_tier dtier({.device = 1});
        REQUIRE(dtier.write("k", data).wait() == n);
        CHECK(emu::device_of_allocation(dtier.device_pointer("k", compute)) == 1);
        std::vector<std::byte> read(n);
        CHECK(dtier.read("k", read).wait() == n);
        CHECK(read == data);
    }
    int current = -1;
    cudaGetDevice(&current);
    CHECK(current == 0);
    cudaFree(act);
    cudaFree(dst);
    cudaStreamDestroy(compute);
    emu::set_device_count(1);
}

TEST_CASE(
    "the library: a failed cudaStreamAddCallback is reported once the copy stopped reading the "
    "buffer") {
    sc::device_tier tier;
    constexpr std::size_t n = 4096;
    sc::pinned_buffer source(n);
    std::memset(source.data(), 7, n);
    gate held(tier.stream());
    emu::fail_stream_add_callback(1);
    auto write = std::async(std::launch::async, [&] {
        return spillway::test::conformance::run(
            [&] { return tier.write("k", std::span<const std::byte>(source.data(), n)); });
    });
    CHECK_FALSE(finishes_within(write, 50));  // the copy still reads `source`: not reported yet
    held.open();
    auto outcome = write.get();
    REQUIRE(outcome.error);
    CHECK_THROWS_WITH_AS(std::rethrow_exception(outcome.error),
                         doctest::Contains("cudaStreamAddCallback"), std::system_error);
    CHECK_FALSE(tier.contains("k"));
}

TEST_CASE(
    "the library: device_tier blobs and Thrust scratch each have a pool of their own, with its "
    "threshold") {
    cudaMemPool_t default_pool = nullptr;
    REQUIRE(cudaDeviceGetDefaultMemPool(&default_pool, 0) == cudaSuccess);
    std::uint64_t threshold = 1;
    sc::device_tier tier;
    constexpr std::size_t n = 4096;
    REQUIRE(tier.write("k", test::random_bytes(n, 1)).wait() == n);
    cudaMemPool_t pool = emu::pool_of(tier.device_pointer("k"));
    REQUIRE(pool != nullptr);
    CHECK(pool != default_pool);  // the caller's default pool keeps its own threshold
    REQUIRE(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) ==
            cudaSuccess);
    CHECK(threshold == sc::tier_release_threshold);
    REQUIRE(tier.write("k", test::random_bytes(n, 2)).wait() == n);
    cudaStreamSynchronize(tier.stream());
    CHECK(emu::reserved_bytes(pool) ==
          n);  // the rewritten blob's memory went back: only the live one

    cudaMemPool_t scratch = sc::scratch_pool(0);
    CHECK(scratch != default_pool);
    CHECK(scratch != pool);
    CHECK(sc::scratch_pool(0) == scratch);  // one per device for the process
    REQUIRE(cudaMemPoolGetAttribute(scratch, cudaMemPoolAttrReleaseThreshold, &threshold) ==
            cudaSuccess);
    CHECK(threshold == sc::scratch_release_threshold);
    stream_owner s;
    void* p = nullptr;
    REQUIRE(cudaMallocFromPoolAsync(&p, std::size_t{1} << 20, scratch, s.s) == cudaSuccess);
    cudaFreeAsync(p, s.s);
    cudaStreamSynchronize(s.s);
    CHECK(emu::reserved_bytes(scratch) == std::size_t{1} << 20);  // kept mapped for the next call
    CHECK_THROWS_AS((void)sc::scratch_pool(64), std::system_error);
}

TEST_CASE("the library: a pageable device_tier copy blocks its caller only, not the tier") {
    sc::device_tier tier;
    constexpr std::size_t n = 8192;
    const auto a = test::random_bytes(n, 1), b = test::random_bytes(n, 2),
               c = test::random_bytes(n, 3);
    REQUIRE(tier.write("a", a).wait() == n);
    REQUIRE(tier.write("b", b).wait() == n);
    std::vector<std::byte> back(n);
    std::optional<gate> held(tier.stream());  // the GPU is busy: a pageable copy waits for it
    auto reading = std::async(std::launch::async, [&] { return tier.read("a", back).wait(); });
    auto writing = std::async(std::launch::async, [&] { return tier.write("b", c).wait(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // both copies are waiting now
    auto others = std::async(std::launch::async, [&] {
        const bool present = tier.contains("a") && tier.size_of("b") == n;
        const bool erased = tier.erase("a");  // the read in flight keeps its blob until it is done
        return present && erased && !tier.contains("a");
    });
    CHECK(finishes_within(others, 10000));  // not behind the blocked copies
    CHECK_FALSE(finishes_within(reading, 0));
    held.reset();
    CHECK(reading.get() == n);
    CHECK(back == a);
    CHECK(writing.get() == n);
    CHECK(others.get());
    std::vector<std::byte> now(n);
    CHECK(tier.read("b", now).wait() == n);
    CHECK(now == c);
    CHECK(tier.used() == n);
    // Two writes of one key in flight at once: the one issued last stands.
    {
        gate again(tier.stream());
        auto first = std::async(std::launch::async, [&] { return tier.write("k", a).wait(); });
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        auto second = std::async(std::launch::async, [&] { return tier.write("k", b).wait(); });
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        again.open();
        CHECK(first.get() == n);
        CHECK(second.get() == n);
    }
    CHECK(tier.read("k", now).wait() == n);
    CHECK(now == b);
    CHECK(tier.used() == 2 * n);
}

TEST_CASE(
    "the library: device_stash::load returns while the side stream's copies are still queued") {
    host_tier tier;
    activation_stash<host_tier> host(tier,
                                     {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<host_tier> stash(host,
                                      {.chunk_bytes = 64 * 1024});  // 7 chunks, 2 staging slots
    stream_owner compute;
    const std::size_t count = 100000, n = count * sizeof(float);
    const auto data = test::random_bytes(n, 23);
    device_bytes act(n), dst(n);
    cudaMemcpyAsync(act.ptr, data.data(), n, cudaMemcpyHostToDevice, compute.s);
    stash.begin_layer(0);
    auto h = stash.save(float_tensor("act", 1, count), act.ptr, compute.s);
    stash.end_layer();
    stash.wait_copied(h);
    stash.flush();
    stash.start_backward();
    cudaMemsetAsync(dst.ptr, 0, n, compute.s);
    {
        gate held(stash.side_stream());  // the copy engine is busy with earlier work
        auto loading = std::async(std::launch::async, [&] { stash.load(h, dst.ptr, compute.s); });
        CHECK(finishes_within(loading, 10000));  // enqueued, not waited for chunk by chunk
        held.open();
        loading.get();
    }
    cudaStreamSynchronize(compute.s);
    CHECK(to_host(dst) == data);
    stash.release(h);
    stash.flush();

    // Arrival buffers bounded below one tensor: each copy in still lands, in order.
    host_tier tier2;
    activation_stash<host_tier> host2(tier2,
                                      {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<host_tier> small(host2,
                                      {.chunk_bytes = 64 * 1024, .arrival_pinned_bytes = 4096});
    std::vector<sc::device_handle> handles;
    small.begin_layer(0);
    for (std::uint64_t id = 1; id <= 3; ++id) {
        handles.push_back(small.save(float_tensor("t" + std::to_string(id), id, count - 1000 * id),
                                     act.ptr, compute.s));
        small.wait_copied(handles.back());
    }
    small.end_layer();
    small.start_backward();
    for (std::size_t i = handles.size(); i-- > 0;) {
        const std::size_t bytes = (count - 1000 * (i + 1)) * sizeof(float);
        device_bytes into(bytes);
        small.load(handles[i], into.ptr, compute.s);
        cudaStreamSynchronize(compute.s);
        CHECK(to_host(into) ==
              std::vector<std::byte>(data.begin(),
                                     data.begin() + static_cast<std::ptrdiff_t>(bytes)));
        small.release(handles[i]);
    }
    small.flush();
}

TEST_CASE("the library: no CUDA call was made inside a stream callback") {
    CHECK(emu::calls_in_callbacks() == 1);  // the emulation's own case above, none of the library's
}
