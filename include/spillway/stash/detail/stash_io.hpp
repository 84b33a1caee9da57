// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/detail/stash_io.hpp: an activation stash's traffic with its tier: writes,
/// reads and erases run on the stash's writer and reader threads and completed there, the
/// prefetch walk that decides which reads to issue, the wait for room under the memory
/// budget, and the bandwidth probe.
///
/// stash_io holds no tensors of its own: it shares the stash's lock, tensor table, budget
/// pool, stats and current step (stash_step) by reference. It owns the thread pools, the
/// counts of I/O in flight, the tier keys (key_recycler), the buffer arena and the first
/// unreported write error. Every member function except the constructor and the destructor
/// is called with the stash's lock held; a `lock` parameter is that lock.
///
/// Guarantees:
/// - The lock is never held across a tier call or a copy: a transfer unlocks around it and
///   locks again to complete (entry state, pool, stats), then notifies the stash's condition
///   variable.
/// - A completion finds its tensor by id: a tensor released while its write or read is in
///   flight is finished by that completion (buffer recycled, key retired), never before.
/// - A key is never used while I/O on it is in flight, nor again once its erase was issued.
/// - make_room() never lifts resident bytes above the budget; it gives up (false) only when
///   nothing can free memory.
/// - Destruction skips queued writes, waits for the I/O in flight, then erases every blob of
///   the stash (live tensors' and retired keys').
/// The steps these implement are in docs/design.md, section "The activation stash".
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/buffer_arena.hpp"
#include "spillway/stash/detail/budget_pool.hpp"
#include "spillway/stash/detail/key_recycler.hpp"
#include "spillway/stash/detail/split_planner.hpp"
#include "spillway/stash/detail/step_layers.hpp"
#include "spillway/stash/detail/tensor_table.hpp"
#include "spillway/stash/stash_options.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway::detail {

/// The stash's current step, as far as its I/O needs it; owned by the stash and changed
/// under its lock.
struct stash_step {
    bool backward = false;              // the step's backward has begun
    std::uint64_t number = 0;           // steps begun before this one
    step_layers layers;                 // its layers, in forward order
    std::vector<std::uint64_t> order;   // its entry ids in save order
    std::size_t cursor = 0;             // prefetch walks `order` down from here
    std::size_t backward_position = 0;  // lowest layer position backward asked for
};

/// Seconds from `t` to Clock::now().
template <class Clock>
double seconds_since(typename Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

/// Whether the caller of start_read() already charged the read's bytes to the budget.
enum class reserved { no, yes };
/// What wait_for_io_and_erase_retired() waits for besides the erases.
enum class io_scope { writes, reads_and_writes };

template <storage_tier Tier, class Clock>
class stash_io {
    using entry = stash_entry;

public:
    /// Starts the writer and reader threads. The references must outlive this object.
    stash_io(Tier& tier, const stash_options& opt, std::uint64_t serial, std::mutex& mutex,
             std::condition_variable& cv, tensor_table& table, budget_pool& pool,
             stash_stats& stats, stash_step& step)
        : tier_(tier),
          opt_(opt),
          mutex_(mutex),
          cv_(cv),
          table_(table),
          pool_(pool),
          stats_(stats),
          step_(step),
          keys_(opt.key_prefix, serial) {
        writer_.emplace(opt_.write_threads, "spw-stash-write");
        reader_.emplace(opt_.read_threads, "spw-stash-read");
    }
    stash_io(const stash_io&) = delete;
    stash_io& operator=(const stash_io&) = delete;

    /// Skips queued writes, waits for the I/O in flight, erases the stash's tier blobs.
    /// Called without the lock.
    ~stash_io() {
        {
            std::lock_guard lock(mutex_);
            shutting_down_ = true;
        }
        reader_.reset();
        writer_.reset();
        table_.for_each([&](entry& e) {
            if (e.on_tier) erase_blob(e.key);
        });
        for (const auto& key : keys_.drain()) erase_blob(key);
    }

    // ---- buffers and errors ---------------------------------------------------------------

    /// Under 2 MiB from the huge-page arena (stash_options::huge_page_arena), else on its own.
    /// Needs no lock.
    aligned_buffer new_buffer(std::size_t nbytes, buffer_fill fill) {
        if (opt_.huge_page_arena && budget_pool::charge_of(nbytes) < huge_page_bytes)
            return arena_.allocate(nbytes, fill);
        return aligned_buffer(nbytes, memory_lock::unlocked, default_alignment, fill);
    }
    /// A new buffer for bytes copied or read into it in full: zeroing it first would only
    /// double the cost of faulting its pages in. Needs no lock.
    aligned_buffer buffer_to_overwrite(std::size_t nbytes) {
        return new_buffer(nbytes, buffer_fill::uninitialized);
    }
    /// The huge-page arena's memory beyond its live buffers' capacities.
    [[nodiscard]] std::size_t arena_slack_bytes() const { return arena_.slack_bytes(); }

    /// Throws (once) the first failed write not reported yet.
    void throw_pending() {
        if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
    }
    /// Forgets the unreported write failure (reset()).
    void forget_pending() noexcept { pending_error_ = nullptr; }

    // ---- writes -------------------------------------------------------------------------

    /// Queues e's write (e is queued and resident) on a writer thread.
    void queue_write(entry& e) {
        if (e.step == step_.number) step_.layers.mark_offloads(e.position);
        ++writes_pending_;
        writer_->submit([this, id = e.id] { run_write(id); });
    }

    /// Writes e's bytes (e is writing) from the calling thread, with the lock released
    /// meanwhile: the one case where compute blocks on a write. On return the lock is held
    /// again and a failure is recorded on e (its error names the tensor) and returned.
    std::exception_ptr write_synchronously(std::unique_lock<std::mutex>& lock, entry& e,
                                           std::span<const std::byte> bytes) {
        ++writes_pending_;
        return write_entry(lock, e, bytes);
    }

    /// Backward takes e (queued) before its write started: the writer will skip it.
    void cancel_write(entry& e) {
        e.state = entry_state::kept;
        ++stats_.write_skips;
        note_forwarded(e);
    }
    /// Counts e in bytes_forwarded, once.
    void note_forwarded(entry& e) {
        if (!e.forwarded) {
            e.forwarded = true;
            stats_.bytes_forwarded += e.nbytes;
        }
    }

    /// Waits for the writes (and with io_scope::reads_and_writes the reads) in flight and for
    /// every erase, then erases the retired blobs and waits for those erases too.
    void wait_for_io_and_erase_retired(std::unique_lock<std::mutex>& lock, io_scope scope) {
        auto idle = [&] {
            return writes_pending_ == 0 && erases_pending_ == 0 &&
                   (scope == io_scope::writes || reads_pending_ == 0);
        };
        cv_.wait(lock, idle);
        for (auto& key : keys_.drain()) erase_later(std::move(key));
        cv_.wait(lock, idle);
    }

    /// The last reference to e is gone: frees it now, or leaves it to its I/O in flight.
    void drop(entry& e) {
        table_.forget_identity(e);
        switch (e.state) {
            case entry_state::queued:
                ++stats_.write_skips;
                [[fallthrough]];
            case entry_state::kept:
            case entry_state::fetched:
            case entry_state::offloaded:
            case entry_state::lost:
                pool_.recycle(std::move(e.buffer));
                if (e.on_tier) retire_key(e);
                table_.erase(e.id);
                break;
            case entry_state::writing:
            case entry_state::reading:
                break;  // the I/O thread finishes the job
        }
    }

    // ---- reads and prefetch ---------------------------------------------------------------

    /// Reads e (offloaded) back on a reader thread. With reserved::yes the caller already
    /// charged its bytes; otherwise they are charged here.
    void start_read(entry& e, reserved r) {
        std::optional<aligned_buffer> pooled = pool_.take(e.nbytes);
        if (r == reserved::yes && pooled)
            pool_.uncount(budget_pool::charge_of(e.nbytes));  // the pooled buffer was counted
        if (r == reserved::no && !pooled) pool_.account(budget_pool::charge_of(e.nbytes));
        pool_.note_peaks();
        e.state = entry_state::reading;
        ++reads_pending_;
        auto buffer =
            std::make_shared<aligned_buffer>(pooled ? std::move(*pooled) : aligned_buffer());
        reader_->submit([this, id = e.id, buffer] { run_read(id, std::move(*buffer)); });
    }

    /// Issues the prefetches the current backward position calls for, newest save first:
    /// every tensor of the window (within the budget), then further tensors while the bytes
    /// held stay within the high-water mark the step already reached (memory that is there
    /// anyway: reading ahead into it costs no peak). Stops at the first read that has no
    /// room (retried when room is freed).
    void prefetch() {
        if (!step_.backward || shutting_down_) return;
        const std::size_t lo = window_low();
        while (step_.cursor > 0) {
            entry* found = table_.find(step_.order[step_.cursor - 1]);
            if (!found || found->refs == 0) {
                --step_.cursor;
                continue;
            }
            entry& e = *found;
            const bool ahead = e.position < lo;
            if (e.state == entry_state::queued) {
                cancel_write(e);  // resident already: keeping it costs nothing
            } else if (e.state == entry_state::writing && ahead) {
                return;  // its completion frees the buffer and calls prefetch() again
            } else if (e.state == entry_state::offloaded && !e.read_error) {
                std::size_t charge = budget_pool::charge_of(e.nbytes);
                if (ahead && pool_.resident() - pool_.pooled() + charge > pool_.held_peak()) return;
                if (!pool_.contains(e.nbytes) && !pool_.trim_to_fit(charge)) return;
                start_read(e, reserved::no);
            }
            --step_.cursor;
        }
    }

    // ---- memory ---------------------------------------------------------------------------

    /// Makes room for `charge` more resident bytes without exceeding the budget. Blocking:
    /// trims the pool, drops prefetched tensors not yet loaded (they are on the tier), waits
    /// for writes to free their buffers, and as a last resort queues writes of kept tensors.
    /// False when nothing can make room.
    /// With `swapped`, a free buffer of size() `swap_size` found in the pool (at once, or
    /// freed by a write while waiting) goes there instead of being trimmed; it leaves the
    /// stash's resident bytes, so it makes room too.
    bool make_room(std::unique_lock<std::mutex>& lock, std::size_t charge,
                   aligned_buffer* swapped = nullptr, std::size_t swap_size = 0) {
        auto take_swap = [&] {
            if (!swapped || swapped->data()) return false;
            auto b = pool_.take(swap_size);
            if (!b) return false;
            pool_.uncount(b->capacity());
            *swapped = std::move(*b);
            return true;
        };
        take_swap();
        if (charge > opt_.memory_budget) return false;
        std::optional<typename Clock::time_point> since;
        auto done = [&](bool ok) {
            if (since) stats_.budget_wait_seconds += seconds_since<Clock>(*since);
            return ok;
        };
        while (!pool_.fits(charge)) {
            if (take_swap()) continue;
            if (pool_.trim_to_fit(charge)) break;
            room_candidates c = table_.find_room();
            if (c.drop) {  // a prefetched tensor not loaded yet: its bytes are on the tier
                c.drop->state = entry_state::offloaded;
                pool_.uncount(c.drop->buffer.capacity());
                aligned_buffer gone = std::move(c.drop->buffer);
                continue;
            }
            if (!c.io_will_free && c.demote) {
                ++stats_.forced_writes;
                c.demote->state = entry_state::queued;
                queue_write(*c.demote);
                c.io_will_free = true;
            }
            if (!c.io_will_free) return done(false);
            if (!since) since = Clock::now();
            cv_.wait(lock);
        }
        return done(true);
    }

    // ---- the bandwidth probe --------------------------------------------------------------

    /// Writes and reads back up to probe_bytes, at most the step's offloadable bytes; the
    /// slower direction's bytes per second. When the step offloads nothing, or no 4 KiB can
    /// be freed under the budget, what the tier delivered since `forward_stats` instead (no
    /// probe). Throws the tier's error naming the tier and the probe size.
    double measure_bandwidth(std::unique_lock<std::mutex>& lock, const tier_stats& forward_stats) {
        const std::string key = keys_.probe_key();
        // The probe never moves more than the step would offload: a stash that offloads a
        // few MiB must not hold a larger probe buffer than everything it removes.
        const std::size_t offloadable = step_.layers.offload_bytes();
        // The probe's buffer counts against the budget like any other: at most the room left,
        // in whole 4 KiB blocks, of which the first 4 KiB are made room for as for any save,
        // so that the probe never lifts the resident bytes above the budget. If nothing can
        // free 4 KiB, the forward's own writes say what the tier delivered.
        if (offloadable == 0 || !make_room(lock, 4096))
            return delivered_bandwidth(forward_stats, tier_.stats());
        const std::size_t room =
            pool_.budget() > pool_.resident() ? pool_.budget() - pool_.resident() : 0;
        const std::size_t n = std::max<std::size_t>(
            std::min({opt_.probe_bytes, room, align_up(offloadable)}) / 4096 * 4096, 4096);
        pool_.count(n);
        lock.unlock();
        double bw = 0;
        try {
            aligned_buffer buf(n);
            for (std::size_t i = 0; i < n; i += 4096) buf.data()[i] = std::byte{1};
            bw = probe_bandwidth<Clock>(tier_, key, buf.bytes());
            erase_blob(key);
        } catch (...) {
            erase_blob(key);  // (noexcept; the tier's error below says what failed)
            lock.lock();
            pool_.uncount(n);
            std::rethrow_exception(spillway::with_context(
                std::current_exception(),
                "activation_stash: measuring the bandwidth of tier " +
                    quoted(std::string(tier_.name())) + " with a probe of " + bytes_str(n) +
                    " failed (set stash_options::tier_bandwidth to skip the probe)"));
        }
        lock.lock();
        pool_.uncount(n);
        return bw;
    }

private:
    std::string write_context(const entry& e) const {
        return "activation_stash: offloading " + e.label() + " (" + bytes_str(e.nbytes) +
               ") to tier " + quoted(std::string(tier_.name())) + " failed";
    }
    std::string read_context(const entry& e) const {
        return "activation_stash: loading " + e.label() + " (" + bytes_str(e.nbytes) +
               ") back from tier " + quoted(std::string(tier_.name())) + " failed";
    }

    void run_write(std::uint64_t id) {
        std::unique_lock lock(mutex_);
        entry* found = table_.find(id);
        if (!found || found->state != entry_state::queued || shutting_down_) {
            --writes_pending_;  // cancelled: released, taken by backward, or shutting down
            cv_.notify_all();
            return;
        }
        entry& e = *found;
        e.state = entry_state::writing;
        std::span<const std::byte> bytes(e.buffer.data(), e.nbytes);
        std::exception_ptr error = write_entry(lock, e, bytes);
        if (error) {
            if (!pending_error_) pending_error_ = e.error;
            if (e.refs == 0) {
                pool_.recycle(std::move(e.buffer));
                table_.erase(e.id);
            } else if (e.pinned) {
                e.state = entry_state::kept;  // backward holds the resident copy: still exact
            } else {
                e.state = entry_state::lost;
                table_.forget_identity(e);
                pool_.uncount(e.buffer.capacity());
                aligned_buffer gone = std::move(e.buffer);
            }
        } else {
            e.on_tier = true;
            stats_.bytes_offloaded += e.nbytes;
            if (e.refs == 0) {
                pool_.recycle(std::move(e.buffer));
                retire_key(e);
                table_.erase(e.id);
            } else if (e.pinned || in_prefetch_window(e)) {
                note_forwarded(e);
                e.state = entry_state::fetched;
            } else {
                pool_.recycle(std::move(e.buffer));
                e.state = entry_state::offloaded;
            }
            prefetch();
        }
        cv_.notify_all();
    }

    // Writes e's bytes to the tier with the lock released. On return the lock is held again,
    // writes_pending_ is one lower, and a failure is recorded on e and returned.
    std::exception_ptr write_entry(std::unique_lock<std::mutex>& lock, entry& e,
                                   std::span<const std::byte> bytes) {
        e.key = keys_.take(e.nbytes);
        const std::string key = e.key;
        lock.unlock();
        std::exception_ptr error;
        try {
            tier_.write(key, bytes).wait();
        } catch (...) {
            error = std::current_exception();
        }
        lock.lock();
        --writes_pending_;
        if (error) {
            ++stats_.failed_writes;
            e.error = spillway::with_context(error, write_context(e));
            erase_later(std::exchange(e.key, std::string()));  // it may hold a stale or torn blob
        }
        return error;
    }

    void run_read(std::uint64_t id, aligned_buffer buffer) {
        std::unique_lock lock(mutex_);
        entry& e = table_.at(id);  // a reading entry is never erased before this ends
        std::string key = e.key;
        std::size_t nbytes = e.nbytes;
        lock.unlock();
        std::exception_ptr error;
        try {
            if (!buffer.data()) buffer = buffer_to_overwrite(nbytes);
            tier_.read(key, std::span<std::byte>(buffer.data(), nbytes)).wait();
        } catch (...) {
            error = std::current_exception();
        }
        lock.lock();
        --reads_pending_;
        if (e.refs == 0) {
            if (buffer.data())
                pool_.recycle(std::move(buffer));
            else
                pool_.uncount(budget_pool::charge_of(nbytes));
            retire_key(e);
            table_.erase(e.id);
        } else if (error) {
            ++stats_.failed_reads;
            if (buffer.data())
                pool_.recycle(std::move(buffer));
            else
                pool_.uncount(budget_pool::charge_of(nbytes));
            e.read_error = spillway::with_context(error, read_context(e));
            e.state = entry_state::offloaded;
        } else {
            e.buffer = std::move(buffer);
            e.state = entry_state::fetched;
            stats_.bytes_loaded += nbytes;
        }
        cv_.notify_all();
    }

    // The lowest layer position of the prefetch window (step_layers::window_low()).
    std::size_t window_low() const {
        return step_.layers.window_low(step_.backward_position, opt_.prefetch_layers);
    }
    bool in_prefetch_window(const entry& e) const {
        if (!step_.backward || e.step != step_.number) return false;
        return e.position >= window_low();
    }

    // The tensor on the tier under e.key is gone and no I/O on the key is in flight: its blob
    // stays for the next write to rewrite (flush(), reset() and the destructor erase it).
    void retire_key(entry& e) {
        if (shutting_down_) {
            erase_blob(e.key);
            return;
        }
        keys_.retire(e.nbytes, std::exchange(e.key, std::string()));
    }

    // Erases a blob on the writer thread: unlinking a file can take milliseconds on a busy
    // disk, and release() runs on the compute thread. A key whose erase was issued is never
    // used again, so the erase cannot race with another operation on the same key.
    void erase_later(std::string key) {
        if (shutting_down_) {  // the pools are draining: erase here
            erase_blob(key);
            return;
        }
        ++erases_pending_;
        writer_->submit([this, key = std::move(key)] {
            erase_blob(key);
            std::lock_guard lock(mutex_);
            --erases_pending_;
            cv_.notify_all();
        });
    }

    void erase_blob(const std::string& key) noexcept {
        try {
            tier_.erase(key);
        } catch (...) {
            // A blob the tier cannot erase is left behind; it holds no data anyone reads.
        }
    }

    Tier& tier_;
    const stash_options& opt_;
    std::mutex& mutex_;
    std::condition_variable& cv_;
    tensor_table& table_;
    budget_pool& pool_;
    stash_stats& stats_;
    stash_step& step_;

    buffer_arena
        arena_;  // small buffers (new_buffer); they keep its memory alive, wherever they go
    key_recycler keys_;
    std::exception_ptr pending_error_;
    std::size_t writes_pending_ = 0, reads_pending_ = 0, erases_pending_ = 0;
    bool shutting_down_ = false;

    // Last: destroyed (drained and joined) first, while everything above is alive.
    std::optional<thread_pool> writer_;
    std::optional<thread_pool> reader_;
};

}  // namespace spillway::detail
