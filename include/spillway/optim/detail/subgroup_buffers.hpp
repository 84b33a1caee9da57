// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/subgroup_buffers.hpp: the update pipeline's host buffers and the
// five-state machine that moves subgroup state between them and the tier (not public).
//
// Each buffer is in one state:
//   free     holds nothing;
//   reading  its subgroup's read (a job of piece_io) is in flight;
//   ready    holds its subgroup, taken by the caller (for the Adam step, a save, a hand-over);
//   writing  its subgroup's write is in flight;
//   resident holds its subgroup between calls, no I/O in flight.
// Transitions: free -> reading (start_read) -> ready (wait_read) -> writing (start_write) ->
// free (a successful write) or resident (a failed one); ready -> resident (keep_resident)
// -> ready (take_resident); any state -> free (release). docs/design.md ("The update
// pipeline") gives the protocol a call runs over them.
//
// Guarantees:
// - Every location of a subgroup's state carries the step it holds: the tier's copy
//   (tier_version) and a buffer's (version). A write commits its step to the tier only when
//   every piece succeeded; a failed write keeps the buffer resident, so the newest state of
//   every subgroup is always on the tier or in a buffer. recover() restores that after an
//   error anywhere.
// - Errors are rethrown naming the subgroup, its key and the tier (rethrow_named); the first
//   error of a call wins.
// - At most `buffers` buffers of `nbytes` each are allocated, once; nothing per call.
// - Not thread-safe: one thread drives it; the tier may complete pieces on any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/buffer_arena.hpp"
#include "spillway/io/completion.hpp"
#include "spillway/optim/detail/pipeline_io.hpp"
#include "spillway/optim/pipeline_config.hpp"
#include "spillway/optim/update_stats.hpp"
#include "spillway/schedule/alternating_order.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/trace/recorder.hpp"

namespace spillway::detail {

/// The state of one host buffer (see the file comment).
enum class buffer_use { free, reading, ready, writing, resident };

/// One host buffer and the subgroup it holds.
struct subgroup_buffer {
    aligned_buffer mem;
    std::ptrdiff_t sg = -1;                          // subgroup held
    std::int64_t version = 0;                        // step of the state held
    bool dirty = false;                              // newer than the tier's copy
    buffer_use use = buffer_use::free;               // reading / writing: its job is active
    std::chrono::steady_clock::time_point issued{};  // when its read or write was issued
};

/// The buffers, the per-subgroup bookkeeping and their I/O, for a pipeline over `Tier`.
template <storage_tier Tier>
class subgroup_buffers {
public:
    using clock = std::chrono::steady_clock;

    /// Keys "<prefix>-<s>" (piece j > 0: "<prefix>-<s>.<j>") for `config.subgroup_count()`
    /// blobs of `state_floats` floats per parameter, and `config.host_buffers` buffers of
    /// `buffer_nbytes`; transfers are counted in `*stats`. The caller keeps `tier` and
    /// `*stats` alive. Throws std::invalid_argument when the tier already holds one of the keys.
    subgroup_buffers(Tier& tier, const pipeline_config& config, const std::string& key_prefix,
                     std::size_t state_floats, std::size_t buffer_nbytes, update_stats* stats)
        : tier_(tier),
          cfg_(config),
          n_(config.subgroup_count()),
          state_floats_(state_floats),
          stats_(stats) {
        keys_.reserve(n_);
        piece_keys_.resize(n_);
        for (std::size_t s = 0; s < n_; ++s) {
            keys_.push_back(key_prefix + "-" + std::to_string(s));
            const std::size_t pieces = (blob_bytes(s) + cfg_.piece_bytes - 1) / cfg_.piece_bytes;
            for (std::size_t j = 0; j < pieces; ++j)
                piece_keys_[s].push_back(j == 0 ? keys_[s] : keys_[s] + "." + std::to_string(j));
        }
        for (const auto& pieces : piece_keys_)
            for (const auto& k : pieces)
                expect_argument(!tier_.contains(k),
                                "update_pipeline: the tier '" + std::string(tier_.name()) +
                                    "' already holds key " + spillway::quoted(k) +
                                    " (another pipeline with the same key_prefix?)");
        bufs_.resize(cfg_.host_buffers);
        if (cfg_.pages == page_size::automatic && cfg_.lock == memory_lock::unlocked &&
            align_up(buffer_nbytes) < huge_page_bytes) {
            // Buffers under 2 MiB would come from malloc's scattered pages: carve them all out
            // of one huge-page slab instead (the set rounded up to 2 MiB), as large ones get
            // their own.
            buffer_arena arena(cfg_.host_buffers * align_up(buffer_nbytes));
            for (auto& b : bufs_) b.mem = arena.allocate(buffer_nbytes);
        } else {
            for (auto& b : bufs_)
                b.mem = aligned_buffer(buffer_nbytes, cfg_.lock, default_alignment,
                                       buffer_fill::zeroed, cfg_.pages);
        }
        // A tier with children runs one read and one write per child itself: no window.
        const std::size_t window = tier_with_children<Tier>
                                       ? std::numeric_limits<std::size_t>::max()
                                       : cfg_.pieces_in_flight;
        io_ = std::make_unique<piece_io<Tier>>(tier_, bufs_.size(), window);
        tier_version_.assign(n_, 0);
        resident_of_.assign(n_, -1);
        prefetch_of_.assign(n_, -1);
    }
    subgroup_buffers(const subgroup_buffers&) = delete;
    subgroup_buffers& operator=(const subgroup_buffers&) = delete;
    ~subgroup_buffers() { quiesce(); }

    // ---- Inspection -----------------------------------------------------------------

    [[nodiscard]] std::size_t size() const noexcept { return bufs_.size(); }
    [[nodiscard]] subgroup_buffer& operator[](std::size_t b) noexcept { return bufs_[b]; }
    [[nodiscard]] const subgroup_buffer& operator[](std::size_t b) const noexcept {
        return bufs_[b];
    }
    [[nodiscard]] std::size_t subgroup_count() const noexcept { return n_; }
    /// Bytes of subgroup s's blob on the tier.
    [[nodiscard]] std::size_t blob_bytes(std::size_t s) const noexcept {
        return state_floats_ * sizeof(float) * cfg_.subgroup_elements(s);
    }
    [[nodiscard]] const std::string& key(std::size_t s) const { return keys_.at(s); }
    [[nodiscard]] std::size_t piece_count(std::size_t s) const { return piece_keys_.at(s).size(); }
    /// The buffer holding subgroup s between calls, or -1.
    [[nodiscard]] std::ptrdiff_t resident_of(std::size_t s) const noexcept {
        return resident_of_[s];
    }
    /// The step of subgroup s's newest state (its resident buffer's, or the tier's).
    [[nodiscard]] std::int64_t version_of(std::size_t s) const noexcept {
        return resident_of_[s] >= 0 ? bufs_[static_cast<std::size_t>(resident_of_[s])].version
                                    : tier_version_[s];
    }
    [[nodiscard]] std::size_t count(buffer_use use) const noexcept {
        return static_cast<std::size_t>(std::count_if(
            bufs_.begin(), bufs_.end(), [use](const subgroup_buffer& b) { return b.use == use; }));
    }
    [[nodiscard]] std::size_t prefetched_count() const noexcept {
        return static_cast<std::size_t>(std::count_if(prefetch_of_.begin(), prefetch_of_.end(),
                                                      [](std::ptrdiff_t b) { return b >= 0; }));
    }
    [[nodiscard]] piece_io<Tier>& io() noexcept { return *io_; }

    /// Records each completed read and write on `recorder` (may be null), on these tracks.
    void trace_to(trace::recorder* recorder, trace::track_id reads, trace::track_id writes) {
        recorder_ = recorder;
        tr_reads_ = reads;
        tr_writes_ = writes;
    }

    // ---- Transitions ----------------------------------------------------------------

    /// After a restore: the tier holds `step` for every subgroup.
    void set_tier_step(std::int64_t step) { tier_version_.assign(n_, step); }

    /// Throws std::logic_error naming `call` and the first subgroup whose newest state is
    /// not at `step` (an update that failed part-way leaves subgroups one step apart).
    void expect_all_at(std::int64_t step, const char* call) const {
        for (std::size_t s = 0; s < n_; ++s)
            if (version_of(s) != step)
                throw std::logic_error(std::string(call) + ": subgroup " + std::to_string(s) +
                                       " holds step " + std::to_string(version_of(s)) +
                                       " but the pipeline is at step " + std::to_string(step) +
                                       " (an update failed part-way; run it again first)");
    }

    /// Every copy of every subgroup (the tier's, each buffer's, a write in flight's) is
    /// labelled as holding step `step`; the caller checked that they all held one step.
    void relabel_step(std::int64_t step) {
        tier_version_.assign(n_, step);
        for (auto& b : bufs_)
            if (b.sg >= 0) b.version = step;
    }

    /// free -> reading: issues the read of subgroup s into buffer b (the tier's step, clean).
    void start_read(std::size_t b, std::size_t s) {
        auto& buf = bufs_[b];
        buf.sg = static_cast<std::ptrdiff_t>(s);
        buf.version = tier_version_[s];
        buf.dirty = false;
        buf.use = buffer_use::reading;
        buf.issued = clock::now();
        io_->start(b, io_direction::read, piece_keys_[s], buf.mem.bytes().first(blob_bytes(s)),
                   cfg_.piece_bytes);
    }

    /// reading -> ready: waits for buffer b's read (read-wait). On failure the buffer is
    /// freed (the tier still holds the subgroup) and the error rethrown, named.
    void wait_read(std::size_t b) {
        auto& buf = bufs_[b];
        auto s = static_cast<std::size_t>(buf.sg);
        auto t0 = clock::now();
        while (!io_->finished(b)) io_->wait_oldest();
        stats_->read_wait_seconds += seconds_since(t0);
        settle_writes();
        if (auto error = io_->take(b)) {
            buf.use = buffer_use::free;
            buf.sg = -1;
            rethrow_named(error, s, "reading");
        }
        trace_io(tr_reads_, "read ", s, buf.issued, blob_bytes(s));
        buf.use = buffer_use::ready;
        ++stats_->subgroups_read;
        stats_->bytes_read += blob_bytes(s);
    }

    /// ready -> writing: issues the write of buffer b's subgroup.
    void start_write(std::size_t b) {
        auto& buf = bufs_[b];
        auto s = static_cast<std::size_t>(buf.sg);
        buf.use = buffer_use::writing;
        buf.issued = clock::now();
        io_->start(b, io_direction::write, piece_keys_[s], buf.mem.bytes().first(blob_bytes(s)),
                   cfg_.piece_bytes);
    }

    /// -> resident: buffer b keeps its subgroup between calls.
    void keep_resident(std::size_t b) {
        bufs_[b].use = buffer_use::resident;
        resident_of_[static_cast<std::size_t>(bufs_[b].sg)] = static_cast<std::ptrdiff_t>(b);
    }

    /// resident -> ready: takes subgroup s's resident buffer (resident_of(s) >= 0).
    std::size_t take_resident(std::size_t s) {
        auto b = static_cast<std::size_t>(resident_of_[s]);
        resident_of_[s] = -1;
        bufs_[b].use = buffer_use::ready;
        return b;
    }

    /// -> free.
    void release(std::size_t b) {
        auto& buf = bufs_[b];
        buf.use = buffer_use::free;
        buf.sg = -1;
        buf.dirty = false;
    }

    /// Completes the pieces that finished, tops the windows up and commits finished writes.
    void poll() {
        io_->poll();
        settle_writes();
    }

    /// A free buffer after polling, if any.
    std::optional<std::size_t> find_free() {
        poll();
        for (std::size_t b = 0; b < bufs_.size(); ++b)
            if (bufs_[b].use == buffer_use::free) return b;
        return std::nullopt;
    }

    /// A free buffer, waiting for the oldest piece in flight while none is (the wait is added
    /// to *wait when `wait` is not null).
    std::size_t take_free(double* wait) {
        for (;;) {
            if (auto b = find_free()) return *b;
            if (count(buffer_use::writing) == 0) {
                rethrow_pending();
                throw std::logic_error("update_pipeline: no host buffer is free or being written");
            }
            auto t0 = clock::now();
            io_->wait_oldest();
            settle_writes();
            if (wait) *wait += seconds_since(t0);
            rethrow_pending();
        }
    }

    /// A buffer for a one-off transfer between calls (save, read_state, a hand-over): a free
    /// one, or a prefetched one, or the last resident one after writing it out.
    std::size_t scratch() {
        wait_all_writes(nullptr);
        rethrow_pending();
        if (auto b = find_free()) return *b;
        if (cancel_prefetch()) return scratch();
        for (std::size_t b = bufs_.size(); b-- > 0;) {
            if (bufs_[b].use == buffer_use::resident) {
                if (bufs_[b].dirty) write_now(b);
                resident_of_[static_cast<std::size_t>(bufs_[b].sg)] = -1;
                release(b);
                return b;
            }
        }
        throw std::logic_error("update_pipeline: no buffer available");
    }

    /// Waits for every write in flight (write-wait, added to *wait when not null).
    void wait_all_writes(double* wait) {
        auto t0 = clock::now();
        for (;;) {
            settle_writes();
            if (count(buffer_use::writing) == 0) break;
            io_->wait_oldest();
        }
        if (wait) *wait += seconds_since(t0);
    }

    /// Synchronous write of buffer b (outside the windows): throws on failure, the buffer
    /// stays as it was (dirty); on success the tier holds its step and it is clean.
    void write_now(std::size_t b) {
        auto& buf = bufs_[b];
        auto s = static_cast<std::size_t>(buf.sg);
        transfer_now(io_direction::write, s, buf.mem.bytes().first(blob_bytes(s)));
        tier_version_[s] = buf.version;
        buf.dirty = false;
    }

    /// Synchronous read of subgroup s's blob into `out` (outside the windows).
    void read_now(std::size_t s, std::span<std::byte> out) {
        transfer_now(io_direction::read, s, out);
    }

    /// Writes out and frees resident buffers, those visited last in `order` first, until at
    /// most `bound` subgroups are resident (after a failed call).
    void make_room(const alternating_order& order, std::size_t bound) {
        std::size_t resident = 0;
        for (auto r : resident_of_) resident += r >= 0;
        for (std::size_t p = n_; p-- > 0 && resident > bound;) {
            std::size_t s = order[p];
            if (resident_of_[s] < 0) continue;
            auto b = static_cast<std::size_t>(resident_of_[s]);
            if (bufs_[b].dirty) write_now(b);
            resident_of_[s] = -1;
            release(b);
            --resident;
        }
    }

    // ---- Prefetch -------------------------------------------------------------------

    /// Issues reads of the first subgroups in `order` that are neither resident nor
    /// prefetched, into free buffers, leaving `keep_free` buffers free; returns how many.
    std::size_t prefetch(const alternating_order& order, std::size_t max_subgroups,
                         std::size_t keep_free) {
        std::size_t free = count(buffer_use::free);
        free -= std::min(free, keep_free);
        std::size_t started = 0;
        for (std::size_t p = 0; p < n_ && started < std::min(free, max_subgroups); ++p) {
            const std::size_t s = order[p];
            if (resident_of_[s] >= 0 || prefetch_of_[s] >= 0) continue;
            auto b = find_free();
            if (!b) break;
            start_read(*b, s);
            prefetch_of_[s] = static_cast<std::ptrdiff_t>(*b);
            ++started;
        }
        return started;
    }

    /// Takes over the prefetched read of subgroup s: its buffer, or -1.
    std::ptrdiff_t take_prefetch(std::size_t s) noexcept {
        return std::exchange(prefetch_of_[s], -1);
    }

    /// Takes the prefetched buffers back: waits for their reads and frees them. Returns
    /// whether there were any.
    bool cancel_prefetch() noexcept {
        bool any = false;
        for (auto& b : prefetch_of_) {
            if (b < 0) continue;
            const auto pb = static_cast<std::size_t>(b);
            io_->drain();
            (void)io_->take(pb);  // the tier still holds the subgroup
            release(pb);
            b = -1;
            any = true;
        }
        own_prefetches = 0;
        return any;
    }

    /// Of the prefetched reads, those the pipeline started itself (not the trainer's).
    std::size_t own_prefetches = 0;

    // ---- Errors ---------------------------------------------------------------------

    /// After an error anywhere: waits for everything in flight, keeps each buffer whose
    /// state is newer than the tier's as resident, frees the others.
    void recover() noexcept {
        io_->drain();  // every piece issued and completed: each job is finished
        for (std::size_t b = 0; b < bufs_.size(); ++b) {
            auto& buf = bufs_[b];
            if (buf.use == buffer_use::writing)
                finish_write(b);  // failure keeps it resident
            else if (io_->active(b))
                (void)io_->take(b);  // a read: the tier holds it
            if (buf.use == buffer_use::resident || buf.use == buffer_use::free) continue;
            // reading or ready (or a resident taken for compute): keep it only if newer.
            if (buf.dirty && buf.sg >= 0)
                keep_resident(b);
            else
                release(b);
        }
        pending_ = call_error{};
    }

    /// Throws the first error a write of this call recorded, if any.
    void rethrow_pending() {
        if (pending_.error) {
            auto e = pending_;
            pending_ = call_error{};
            rethrow_named(e.error, e.subgroup, e.what);
        }
    }

    /// Rethrows `error` with the subgroup, its key and the tier in front of its message.
    [[noreturn]] void rethrow_named(std::exception_ptr error, std::size_t s,
                                    std::string_view what) const {
        rethrow_with_context(std::move(error), "update_pipeline: " + std::string(what) +
                                                   " subgroup " + std::to_string(s) + " (key " +
                                                   spillway::quoted(keys_[s]) + ") on tier '" +
                                                   std::string(tier_.name()) + "' failed");
    }

    /// Waits for every transfer in flight: the tier's contract forbids erasing a key with an
    /// operation in flight (a write finishing later would bring the key back).
    void quiesce() noexcept {
        if (io_) io_->drain();
    }

    /// Erases every key of the state (after quiesce()).
    void erase_all() noexcept {
        for (const auto& pieces : piece_keys_) {
            for (const auto& k : pieces) {
                try {
                    tier_.erase(k);
                } catch (...) {
                }
            }
        }
    }

private:
    struct call_error {
        std::exception_ptr error;
        std::size_t subgroup = 0;
        const char* what = "";
    };

    // Commits the writes that finished (every call into io_ may finish some).
    void settle_writes() {
        for (std::size_t b = 0; b < bufs_.size(); ++b)
            if (bufs_[b].use == buffer_use::writing && io_->finished(b)) finish_write(b);
    }

    // writing -> free on success (the tier holds the buffer's step); -> resident on failure
    // (its state is the newest), the error recorded for rethrow_pending().
    void finish_write(std::size_t b) {
        auto& buf = bufs_[b];
        auto s = static_cast<std::size_t>(buf.sg);
        if (auto error = io_->take(b)) {
            keep_resident(b);
            if (!pending_.error) pending_ = call_error{error, s, "writing"};
            return;
        }
        trace_io(tr_writes_, "write ", s, buf.issued, blob_bytes(s));
        tier_version_[s] = buf.version;
        ++stats_->subgroups_written;
        stats_->bytes_written += blob_bytes(s);
        release(b);
    }

    // Moves subgroup s's whole blob at once, outside the windows, and throws the first error,
    // naming the subgroup.
    void transfer_now(io_direction dir, std::size_t s, std::span<std::byte> bytes) {
        std::vector<io_completion> ops;
        std::exception_ptr error;
        for (std::size_t j = 0; j < piece_keys_[s].size(); ++j) {
            const std::size_t begin = j * cfg_.piece_bytes;
            auto piece = bytes.subspan(begin, std::min(cfg_.piece_bytes, bytes.size() - begin));
            try {
                if (dir == io_direction::read)
                    ops.push_back(tier_.read(piece_keys_[s][j], piece));
                else
                    ops.push_back(
                        tier_.write(piece_keys_[s][j], std::span<const std::byte>(piece)));
            } catch (...) {
                error = std::current_exception();
                break;
            }
        }
        for (auto& op : ops) {
            try {
                op.wait();
            } catch (...) {
                if (!error) error = std::current_exception();
            }
        }
        if (error) rethrow_named(error, s, dir == io_direction::read ? "reading" : "writing");
    }

    void trace_io(trace::track_id track, const char* what, std::size_t s, clock::time_point begin,
                  std::size_t nbytes) {
        if (!recorder_ || !recorder_->enabled()) return;
        recorder_->complete(track, what + std::to_string(s), begin, clock::now(), "io",
                            {{"bytes", static_cast<double>(nbytes)}});
    }

    static double seconds_since(clock::time_point t0) {
        return std::chrono::duration<double>(clock::now() - t0).count();
    }

    Tier& tier_;
    const pipeline_config cfg_;
    std::size_t n_;
    std::size_t state_floats_;
    update_stats* stats_;
    trace::recorder* recorder_ = nullptr;
    std::vector<std::string> keys_;                     // first piece of each subgroup
    std::vector<std::vector<std::string>> piece_keys_;  // every piece of each subgroup
    std::vector<subgroup_buffer> bufs_;
    std::unique_ptr<piece_io<Tier>> io_;       // after bufs_: destroyed (drained) first
    std::vector<std::int64_t> tier_version_;   // step held on the tier, per subgroup
    std::vector<std::ptrdiff_t> resident_of_;  // buffer holding the subgroup between calls, or -1
    std::vector<std::ptrdiff_t> prefetch_of_;  // buffer a prefetch reads the subgroup into, or -1
    call_error pending_;
    trace::track_id tr_reads_ = 0, tr_writes_ = 0;
};

}  // namespace spillway::detail
