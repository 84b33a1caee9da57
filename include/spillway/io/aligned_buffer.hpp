// spillway/io/aligned_buffer.hpp: RAII host buffers aligned for O_DIRECT.
//
// Guarantees: data() is aligned to `alignment` (default 4 KiB, a power of two); the
// allocation is rounded up to a multiple of the alignment, so O_DIRECT transfers of the
// padded size are legal; size() is the size the caller asked for. With
// memory_lock::locked the pages are mlock()ed (pinned in RAM, never swapped) and a failure
// to lock throws std::system_error naming the size (raise RLIMIT_MEMLOCK or use unlocked).
// The contents start zeroed (buffer_fill::uninitialized leaves all but the padding as the
// allocator returned it).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <utility>

#include <sys/mman.h>

#include "spillway/error.hpp"

namespace spillway {

inline constexpr std::size_t default_alignment = 4096;

/// Rounds nbytes up to a multiple of `alignment` (a power of two).
constexpr std::size_t align_up(std::size_t nbytes, std::size_t alignment = default_alignment) noexcept {
    return (nbytes + alignment - 1) & ~(alignment - 1);
}
constexpr bool is_aligned(std::size_t value, std::size_t alignment = default_alignment) noexcept {
    return (value & (alignment - 1)) == 0;
}
inline bool is_aligned(const void* p, std::size_t alignment = default_alignment) noexcept {
    return is_aligned(reinterpret_cast<std::size_t>(p), alignment);
}

/// Whether an aligned_buffer pins its pages with mlock().
enum class memory_lock { unlocked, locked };

/// Whether an aligned_buffer starts zeroed (the default) or with whatever the allocator
/// returned (for bounce buffers that are overwritten at once).
enum class buffer_fill { zeroed, uninitialized };

class aligned_buffer {
public:
    aligned_buffer() = default;
    explicit aligned_buffer(std::size_t nbytes, memory_lock lock = memory_lock::unlocked,
                            std::size_t alignment = default_alignment, buffer_fill fill = buffer_fill::zeroed)
        : size_(nbytes), capacity_(align_up(nbytes == 0 ? 1 : nbytes, alignment)), alignment_(alignment) {
        expect_argument(alignment != 0 && (alignment & (alignment - 1)) == 0,
                        "aligned_buffer: alignment " + std::to_string(alignment) + " is not a power of two");
        data_ = static_cast<std::byte*>(std::aligned_alloc(alignment, capacity_));
        if (!data_) throw std::bad_alloc();
        if (fill == buffer_fill::zeroed) std::memset(data_, 0, capacity_);
        else if (capacity_ > size_) std::memset(data_ + size_, 0, capacity_ - size_);  // the padding stays zero
        if (lock == memory_lock::locked) {
            if (::mlock(data_, capacity_) != 0) {
                int err = errno;
                std::free(data_);
                data_ = nullptr;
                throw_system_error(err, "mlock", "aligned_buffer of " + bytes_str(capacity_) +
                                                     " (raise RLIMIT_MEMLOCK or use memory_lock::unlocked)");
            }
            locked_ = true;
        }
    }
    aligned_buffer(aligned_buffer&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
          capacity_(std::exchange(o.capacity_, 0)), alignment_(o.alignment_), locked_(std::exchange(o.locked_, false)) {}
    aligned_buffer& operator=(aligned_buffer&& o) noexcept {
        if (this != &o) {
            release();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
            capacity_ = std::exchange(o.capacity_, 0);
            alignment_ = o.alignment_;
            locked_ = std::exchange(o.locked_, false);
        }
        return *this;
    }
    aligned_buffer(const aligned_buffer&) = delete;
    aligned_buffer& operator=(const aligned_buffer&) = delete;
    ~aligned_buffer() { release(); }

    [[nodiscard]] std::byte* data() noexcept { return data_; }
    [[nodiscard]] const std::byte* data() const noexcept { return data_; }
    /// The size asked for.
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    /// The allocated size: size() rounded up to the alignment.
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
    [[nodiscard]] bool locked() const noexcept { return locked_; }
    [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_, size_}; }
    [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
    /// The whole padded allocation (for O_DIRECT transfers).
    [[nodiscard]] std::span<std::byte> padded_bytes() noexcept { return {data_, capacity_}; }
    template <class T>
    [[nodiscard]] std::span<T> as() noexcept {
        return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
    }

private:
    void release() noexcept {
        if (data_) {
            if (locked_) ::munlock(data_, capacity_);
            std::free(data_);
            data_ = nullptr;
        }
    }
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
    std::size_t alignment_ = default_alignment;
    bool locked_ = false;
};

}  // namespace spillway
