// SPDX-License-Identifier: Apache-2.0
// GPU tests (ctest label `gpu`; built with SPILLWAY_WITH_CUDA=ON): the device tier passes
// the shared storage_tier conformance suite, with pageable and with pinned caller buffers;
// pinned buffers, and a failed allocation that later Thrust launches do not see; writes and
// reads from pinned buffers return while the tier's stream is busy, pageable reads wait;
// read-only host registration or its fallback; and the Thrust widening kernel on the GPU fed
// straight from a device-tier blob.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>

#include <spillway/cuda/device_tier.hpp>
#include <spillway/cuda/host_registration.hpp>
#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/thrust_widen.hpp>

#include "cuda/gpu_skip.hpp"
#include "cuda/device_test_support.hpp"
#include "tier/conformance_cases.hpp"

SPILLWAY_CONFORMANCE_SUITE(device_factory, throttled_of<device_factory>, faulty_of<device_factory>,
                           device_pinned_factory);
SPILLWAY_CONFORMANCE_FAULT_SUITE(device_factory, device_pinned_factory);

// Using-declarations, not `using namespace spillway`: nvcc's generated code names the
// global ::cuda namespace, which spillway::cuda would make ambiguous.
using spillway::bfloat16;
using spillway::to_float;
using spillway::test::conformance::MiB;
namespace test = spillway::test;

// widen() on the CUDA backend runs on a stream the caller names: an overload without one would
// run on the legacy default stream, unordered with the library's non-blocking streams.
template <class Half>
concept widen_without_stream = requires(std::span<const Half> in, std::span<float> out) {
    spillway::cuda::widen(in, out);
};
static_assert(!widen_without_stream<bfloat16>);

TEST_CASE("pinned_buffer: allocation, moves, and a clear error for an impossible size") {
    spillway::cuda::pinned_buffer a(3 * 4096 + 5);
    REQUIRE(a.data() != nullptr);
    CHECK(a.size() == 3 * 4096 + 5);
    std::memset(a.data(), 0x5a, a.size());
    spillway::cuda::pinned_buffer b = std::move(a);
    CHECK(a.empty());
    CHECK(b.bytes()[b.size() - 1] == std::byte{0x5a});
    spillway::cuda::pinned_buffer none(0);
    CHECK(none.empty());
    try {
        spillway::cuda::pinned_buffer huge(std::size_t{1} << 52);  // 4 PiB
        FAIL("a 4 PiB pinned allocation succeeded");
    } catch (const std::system_error& e) {
        CHECK(&e.code().category() == &spillway::cuda::cuda_category());
        CHECK(std::string(e.what()).find(std::to_string(std::size_t{1} << 52)) !=
              std::string::npos);
        CHECK(std::string(e.what()).find("cudaHostAlloc") != std::string::npos);
    }
    // The failure was reported once, by the exception: the thread's last error is clear, so
    // a Thrust launch (which checks cudaPeekAtLastError after each kernel) works.
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    thrust::device_vector<int> v(1000);
    thrust::sequence(v.begin(), v.end());
    CHECK(thrust::reduce(v.begin(), v.end()) == 999 * 1000 / 2);
}

namespace {
/// Spins one GPU thread for `ns` nanoseconds of the GPU's global timer.
__global__ void spin_kernel(unsigned long long ns) {
    unsigned long long start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST_CASE(
    "device_tier: with pinned buffers write() and read() return while the stream is busy; a "
    "pageable read() waits") {
    constexpr double spin_ms = 300;
    const unsigned long long spin_ns = static_cast<unsigned long long>(spin_ms * 1e6);
    spillway::cuda::device_tier tier;
    constexpr std::size_t n = 4 * MiB + 1;
    spillway::cuda::pinned_buffer in(n), out(n);
    auto data = test::random_bytes(n, 31);
    std::memcpy(in.data(), data.data(), n);
    // Warm up: the stream's memory pool, the kernel's module.
    tier.write("warm", in.bytes()).wait();
    spin_kernel<<<1, 1, 0, tier.stream()>>>(0);
    REQUIRE(cudaStreamSynchronize(tier.stream()) == cudaSuccess);

    // 1. A write from pinned memory enqueues behind the spin and returns.
    spin_kernel<<<1, 1, 0, tier.stream()>>>(spin_ns);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    auto t0 = std::chrono::steady_clock::now();
    auto w = tier.write("k", in.bytes());
    const double write_ms = ms_since(t0);
    CHECK_FALSE(w.ready());
    CHECK(w.wait() == n);
    const double write_total_ms = ms_since(t0);
    MESSAGE("pinned write: returned after " << write_ms << " ms, done after " << write_total_ms
                                            << " ms (spin " << spin_ms << " ms)");
    CHECK(write_total_ms > spin_ms / 2);  // the spin did hold the copy back
    CHECK(write_ms < spin_ms / 4);

    // 2. So does a read into pinned memory; the bytes are right once wait() returns.
    spin_kernel<<<1, 1, 0, tier.stream()>>>(spin_ns);
    t0 = std::chrono::steady_clock::now();
    auto r = tier.read("k", out.bytes());
    const double read_ms = ms_since(t0);
    CHECK(r.wait() == n);
    const double read_total_ms = ms_since(t0);
    MESSAGE("pinned read: returned after " << read_ms << " ms, done after " << read_total_ms
                                           << " ms");
    CHECK(read_total_ms > spin_ms / 2);
    CHECK(read_ms < spin_ms / 4);
    CHECK(std::memcmp(out.data(), data.data(), n) == 0);

    // 3. A read into pageable memory returns only once the copy is done (CUDA's documented
    //    behaviour for device-to-pageable copies): behind the whole spin.
    std::vector<std::byte> pageable(n);
    spin_kernel<<<1, 1, 0, tier.stream()>>>(spin_ns);
    t0 = std::chrono::steady_clock::now();
    auto p = tier.read("k", pageable);
    const double pageable_ms = ms_since(t0);
    MESSAGE("pageable read: returned after " << pageable_ms << " ms");
    CHECK(pageable_ms > spin_ms / 2);
    CHECK(p.wait() == n);
    CHECK(pageable == data);

    // 4. A write from pageable memory may wait too (the runtime stages it): reported only.
    spin_kernel<<<1, 1, 0, tier.stream()>>>(spin_ns);
    t0 = std::chrono::steady_clock::now();
    auto pw = tier.write("k2", data);
    MESSAGE("pageable write: returned after " << ms_since(t0) << " ms");
    CHECK(pw.wait() == n);
    std::vector<std::byte> back(n);
    CHECK(tier.read("k2", back).wait() == n);
    CHECK(back == data);
}

TEST_CASE(
    "host_registration: read_only where the device supports it, portable otherwise; registered "
    "either way") {
    int device = 0;
    REQUIRE(cudaGetDevice(&device) == cudaSuccess);
    int supported = 0;
    REQUIRE(cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device) ==
            cudaSuccess);
    MESSAGE("cudaDevAttrHostRegisterReadOnlySupported on device " << device << ": " << supported);
    constexpr std::size_t n = MiB + 5;
    spillway::cuda::registered_buffer buf(n, spillway::cuda::registration_mode::read_only);
    const auto& reg = buf.registration();
    CHECK(reg.active());
    CHECK(reg.mode() == (supported ? spillway::cuda::registration_mode::read_only
                                   : spillway::cuda::registration_mode::portable));
    CHECK(reg.fallback_reason().empty() == (supported != 0));
    if (!supported) MESSAGE("fallback: " << reg.fallback_reason());
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, buf.data()) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeHost);  // page-locked, known to CUDA

    // The device reads it: a copy to device memory and back.
    auto data = test::random_bytes(n, 12);
    std::memcpy(buf.data(), data.data(), n);
    thrust::device_vector<unsigned char> dev(n);
    REQUIRE(cudaMemcpy(thrust::raw_pointer_cast(dev.data()), buf.data(), n,
                       cudaMemcpyHostToDevice) == cudaSuccess);
    std::vector<std::byte> back(n);
    REQUIRE(cudaMemcpy(back.data(), thrust::raw_pointer_cast(dev.data()), n,
                       cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(back == data);
}

TEST_CASE("device_tier: pinned buffers round-trip, and device_pointer exposes the blob") {
    spillway::cuda::device_tier tier;
    spillway::cuda::pinned_buffer in(8 * MiB + 3), out(8 * MiB + 3);
    auto data = test::random_bytes(in.size(), 77);
    std::memcpy(in.data(), data.data(), data.size());
    auto w = tier.write("p", in.bytes());
    CHECK(w.wait() == in.size());
    tier.read("p", out.bytes()).wait();
    CHECK(std::memcmp(out.data(), data.data(), data.size()) == 0);
    CHECK(tier.device_pointer("p") != nullptr);
    CHECK(tier.device_pointer("absent") == nullptr);
}

TEST_CASE("thrust widen on the GPU: a bf16 blob in the device tier becomes scaled fp32") {
    constexpr std::size_t n = (std::size_t{1} << 20) + 7;
    std::vector<bfloat16> grads(n);
    std::mt19937 rng(3);
    for (auto& g : grads) g.bits = static_cast<std::uint16_t>(rng());
    spillway::cuda::device_tier tier;
    auto bytes = std::as_bytes(std::span<const bfloat16>(grads));
    tier.write("grads", bytes).wait();
    thrust::device_vector<float> out(n);
    const auto* dev = static_cast<const bfloat16*>(tier.device_pointer("grads"));
    const float scale = 1.0f / 1024;
    spillway::cuda::widen(tier.stream(), std::span<const bfloat16>(dev, n),
                          std::span<float>(thrust::raw_pointer_cast(out.data()), n), scale);
    cudaStreamSynchronize(tier.stream());
    std::vector<float> host(n);
    thrust::copy(out.begin(), out.end(), host.begin());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
        float want = to_float(grads[i]) * scale;
        bool same =
            std::isnan(want) ? std::isnan(host[i]) : std::memcmp(&want, &host[i], sizeof want) == 0;
        if (!same) ++bad;
    }
    CHECK(bad == 0);
}
