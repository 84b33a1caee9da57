// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/io/buffer_arena.hpp: small aligned_buffers carved out of huge-page slabs.
///
/// Why: aligned_buffer gives buffers of 2 MiB or more transparent huge pages, so that an
/// O_DIRECT request from them needs one physically contiguous segment per 2 MiB; a smaller
/// buffer comes from malloc on scattered 4 KiB pages, and a virtual disk (virtio) pays per
/// segment. Giving each small buffer a 2 MiB page of its own would waste most of it. An arena
/// maps 2 MiB-aligned slabs with the huge-page advice and hands out pieces of them, so many
/// small buffers share a few huge pages. (An activation stash moves many tensors of about a
/// megabyte, each too small for a huge page of its own.)
///
/// Guarantees:
/// 1. allocate(n) returns an aligned_buffer like aligned_buffer(n): size() n, capacity() n
///    rounded up to 4 KiB, data() 4 KiB-aligned, zeroed unless buffer_fill::uninitialized
///    (the padding is zeroed either way). huge_page_advice() says whether the kernel accepted
///    the advice for its slab; fork_inherited() is false (slabs are MADV_DONTFORK, as large
///    aligned_buffers are).
/// 2. A buffer's memory goes back to the arena when the buffer is destroyed, in any thread,
///    even after the buffer_arena object itself is gone: the buffers share the arena's state,
///    and the last of them unmaps what is left.
/// 3. A slab whose pieces are all free is unmapped at once; so mapped_bytes() is the memory the
///    arena holds, and mapped_bytes() - used_bytes() (slack_bytes()) is what it holds beyond
///    the capacities of live buffers: free pieces of partly used slabs. Callers that account
///    memory by buffer capacities (activation_stash does) add slack_bytes() to be exact.
/// 4. Requests of a slab's size or more get a slab of their own (rounded up to 2 MiB).
/// 5. Thread-safe: any thread may allocate and free.
///
/// Placement inside slabs is best fit (the smallest free piece that holds the request, the
/// lowest address among equals), with neighbouring free pieces of a slab merged, so a
/// workload that frees and allocates the same sizes reuses the same places.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include <sys/mman.h>

#include "spillway/io/aligned_buffer.hpp"

namespace spillway {

namespace detail {

/// The state buffers of a buffer_arena share (guarantee 2).
class arena_state {
public:
    explicit arena_state(std::size_t slab_bytes) : slab_bytes_(slab_bytes) {}
    arena_state(const arena_state&) = delete;
    arena_state& operator=(const arena_state&) = delete;
    ~arena_state() {
        for (auto& [base, s] : slabs_) ::munmap(base, s.size);
    }

    /// A piece of `capacity` bytes (a multiple of 4 KiB) and whether its slab took the advice.
    std::pair<std::byte*, bool> take(std::size_t capacity) {
        std::lock_guard lock(mutex_);
        slab* best_slab = nullptr;
        std::map<std::byte*, std::size_t>::iterator best;
        for (auto& [base, s] : slabs_) {
            for (auto it = s.free.begin(); it != s.free.end(); ++it) {
                if (it->second >= capacity && (!best_slab || it->second < best->second)) {
                    best_slab = &s;
                    best = it;
                }
            }
        }
        if (!best_slab) {  // nothing free fits: a new slab
            best_slab = map_slab(std::max(slab_bytes_, align_up(capacity, huge_page_bytes)));
            best = best_slab->free.begin();
        }
        std::byte* p = best->first;
        const std::size_t left = best->second - capacity;
        best_slab->free.erase(best);
        if (left > 0) best_slab->free.emplace(p + capacity, left);
        best_slab->live += capacity;
        used_ += capacity;
        return {p, best_slab->huge_advice};
    }

    /// Returns a piece taken with take(); unmaps its slab when nothing of it is in use.
    void give_back(std::byte* p, std::size_t capacity) noexcept {
        std::lock_guard lock(mutex_);
        auto it = std::prev(slabs_.upper_bound(p));  // the slab starting at or before p
        slab& s = it->second;
        s.live -= capacity;
        used_ -= capacity;
        if (s.live == 0) {
            ::munmap(it->first, s.size);
            mapped_ -= s.size;
            slabs_.erase(it);
            return;
        }
        std::map<std::byte*, std::size_t>::iterator pos;
        try {
            pos = s.free.emplace(p, capacity).first;
        } catch (...) {
            return;  // no memory to record the piece: it is not reused, and the slab still goes
                     // with its last piece
        }
        if (auto next = std::next(pos);
            next != s.free.end() && pos->first + pos->second == next->first) {
            pos->second += next->second;
            s.free.erase(next);
        }
        if (pos != s.free.begin()) {
            auto prev = std::prev(pos);
            if (prev->first + prev->second == pos->first) {
                prev->second += pos->second;
                s.free.erase(pos);
            }
        }
    }

    std::size_t mapped_bytes() const {
        std::lock_guard lock(mutex_);
        return mapped_;
    }
    std::size_t used_bytes() const {
        std::lock_guard lock(mutex_);
        return used_;
    }
    std::size_t slack_bytes() const {
        std::lock_guard lock(mutex_);
        return mapped_ - used_;
    }
    std::size_t slab_count() const {
        std::lock_guard lock(mutex_);
        return slabs_.size();
    }

private:
    struct slab {
        std::size_t size = 0;
        std::size_t live = 0;                    // capacities of the pieces in use
        std::map<std::byte*, std::size_t> free;  // free pieces: start -> length
        bool huge_advice = false;
    };
    // Maps a slab of `len` bytes (a multiple of 2 MiB) on a 2 MiB boundary, advised for huge pages.
    slab* map_slab(std::size_t len) {
        std::byte* base = detail::map_aligned(len, huge_page_bytes);
        try {
            slab s;
            s.size = len;
            s.huge_advice = ::madvise(base, len, MADV_HUGEPAGE) == 0;
            s.free.emplace(base, len);
            auto it = slabs_.emplace(base, std::move(s)).first;
            mapped_ += len;
            return &it->second;
        } catch (...) {
            ::munmap(base, len);
            throw;
        }
    }

    const std::size_t slab_bytes_;
    mutable std::mutex mutex_;
    std::map<std::byte*, slab> slabs_;  // by start address
    std::size_t mapped_ = 0;
    std::size_t used_ = 0;
};

}  // namespace detail

/// Hands out aligned_buffers carved from 2 MiB-aligned huge-page slabs (see the file comment).
class buffer_arena {
public:
    /// @param slab_bytes bytes per slab (rounded up to a multiple of 2 MiB; default 2 MiB)
    explicit buffer_arena(std::size_t slab_bytes = huge_page_bytes)
        : state_(std::make_shared<detail::arena_state>(
              align_up(slab_bytes == 0 ? 1 : slab_bytes, huge_page_bytes))) {}

    /// A buffer of `nbytes` from the arena (guarantee 1).
    /// @throws std::bad_alloc when a slab cannot be mapped
    [[nodiscard]] aligned_buffer allocate(std::size_t nbytes,
                                          buffer_fill fill = buffer_fill::zeroed) {
        // (A size no memory holds: rounding it up to slabs would wrap around.)
        if (nbytes > std::numeric_limits<std::size_t>::max() / 2) throw std::bad_alloc();
        const std::size_t capacity = align_up(nbytes == 0 ? 1 : nbytes);
        auto [p, advised] = state_->take(capacity);
        aligned_buffer b(p, nbytes, capacity, advised, state_,
                         [](void* owner, std::byte* q, std::size_t cap) noexcept {
                             static_cast<detail::arena_state*>(owner)->give_back(q, cap);
                         });
        if (fill == buffer_fill::zeroed)
            std::memset(p, 0, capacity);
        else if (capacity > nbytes)
            std::memset(p + nbytes, 0, capacity - nbytes);
        return b;
    }

    /// Bytes of the slabs mapped now.
    [[nodiscard]] std::size_t mapped_bytes() const { return state_->mapped_bytes(); }
    /// Capacities of the arena's live buffers.
    [[nodiscard]] std::size_t used_bytes() const { return state_->used_bytes(); }
    /// mapped_bytes() - used_bytes(), read at one instant: the memory held beyond live buffers.
    [[nodiscard]] std::size_t slack_bytes() const { return state_->slack_bytes(); }
    /// Slabs mapped now.
    [[nodiscard]] std::size_t slab_count() const { return state_->slab_count(); }

private:
    std::shared_ptr<detail::arena_state> state_;
};

}  // namespace spillway
