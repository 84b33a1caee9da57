// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/io/aligned_buffer.hpp: RAII host buffers aligned for O_DIRECT.
///
/// Guarantees: data() is aligned to `alignment` (default 4 KiB, a power of two); the
/// allocation is rounded up to a multiple of the alignment, so O_DIRECT transfers of the
/// padded size are legal; size() is the size the caller asked for. With
/// memory_lock::locked the pages are mlock()ed (pinned in RAM, never swapped) and a failure
/// to lock throws std::system_error naming the size (raise RLIMIT_MEMLOCK or use unlocked).
/// The contents start zeroed (buffer_fill::uninitialized leaves all but the padding as the
/// allocator returned it).
/// Large buffers (page_size::automatic, the default, and a capacity of at least
/// huge_page_bytes) start on a 2 MiB boundary and are madvise(MADV_HUGEPAGE)d before they
/// are touched, so the kernel backs them with transparent huge pages where it can: O_DIRECT
/// requests from them need one physically contiguous segment per 2 MiB instead of one per
/// scattered 4 KiB page, and virtual disks (virtio) pay per segment. The advice is a hint:
/// where THP is off it is ignored, and huge_page_advice() says whether the kernel accepted it.
/// Such buffers are mapped on their own (mmap) and madvise(MADV_DONTFORK)d: a child created
/// with fork() does not inherit them. Otherwise the parent's pages would be shared
/// copy-on-write with the child, and the parent's next write into them (a read from disk
/// landing there) would split each huge page into base pages, so a trainer that forks would
/// lose its I/O buffers' huge pages within one update. A forked child must
/// not touch its parent's large buffers (open(2) warns against O_DIRECT buffers shared over
/// fork() anyway); destroying them there is harmless. fork_inherited() says which applies.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <utility>

#include <sys/mman.h>

#include "spillway/error.hpp"

namespace spillway {

/// The alignment, in bytes, of buffers, offsets and sizes for O_DIRECT: 4 KiB, the logical
/// block size of every NVMe device and file system Spillway targets (512-byte devices accept
/// it too).
inline constexpr std::size_t default_alignment = 4096;

/// Rounds nbytes up to a multiple of `alignment` (a power of two; any other value gives a
/// meaningless result, unchecked because this runs on hot paths).
constexpr std::size_t align_up(std::size_t nbytes,
                               std::size_t alignment = default_alignment) noexcept {
    return (nbytes + alignment - 1) & ~(alignment - 1);
}
/// True when `value` (a byte offset or size) is a multiple of `alignment` (a power of two).
constexpr bool is_aligned(std::size_t value, std::size_t alignment = default_alignment) noexcept {
    return (value & (alignment - 1)) == 0;
}
/// True when the address `p` is a multiple of `alignment` (a power of two).
inline bool is_aligned(const void* p, std::size_t alignment = default_alignment) noexcept {
    return is_aligned(reinterpret_cast<std::size_t>(p), alignment);
}

/// Whether an aligned_buffer pins its pages with mlock().
enum class memory_lock {
    unlocked,  ///< ordinary pageable memory
    locked,    ///< mlock()ed: resident and never swapped; counts against RLIMIT_MEMLOCK
};

/// Whether an aligned_buffer starts zeroed (the default) or with whatever the allocator
/// returned (for bounce buffers that are overwritten at once).
enum class buffer_fill {
    zeroed,         ///< every byte, padding included, is zero
    uninitialized,  ///< the first size() bytes are as allocated; the padding is still zeroed
};

/// Whether a large aligned_buffer asks for transparent huge pages.
enum class page_size {
    automatic,  ///< capacity >= huge_page_bytes: 2 MiB-aligned and madvise(MADV_HUGEPAGE)d
    base,       ///< ordinary pages only (e.g. to compare with a program that uses them)
};

/// The size of a transparent huge page on x86-64 and arm64 (4 KiB base pages): buffers of at
/// least this capacity get the huge-page advice under page_size::automatic.
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

class buffer_arena;

namespace detail {

/// Maps `len` bytes (a multiple of `block`, a power of two) on a `block` boundary, on their
/// own and not inherited over fork() (MADV_DONTFORK): over-maps by one block, then unmaps the
/// unaligned ends. Throws std::bad_alloc when mmap fails.
inline std::byte* map_aligned(std::size_t len, std::size_t block) {
    void* p =
        ::mmap(nullptr, len + block, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    const auto aligned = (start + block - 1) & ~(std::uintptr_t{block} - 1);
    if (aligned > start) ::munmap(p, aligned - start);
    if (const auto tail = start + len + block - (aligned + len); tail > 0)
        ::munmap(reinterpret_cast<void*>(aligned + len), tail);
    auto* data = reinterpret_cast<std::byte*>(aligned);
    (void)::madvise(data, len, MADV_DONTFORK);  // a hint like the huge-page advice
    return data;
}

}  // namespace detail

/// An owning, move-only host buffer aligned for O_DIRECT, optionally pinned with mlock().
/// A buffer_arena (io/buffer_arena.hpp) hands out aligned_buffers carved from its slabs; they
/// behave like any other, and destroying one gives its piece back to the arena.
///
/// What the file comment guarantees holds for every live buffer; a moved-from or
/// default-constructed buffer is empty (data() null, size() 0). Not synchronised: concurrent
/// use follows the rules for a plain array (distinct bytes from distinct threads are fine).
class aligned_buffer {
public:
    /// An empty buffer: data() is null, size() and capacity() are 0.
    aligned_buffer() = default;
    /// Allocates `nbytes` (rounded up to `alignment` for capacity(); at least one block even
    /// for 0) aligned to `alignment`.
    /// @param nbytes    the size the caller needs, in bytes
    /// @param lock      memory_lock::locked pins the pages with mlock()
    /// @param alignment a power of two, in bytes
    /// @param fill      buffer_fill::uninitialized skips zeroing the requested bytes
    /// @param pages     page_size::automatic advises huge pages for large buffers (see the file
    ///                  comment); page_size::base never does
    /// @throws std::invalid_argument when `alignment` is not a power of two (names it)
    /// @throws std::bad_alloc when the allocation fails
    /// @throws std::system_error from mlock() (ENOMEM, EPERM), naming the padded size and the
    ///         remedy (raise RLIMIT_MEMLOCK or use memory_lock::unlocked); nothing is leaked
    explicit aligned_buffer(std::size_t nbytes, memory_lock lock = memory_lock::unlocked,
                            std::size_t alignment = default_alignment,
                            buffer_fill fill = buffer_fill::zeroed,
                            page_size pages = page_size::automatic)
        : size_(nbytes), alignment_(alignment) {
        expect_argument(
            alignment != 0 && (alignment & (alignment - 1)) == 0,
            "aligned_buffer: alignment " + std::to_string(alignment) + " is not a power of two");
        // (A size no memory holds: rounding it up would wrap around to a small capacity.)
        if (nbytes > std::numeric_limits<std::size_t>::max() / 2 ||
            alignment > std::numeric_limits<std::size_t>::max() / 2)
            throw std::bad_alloc();
        capacity_ = align_up(nbytes == 0 ? 1 : nbytes, alignment);
        // Huge pages: allocate whole 2 MiB pages on a 2 MiB boundary (the tail past capacity_
        // is never handed out) and advise before the first touch, so zeroing faults them in.
        const bool huge = pages == page_size::automatic && capacity_ >= huge_page_bytes;
        if (huge) {
            const std::size_t block = std::max(alignment, huge_page_bytes);
            map_huge(align_up(capacity_, block), block);
            huge_advice_ = ::madvise(data_, mapped_, MADV_HUGEPAGE) == 0;
        } else {
            data_ = static_cast<std::byte*>(std::aligned_alloc(alignment, capacity_));
            if (!data_) throw std::bad_alloc();
        }
        if (fill == buffer_fill::zeroed)
            std::memset(data_, 0, capacity_);
        else if (capacity_ > size_)
            std::memset(data_ + size_, 0, capacity_ - size_);  // the padding stays zero
        if (lock == memory_lock::locked) {
            if (::mlock(data_, capacity_) != 0) {
                int err = errno;
                release();
                throw_system_error(err, "mlock",
                                   "aligned_buffer of " + bytes_str(capacity_) +
                                       " (raise RLIMIT_MEMLOCK or use memory_lock::unlocked)");
            }
            locked_ = true;
        }
    }
    /// Takes over `o`'s memory (and its lock); `o` becomes empty.
    aligned_buffer(aligned_buffer&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)),
          size_(std::exchange(o.size_, 0)),
          capacity_(std::exchange(o.capacity_, 0)),
          alignment_(o.alignment_),
          mapped_(std::exchange(o.mapped_, 0)),
          locked_(std::exchange(o.locked_, false)),
          huge_advice_(std::exchange(o.huge_advice_, false)),
          owner_(std::move(o.owner_)),
          give_back_(std::exchange(o.give_back_, nullptr)) {}
    /// Frees this buffer's memory (munlock()ing it first), then takes over `o`'s; `o` becomes
    /// empty.
    aligned_buffer& operator=(aligned_buffer&& o) noexcept {
        if (this != &o) {
            release();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
            capacity_ = std::exchange(o.capacity_, 0);
            alignment_ = o.alignment_;
            mapped_ = std::exchange(o.mapped_, 0);
            locked_ = std::exchange(o.locked_, false);
            huge_advice_ = std::exchange(o.huge_advice_, false);
            owner_ = std::move(o.owner_);
            give_back_ = std::exchange(o.give_back_, nullptr);
        }
        return *this;
    }
    /// Owns its memory: not copyable.
    aligned_buffer(const aligned_buffer&) = delete;
    /// Owns its memory: not copyable.
    aligned_buffer& operator=(const aligned_buffer&) = delete;
    /// Unlocks (when locked) and frees the memory. No I/O may still target it: wait for or
    /// drop the io_completion of every transfer first.
    ~aligned_buffer() { release(); }

    /// The first byte, aligned to alignment(); null for an empty buffer.
    [[nodiscard]] std::byte* data() noexcept { return data_; }
    /// @copydoc data()
    [[nodiscard]] const std::byte* data() const noexcept { return data_; }
    /// The size asked for.
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    /// The allocated size: size() rounded up to the alignment.
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// The alignment of data() and of capacity(), in bytes.
    [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
    /// True when the pages are mlock()ed (asked for with memory_lock::locked).
    [[nodiscard]] bool locked() const noexcept { return locked_; }
    /// True when the kernel accepted madvise(MADV_HUGEPAGE) for this buffer (page_size::automatic
    /// and capacity() >= huge_page_bytes, on a kernel with transparent huge pages enabled);
    /// whether it found huge pages to give is up to it.
    [[nodiscard]] bool huge_page_advice() const noexcept { return huge_advice_; }
    /// False for the large buffers of page_size::automatic and for a buffer_arena's (mapped
    /// with MADV_DONTFORK: a child created with fork() does not get them, see the file
    /// comment), true otherwise.
    [[nodiscard]] bool fork_inherited() const noexcept { return mapped_ == 0 && !give_back_; }
    /// The requested bytes, [data(), data() + size()).
    [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_, size_}; }
    /// @copydoc bytes()
    [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
    /// The whole padded allocation (for O_DIRECT transfers).
    [[nodiscard]] std::span<std::byte> padded_bytes() noexcept { return {data_, capacity_}; }
    /// The requested bytes viewed as `size() / sizeof(T)` objects of a trivially copyable `T`
    /// (a trailing partial element is left out). The alignment suits any scalar type.
    template <class T>
    [[nodiscard]] std::span<T> as() noexcept {
        return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
    }

private:
    friend class buffer_arena;
    using give_back_fn = void (*)(void* owner, std::byte* data, std::size_t capacity) noexcept;
    // A piece of a buffer_arena's slab: `give_back` returns it to `owner` on release.
    aligned_buffer(std::byte* data, std::size_t size, std::size_t capacity, bool huge_advice,
                   std::shared_ptr<void> owner, give_back_fn give_back) noexcept
        : data_(data),
          size_(size),
          capacity_(capacity),
          huge_advice_(huge_advice),
          owner_(std::move(owner)),
          give_back_(give_back) {}
    // Maps `len` bytes (a multiple of `block`) on a `block` boundary (detail::map_aligned).
    void map_huge(std::size_t len, std::size_t block) {
        data_ = detail::map_aligned(len, block);
        mapped_ = len;
    }
    void release() noexcept {
        if (data_) {
            if (locked_) ::munlock(data_, capacity_);
            if (give_back_)
                give_back_(owner_.get(), data_, capacity_);
            else if (mapped_)
                ::munmap(data_, mapped_);
            else
                std::free(data_);
            owner_.reset();
            give_back_ = nullptr;
            data_ = nullptr;
            mapped_ = 0;
            locked_ = false;
        }
    }
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
    std::size_t alignment_ = default_alignment;
    std::size_t mapped_ = 0;  // bytes mapped by map_huge (0: from aligned_alloc)
    bool locked_ = false;
    bool huge_advice_ = false;
    std::shared_ptr<void> owner_;       // a buffer_arena's shared state (null otherwise)
    give_back_fn give_back_ = nullptr;  // returns data_ to owner_ (null: freed or unmapped here)
};

}  // namespace spillway
