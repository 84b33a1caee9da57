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

/// The next `count` cudaStreamAddCallback calls fail with cudaErrorLaunchFailure (the work
/// enqueued before them stays enqueued); 0 disarms.
void fail_stream_add_callback(int count);

/// From now on every CUDA call fails with `err` (a corrupted context; cudaGetLastError
/// cannot clear it); cudaSuccess restores a working context.
void make_sticky(cudaError_t err);

/// CUDA calls made inside stream callbacks so far (each failed with cudaErrorNotPermitted).
int calls_in_callbacks();

/// The number of emulated devices (1 to 8; 1 at start).
void set_device_count(int count);

/// What cudaDeviceGetAttribute(cudaDevAttrHostRegisterReadOnlySupported) answers.
void set_read_only_supported(bool supported);

/// The flags `p` was registered with by cudaHostRegister, or -1 when it starts no
/// registration.
int registration_flags(const void* p);

/// Bytes `pool` holds from the system (live allocations and freed ranges it keeps).
std::size_t reserved_bytes(cudaMemPool_t pool);

/// The pool a live stream-ordered allocation starting at `p` came from (nullptr: none).
cudaMemPool_t pool_of(const void* p);

/// The device of the live allocation starting at `p`, or -1.
int device_of_allocation(const void* p);

}  // namespace spillway::test::host_cudart
