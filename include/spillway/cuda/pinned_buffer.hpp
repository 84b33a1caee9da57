// spillway/cuda/pinned_buffer.hpp: RAII page-locked host memory from cudaHostAlloc.
//
// Guarantees: a pinned_buffer owns `size()` bytes of page-locked host memory (DMA-capable,
// so cudaMemcpyAsync to and from it overlaps with compute); it is move-only and frees the
// memory with cudaFreeHost. A failed allocation throws std::system_error in
// cuda_category() whose message names the size and the flags. The contents start
// uninitialised (cudaHostAlloc does not clear them). An empty buffer (size 0) owns nothing.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "spillway/cuda/cuda_error.hpp"
#include "spillway/error.hpp"

namespace spillway::cuda {

/// How a pinned_buffer is mapped (cudaHostAlloc flags).
enum class pinned_mode : unsigned {
    portable = cudaHostAllocPortable,            // pinned for every CUDA context (the default)
    mapped = cudaHostAllocPortable | cudaHostAllocMapped,  // also addressable from the device
    write_combined = cudaHostAllocPortable | cudaHostAllocWriteCombined,  // fast H2D, slow host reads
};

class pinned_buffer {
public:
    pinned_buffer() = default;
    /// Allocates nbytes of pinned host memory. Throws std::system_error (cuda_category()).
    explicit pinned_buffer(std::size_t nbytes, pinned_mode mode = pinned_mode::portable) : size_(nbytes) {
        if (nbytes == 0) return;
        void* p = nullptr;
        cudaError_t err = cudaHostAlloc(&p, nbytes, static_cast<unsigned>(mode));
        if (err != cudaSuccess) {
            size_ = 0;
            throw_cuda_error(err, "cudaHostAlloc",
                             "pinned_buffer of " + bytes_str(nbytes) + " (flags " +
                                 std::to_string(static_cast<unsigned>(mode)) + ")");
        }
        data_ = static_cast<std::byte*>(p);
    }
    pinned_buffer(pinned_buffer&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    pinned_buffer& operator=(pinned_buffer&& o) noexcept {
        if (this != &o) {
            release();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    pinned_buffer(const pinned_buffer&) = delete;
    pinned_buffer& operator=(const pinned_buffer&) = delete;
    ~pinned_buffer() { release(); }

    [[nodiscard]] std::byte* data() noexcept { return data_; }
    [[nodiscard]] const std::byte* data() const noexcept { return data_; }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
    [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_, size_}; }
    [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
    /// The memory as `size() / sizeof(T)` elements of T.
    template <class T>
    [[nodiscard]] std::span<T> as() noexcept {
        return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
    }

private:
    void release() noexcept {
        if (data_) cudaFreeHost(data_);  // cannot fail for a pointer from cudaHostAlloc
        data_ = nullptr;
        size_ = 0;
    }
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace spillway::cuda
