// SPDX-License-Identifier: Apache-2.0
// tests/cuda/device_test_support.hpp: what the CUDA tests share, on a GPU or on the host
// emulation of the runtime (host_cudart.cpp): device memory freed at scope exit, its bytes
// copied back, and the conformance suite's factories for device_tier (pageable and pinned
// caller buffers). Host API calls only, so the host compiler and nvcc both build it.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include <spillway/cuda/cuda_error.hpp>
#include <spillway/cuda/device_tier.hpp>
#include <spillway/cuda/pinned_buffer.hpp>

#include "tier/conformance.hpp"

namespace spillway::test {

/// Device memory for a test (freed at scope exit).
struct device_bytes {
    explicit device_bytes(std::size_t n) : size(n) {
        spillway::cuda::check_cuda(cudaMalloc(&ptr, n == 0 ? 1 : n), "cudaMalloc", "test buffer");
    }
    ~device_bytes() { cudaFree(ptr); }
    device_bytes(const device_bytes&) = delete;
    device_bytes& operator=(const device_bytes&) = delete;
    void* ptr = nullptr;
    std::size_t size;
};

/// d's bytes. The caller first synchronises the streams that wrote d: this copy runs on the
/// legacy default stream, which does not wait for non-blocking streams.
inline std::vector<std::byte> to_host(const device_bytes& d) {
    std::vector<std::byte> out(d.size);
    spillway::cuda::check_cuda(cudaMemcpy(out.data(), d.ptr, d.size, cudaMemcpyDeviceToHost), "cudaMemcpy",
                               "to_host");
    return out;
}

}  // namespace spillway::test

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
/// The same tier, handed caller buffers in pinned memory: the asynchronous path (with the
/// pageable buffers of device_factory every copy is staged, and waits).
struct device_pinned_factory : device_factory {
    using buffer_type = std::vector<std::byte, spillway::cuda::pinned_allocator<std::byte>>;
    static std::string name() { return "device(pinned buffers)"; }
};
}  // namespace spillway::test::conformance
