// SPDX-License-Identifier: Apache-2.0
// tests/cuda/host_cudart.hpp: the test hooks of the host emulation of the CUDA runtime
// (tests/cuda/host_cudart.cpp, which defines the cudart functions spillway/cuda/ calls, so
// a test linked with it instead of libcudart runs those headers on a machine without a GPU).
// See host_cudart.cpp for what is emulated and what is not.
#pragma once

#include <cstddef>
#include <functional>

#include <cuda_runtime_api.h>

namespace spillway::test::host_cudart {

/// The next `count` cudaMallocAsync calls (from any thread) fail with
/// cudaErrorMemoryAllocation; 0 disarms.
void fail_malloc_async(int count);

/// Stream callbacks enqueued (cudaStreamAddCallback) from now on are called with `status`
/// instead of cudaSuccess; cudaSuccess disarms.
void set_callback_status(cudaError_t status);

/// Enqueues `work` on `stream`: it runs on the stream's thread, in order with the copies
/// (a stand-in for a kernel, e.g. a sleep that makes "the host did not wait" observable).
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work);

/// Bytes of "device" memory (cudaMalloc, cudaMallocAsync) allocated and not yet freed.
std::size_t device_bytes_in_use();

}  // namespace spillway::test::host_cudart
