// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/memory_pools.hpp: the stream-ordered memory pools of the library, one per
// role, each with a stated release threshold, so that one role's freed memory neither
// goes back to the driver when another role wants it kept nor is kept when another role
// needs it.
//
// Guarantees:
// - Two roles, never the device's default pool (which stays the caller's, with the
//   caller's threshold):
//   1. Thrust scratch (stream_allocator, stream_policy.hpp): one pool per device for the
//      process, scratch_pool(device), release threshold scratch_release_threshold
//      (64 MiB). Freed scratch up to that much stays mapped across synchronisations, so a
//      reduction per step does not map and unmap its temporary storage each time; above it
//      the pool gives memory back at the next synchronisation.
//   2. device_tier blobs: one pool per tier (tier_pool), release threshold 0. A freed or
//      rewritten blob's memory goes back to the driver at the next synchronisation of the
//      tier's stream, where the trainer's own allocations can have it; a tier never holds
//      more than its live blobs across a synchronisation.
// - memory_pool owns a pool (cudaMemPoolCreate on a device, pinned device memory) and
//   destroys it (cudaMemPoolDestroy; CUDA defers that until its allocations are freed).
// - Creation failures throw std::system_error in cuda_category() naming the device and
//   the role (the thread's last error cleared).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include <cuda_runtime_api.h>

#include "spillway/cuda/cuda_error.hpp"

namespace spillway::cuda {

/// The release threshold of the Thrust scratch pools (bytes kept mapped across syncs).
inline constexpr std::uint64_t scratch_release_threshold = std::uint64_t{64} << 20;
/// The release threshold of a device_tier's pool: freed blobs go back at the next sync.
inline constexpr std::uint64_t tier_release_threshold = 0;

/// Owner of one stream-ordered memory pool on a device.
class memory_pool {
public:
    /// Owns no pool.
    memory_pool() = default;
    /// Creates a pool of device memory on `device` with the given release threshold; `role`
    /// names it in errors. Throws std::system_error (cuda_category()).
    memory_pool(int device, std::uint64_t release_threshold, std::string_view role) {
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        const std::string what =
            std::string(role) + " memory pool on device " + std::to_string(device);
        check_cuda(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate", what);
        std::uint64_t threshold = release_threshold;
        if (cudaError_t err =
                cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
            err != cudaSuccess) {
            cudaMemPoolDestroy(std::exchange(pool_, nullptr));
            throw_cuda_error(err, "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)", what);
        }
    }
    /// Takes o's pool; o then owns none.
    memory_pool(memory_pool&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)) {}
    /// Destroys this pool (if any) and takes o's.
    memory_pool& operator=(memory_pool&& o) noexcept {
        if (this != &o) {
            reset();
            pool_ = std::exchange(o.pool_, nullptr);
        }
        return *this;
    }
    memory_pool(const memory_pool&) = delete;
    memory_pool& operator=(const memory_pool&) = delete;
    ~memory_pool() { reset(); }
    /// The pool (nullptr when none is owned).
    [[nodiscard]] cudaMemPool_t get() const noexcept { return pool_; }

private:
    void reset() noexcept {
        if (pool_ && cudaMemPoolDestroy(pool_) != cudaSuccess) cudaGetLastError();
        pool_ = nullptr;
    }
    cudaMemPool_t pool_ = nullptr;
};

/// The Thrust scratch pool of `device` (0 to 63), created on first use and kept for the
/// process (see the header comment). Thread-safe. Throws std::system_error (cuda_category()).
[[nodiscard]] inline cudaMemPool_t scratch_pool(int device) {
    static std::mutex mutex;
    // Never destroyed: a pool destroyed at exit could outlive the runtime it belongs to.
    static auto* const pools = new std::array<std::unique_ptr<memory_pool>, 64>();
    if (device < 0 || device >= static_cast<int>(pools->size()))
        throw_cuda_error(cudaErrorInvalidDevice, "scratch_pool",
                         "device " + std::to_string(device));
    std::lock_guard lock(mutex);
    auto& pool = (*pools)[static_cast<std::size_t>(device)];
    if (!pool)
        pool = std::make_unique<memory_pool>(device, scratch_release_threshold, "Thrust scratch");
    return pool->get();
}

/// A new pool for one device_tier's blobs on `device` (see the header comment).
[[nodiscard]] inline memory_pool tier_pool(int device) {
    return memory_pool(device, tier_release_threshold, "device_tier");
}

}  // namespace spillway::cuda
