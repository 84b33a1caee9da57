// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/host_tier.hpp: a storage tier in host memory, with a capacity bound.
///
/// Guarantees: operations complete before they return (the completion is already ready);
/// a write that would take used() past capacity() fails with ENOSPC naming the key, the size
/// and the capacity, and leaves the previous blob of that key in place; reads and writes of
/// different keys run concurrently (copies, allocations and frees happen outside the tier's
/// lock); a rewrite builds the new blob in another block and swaps it in, so a concurrent
/// reader of the old blob is never torn.
///
/// Spare blocks. A block that a rewrite replaced is kept as a spare (at most `spare_blocks`,
/// blocks of at least spare_min_bytes only), and a later write of a blob of the same
/// allocation size, under any key, copies into it instead of allocating: a fresh allocation
/// faults in every page of the blob as it is written (a 64 MiB write ran at 0.02-0.2 of
/// memcpy), a spare's pages are resident already. The write protocol:
///  1. under the lock: fail with ENOSPC when used() minus the key's old blob plus the new one
///     would pass capacity(); take a spare of the blob's allocation size that no read is
///     copying from; without one, free spares (oldest first) until the blobs as they will be
///     and the remaining spares fit in capacity() (so the allocation can reuse their memory);
///  2. without a spare, allocate a block (blocks of at least huge_page_bytes start on a 2 MiB
///     boundary and are advised MADV_HUGEPAGE, as aligned_buffer's are: 512 times fewer
///     faults on the first write);
///  3. copy the caller's bytes into the block, outside the lock;
///  4. under the lock: check the capacity again (other writes ran meanwhile), freeing spares
///     as in step 1; install the block; the replaced block becomes a spare when it is large
///     enough and fits beside the blobs and spares within capacity() (the oldest spare makes
///     way when `spare_blocks` are held), else it is freed (a read still copying from it
///     keeps it alive until it is done).
/// Spares are not blobs: used() does not count them, but the tier keeps used() plus
/// spare_bytes() within capacity() (spares are freed when a write needs their room), so the
/// memory it holds outside writes in flight is bounded by capacity() as before; erase() and
/// release_spares() free every spare.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway {

namespace detail {

/// One allocation of host_tier: `capacity` bytes holding a blob of `size` <= capacity bytes,
/// and the count of reads copying from it. Blocks of at least huge_page_bytes are mapped on a
/// 2 MiB boundary and advised MADV_HUGEPAGE (inherited over fork(), unlike aligned_buffer's:
/// host_tier's blobs always were); smaller ones come from operator new
/// (on a page when they are whole pages, as blocks of spare_min_bytes and more are).
class host_block {
public:
    /// Allocates `capacity` bytes, uninitialised. @throws std::bad_alloc
    explicit host_block(std::size_t capacity) : capacity_(capacity) {
        if (capacity_ >= huge_page_bytes) {
            // Over-map by one huge page, then unmap the unaligned ends (capacity_ is a multiple
            // of the base page, so both ends are page-aligned).
            const std::size_t len = capacity_ + huge_page_bytes;
            void* p =
                ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) throw std::bad_alloc();
            const auto start = reinterpret_cast<std::uintptr_t>(p);
            const auto aligned =
                (start + huge_page_bytes - 1) & ~(std::uintptr_t{huge_page_bytes} - 1);
            if (aligned > start) ::munmap(p, aligned - start);
            if (const auto tail = start + len - (aligned + capacity_); tail > 0)
                ::munmap(reinterpret_cast<void*>(aligned + capacity_), tail);
            data_ = reinterpret_cast<std::byte*>(aligned);
            (void)::madvise(data_, capacity_, MADV_HUGEPAGE);  // a hint: ignored where THP is off
            mapped_ = true;
        } else if (capacity_ > 0) {
            data_ = static_cast<std::byte*>(::operator new(capacity_, alignment()));
        }
    }
    host_block(const host_block&) = delete;
    host_block& operator=(const host_block&) = delete;
    ~host_block() {
        if (mapped_)
            ::munmap(data_, capacity_);
        else if (data_)
            ::operator delete(data_, alignment());
    }
    /// The first byte (null for a block of capacity 0).
    [[nodiscard]] std::byte* data() noexcept { return data_; }
    /// The allocated bytes.
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

    /// The bytes of the blob it holds: set by the writer before the block is installed.
    std::size_t size = 0;
    /// Reads copying from the block now: raised under the tier's lock, lowered (release) when
    /// the copy is done; a spare is written again only while it is 0 (acquire, under the lock).
    std::atomic<std::uint32_t> readers{0};

private:
    // Whole pages start on a page (as the caller's aligned buffers do), the rest on a line.
    std::align_val_t alignment() const noexcept {
        return std::align_val_t{capacity_ % default_alignment == 0 ? default_alignment : 64};
    }
    std::byte* data_ = nullptr;
    std::size_t capacity_;
    bool mapped_ = false;
};

}  // namespace detail

/// A storage_tier that keeps each blob in a host memory block; synchronous, thread-safe.
///
/// The fastest tier and the reference model of the contract: the conformance suite and the
/// decorators' tests run over it. Also the natural inner tier of throttled_tier for a
/// simulated device. Rewrites recycle replaced blocks (see the file comment). Not copyable,
/// not movable (it owns a mutex).
class host_tier {
public:
    /// Volatile host memory, no page cache involved.
    static constexpr tier_properties properties{
        .persistent = false, .direct_io = false, .host_accessible = true};
    /// Blocks smaller than this are freed when replaced, never kept as spares: the allocator
    /// recycles them without page faults anyway.
    static constexpr std::size_t spare_min_bytes = std::size_t{64} << 10;
    /// The spares kept by default: one per concurrent rewrite of a size, like file_tier's
    /// spare files.
    static constexpr std::size_t default_spare_blocks = 2;

    /// An empty tier.
    /// @param capacity     the most bytes of blobs held at once (unbounded by default); spare
    ///                     blocks live in the room blobs leave (see the file comment)
    /// @param name         the name used in error messages and reports
    /// @param spare_blocks the most replaced blocks kept for reuse (0: none, every write
    ///                     allocates)
    explicit host_tier(std::size_t capacity = std::numeric_limits<std::size_t>::max(),
                       std::string name = "host", std::size_t spare_blocks = default_spare_blocks)
        : capacity_(capacity), name_(std::move(name)), max_spares_(spare_blocks) {}
    /// Owns its blobs: not copyable.
    host_tier(const host_tier&) = delete;
    /// Owns its blobs: not copyable.
    host_tier& operator=(const host_tier&) = delete;

    /// Copies `bytes` into a block (a spare or a new one) and installs it under `key`,
    /// replacing any earlier blob (numbered protocol in the file comment); done when it
    /// returns (`bytes` may be reused at once).
    /// Errors through the completion: std::system_error(ENOSPC) naming the tier, the key, the
    /// size, the capacity and the bytes used, when the blob would not fit (the old blob of
    /// `key` stays); std::bad_alloc when the block cannot be allocated (the old blob stays).
    /// @return a ready completion: the size, or the error
    /// @throws std::invalid_argument at once for a bad key (see validate_key()), naming the tier
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        check_key(key);
        stats_.begin(io_direction::write);
        std::exception_ptr error;
        const std::size_t n = bytes.size();
        std::vector<block_ptr> released;  // freed after the lock is let go (munmap is slow)
        try {
            // (No memory holds such a blob, and rounding it up to pages would wrap around.)
            if (n > std::numeric_limits<std::size_t>::max() / 2) throw std::bad_alloc();
            const std::size_t need = block_size(n);
            block_ptr block;
            {  // step 1
                std::lock_guard lock(mutex_);
                const std::size_t old = size_locked(key);
                if (used_ - old + n > capacity_) throw no_space(key, n);
                block = take_spare(need);
                if (!block) make_room(used_ - old + n, released);
            }
            released.clear();
            if (!block) {  // step 2
                block = std::make_shared<detail::host_block>(need);
                allocations_.fetch_add(1, std::memory_order_relaxed);
            }
            if (n > 0) std::memcpy(block->data(), bytes.data(), n);  // step 3
            block->size = n;
            std::lock_guard lock(mutex_);  // step 4
            auto it = blobs_.find(std::string(key));
            const std::size_t old = it == blobs_.end() ? 0 : it->second->size;
            if (used_ - old + n > capacity_) throw no_space(key, n);
            make_room(used_ - old + n, released);
            used_ = used_ - old + n;
            if (it == blobs_.end()) {
                blobs_.emplace(std::string(key), std::move(block));
            } else {
                block_ptr replaced = std::exchange(it->second, std::move(block));
                keep_or_release(std::move(replaced), released);
            }
        } catch (...) {
            error = std::current_exception();
        }
        released.clear();
        stats_.end(io_direction::write, n, !error);
        return error ? io_completion::failed(error) : io_completion::completed(n);
    }

    /// Copies the blob of `key` into `bytes`, whose size must equal size_of(key); done when
    /// it returns.
    /// Errors through the completion: std::system_error(ENOENT) naming the tier and the key
    /// for a missing key; std::invalid_argument naming the key and both sizes for a buffer
    /// of the wrong size (the buffer is left as it was).
    /// @return a ready completion: the size, or the error
    /// @throws std::invalid_argument at once for a bad key (see validate_key()), naming the tier
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        check_key(key);
        stats_.begin(io_direction::read);
        std::exception_ptr error;
        try {
            block_ptr blob;
            {
                std::lock_guard lock(mutex_);
                auto it = blobs_.find(std::string(key));
                if (it == blobs_.end())
                    throw std::system_error(
                        ENOENT, std::generic_category(),
                        name_ + ": read of key " + quoted(key) + ": no such key");
                blob = it->second;
                blob->readers.fetch_add(1, std::memory_order_relaxed);  // the lock orders it
            }
            // Until the count is lowered, no write reuses the block (it may be a spare by now).
            struct reading {
                detail::host_block& b;
                ~reading() { b.readers.fetch_sub(1, std::memory_order_release); }
            } guard{*blob};
            if (blob->size != bytes.size())
                throw std::invalid_argument(name_ + ": read of key " + quoted(key) +
                                            " into a buffer of " + bytes_str(bytes.size()) +
                                            ", but the blob has " + bytes_str(blob->size));
            if (!bytes.empty()) std::memcpy(bytes.data(), blob->data(), bytes.size());
        } catch (...) {
            error = std::current_exception();
        }
        stats_.end(io_direction::read, bytes.size(), !error);
        return error ? io_completion::failed(error) : io_completion::completed(bytes.size());
    }

    /// Removes the blob of `key` and frees its memory and every spare block (a reader that
    /// already holds the blob keeps it alive until it is done).
    /// @return false when there was no such key (the spares are freed all the same)
    /// @throws std::invalid_argument for a bad key
    bool erase(std::string_view key) {
        check_key(key);
        block_ptr erased;
        std::vector<block_ptr> spares;
        std::lock_guard lock(mutex_);  // (declared after them: released first, frees outside it)
        spares.swap(spares_);
        spare_bytes_ = 0;
        auto it = blobs_.find(std::string(key));
        if (it == blobs_.end()) return false;
        used_ -= it->second->size;
        erased = std::move(it->second);
        blobs_.erase(it);
        return true;
    }
    /// True when a blob is stored under `key` (no key validation: a bad key is never stored).
    [[nodiscard]] bool contains(std::string_view key) const {
        std::lock_guard lock(mutex_);
        return blobs_.contains(std::string(key));
    }
    /// The size in bytes of the blob under `key`, or std::nullopt when there is none.
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = blobs_.find(std::string(key));
        if (it == blobs_.end()) return std::nullopt;
        return it->second->size;
    }
    /// The bound given to the constructor, in bytes (SIZE_MAX when unbounded).
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// The bytes of all stored blobs together (spare blocks not counted).
    [[nodiscard]] std::size_t used() const {
        std::lock_guard lock(mutex_);
        return used_;
    }
    /// The traffic counters so far; failed operations count as failures, not bytes.
    [[nodiscard]] tier_stats stats() const { return stats_.snapshot(); }
    /// The name given to the constructor.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// The bytes of the spare blocks held now (their allocation sizes); used() plus this stays
    /// within capacity().
    [[nodiscard]] std::size_t spare_bytes() const {
        std::lock_guard lock(mutex_);
        return spare_bytes_;
    }
    /// The spare blocks held now (at most the constructor's `spare_blocks`).
    [[nodiscard]] std::size_t spare_blocks_held() const {
        std::lock_guard lock(mutex_);
        return spares_.size();
    }
    /// Blocks allocated by writes so far: a write that reuses a spare allocates none.
    [[nodiscard]] std::uint64_t allocations() const noexcept {
        return allocations_.load(std::memory_order_relaxed);
    }
    /// Frees every spare block (a read still copying from one keeps it alive until it is done).
    void release_spares() {
        std::vector<block_ptr> spares;
        std::lock_guard lock(mutex_);  // (declared after: released first, frees outside it)
        spares.swap(spares_);
        spare_bytes_ = 0;
    }

private:
    using block_ptr = std::shared_ptr<detail::host_block>;

    // The allocation size of a blob of `n` bytes: whole base pages for blocks that may become
    // spares, so that blobs of nearly the same size share them; `n` itself below that.
    static std::size_t block_size(std::size_t n) noexcept {
        return n >= spare_min_bytes ? align_up(n, default_alignment) : n;
    }

    // validate_key() with the tier's name in front of its message.
    void check_key(std::string_view key) const {
        try {
            validate_key(key);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(name_ + ": " + e.what());
        }
    }

    std::system_error no_space(std::string_view key, std::size_t n) const {
        return std::system_error(ENOSPC, std::generic_category(),
                                 name_ + ": write of key " + quoted(key) + " (" + bytes_str(n) +
                                     ") exceeds the capacity of " + bytes_str(capacity_) + " (" +
                                     bytes_str(used_) + " used)");
    }

    // The size of the blob under `key`, 0 when there is none. Caller holds mutex_.
    std::size_t size_locked(std::string_view key) const {
        auto it = blobs_.find(std::string(key));
        return it == blobs_.end() ? 0 : it->second->size;
    }

    // Step 1: a spare of exactly `need` bytes that no read copies from, or null. Caller holds
    // mutex_.
    block_ptr take_spare(std::size_t need) {
        for (auto it = spares_.begin(); it != spares_.end(); ++it) {
            if ((*it)->capacity() == need && (*it)->readers.load(std::memory_order_acquire) == 0) {
                block_ptr b = std::move(*it);
                spares_.erase(it);
                spare_bytes_ -= need;
                return b;
            }
        }
        return nullptr;
    }

    // Moves spares, oldest first, to `released` until `bytes` plus the remaining spares fit
    // in capacity_ (or none is left). Caller holds mutex_.
    void make_room(std::size_t bytes, std::vector<block_ptr>& released) {
        std::size_t drop = 0;
        while (drop < spares_.size() && bytes + spare_bytes_ > capacity_) {
            spare_bytes_ -= spares_[drop]->capacity();
            ++drop;
        }
        for (std::size_t i = 0; i < drop; ++i) released.push_back(std::move(spares_[i]));
        spares_.erase(spares_.begin(), spares_.begin() + static_cast<std::ptrdiff_t>(drop));
    }

    // Step 4's end: keeps a replaced block as the newest spare when it may be one and fits,
    // else moves it to `released`. Caller holds mutex_.
    void keep_or_release(block_ptr replaced, std::vector<block_ptr>& released) {
        const std::size_t cap = replaced->capacity();
        if (max_spares_ == 0 || cap < spare_min_bytes || used_ + cap > capacity_) {
            released.push_back(std::move(replaced));
            return;
        }
        // Make way: the oldest spares go while too many are held or they do not fit beside it.
        while (!spares_.empty() &&
               (spares_.size() >= max_spares_ || used_ + spare_bytes_ + cap > capacity_)) {
            spare_bytes_ -= spares_.front()->capacity();
            released.push_back(std::move(spares_.front()));
            spares_.erase(spares_.begin());
        }
        spare_bytes_ += cap;
        spares_.push_back(std::move(replaced));
    }

    std::size_t capacity_;
    std::string name_;
    std::size_t max_spares_;
    mutable std::mutex mutex_;
    std::unordered_map<std::string, block_ptr> blobs_;
    std::size_t used_ = 0;
    std::vector<block_ptr> spares_;  // oldest first
    std::size_t spare_bytes_ = 0;    // the spares' capacities together
    std::atomic<std::uint64_t> allocations_{0};
    stats_recorder stats_;
};

static_assert(storage_tier<host_tier>);

}  // namespace spillway
