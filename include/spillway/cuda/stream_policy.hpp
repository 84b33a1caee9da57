// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/stream_policy.hpp: a Thrust execution policy for the CUDA backend that keeps
// a Thrust call on its stream: its scratch memory is stream-ordered, so a reduction on one
// stream never stalls the others.
//
// Guarantees:
// - stream_policy(s) is thrust::cuda::par_nosync(stream_allocator(s)).on(s). Thrust's
//   scratch memory (the temporary storage of reductions such as transform_reduce and
//   any_of) comes from cudaMallocFromPoolAsync and goes back with cudaFreeAsync, both
//   ordered on s.
//   thrust::cuda::par.on(s) uses cudaMalloc and cudaFree instead, and cudaFree synchronises
//   the whole device: every reduction would wait for the work of every other stream.
// - Nothing waits for s unless the call's result is needed on the host. A call that returns
//   nothing computed on the device (transform, for_each, fill) returns once its kernels are
//   enqueued on s, like a <<<...>>> launch; the caller orders later readers after s. A call
//   that returns a value computed on the device (reduce, transform_reduce, any_of) waits
//   for s up to its own kernels, because copying the value to the host synchronises s, so
//   the value it returns is final. Work enqueued on s before a call runs before it.
// - The scratch memory comes from the Thrust scratch pool of the current device
//   (memory_pools.hpp: scratch_pool(), release threshold scratch_release_threshold), never
//   from the device's default pool: freed scratch up to that threshold stays mapped for the
//   next call, and the caller's default pool keeps its own threshold. The stream must
//   belong to the current device.
// - stream_allocator::allocate() throws std::system_error in cuda_category() naming the
//   size (check_cuda: the thread's last CUDA error is cleared, so a later Thrust launch does
//   not report it as its own); deallocate() never throws (Thrust calls it from destructors).
// - Declared only where Thrust's CUDA backend is there (compiled by nvcc, or with the CUDA
//   backend as Thrust's device system). With Thrust's CPU backends (OMP, CPP) this header
//   declares nothing, so code that runs the Thrust kernels on the CPU compiles unchanged.
#pragma once

#include <thrust/execution_policy.h>  // THRUST_DEVICE_SYSTEM

#if defined(__CUDACC__) || THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA

#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>
#include <thrust/system/cuda/execution_policy.h>

#include "spillway/cuda/cuda_error.hpp"
#include "spillway/cuda/memory_pools.hpp"
#include "spillway/error.hpp"

namespace spillway::cuda {

/// A Thrust allocator of scratch bytes ordered on one stream (cudaMallocAsync and
/// cudaFreeAsync). Copies share the stream; the stream must outlive every policy using it.
class stream_allocator {
public:
    /// Thrust allocates scratch as bytes.
    using value_type = char;

    /// Allocates on `stream` (which the caller keeps alive).
    explicit stream_allocator(cudaStream_t stream) noexcept : stream_(stream) {}

    /// nbytes of device memory, usable by work enqueued on the stream from now on (nullptr
    /// for nbytes <= 0). Throws std::system_error (cuda_category()) naming the size.
    [[nodiscard]] char* allocate(std::ptrdiff_t nbytes) {
        if (nbytes <= 0) return nullptr;
        void* p = nullptr;
        const std::string what =
            "stream_allocator: " + bytes_str(static_cast<std::size_t>(nbytes)) +
            " of Thrust scratch memory";
        int device = 0;
        check_cuda(cudaGetDevice(&device), "cudaGetDevice", what);
        check_cuda(cudaMallocFromPoolAsync(&p, static_cast<std::size_t>(nbytes),
                                           scratch_pool(device), stream_),
                   "cudaMallocFromPoolAsync", what);
        return static_cast<char*>(p);
    }

    /// Gives p back once the work enqueued on the stream so far has finished with it. Never
    /// throws: a failure is cleared from the thread's last error (a broken context stays
    /// broken, and the next CUDA call reports it).
    void deallocate(char* p, std::size_t) noexcept {
        if (p && cudaFreeAsync(p, stream_) != cudaSuccess) cudaGetLastError();
    }

    /// The stream the memory is ordered on.
    [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

private:
    cudaStream_t stream_;
};

/// The execution policy for Thrust calls on `stream` (which the caller keeps alive while a
/// call runs): thrust::cuda::par_nosync with a stream_allocator, on `stream`. See the
/// header comment for which calls return before their kernels finish.
[[nodiscard]] inline auto stream_policy(cudaStream_t stream) {
    return thrust::cuda::par_nosync(stream_allocator(stream)).on(stream);
}

}  // namespace spillway::cuda

#endif
