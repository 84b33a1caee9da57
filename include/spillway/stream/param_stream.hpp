// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/param_stream.hpp: a model's parameters as layer-sized blobs on any
/// storage_tier, streamed through a hard memory budget in the order training visits them
/// (forward 0..N-1, then backward N-1..0, step after step).
///
/// What it guarantees:
/// - Resident parameter bytes (every buffer it holds: layers held, resident, being read or
///   written, and free buffers kept for reuse, each charged by charge_of()) never exceed
///   memory_budget. A budget under smallest_budget() (the held_layers largest layers) is
///   refused at construction, naming the smallest that works; above it no acquire fails
///   for lack of room.
/// - Bytes out are bytes in: acquire() gives exactly the bytes last stored or released as
///   updated, or throws; never stale or partial data.
/// - In the training order a layer is read at most once per pass, and not at all while it
///   is still in memory: with room for k layers, the last k of forward start backward and
///   the last k of backward start the next forward without a read (2(N-k) reads a step).
/// - An updated layer is written back once, before its buffer is reused, or stays resident.
/// - Tier errors are rethrown naming the layer, its key and the tier; a failed write-back
///   leaves the layer's bytes in memory and dirty (nothing lost; the write is retried).
/// - Not thread-safe: one thread (the trainer's) drives it; the tier's own threads complete
///   its I/O. resident_bytes() alone may be read from any thread.
///
/// The protocol, per layer (docs/param_stream.md gives the reasons):
///  1. Construction checks the sizes, the budget, the keys ("<prefix>-<layer>") and, for a
///     bounded tier, the free space; adopt_existing checks every blob's size instead.
///  2. store(layer, bytes) or fill(layer, writer) puts a layer's first contents in a buffer
///     inside the budget and issues its write; stores of several layers overlap, and
///     progress() says how many bytes reached the tier.
///  3. acquire(layer) / acquire_for_update(layer) move the cursor to the layer's next visit
///     and return its bytes: resident ones at once, otherwise after its read (issued by
///     prefetch earlier, or now). Room for a read is made by evicting the layers visited
///     furthest in the future (Belady's rule); a dirty one is written back first.
///  4. After each call, prefetch walks the upcoming visits in order and reads the layers
///     not in memory, as long as the free room, or the room of layers visited later than
///     the one to read, allows; it never evicts a layer needed sooner than the one it reads.
///  5. release(layer) ends a use; release(layer, layer_change::updated) after
///     acquire_for_update() marks the layer dirty.
///  6. flush() writes every dirty layer and waits (for a checkpoint); the destructor waits
///     for the I/O in flight and erases the blobs (blob_lifetime::keep keeps them).
///
/// Bytes per parameter per step, with b bytes per element of the streamed copy (4 for
/// fp32): at most 2b read (forward, backward) + b written (after the update) = 3b = 12 B
/// for fp32. For N equal layers and room for k < N: 2(N-k) reads and min(N, 2(N-k)) writes
/// a step. With the fp32 master copy in this stream and m, v (8 B) in the update pipeline,
/// a step moves at most 12 + 16 = 28 B per parameter.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/completion.hpp"
#include "spillway/stream/detail/visit_order.hpp"
#include "spillway/stream/layer_view.hpp"
#include "spillway/stream/param_stream_options.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway {

/// A model's parameters as one blob per layer on `Tier`, acquired and released in training
/// order through a bounded set of host buffers (see the file comment for the guarantees and
/// the protocol). Not copyable or movable; one thread drives it.
/// @tparam Tier any storage_tier; the stream holds a reference to it.
template <storage_tier Tier>
class param_stream {
public:
    /// The clock of the wait times in the stats.
    using clock = std::chrono::steady_clock;

    /// A stream over `tier` (which must outlive it) for layers of `layer_nbytes` bytes.
    /// @throws std::invalid_argument for no layers, a layer of 0 bytes, a bad key prefix,
    ///         held_layers 0, a budget under smallest_budget() (the message names the
    ///         smallest that works), a bounded tier without room for every layer, or (with
    ///         initial_contents::adopt_existing) a missing blob or one of the wrong size
    param_stream(Tier& tier, std::vector<std::size_t> layer_nbytes, param_stream_options options)
        : tier_(tier),
          opt_(std::move(options)),
          order_(std::max<std::size_t>(layer_nbytes.size(), 1), opt_.pattern) {
        expect_argument(!layer_nbytes.empty(), "param_stream: at least one layer is needed");
        validate_key(opt_.key_prefix, "param_stream: key_prefix");
        expect_argument(opt_.key_prefix.size() <= 200,
                        "param_stream: key_prefix " + quoted(opt_.key_prefix) +
                            " is longer than 200 bytes: its keys \"<key_prefix>-<layer>\" must "
                            "fit a tier's 255-byte limit");
        expect_argument(opt_.held_layers >= 1,
                        "param_stream: held_layers must be at least 1 (a trainer holds the layer "
                        "it computes with)");
        slots_.resize(layer_nbytes.size());
        for (std::size_t l = 0; l < layer_nbytes.size(); ++l) {
            expect_argument(layer_nbytes[l] > 0,
                            "param_stream: layer " + std::to_string(l) + " has 0 bytes");
            slots_[l].nbytes = layer_nbytes[l];
            slots_[l].charge = charge_of(layer_nbytes[l], opt_.pages);
            slots_[l].key = opt_.key_prefix + "-" + std::to_string(l);
            total_bytes_ += layer_nbytes[l];
        }
        const std::size_t least = smallest_budget(layer_nbytes, opt_);
        if (opt_.memory_budget < least) {
            const auto largest = *std::max_element(layer_nbytes.begin(), layer_nbytes.end());
            throw std::invalid_argument(
                "param_stream: memory_budget of " + bytes_str(opt_.memory_budget) +
                " is too small: the smallest budget that works is " + bytes_str(least) +
                " (the buffers of the " +
                std::to_string(std::min(opt_.held_layers, slots_.size())) +
                " largest layers, held_layers = " + std::to_string(opt_.held_layers) +
                "; the largest layer has " + bytes_str(largest) + ")");
        }
        std::size_t ours_on_tier = 0;
        for (std::size_t l = 0; l < slots_.size(); ++l) {
            auto& s = slots_[l];
            const auto found = tier_.size_of(s.key);
            if (opt_.contents == initial_contents::adopt_existing) {
                if (!found)
                    throw std::invalid_argument("param_stream: adopt_existing, but layer " +
                                                std::to_string(l) + " (key " +
                                                quoted(std::string_view(s.key)) +
                                                ") has no blob on tier " + quoted(tier_name()));
                if (*found != s.nbytes)
                    throw std::invalid_argument(
                        "param_stream: adopt_existing, but the blob of layer " + std::to_string(l) +
                        " (key " + quoted(std::string_view(s.key)) + ") on tier " +
                        quoted(tier_name()) + " has " + bytes_str(*found) +
                        " where the layer has " + bytes_str(s.nbytes));
                s.stored = s.on_tier = s.progress_counted = true;
                ++layers_stored_;
                bytes_stored_ += s.nbytes;
            }
            if (found) ours_on_tier += *found;
        }
        if (tier_.capacity() != std::numeric_limits<std::size_t>::max()) {
            const std::size_t used = tier_.used();
            const std::size_t free = tier_.capacity() > used ? tier_.capacity() - used : 0;
            const std::size_t needed =
                total_bytes_ > ours_on_tier ? total_bytes_ - ours_on_tier : 0;
            expect_argument(free >= needed, "param_stream: tier " + quoted(tier_name()) + " has " +
                                                bytes_str(free) +
                                                " free, but the parameters need " +
                                                bytes_str(needed) + " more (" +
                                                bytes_str(total_bytes_) + " in all)");
        }
    }
    param_stream(const param_stream&) = delete;
    param_stream& operator=(const param_stream&) = delete;

    /// Waits for the I/O in flight (dropping its errors) and, under
    /// blob_lifetime::erase_on_destroy, erases every blob under the stream's keys. Writes
    /// nothing: call flush() first to keep the newest contents. Views become dangling.
    ~param_stream() {
        for (auto& s : slots_) s.io = io_completion{};  // (waits)
        if (opt_.blobs == blob_lifetime::erase_on_destroy) {
            for (auto& s : slots_) {
                try {
                    if (tier_.contains(s.key)) tier_.erase(s.key);
                } catch (...) {  // a destructor reports nothing
                }
            }
        }
    }

    // ---- Layout ------------------------------------------------------------------------

    /// The number of layers.
    [[nodiscard]] std::size_t layer_count() const noexcept { return slots_.size(); }
    /// The size in bytes of `layer` (< layer_count()).
    [[nodiscard]] std::size_t layer_size(std::size_t layer) const {
        return slot_of(layer, "layer_size").nbytes;
    }
    /// The tier key of `layer`: "<key_prefix>-<layer>".
    [[nodiscard]] const std::string& key_of(std::size_t layer) const {
        return slot_of(layer, "key_of").key;
    }
    /// The bytes of every layer together.
    [[nodiscard]] std::size_t total_bytes() const noexcept { return total_bytes_; }

    // ---- First contents ----------------------------------------------------------------

    /// Copies `bytes` (exactly layer_size(layer) of them) into a buffer inside the budget and
    /// issues its write; returns without waiting for it (the caller may reuse `bytes` at
    /// once). Replaces earlier contents of the layer. Waits when the budget is full of
    /// writes in flight.
    /// @throws std::invalid_argument for a bad layer or size; std::logic_error while the
    ///         layer is acquired or held_layers layers are; the pending error of a failed
    ///         write (see acquire()); a tier error of a write it had to wait for
    void store(std::size_t layer, std::span<const std::byte> bytes) {
        slot& s = slot_of(layer, "store");
        expect_argument(bytes.size() == s.nbytes,
                        "param_stream: store of layer " + std::to_string(layer) + " with " +
                            bytes_str(bytes.size()) + ", but the layer has " + bytes_str(s.nbytes));
        fill(layer, [&](layer_update_view v) {
            std::memcpy(v.bytes().data(), bytes.data(), bytes.size());
        });
    }

    /// As store(), but `writer(layer_update_view)` writes the layer's contents straight into
    /// the stream's buffer (no copy of the whole model needed): it must write every byte
    /// (the buffer's contents are unspecified before) and must not call the stream. If it
    /// throws, the layer reverts to its blob on the tier (or to no contents) and the
    /// exception propagates.
    template <class Writer>
    void fill(std::size_t layer, Writer&& writer) {
        slot& s = slot_of(layer, "fill");
        if (s.held != hold::none)
            throw std::logic_error("param_stream: store of layer " + std::to_string(layer) +
                                   ", which is acquired (release it first)");
        if (held_count_ >= opt_.held_layers)
            throw std::logic_error("param_stream: store of layer " + std::to_string(layer) +
                                   " while " + std::to_string(held_count_) +
                                   " layers are acquired (held_layers): release one first");
        throw_pending();
        if (s.state == slot_state::reading || s.state == slot_state::writing)
            (void)finish(s, report::no);  // superseded: its outcome no longer matters
        if (s.state == slot_state::absent) {
            make_room_for_store(s.charge);
            take_buffer(s);
        }
        s.state = slot_state::dirty;
        s.fresh = false;
        try {
            writer(layer_update_view(layer, std::span<std::byte>(s.buffer.data(), s.nbytes)));
        } catch (...) {
            give_up_buffer(s);
            s.stored = s.on_tier;
            throw;
        }
        s.stored = true;
        s.read_error = nullptr;
        issue_write(s, write_kind::store);
    }

    /// How far the first contents have reached the tier; finishes the I/O that completed
    /// (never blocks, never throws a pending error).
    [[nodiscard]] store_progress progress() {
        poll_completions();
        return {layers_stored_, slots_.size(), bytes_stored_, total_bytes_};
    }

    // ---- Training --------------------------------------------------------------------

    /// The bytes of `layer`, read-only, for forward or backward; blocks until they are in
    /// memory. Valid until release(layer).
    /// @throws std::invalid_argument for a layer out of range; std::logic_error when the
    ///         layer is already acquired, held_layers layers are held, or it has no contents
    ///         (never stored); the tier's error (std::system_error, or what the tier threw)
    ///         naming the layer, its key and the tier for a failed read of this layer
    ///         (a later acquire retries) or for a failed write-back the room needed; and,
    ///         once, the pending error of an earlier failed write-back (the call does nothing
    ///         then; the layer of that write keeps its bytes, dirty)
    [[nodiscard]] layer_view acquire(std::size_t layer) {
        return layer_view(acquire_impl(layer, hold::read, "acquire"));
    }
    /// As acquire(), but writable: the trainer (or the update pipeline, on the trainer's
    /// behalf) writes the layer's new parameters, then calls release(layer,
    /// layer_change::updated). Waits for a write-back of the layer in flight first.
    [[nodiscard]] layer_update_view acquire_for_update(std::size_t layer) {
        return acquire_impl(layer, hold::update, "acquire_for_update");
    }

    /// Ends the use of `layer`; with layer_change::updated (only after acquire_for_update())
    /// the layer becomes dirty: written back once before its buffer is reused, or kept.
    /// Then prefetches. Never throws a pending error.
    /// @throws std::invalid_argument for a layer out of range; std::logic_error when it is
    ///         not acquired, or is released as updated after a read-only acquire()
    void release(std::size_t layer, layer_change change = layer_change::unchanged) {
        slot& s = slot_of(layer, "release");
        if (s.held == hold::none)
            throw std::logic_error("param_stream: release of layer " + std::to_string(layer) +
                                   ", which is not acquired");
        if (change == layer_change::updated && s.held != hold::update)
            throw std::logic_error("param_stream: release of layer " + std::to_string(layer) +
                                   " as updated, but it was acquired read-only (use "
                                   "acquire_for_update)");
        s.held = hold::none;
        --held_count_;
        if (change == layer_change::updated) s.state = slot_state::dirty;
        prefetch_quietly();
    }

    /// Finishes the I/O that completed and prefetches; never blocks. A trainer may call it
    /// between layers to keep the tier busy. Never throws a pending error.
    void poll() { prefetch_quietly(); }

    /// Issues the write-back of every dirty layer (except those acquired for update) and
    /// waits for every I/O in flight: afterwards the tier holds the newest contents of those
    /// layers (for a checkpoint, or before a destructor that keeps the blobs).
    /// @throws the pending error of an earlier failed write, or the first error of these
    ///         writes (naming the layer, its key and the tier); the failed layers stay dirty
    void flush() {
        throw_pending();
        for (auto& s : slots_)
            if (s.state == slot_state::dirty && s.held != hold::update)
                issue_write(s, write_kind::write_back);
        std::exception_ptr first;
        for (auto& s : slots_) {
            if (in_flight(s)) {
                auto err = finish(s, report::no);
                // (a failed read is the acquire's to report: the layer is simply not in memory)
                if (err && s.state == slot_state::dirty && !first) first = err;
            }
        }
        if (first) std::rethrow_exception(first);
    }

    // ---- Reporting -------------------------------------------------------------------

    /// The counters so far (see param_stream_stats).
    [[nodiscard]] param_stream_stats stats() const {
        param_stream_stats s = stats_;
        s.resident_bytes = resident_.load(std::memory_order_relaxed);
        s.peak_resident_bytes = peak_.load(std::memory_order_relaxed);
        s.memory_budget = opt_.memory_budget;
        return s;
    }
    /// Resident parameter bytes now (charged); safe to read from any thread.
    [[nodiscard]] std::size_t resident_bytes() const noexcept {
        return resident_.load(std::memory_order_relaxed);
    }
    /// Starts the peak over from the resident bytes now.
    void reset_peak() noexcept {
        peak_.store(resident_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
    /// True when `layer`'s bytes are in memory (held, resident, or being read or written).
    [[nodiscard]] bool in_memory(std::size_t layer) const {
        return slot_of(layer, "in_memory").state != slot_state::absent;
    }
    /// True when `layer`'s newest bytes are in memory only (updated or stored, and their
    /// write not yet completed).
    [[nodiscard]] bool dirty(std::size_t layer) const {
        const auto st = slot_of(layer, "dirty").state;
        return st == slot_state::dirty || st == slot_state::writing;
    }
    /// The options the stream was built with.
    [[nodiscard]] const param_stream_options& options() const noexcept { return opt_; }

private:
    enum class slot_state {
        absent,   // no buffer; the contents (if stored) are on the tier
        reading,  // buffer, read in flight
        clean,    // buffer equal to the tier's blob
        dirty,    // buffer newer than the tier's blob, no write in flight
        writing,  // buffer newer than the tier's blob, write in flight
    };
    enum class hold { none, read, update };
    enum class write_kind { store, write_back };
    enum class report { pending, no };

    struct slot {
        std::size_t nbytes = 0;
        std::size_t charge = 0;
        std::string key;
        aligned_buffer buffer;  // charged while state != absent
        io_completion io;       // the read or write in flight
        slot_state state = slot_state::absent;
        hold held = hold::none;
        write_kind kind = write_kind::store;  // of the write in flight, for messages
        bool stored = false;                  // has contents (in memory or on the tier)
        bool on_tier = false;                 // a blob of the stream is on the tier
        bool progress_counted = false;        // counted in progress()
        bool fresh = false;                   // read issued, not yet consumed by an acquire
        bool fresh_by_prefetch = false;
        bool write_failed = false;  // the last write-back failed: prefetch does not retry it
        std::uint64_t issued = 0;   // sequence number of the I/O in flight
        std::exception_ptr read_error;
    };
    struct spare {
        std::size_t charge;
        aligned_buffer buffer;
    };

    slot& slot_of(std::size_t layer, const char* what) {
        if (layer >= slots_.size())
            throw std::invalid_argument("param_stream: " + std::string(what) + " of layer " +
                                        std::to_string(layer) + ", but there are " +
                                        std::to_string(slots_.size()) + " layers");
        return slots_[layer];
    }
    const slot& slot_of(std::size_t layer, const char* what) const {
        return const_cast<param_stream*>(this)->slot_of(layer, what);
    }
    std::size_t index_of(const slot& s) const {
        return static_cast<std::size_t>(&s - slots_.data());
    }
    std::string tier_name() const { return std::string(tier_.name()); }
    std::string context(const slot& s, const char* what) const {
        return "param_stream: " + std::string(what) + " of layer " + std::to_string(index_of(s)) +
               " (key " + quoted(std::string_view(s.key)) + ", " + bytes_str(s.nbytes) + ") " +
               (std::strcmp(what, "read") == 0 ? "from" : "to") + " tier " + quoted(tier_name());
    }

    // Finishes the I/O that completed, then throws the first unreported write failure.
    void throw_pending() {
        poll_completions();
        if (pending_) std::rethrow_exception(std::exchange(pending_, nullptr));
    }

    // ---- the budget ----
    std::size_t room() const noexcept {
        return opt_.memory_budget - resident_.load(std::memory_order_relaxed) + spare_bytes_;
    }
    void account(std::size_t charge) {
        const std::size_t now = resident_.load(std::memory_order_relaxed);
        if (now + charge > opt_.memory_budget)  // the guarantee, checked in every build
            throw std::logic_error("param_stream: internal error: a buffer of " +
                                   bytes_str(charge) + " would take resident bytes to " +
                                   bytes_str(now + charge) + ", over the budget of " +
                                   bytes_str(opt_.memory_budget));
        resident_.store(now + charge, std::memory_order_relaxed);
        if (now + charge > peak_.load(std::memory_order_relaxed))
            peak_.store(now + charge, std::memory_order_relaxed);
    }
    void uncount(std::size_t charge) noexcept {
        resident_.store(resident_.load(std::memory_order_relaxed) - charge,
                        std::memory_order_relaxed);
    }
    // Gives `s` a buffer; room() >= s.charge must hold. A free buffer of the same charge is
    // reused; otherwise free buffers are dropped until a new one fits.
    void take_buffer(slot& s) {
        for (auto it = spares_.begin(); it != spares_.end(); ++it) {
            if (it->charge == s.charge && it->buffer.capacity() >= s.nbytes) {
                s.buffer = std::move(it->buffer);
                spare_bytes_ -= it->charge;
                spares_.erase(it);
                return;
            }
        }
        while (opt_.memory_budget - resident_.load(std::memory_order_relaxed) < s.charge &&
               !spares_.empty()) {
            const std::size_t c = spares_.back().charge;
            spares_.pop_back();  // frees it
            spare_bytes_ -= c;
            uncount(c);
        }
        account(s.charge);
        try {
            s.buffer = aligned_buffer(s.nbytes, opt_.lock, default_alignment,
                                      buffer_fill::uninitialized, opt_.pages);
        } catch (...) {
            uncount(s.charge);
            throw;
        }
    }
    // The layer leaves memory; its buffer is kept (charged) for reuse.
    void give_up_buffer(slot& s) {
        spares_.push_back({s.charge, std::move(s.buffer)});
        spare_bytes_ += s.charge;
        s.buffer = aligned_buffer{};
        s.state = slot_state::absent;
        s.fresh = false;
    }
    void evict(slot& s) {
        give_up_buffer(s);
        ++stats_.evictions;
    }

    // ---- I/O ----
    void issue_read(slot& s, bool by_prefetch) {
        s.state = slot_state::reading;
        s.fresh = true;
        s.fresh_by_prefetch = by_prefetch;
        s.issued = ++sequence_;
        try {
            s.io = tier_.read(s.key, std::span<std::byte>(s.buffer.data(), s.nbytes));
        } catch (...) {
            s.io = io_completion::failed(std::current_exception());
        }
    }
    void issue_write(slot& s, write_kind kind) {
        s.state = slot_state::writing;
        s.kind = kind;
        s.issued = ++sequence_;
        try {
            s.io = tier_.write(s.key, std::span<const std::byte>(s.buffer.data(), s.nbytes));
        } catch (...) {
            s.io = io_completion::failed(std::current_exception());
        }
    }
    // Waits for the I/O of `s` (reading or writing) and applies its outcome. Returns the
    // error (with context) or null; a failed write also becomes the pending error unless
    // `rep` is report::no.
    std::exception_ptr finish(slot& s, report rep) {
        std::exception_ptr err;
        const bool reading = s.state == slot_state::reading;
        try {
            s.io.wait();
        } catch (...) {
            err = with_context(
                std::current_exception(),
                context(s,
                        reading ? "read" : (s.kind == write_kind::store ? "store" : "write-back")));
        }
        if (reading) {
            if (!err) {
                s.state = slot_state::clean;
                ++stats_.reads;
                stats_.bytes_read += s.nbytes;
            } else {
                give_up_buffer(s);
                s.read_error = err;
                ++stats_.failed_reads;
            }
        } else {
            if (!err) {
                s.state = slot_state::clean;
                s.on_tier = true;
                s.write_failed = false;
                ++stats_.writes;
                stats_.bytes_written += s.nbytes;
                if (!s.progress_counted) {
                    s.progress_counted = true;
                    ++layers_stored_;
                    bytes_stored_ += s.nbytes;
                }
            } else {
                s.state = slot_state::dirty;  // the bytes stay; nothing is lost
                s.write_failed = true;
                ++stats_.failed_writes;
                if (rep == report::pending && !pending_) pending_ = err;
            }
        }
        return err;
    }
    static bool in_flight(const slot& s) noexcept {
        return s.state == slot_state::reading || s.state == slot_state::writing;
    }
    void poll_completions() {
        for (auto& s : slots_)
            if (in_flight(s) && s.io.ready()) (void)finish(s, report::pending);
    }
    // Waits for `s`'s I/O as part of a call that needs it; a failed write is thrown (it is
    // the call's own error, not a pending one).
    void finish_or_throw(slot& s) {
        if (auto err = finish(s, report::no)) {
            if (s.state == slot_state::dirty) std::rethrow_exception(err);
        }
    }

    // ---- making room ----
    // For an acquire: Belady's rule over every layer not held (the acquired one is needed
    // now): evict the one visited furthest ahead; write it first if dirty, wait for it if
    // in flight. Returns true when it blocked.
    bool make_room_for_acquire(std::size_t charge) {
        bool blocked = false;
        for (;;) {
            poll_completions();
            if (room() >= charge) return blocked;
            slot* victim = nullptr;
            for (auto& v : slots_) {
                if (v.held != hold::none || v.state == slot_state::absent) continue;
                if (!victim || order_.distance(index_of(v)) > order_.distance(index_of(*victim)))
                    victim = &v;
            }
            if (!victim)
                throw std::logic_error(
                    "param_stream: internal error: no room and nothing to evict");
            switch (victim->state) {
                case slot_state::clean:
                    evict(*victim);
                    break;
                case slot_state::dirty:
                    issue_write(*victim, write_kind::write_back);
                    [[fallthrough]];
                case slot_state::reading:
                case slot_state::writing:
                    blocked = true;
                    finish_or_throw(*victim);
                    break;
                case slot_state::absent:
                    break;
            }
        }
    }
    // For a store: never wait while something can go at once: clean layers first (furthest
    // visit first), then write-backs of dirty ones, then wait for the oldest I/O in flight,
    // so that the writes of consecutive stores overlap.
    void make_room_for_store(std::size_t charge) {
        for (;;) {
            poll_completions();
            if (room() >= charge) return;
            slot* clean = nullptr;
            slot* dirty = nullptr;
            slot* oldest = nullptr;
            for (auto& v : slots_) {
                if (v.held != hold::none) continue;
                const auto d = order_.distance(index_of(v));
                if (v.state == slot_state::clean &&
                    (!clean || d > order_.distance(index_of(*clean))))
                    clean = &v;
                if (v.state == slot_state::dirty &&
                    (!dirty || d > order_.distance(index_of(*dirty))))
                    dirty = &v;
                if (in_flight(v) && (!oldest || v.issued < oldest->issued)) oldest = &v;
            }
            if (clean) {
                evict(*clean);
            } else if (dirty) {
                issue_write(*dirty, write_kind::write_back);
            } else if (oldest) {
                finish_or_throw(*oldest);
            } else {
                throw std::logic_error(
                    "param_stream: internal error: no room and nothing to evict");
            }
        }
    }

    // ---- prefetch ----
    void prefetch() {
        poll_completions();
        if (opt_.prefetch_depth == 0) return;
        std::vector<char> seen(slots_.size(), 0);
        std::size_t looked = 0;
        for (std::size_t off = 1; off <= order_.period() && looked < opt_.prefetch_depth; ++off) {
            const std::size_t l = order_.layer_at(off);
            if (seen[l]) continue;
            seen[l] = 1;
            ++looked;
            slot& s = slots_[l];
            if (s.state != slot_state::absent || !s.stored || s.read_error) continue;
            if (room() < s.charge && !free_room_for(off, s.charge)) return;
            take_buffer(s);
            issue_read(s, true);
        }
    }
    // Prefetch after a call's own work is done: an error (an allocation that failed) is
    // kept for the next call that reports pending errors, so the call itself stands.
    void prefetch_quietly() noexcept {
        try {
            prefetch();
        } catch (...) {
            if (!pending_) pending_ = std::current_exception();
        }
    }
    // Makes room for a read of `charge` bytes for the visit `d` positions ahead from layers
    // visited later than that (never one needed sooner): evicts clean ones, issues the
    // write-back of dirty ones. True when the room is there now; false when it is not (yet:
    // writes issued now or before free it later).
    bool free_room_for(std::size_t d, std::size_t charge) {
        std::vector<slot*> later;
        for (auto& v : slots_) {
            if (v.held != hold::none || order_.distance(index_of(v)) <= d) continue;
            if (v.state == slot_state::clean || v.state == slot_state::writing ||
                (v.state == slot_state::dirty && !v.write_failed))
                later.push_back(&v);
        }
        std::sort(later.begin(), later.end(), [&](const slot* a, const slot* b) {
            return order_.distance(index_of(*a)) > order_.distance(index_of(*b));
        });
        const std::size_t need = charge - room();
        std::size_t found = 0;
        std::size_t chosen = 0;
        while (chosen < later.size() && found < need) found += later[chosen++]->charge;
        if (found < need) return false;  // not even then: stop prefetching
        for (std::size_t i = 0; i < chosen; ++i)
            if (later[i]->state == slot_state::dirty)
                issue_write(*later[i], write_kind::write_back);
        poll_completions();  // a synchronous tier has finished them
        for (std::size_t i = 0; i < chosen; ++i)
            if (later[i]->state == slot_state::clean) evict(*later[i]);
        return room() >= charge;
    }

    layer_update_view acquire_impl(std::size_t layer, hold mode, const char* what) {
        slot& s = slot_of(layer, what);
        if (s.held != hold::none)
            throw std::logic_error("param_stream: " + std::string(what) + " of layer " +
                                   std::to_string(layer) +
                                   ", which is already acquired (release it first)");
        if (held_count_ >= opt_.held_layers)
            throw std::logic_error(
                "param_stream: " + std::string(what) + " of layer " + std::to_string(layer) +
                " would hold " + std::to_string(held_count_ + 1) +
                " layers at once, but held_layers is " + std::to_string(opt_.held_layers));
        if (!s.stored)
            throw std::logic_error("param_stream: " + std::string(what) + " of layer " +
                                   std::to_string(layer) +
                                   ", which has no contents yet (store() or fill() it first)");
        throw_pending();
        order_.visit(layer);
        const auto t0 = clock::now();
        bool waited = false;
        bool demand = false;
        poll_completions();
        if (s.state == slot_state::reading) {
            waited = true;
            (void)finish(s, report::no);
        }
        if (s.state == slot_state::absent) {
            if (s.read_error) std::rethrow_exception(std::exchange(s.read_error, nullptr));
            waited = make_room_for_acquire(s.charge) || waited;
            take_buffer(s);
            issue_read(s, false);
            demand = waited = true;
            (void)finish(s, report::no);
            if (s.state == slot_state::absent)
                std::rethrow_exception(std::exchange(s.read_error, nullptr));
        }
        if (mode == hold::update && s.state == slot_state::writing) {
            waited = true;
            finish_or_throw(s);
        }
        if (demand)
            ++stats_.demand_reads;
        else if (s.fresh && s.fresh_by_prefetch)
            ++stats_.served_prefetched;
        else
            ++stats_.served_resident;
        s.fresh = false;
        s.held = mode;
        ++held_count_;
        ++stats_.acquires;
        if (waited) {
            ++stats_.waits;
            stats_.wait_seconds += std::chrono::duration<double>(clock::now() - t0).count();
        }
        prefetch_quietly();
        return layer_update_view(layer, std::span<std::byte>(s.buffer.data(), s.nbytes));
    }

    Tier& tier_;
    param_stream_options opt_;
    detail::visit_order order_;
    std::vector<slot> slots_;
    std::vector<spare> spares_;
    std::size_t spare_bytes_ = 0;
    std::size_t held_count_ = 0;
    std::size_t total_bytes_ = 0;
    std::size_t layers_stored_ = 0;
    std::size_t bytes_stored_ = 0;
    std::uint64_t sequence_ = 0;
    std::exception_ptr pending_;
    param_stream_stats stats_;
    std::atomic<std::size_t> resident_{0};
    std::atomic<std::size_t> peak_{0};
};

}  // namespace spillway
