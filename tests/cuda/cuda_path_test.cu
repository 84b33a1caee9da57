// SPDX-License-Identifier: Apache-2.0
// GPU tests of the CUDA path (ctest label `gpu`; built with SPILLWAY_WITH_CUDA=ON):
// registered I/O buffers, staged tier <-> device round trips of random sizes over a host and a
// file tier, the pageable copies through the staging ring, the Thrust optimizer kernels on
// the GPU against the CPU step, stream_policy against thrust::cuda::par (the same results,
// and a gradient scan that does not wait for another stream), and the activation stash with
// device tensors (compute never waits, exact round trips through a file tier, prefetch).
// Consecutive ring calls on two streams do not overwrite a slot still being read; a prefetch
// never writes its destination after release() or after the load() of a newer prefetch, nor
// before the compute work enqueued ahead of it.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>

#include <spillway/cuda/device_stash.hpp>
#include <spillway/cuda/host_registration.hpp>
#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/staged_copy.hpp>
#include <spillway/cuda/stream_policy.hpp>
#include <spillway/cuda/thrust_optim.hpp>
#include <spillway/optim/adam.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include "cuda/device_test_support.hpp"
#include "cuda/gpu_skip.hpp"
#include "support/random_bytes.hpp"
#include "support/temp_dir.hpp"

// Using-declarations, not `using namespace spillway`: nvcc's generated code names the
// global ::cuda namespace, which spillway::cuda would make ambiguous.
using spillway::activation_stash;
using spillway::adamw_config;
using spillway::adamw_step_args;
using spillway::aligned_buffer;
using spillway::bfloat16;
using spillway::dtype;
using spillway::file_tier;
using spillway::float16;
using spillway::from_float;
using spillway::host_tier;
using spillway::split_mode;
using spillway::step_result;
using spillway::tensor_desc;
using spillway::to_float;
namespace sc = spillway::cuda;
namespace test = spillway::test;

namespace {
using spillway::test::device_bytes;
using spillway::test::to_host;
constexpr std::size_t MiB = std::size_t{1} << 20;

/// Spins on the GPU for about `ms` milliseconds (makes "the host did not wait" observable).
__global__ void spin_kernel(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
void spin(cudaStream_t stream, int ms) {
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    spin_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(khz) * ms);
}
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
template <class T>
std::span<T> span_of(thrust::device_vector<T>& v) {
    return {thrust::raw_pointer_cast(v.data()), v.size()};
}
template <class T>
std::span<const T> const_span_of(const thrust::device_vector<T>& v) {
    return {thrust::raw_pointer_cast(v.data()), v.size()};
}

template <class Tier>
void staged_round_trips(Tier& tier, std::size_t slots) {
    CAPTURE(slots);
    sc::staging_ring ring(MiB, slots);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    std::mt19937_64 rng(slots);
    std::vector<std::size_t> sizes = {0, 1, MiB - 1, MiB, MiB + 1, 3 * MiB};
    for (int i = 0; i < 6; ++i) sizes.push_back(rng() % (20 * MiB));
    for (std::size_t n : sizes) {
        CAPTURE(n);
        auto data = test::random_bytes(n, n + slots);
        device_bytes src(n), dst(n);
        cudaMemcpyAsync(src.ptr, data.data(), n, cudaMemcpyHostToDevice, stream);
        sc::stage_from_device(tier, "blob", src.ptr, n, stream, ring);
        CHECK(tier.contains(sc::chunk_key("blob", 0)) == (n > 0));
        CHECK_FALSE(tier.contains(
            sc::chunk_key("blob", sc::chunk_count(n, MiB))));  // longer blobs' chunks erased
        sc::stage_to_device(tier, "blob", dst.ptr, n, stream, ring);
        cudaStreamSynchronize(stream);
        CHECK(to_host(dst) == data);
    }
    // A size that does not match the staged blob is refused, naming the chunk, before
    // anything is read: a missing chunk, a longer blob, a last chunk of another size.
    device_bytes three(3 * MiB), dst(5 * MiB);
    sc::stage_from_device(tier, "blob", three.ptr, 3 * MiB, stream, ring);
    CHECK_THROWS_WITH_AS(sc::stage_to_device(tier, "blob", dst.ptr, 5 * MiB, stream, ring),
                         doctest::Contains("no chunk 'blob.3'"), std::system_error);
    CHECK_THROWS_WITH_AS(sc::stage_to_device(tier, "blob", dst.ptr, 2 * MiB, stream, ring),
                         doctest::Contains("'blob.2' exists"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sc::stage_to_device(tier, "blob", dst.ptr, 3 * MiB - 1, stream, ring),
                         doctest::Contains("chunk 'blob.2' has"), std::invalid_argument);
    CHECK(sc::erase_staged(tier, "blob") == 3);
    CHECK_FALSE(tier.contains("blob.0"));
    cudaStreamDestroy(stream);
}
}  // namespace

TEST_CASE(
    "pinned_allocator and host_registration: pinned vectors, registered file-tier reads go "
    "straight to the GPU") {
    std::vector<float, sc::pinned_allocator<float>> v(1000, 2.5f);
    CHECK(v[999] == 2.5f);
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, v.data()) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeHost);  // page-locked, not pageable

    test::temp_dir dir("cuda-reg");
    file_tier<> tier(dir.path());
    const std::size_t n = 8 * MiB + 100;
    auto data = test::random_bytes(n, 5);
    tier.write("x", data).wait();
    sc::registered_buffer landing(n);
    REQUIRE(cudaPointerGetAttributes(&attr, landing.data()) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeHost);
    tier.read("x", landing.bytes()).wait();  // O_DIRECT into registered memory: no bounce
    device_bytes dev(n);
    cudaStream_t s;
    cudaStreamCreate(&s);
    REQUIRE(cudaMemcpyAsync(dev.ptr, landing.data(), n, cudaMemcpyHostToDevice, s) == cudaSuccess);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    CHECK(to_host(dev) == data);

    aligned_buffer twice(MiB);
    auto first = sc::register_buffer(twice);
    try {
        auto second = sc::register_buffer(twice);
        FAIL("a range was registered twice");
    } catch (const std::system_error& e) {
        CHECK(&e.code().category() == &sc::cuda_category());
        CHECK(std::string(e.what()).find(std::to_string(MiB)) != std::string::npos);
    }
}

TEST_CASE("staged transfers: random sizes round-trip exactly through a host tier and a file tier") {
    host_tier host;
    staged_round_trips(host, 2);
    test::temp_dir dir("cuda-staged");
    file_tier<> files(dir.path());
    staged_round_trips(files, 2);
    staged_round_trips(files, 3);
}

TEST_CASE("copy_to_device and copy_from_device: pageable memory through the ring, exact") {
    sc::staging_ring ring(64 * 1024, 2);
    cudaStream_t s;
    cudaStreamCreate(&s);
    for (std::size_t n :
         {std::size_t{0}, std::size_t{7}, std::size_t{64 * 1024}, std::size_t{1000003}}) {
        auto data = test::random_bytes(n, n);
        device_bytes dev(n);
        sc::copy_to_device(dev.ptr, data, s, ring);
        std::vector<std::byte> back(n);
        sc::copy_from_device(back, dev.ptr, s, ring);
        CHECK(back == data);
    }
    cudaStreamDestroy(s);
}

TEST_CASE(
    "staging ring on two streams: a device-to-host copy waits for the earlier call's copy out of "
    "the slot") {
    const std::size_t chunk = 64 * 1024, n = 2 * chunk;  // one chunk per slot
    sc::staging_ring ring(chunk, 2);
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    auto first = test::random_bytes(n, 31), second = test::random_bytes(n, 32);
    device_bytes src(n);
    // On b, which reads src below: a and b do not synchronise with the legacy default stream,
    // and a pageable cudaMemcpy may return before its copy has reached the device.
    cudaMemcpyAsync(src.ptr, second.data(), n, cudaMemcpyHostToDevice, b);
    {  // pageable copies: copy_to_device on a, then copy_from_device on b
        device_bytes dst(n);
        spin(a, 200);  // a's copies out of the slots start late: they still need them below
        sc::copy_to_device(dst.ptr, first, a, ring);
        std::vector<std::byte> back(n);
        sc::copy_from_device(back, src.ptr, b, ring);
        cudaStreamSynchronize(a);
        CHECK(back == second);
        CHECK(to_host(dst) == first);
    }
    {  // staged copies: stage_to_device on a, then stage_from_device on b
        host_tier tier;
        device_bytes staged(n), dst(n);
        cudaMemcpyAsync(staged.ptr, first.data(), n, cudaMemcpyHostToDevice,
                        a);  // on a, which reads it
        sc::stage_from_device(tier, "first", staged.ptr, n, a, ring);
        spin(a, 200);
        sc::stage_to_device(tier, "first", dst.ptr, n, a, ring);
        sc::stage_from_device(tier, "second", src.ptr, n, b, ring);
        cudaStreamSynchronize(a);
        CHECK(to_host(dst) == first);
        device_bytes again(n);
        sc::stage_to_device(tier, "second", again.ptr, n, b, ring);
        cudaStreamSynchronize(b);
        CHECK(to_host(again) == second);
    }
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

TEST_CASE(
    "thrust optimizer kernels on the GPU: AdamW and the cast bit-identical to the CPU, the norm "
    "within 1e-12") {
    constexpr std::size_t n = (std::size_t{1} << 20) + 33;
    std::mt19937 rng(21);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
    for (auto& x : p) x = d(rng);
    thrust::device_vector<float> dp(p), dm(m), dv(v);
    thrust::device_vector<bfloat16> dcopy(n);
    std::vector<bfloat16> copy(n);
    cudaStream_t s;
    cudaStreamCreate(&s);
    auto pol = sc::stream_policy(s);
    adamw_config config{.lr = 1e-3f, .weight_decay = 0.01f};
    for (std::int64_t step = 1; step <= 3; ++step) {
        std::vector<float16> g(n);
        for (auto& x : g) x = from_float<float16>(d(rng) * 64.0f);
        thrust::device_vector<float16> dg(g);
        adamw_step_args args{.step = step, .grad_scale = 64.0f};
        REQUIRE(spillway::adamw_step<float16, bfloat16>(config, args, p, m, v, g, copy) ==
                step_result::applied);
        REQUIRE(sc::adamw_step(pol, config, args,
                               std::span<float>(thrust::raw_pointer_cast(dp.data()), n),
                               std::span<float>(thrust::raw_pointer_cast(dm.data()), n),
                               std::span<float>(thrust::raw_pointer_cast(dv.data()), n),
                               std::span<const float16>(thrust::raw_pointer_cast(dg.data()), n),
                               std::span<bfloat16>(thrust::raw_pointer_cast(dcopy.data()), n)) ==
                step_result::applied);
        auto check = sc::check_gradients(
            pol, std::span<const float16>(thrust::raw_pointer_cast(dg.data()), n), 64.0f);
        long double ref = 0;
        for (auto x : g) ref += static_cast<long double>(to_float(x) / 64.0) * (to_float(x) / 64.0);
        CHECK(std::fabs(static_cast<long double>(check.sum_squares) - ref) <= 1e-12L * ref);
    }
    cudaStreamSynchronize(s);
    std::vector<float> gp(n), gm(n), gv(n);
    thrust::copy(dp.begin(), dp.end(), gp.begin());
    thrust::copy(dm.begin(), dm.end(), gm.begin());
    thrust::copy(dv.begin(), dv.end(), gv.begin());
    std::vector<bfloat16> gcopy(n);
    thrust::copy(dcopy.begin(), dcopy.end(), gcopy.begin());
    CHECK(std::memcmp(gp.data(), p.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(gm.data(), m.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(gv.data(), v.data(), n * sizeof(float)) == 0);
    CHECK(gcopy == copy);

    thrust::device_vector<float16> half(n);
    sc::narrow(pol, std::span<const float>(thrust::raw_pointer_cast(dp.data()), n),
               std::span<float16>(thrust::raw_pointer_cast(half.data()), n));
    std::vector<float16> cpu_half(n), gpu_half(n);
    spillway::narrow(p, std::span<float16>(cpu_half));
    cudaStreamSynchronize(s);
    thrust::copy(half.begin(), half.end(), gpu_half.begin());
    CHECK(gpu_half == cpu_half);
    cudaStreamDestroy(s);
}

TEST_CASE(
    "stream_policy: the same norm, scan and step as par.on, and a gradient scan does not wait for "
    "another stream") {
    constexpr std::size_t n = (std::size_t{1} << 20) + 7;
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float16> g(n);
    for (auto& x : g) x = from_float<float16>(d(rng) * 64.0f);
    std::vector<float> p(n);
    for (auto& x : p) x = d(rng);
    std::vector<float16> bad = g;
    bad[n / 2] = from_float<float16>(std::numeric_limits<float>::infinity());
    // Built and filled by Thrust on the legacy default stream, which it synchronises.
    thrust::device_vector<float16> dg(g), dbad(bad);
    thrust::device_vector<float> p1(p), m1(n, 0.0f), v1(n, 0.0f), p2(p), m2(n, 0.0f), v2(n, 0.0f);
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    const auto legacy = thrust::cuda::par.on(a);  // cudaMalloc/cudaFree scratch
    const auto ordered = sc::stream_policy(a);

    // The reductions: one CUB reduction either way, so the same bits.
    const auto by_par = sc::check_gradients(legacy, const_span_of(dg), 64.0f);
    const auto by_stream = sc::check_gradients(ordered, const_span_of(dg), 64.0f);
    CHECK(by_stream.sum_squares == by_par.sum_squares);
    CHECK(by_stream.norm == by_par.norm);
    CHECK_FALSE(by_stream.overflow);
    CHECK(sc::grad_sum_squares(ordered, const_span_of(dg), 64.0f) == by_par.sum_squares);
    CHECK(sc::check_gradients(ordered, const_span_of(dbad), 64.0f).overflow);

    // The scan (any_of): an inf skips the step and touches nothing; finite gradients step
    // bit-identically under both policies.
    adamw_config config{.lr = 1e-3f, .weight_decay = 0.01f};
    adamw_step_args args{.step = 1, .grad_scale = 64.0f};
    CHECK(sc::adamw_step(ordered, config, args, span_of(p1), span_of(m1), span_of(v1),
                         const_span_of(dbad)) == step_result::skipped_overflow);
    CHECK(sc::adamw_step(legacy, config, args, span_of(p2), span_of(m2), span_of(v2),
                         const_span_of(dbad)) == step_result::skipped_overflow);
    cudaStreamSynchronize(a);
    std::vector<float> h1(n), h2(n);
    thrust::copy(p1.begin(), p1.end(), h1.begin());
    CHECK(std::memcmp(h1.data(), p.data(), n * sizeof(float)) == 0);
    CHECK(sc::adamw_step(ordered, config, args, span_of(p1), span_of(m1), span_of(v1),
                         const_span_of(dg)) == step_result::applied);
    CHECK(sc::adamw_step(legacy, config, args, span_of(p2), span_of(m2), span_of(v2),
                         const_span_of(dg)) == step_result::applied);
    cudaStreamSynchronize(a);  // stream_policy's update returns before it has run
    thrust::copy(p1.begin(), p1.end(), h1.begin());
    thrust::copy(p2.begin(), p2.end(), h2.begin());
    CHECK(std::memcmp(h1.data(), h2.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(h1.data(), p.data(), n * sizeof(float)) != 0);

    // A scan on a while b spins: it returns while b is still busy. Every kernel involved ran
    // once above (spin below), so no lazy module load, which may synchronise the context,
    // falls inside the measurement.
    spin(b, 1);
    cudaStreamSynchronize(b);
    spin(b, 500);
    const auto t0 = std::chrono::steady_clock::now();
    const auto during = sc::check_gradients(ordered, const_span_of(dg), 64.0f);
    const bool scan_applied =
        sc::adamw_step(ordered, config, args, span_of(p1), span_of(m1), span_of(v1),
                       const_span_of(dg)) == step_result::applied;
    cudaStreamSynchronize(a);
    const double ms = ms_since(t0);
    const bool b_busy = !sc::query_done(cudaStreamQuery(b), "cudaStreamQuery", "stream b");
    INFO("the scan and the step on stream a took " << ms << " ms; a 500 ms spin runs on stream b");
    CHECK(b_busy);
    CHECK(ms < 250);
    CHECK(during.sum_squares == by_par.sum_squares);
    CHECK(scan_applied);
    cudaStreamSynchronize(b);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

TEST_CASE(
    "device_stash: compute never waits, tensors round-trip exactly through a file tier, prefetch") {
    test::temp_dir dir("cuda-stash");
    file_tier<> tier(dir.path());
    activation_stash<file_tier<>> host(
        tier, {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<file_tier<>> stash(host, {.chunk_bytes = 256 * 1024});
    cudaStream_t compute;
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);

    constexpr int layers = 4;
    const std::size_t count = 300000;  // floats per activation
    std::vector<std::vector<std::byte>> originals;
    std::deque<device_bytes> acts;  // not movable: a deque builds them in place
    std::vector<sc::device_handle> handles;
    for (int l = 0; l < layers; ++l) {
        acts.emplace_back(count * sizeof(float));
        originals.push_back(test::random_bytes(count * sizeof(float), 100 + l));
        cudaMemcpyAsync(acts[l].ptr, originals[l].data(), count * sizeof(float),
                        cudaMemcpyHostToDevice, compute);
        stash.begin_layer(static_cast<std::uint32_t>(l));
        if (l == 0) spin(compute, 200);  // the activation is "still being computed"
        tensor_desc desc;
        desc.name = "act" + std::to_string(l);
        desc.storage_id = static_cast<std::uint64_t>(l + 1);
        desc.type = dtype::f32;
        desc.shape = {static_cast<std::int64_t>(count)};
        auto t0 = std::chrono::steady_clock::now();
        handles.push_back(stash.save(desc, acts[l].ptr, compute));
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count();
        CHECK(ms < 50);  // returned while the GPU is still spinning
        if (l == 0) CHECK_FALSE(stash.copied(handles[0]));
        stash.end_layer();
    }
    for (auto& h : handles) stash.wait_copied(h);
    // The device copies are free again. The copies in are ordered after these memsets by
    // the prefetches (and the first load), not by the host.
    for (auto& a : acts) cudaMemsetAsync(a.ptr, 0, a.size, compute);
    stash.start_backward();
    for (int l = layers - 1; l >= 0; --l) {
        if (l > 0) stash.prefetch(handles[l - 1], acts[l - 1].ptr, compute);  // one layer ahead
        stash.load(handles[l], acts[l].ptr, compute);
        cudaStreamSynchronize(compute);
        CHECK(to_host(acts[l]) == originals[l]);
        stash.release(handles[l]);
        CHECK_FALSE(handles[l].valid());
    }
    stash.flush();
    CHECK(host.stats().bytes_offloaded > 0);
    CHECK_THROWS_AS(stash.load(handles[0], acts[0].ptr, compute), std::invalid_argument);
    cudaStreamDestroy(compute);
}

TEST_CASE(
    "device_stash: a prefetch never writes its destination after release() or after a newer "
    "prefetch's load()") {
    host_tier tier;
    activation_stash<host_tier> host(tier,
                                     {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<host_tier> stash(host, {.chunk_bytes = 64 * 1024});
    cudaStream_t compute;
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    const std::size_t count = 100000;  // floats
    const std::size_t n = count * sizeof(float);
    const auto original = test::random_bytes(n, 77);
    device_bytes act(n), dst(n);
    cudaMemcpyAsync(act.ptr, original.data(), n, cudaMemcpyHostToDevice,
                    compute);  // save() orders after compute
    auto save = [&](int id) {
        tensor_desc desc;
        desc.name = "t" + std::to_string(id);
        desc.storage_id = static_cast<std::uint64_t>(id);
        desc.type = dtype::f32;
        desc.shape = {static_cast<std::int64_t>(count)};
        auto h = stash.save(desc, act.ptr, compute);
        stash.wait_copied(h);
        return h;
    };
    stash.begin_layer(0);
    auto h1 = save(1), h2 = save(2);
    stash.end_layer();
    stash.start_backward();
    const std::vector<std::byte> marker(n, std::byte{0xAB});

    // prefetch then release without a load: once release() returned, dst is the caller's.
    spin(stash.side_stream(), 200);  // the copy in is still pending when release() is called
    stash.prefetch(h1, dst.ptr, compute);
    stash.release(h1);
    cudaMemsetAsync(dst.ptr, 0xAB, n, compute);
    cudaStreamSynchronize(compute);
    stash.flush();
    cudaStreamSynchronize(stash.side_stream());
    CHECK(to_host(dst) == marker);

    // The same destination prefetched twice: load() waits for the newer prefetch, and no
    // copy in writes dst after it returned.
    spin(stash.side_stream(), 200);
    stash.prefetch(h2, dst.ptr, compute);
    stash.prefetch(h2, dst.ptr, compute);
    stash.load(h2, dst.ptr, compute);
    cudaStreamSynchronize(compute);
    CHECK(to_host(dst) == original);
    cudaMemsetAsync(dst.ptr, 0xAB, n, compute);
    cudaStreamSynchronize(compute);
    stash.flush();
    cudaStreamSynchronize(stash.side_stream());
    CHECK(to_host(dst) == marker);
    stash.release(h2);
    cudaStreamDestroy(compute);
}

TEST_CASE(
    "device_stash: a copy in runs after the compute work enqueued before its prefetch or load") {
    host_tier tier;
    activation_stash<host_tier> host(tier,
                                     {.keep_below_bytes = 4096, .split = split_mode::offload_all});
    sc::device_stash<host_tier> stash(host,
                                      {.chunk_bytes = 64 * 1024});  // 7 chunks through 2 slots
    cudaStream_t compute;
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    const std::size_t count = 100000;  // floats
    const std::size_t n = count * sizeof(float);
    const auto original = test::random_bytes(n, 91);
    device_bytes act(n), dst(n), other(n);
    cudaMemcpyAsync(act.ptr, original.data(), n, cudaMemcpyHostToDevice, compute);
    tensor_desc desc;
    desc.name = "t";
    desc.storage_id = 1;
    desc.type = dtype::f32;
    desc.shape = {static_cast<std::int64_t>(count)};
    stash.begin_layer(0);
    auto h = stash.save(desc, act.ptr, compute);
    stash.end_layer();
    stash.wait_copied(h);
    stash.start_backward();

    // The destination's last user before the prefetch is a memset that starts only after a
    // spin: the copy in must land after it, not during the spin.
    spin(compute, 200);
    cudaMemsetAsync(dst.ptr, 0xAB, n, compute);
    const auto t0 = std::chrono::steady_clock::now();
    stash.prefetch(h, dst.ptr, compute);
    CHECK(ms_since(t0) < 50);  // the host does not wait for compute
    stash.load(h, dst.ptr, compute);
    cudaStreamSynchronize(compute);
    CHECK(to_host(dst) == original);

    // load() into a destination no prefetch went to starts the copy in itself: the same order.
    spin(compute, 200);
    cudaMemsetAsync(other.ptr, 0xAB, n, compute);
    stash.load(h, other.ptr, compute);
    cudaStreamSynchronize(compute);
    CHECK(to_host(other) == original);
    stash.release(h);
    stash.flush();
    cudaStreamDestroy(compute);
}
