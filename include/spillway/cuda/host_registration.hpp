// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/host_registration.hpp: page-locks memory the program already owns
// (cudaHostRegister), so that buffers of the I/O engines and tiers become DMA-able in place.
//
// Guarantees:
// - A host_registration pins [data, data + nbytes) for its lifetime and unregisters it
//   (cudaHostUnregister) on destruction; it is move-only. A file read into such a buffer
//   lands in memory the GPU's copy engines read directly: no extra copy through a staging
//   buffer, and cudaMemcpyAsync from it is truly asynchronous.
// - register_buffer(aligned_buffer&) registers the whole padded allocation of an
//   aligned_buffer (the buffers file_tier, the update pipeline and the stash use), whose
//   4 KiB alignment keeps O_DIRECT working unchanged.
// - Registering a range that overlaps one already registered, or that the driver refuses,
//   throws std::system_error in cuda_category() naming the address and the size (the
//   thread's last error cleared, see throw_cuda_error); nothing is then registered. The
//   memory must outlive the registration.
// - registration_mode::read_only needs cudaDevAttrHostRegisterReadOnlySupported on the
//   current device, which some machines (PCIe H100s among them) lack. Where it is missing
//   the memory is registered portable instead, mode() says so and fallback_reason() says
//   why, as io_engine does for io_uring: the copies work the same, only the device's
//   promise not to write is lost.
// - Registration costs a system call and page-table work proportional to the size: register
//   long-lived buffers once, not per transfer.
#pragma once

#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "spillway/cuda/cuda_error.hpp"
#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"

namespace spillway::cuda {

/// How registered memory is mapped (cudaHostRegister flags).
enum class registration_mode : unsigned {
    portable = cudaHostRegisterPortable,  ///< pinned for every CUDA context (the default)
    mapped = cudaHostRegisterPortable | cudaHostRegisterMapped,  ///< also addressable from the device
    read_only = cudaHostRegisterPortable | cudaHostRegisterReadOnly,  ///< the device only reads it
};

namespace detail {
/// registration_mode::read_only where the current device supports it; otherwise portable,
/// with the reason in `why`. Throws std::system_error (cuda_category()) when the device
/// cannot be asked.
inline registration_mode usable_read_only(std::string& why) {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice", "host_registration (read_only)");
    int supported = 0;
    check_cuda(cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device),
               "cudaDeviceGetAttribute(cudaDevAttrHostRegisterReadOnlySupported)",
               "host_registration (read_only) on device " + std::to_string(device));
    if (supported != 0) return registration_mode::read_only;
    why = "device " + std::to_string(device) +
          " does not support read-only host registration (cudaDevAttrHostRegisterReadOnlySupported is 0): "
          "registered as portable";
    return registration_mode::portable;
}
}  // namespace detail

/// RAII registration of existing host memory as pinned; see the header comment.
class host_registration {
public:
    /// Registers nothing.
    host_registration() = default;
    /// Registers `memory` (an empty span registers nothing) with `mode`, or portable where
    /// read_only is unsupported (see mode()). Throws std::system_error (cuda_category())
    /// naming the address and the size.
    explicit host_registration(std::span<std::byte> memory, registration_mode mode = registration_mode::portable) {
        if (memory.empty()) return;
        if (mode == registration_mode::read_only) mode = detail::usable_read_only(fallback_reason_);
        cudaError_t err = cudaHostRegister(memory.data(), memory.size(), static_cast<unsigned>(mode));
        if (err != cudaSuccess) {
            char where[32];
            std::snprintf(where, sizeof where, "%p", static_cast<void*>(memory.data()));
            throw_cuda_error(err, "cudaHostRegister",
                             "host_registration of " + bytes_str(memory.size()) + " at " + where);
        }
        data_ = memory.data();
        size_ = memory.size();
        mode_ = mode;
    }
    /// Takes o's registration; o becomes empty.
    host_registration(host_registration&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)),
          size_(std::exchange(o.size_, 0)),
          mode_(std::exchange(o.mode_, registration_mode::portable)),
          fallback_reason_(std::exchange(o.fallback_reason_, {})) {}
    /// Ends this registration and takes o's; o becomes empty.
    host_registration& operator=(host_registration&& o) noexcept {
        if (this != &o) {
            release();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
            mode_ = std::exchange(o.mode_, registration_mode::portable);
            fallback_reason_ = std::exchange(o.fallback_reason_, {});
        }
        return *this;
    }
    host_registration(const host_registration&) = delete;
    host_registration& operator=(const host_registration&) = delete;
    /// Unregisters; every copy using the memory must have finished.
    ~host_registration() { release(); }

    /// The registered memory (empty when nothing is registered).
    [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
    /// True while a range is registered.
    [[nodiscard]] bool active() const noexcept { return data_ != nullptr; }
    /// The mode the memory is registered with: the one asked for, or portable where
    /// read_only is unsupported; portable when nothing is registered.
    [[nodiscard]] registration_mode mode() const noexcept { return mode_; }
    /// Why read_only fell back to portable; empty otherwise.
    [[nodiscard]] const std::string& fallback_reason() const noexcept { return fallback_reason_; }

private:
    void release() noexcept {
        if (data_) cudaHostUnregister(data_);
        data_ = nullptr;
        size_ = 0;
        mode_ = registration_mode::portable;
        fallback_reason_.clear();
    }
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    registration_mode mode_ = registration_mode::portable;
    std::string fallback_reason_;
};

/// Registers the whole (padded) allocation of `buffer`, which must outlive the result.
[[nodiscard]] inline host_registration register_buffer(aligned_buffer& buffer,
                                                       registration_mode mode = registration_mode::portable) {
    return host_registration(buffer.padded_bytes(), mode);
}

/// An aligned_buffer (4 KiB aligned, O_DIRECT-ready) that is also pinned for its lifetime:
/// the buffer a file tier reads into when the bytes go on to the GPU.
class registered_buffer {
public:
    /// An empty buffer.
    registered_buffer() = default;
    /// Allocates nbytes (zeroed, 4 KiB aligned) and registers them. Throws std::bad_alloc,
    /// or std::system_error (cuda_category()) when registration fails (nothing is leaked).
    explicit registered_buffer(std::size_t nbytes, registration_mode mode = registration_mode::portable)
        : buffer_(nbytes), registration_(register_buffer(buffer_, mode)) {}
    /// Takes o's buffer and registration; o becomes empty.
    registered_buffer(registered_buffer&&) noexcept = default;
    /// Unregisters and frees this buffer, then takes o's.
    registered_buffer& operator=(registered_buffer&& o) noexcept {
        registration_ = std::move(o.registration_);  // unregister before the old memory goes
        buffer_ = std::move(o.buffer_);
        return *this;
    }
    /// Unregisters, then frees.
    ~registered_buffer() = default;

    /// The bytes asked for.
    [[nodiscard]] std::span<std::byte> bytes() noexcept { return buffer_.bytes(); }
    /// The bytes asked for.
    [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return buffer_.bytes(); }
    /// The first byte.
    [[nodiscard]] std::byte* data() noexcept { return buffer_.data(); }
    /// The size asked for.
    [[nodiscard]] std::size_t size() const noexcept { return buffer_.size(); }
    /// The registration: its mode() and fallback_reason().
    [[nodiscard]] const host_registration& registration() const noexcept { return registration_; }

private:
    aligned_buffer buffer_;                // declared first: destroyed after the registration
    host_registration registration_;
};

}  // namespace spillway::cuda
