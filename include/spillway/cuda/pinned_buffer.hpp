// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/pinned_buffer.hpp: page-locked host memory from cudaHostAlloc: RAII buffers
// and a standard allocator.
//
// Guarantees:
// - A pinned_buffer owns `size()` bytes of page-locked host memory (DMA-capable, so
//   cudaMemcpyAsync to and from it is truly asynchronous and overlaps with compute); it is
//   move-only and frees the memory with cudaFreeHost. cudaHostAlloc returns page-aligned
//   memory, so a pinned_buffer is also a legal O_DIRECT buffer for the file tier.
// - A failed allocation throws std::system_error in cuda_category() whose message names
//   the size, the flags and cudaHostAlloc, and clears the thread's last error (so a later
//   Thrust launch does not report it). The contents start uninitialised (cudaHostAlloc does
//   not clear them). An empty buffer (size 0) owns nothing.
// - pinned_allocator<T> gives std containers pinned storage (std::vector<float,
//   pinned_allocator<float>>); allocate() throws std::system_error like pinned_buffer,
//   deallocate() never throws. All pinned_allocators compare equal (memory from one can be
//   freed by any other).
#pragma once

#include <cstddef>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <cuda_runtime_api.h>

#include "spillway/cuda/cuda_error.hpp"
#include "spillway/error.hpp"

namespace spillway::cuda {

/// How pinned memory is mapped (cudaHostAlloc flags).
enum class pinned_mode : unsigned {
    portable = cudaHostAllocPortable,                      ///< pinned for every CUDA context (the default)
    mapped = cudaHostAllocPortable | cudaHostAllocMapped,  ///< also addressable from the device
    write_combined = cudaHostAllocPortable | cudaHostAllocWriteCombined,  ///< fast H2D, slow host reads
};

namespace detail {
/// cudaHostAlloc of nbytes (> 0) or std::system_error naming `what`, the size and the flags
/// (the thread's last error cleared, see throw_cuda_error).
inline void* host_alloc(std::size_t nbytes, pinned_mode mode, std::string_view what) {
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, nbytes, static_cast<unsigned>(mode));
    if (err != cudaSuccess)
        throw_cuda_error(err, "cudaHostAlloc",
                         std::string(what) + " of " + bytes_str(nbytes) + " (flags " +
                             std::to_string(static_cast<unsigned>(mode)) + ")");
    return p;
}
}  // namespace detail

/// Move-only owner of page-locked host memory; see the header comment.
class pinned_buffer {
public:
    /// An empty buffer (owns nothing).
    pinned_buffer() = default;
    /// Allocates nbytes of pinned host memory. Throws std::system_error (cuda_category()).
    explicit pinned_buffer(std::size_t nbytes, pinned_mode mode = pinned_mode::portable) {
        if (nbytes == 0) return;
        data_ = static_cast<std::byte*>(detail::host_alloc(nbytes, mode, "pinned_buffer"));
        size_ = nbytes;
    }
    /// Takes o's memory; o becomes empty.
    pinned_buffer(pinned_buffer&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    /// Frees this buffer's memory and takes o's; o becomes empty.
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
    /// Frees the memory (cudaFreeHost); the caller has finished every copy using it.
    ~pinned_buffer() { release(); }

    /// The first byte (nullptr when empty).
    [[nodiscard]] std::byte* data() noexcept { return data_; }
    /// The first byte (nullptr when empty).
    [[nodiscard]] const std::byte* data() const noexcept { return data_; }
    /// Bytes owned.
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    /// True when the buffer owns nothing.
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
    /// The memory as bytes.
    [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_, size_}; }
    /// The memory as bytes.
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

/// A standard allocator of pinned host memory (cudaHostAlloc, portable).
template <class T>
class pinned_allocator {
public:
    /// The element type.
    using value_type = T;
    /// Allocators of any T are interchangeable (all memory is freed by cudaFreeHost).
    using is_always_equal = std::true_type;

    /// A stateless allocator.
    pinned_allocator() noexcept = default;
    /// Rebinding copy (std containers allocate nodes of other types).
    template <class U>
    pinned_allocator(const pinned_allocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

    /// Pinned memory for count elements. Throws std::bad_array_new_length when the size
    /// overflows, std::system_error (cuda_category()) when cudaHostAlloc fails.
    [[nodiscard]] T* allocate(std::size_t count) {
        if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
        if (count == 0) count = 1;  // a distinct, freeable pointer
        return static_cast<T*>(detail::host_alloc(count * sizeof(T), pinned_mode::portable, "pinned_allocator"));
    }
    /// Frees memory from allocate().
    void deallocate(T* p, std::size_t) noexcept { cudaFreeHost(p); }

    /// All pinned allocators are equal.
    template <class U>
    friend bool operator==(const pinned_allocator&, const pinned_allocator<U>&) noexcept {
        return true;
    }
};

}  // namespace spillway::cuda
