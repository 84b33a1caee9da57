// SPDX-License-Identifier: Apache-2.0
// GPU tests (ctest label `gpu`; built with SPILLWAY_WITH_CUDA=ON): the device tier passes
// the shared storage_tier conformance suite, pinned buffers, and the Thrust widening kernel
// on the GPU fed straight from a device-tier blob.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>

#include <spillway/cuda/device_tier.hpp>
#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/thrust_widen.hpp>

#include "cuda/gpu_skip.hpp"
#include "tier/conformance_cases.hpp"

namespace spillway::test::conformance {
/// device_tier on device 0.
struct device_factory {
    using tier_type = spillway::cuda::device_tier;
    static std::string name() { return "device"; }
    static auto bounded_args(tier_env&, std::size_t capacity) {
        spillway::cuda::device_tier_options o;
        o.capacity = capacity;
        return std::tuple(std::move(o));
    }
    static auto args(tier_env& env) { return bounded_args(env, std::numeric_limits<std::size_t>::max()); }
};
}  // namespace spillway::test::conformance

SPILLWAY_CONFORMANCE_SUITE(device_factory, throttled_of<device_factory>, faulty_of<device_factory>);
SPILLWAY_CONFORMANCE_FAULT_SUITE(device_factory);

// Using-declarations, not `using namespace spillway`: nvcc's generated code names the
// global ::cuda namespace, which spillway::cuda would make ambiguous.
using spillway::bfloat16;
using spillway::to_float;
using spillway::test::conformance::MiB;
namespace test = spillway::test;

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
        CHECK(std::string(e.what()).find(std::to_string(std::size_t{1} << 52)) != std::string::npos);
        CHECK(std::string(e.what()).find("cudaHostAlloc") != std::string::npos);
    }
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
    spillway::cuda::widen(thrust::cuda::par.on(tier.stream()), std::span<const bfloat16>(dev, n),
                std::span<float>(thrust::raw_pointer_cast(out.data()), n), scale);
    cudaStreamSynchronize(tier.stream());
    std::vector<float> host(n);
    thrust::copy(out.begin(), out.end(), host.begin());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
        float want = to_float(grads[i]) * scale;
        bool same = std::isnan(want) ? std::isnan(host[i]) : std::memcmp(&want, &host[i], sizeof want) == 0;
        if (!same) ++bad;
    }
    CHECK(bad == 0);
}
