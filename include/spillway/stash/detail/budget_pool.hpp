// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/detail/budget_pool.hpp: the activation stash's count of resident bytes and
/// its pool of free buffers kept for reuse.
///
/// Resident bytes are the capacities of every buffer the stash holds: tensors, reads in
/// flight and the free buffers in this pool. The pool keeps a free buffer while it holds at
/// most pool_limit bytes, or beyond that while the bytes held (resident minus pooled) stay
/// within the held high-water mark of this step and the last: memory the stash needed
/// anyway, so reusing it costs no peak.
///
/// Guarantees:
/// - One eviction rule: pooled buffers leave largest size() first (of equal sizes, the one
///   pooled last), and only while the caller's condition holds; every shrink goes through it.
/// - The pool never lifts resident bytes above the budget: give_back(), adopt_if_room() and
///   trim_to_fit() refuse or evict rather than exceed it. The caller keeps the budget for
///   the buffers it holds itself (it checks fits() before account()).
/// - When the pool is empty and the held bytes alone exceed the budget, trim_to_fit() says
///   so (false) and changes nothing.
/// - Sums of byte counts saturate at SIZE_MAX, so a budget or pool_limit of SIZE_MAX means
///   "no limit" and never wraps around.
/// Not synchronised: the stash calls it under its own lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "spillway/io/aligned_buffer.hpp"

namespace spillway::detail {

class budget_pool {
public:
    /// @param budget     most resident bytes the caller allows (memory_budget)
    /// @param pool_limit pooled bytes always allowed (stash_options::pool_limit)
    budget_pool(std::size_t budget, std::size_t pool_limit) noexcept
        : budget_(budget), pool_limit_(pool_limit) {}

    /// Bytes a buffer of `nbytes` counts for: its capacity (whole 4 KiB blocks, at least one).
    static std::size_t charge_of(std::size_t nbytes) noexcept {
        return align_up(nbytes == 0 ? 1 : nbytes);
    }

    [[nodiscard]] std::size_t budget() const noexcept { return budget_; }
    /// Resident bytes: buffers the caller holds plus the pool.
    [[nodiscard]] std::size_t resident() const noexcept { return resident_; }
    /// Bytes of free buffers in the pool (part of resident()).
    [[nodiscard]] std::size_t pooled() const noexcept { return pooled_; }
    /// Most resident() since construction or reset_peak().
    [[nodiscard]] std::size_t peak() const noexcept { return peak_; }
    /// Most bytes held (resident minus pooled) in this step and the last.
    [[nodiscard]] std::size_t held_peak() const noexcept { return held_peak_; }
    /// True when `charge` more resident bytes stay within the budget.
    [[nodiscard]] bool fits(std::size_t charge) const noexcept {
        return saturating_add(resident_, charge) <= budget_;
    }
    /// True when a free buffer of size() `nbytes` is pooled.
    [[nodiscard]] bool contains(std::size_t nbytes) const { return pool_.contains(nbytes); }

    /// Counts `charge` bytes of fresh memory. Pooled buffers that would lift resident bytes
    /// above the held high-water mark, or above the bytes held plus this charge plus
    /// pool_limit, are freed first.
    void account(std::size_t charge) {
        auto allowed = [&] {  // resident bytes the pool may keep us at after this charge
            return std::max(held_peak_, saturating_add(saturating_add(resident_ - pooled_, charge),
                                                       pool_limit_));
        };
        evict_while([&] { return saturating_add(resident_, charge) > allowed(); });
        resident_ += charge;
        note_peaks();
    }
    /// Counts `nbytes` more resident bytes as they are (no eviction) and notes the peaks.
    void count(std::size_t nbytes) noexcept {
        resident_ += nbytes;
        note_peaks();
    }
    /// `nbytes` of resident memory left the caller (freed, or handed out of the stash).
    void uncount(std::size_t nbytes) noexcept { resident_ -= nbytes; }
    /// Lifts the peak and the held high-water marks to the current state.
    void note_peaks() noexcept {
        peak_ = std::max(peak_, resident_);
        step_peak_ = std::max(step_peak_, resident_);
        held_peak_ = std::max(held_peak_, resident_ - pooled_);
        step_held_peak_ = std::max(step_held_peak_, resident_ - pooled_);
    }

    /// The oldest pooled buffer of size() `nbytes`, or none. Its bytes stay counted as
    /// resident (now held by the caller); the peaks are not noted.
    std::optional<aligned_buffer> take(std::size_t nbytes) {
        auto it = pool_.find(nbytes);
        if (it == pool_.end()) return std::nullopt;
        aligned_buffer b = std::move(it->second);
        pool_.erase(it);
        pooled_ -= b.capacity();
        return b;
    }
    /// A counted buffer the caller no longer needs: pooled while the pool holds at most
    /// pool_limit bytes or resident bytes stay within the held high-water mark, else freed
    /// (and uncounted). An empty buffer is ignored.
    void recycle(aligned_buffer&& b) {
        if (!b.data()) return;
        if (saturating_add(pooled_, b.capacity()) <= pool_limit_ || resident_ <= held_peak_) {
            insert(std::move(b));
        } else {
            resident_ -= b.capacity();
            aligned_buffer gone = std::move(b);
        }
    }
    /// An uncounted buffer (one take()n and uncounted for an exchange that did not happen):
    /// pooled and counted when the budget has room for it; otherwise left in `b`.
    void give_back(aligned_buffer&& b) {
        if (!b.data() || saturating_add(resident_, b.capacity()) > budget_) return;
        resident_ += b.capacity();
        insert(std::move(b));
        note_peaks();
    }
    /// An uncounted buffer: pooled (and counted as account() counts) when the pool stays
    /// within pool_limit and resident bytes within the budget; otherwise left in `b`.
    void adopt_if_room(aligned_buffer&& b) {
        if (saturating_add(pooled_, b.capacity()) <= pool_limit_ &&
            saturating_add(resident_, b.capacity()) <= budget_) {
            account(b.capacity());
            insert(std::move(b));
        }
    }
    /// Frees pooled buffers until `need` more bytes fit the budget or the pool is empty;
    /// returns fits(need).
    bool trim_to_fit(std::size_t need) {
        evict_while([&] { return saturating_add(resident_, need) > budget_; });
        return fits(need);
    }
    /// Frees every pooled buffer; returns the bytes freed.
    std::size_t clear() noexcept {
        const std::size_t freed = pooled_;
        resident_ -= pooled_;
        pooled_ = 0;
        pool_.clear();
        return freed;
    }

    /// The pool shrinks to pool_limit and the held high-water marks restart from now.
    void restart_high_water() {
        evict_while([&] { return pooled_ > pool_limit_; });
        held_peak_ = step_held_peak_ = resident_ - pooled_;
    }
    /// Most resident() since restart_step_peak().
    [[nodiscard]] std::size_t step_peak() const noexcept { return step_peak_; }
    /// step_peak() restarts from the current resident bytes.
    void restart_step_peak() noexcept { step_peak_ = resident_; }
    /// peak() restarts from the current resident bytes.
    void reset_peak() noexcept { peak_ = resident_; }
    /// A new step: the held high-water mark becomes the last step's (one bad step, a stalled
    /// tier, must not keep its memory in the pool for ever), and the pool shrinks to it.
    void roll_high_water() {
        const std::size_t held = resident_ - pooled_;
        held_peak_ = std::max(step_held_peak_, held);
        step_held_peak_ = held;
        evict_while(
            [&] { return resident_ > std::max(held_peak_, saturating_add(held, pool_limit_)); });
    }

private:
    // a + b, or SIZE_MAX when that does not fit: a limit of SIZE_MAX is "no limit".
    static constexpr std::size_t saturating_add(std::size_t a, std::size_t b) noexcept {
        return b > std::numeric_limits<std::size_t>::max() - a
                   ? std::numeric_limits<std::size_t>::max()
                   : a + b;
    }
    // The one eviction loop: frees pooled buffers, largest size() first (of equal sizes the
    // one pooled last), while `too_much()` holds.
    template <class Pred>
    void evict_while(Pred too_much) {
        while (!pool_.empty() && too_much()) {
            auto it = std::prev(pool_.end());
            pooled_ -= it->second.capacity();
            resident_ -= it->second.capacity();
            pool_.erase(it);
        }
    }
    void insert(aligned_buffer&& b) {
        pooled_ += b.capacity();
        const std::size_t size = b.size();
        pool_.emplace(size, std::move(b));
    }

    std::size_t budget_;
    std::size_t pool_limit_;
    std::multimap<std::size_t, aligned_buffer> pool_;  // by size()
    std::size_t pooled_ = 0;
    std::size_t resident_ = 0;
    std::size_t peak_ = 0;
    std::size_t step_peak_ = 0;       // most resident bytes this step
    std::size_t held_peak_ = 0;       // most bytes held this step and the last
    std::size_t step_held_peak_ = 0;  // most bytes held this step
};

}  // namespace spillway::detail
