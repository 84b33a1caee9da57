/// @file
/// spillway/stash/activation_stash.hpp: offload the tensors a trainer saves in forward for
/// backward to any storage_tier, and bring them back in reverse order before backward needs
/// them (TBA / SSDTrain as a primitive).
///
/// What it guarantees:
/// - Round trips are exact: load() gives back the bytes save() was handed, or throws an error
///   naming the tensor; it never returns wrong or partial data.
/// - Deduplication: saving a tensor whose identity (tensor_desc.hpp: storage id, version,
///   dtype, shape, strides, offset) equals a live one stores it once and counts a reference.
///   A transpose (other strides) is another tensor. Raw addresses are never a key.
/// - Forwarding: a tensor still in memory when backward (or prefetch) asks for it, because its
///   write is queued or in flight, is served from memory without a read; a write that has not
///   started by then is skipped.
/// - Adaptive keep: tensors under keep_below_bytes stay in memory; the layers at the end of
///   forward whose I/O cannot be hidden stay in memory (split chosen by TBA's rule from a
///   profiling step, split_rule.hpp, or set by the user); memory_budget caps resident bytes
///   and is never exceeded (save waits for writes to finish, or writes synchronously).
/// - Prefetch: in backward, reads are issued in reverse order of saving, at least
///   prefetch_layers offloading layers ahead of the layer backward is in.
/// - Compute never blocks on a write, except when the memory budget leaves no room.
/// - All public member functions are thread-safe.
///
/// Memory ownership. The stash owns the resident copy of every tensor it holds, so that a
/// tensor really leaves memory once its write completed:
/// - save(desc, bytes) copies the caller's bytes into a stash-owned buffer (taken from the
///   stash's pool when one of that size is free); the caller may reuse or free its buffer as
///   soon as save() returns.
/// - save(desc, aligned_buffer&&) adopts a buffer the trainer hands over (no copy); get such
///   buffers from allocate() to reuse the stash's pool.
/// - save_and_exchange(desc, buffer) adopts it too and leaves in `buffer` a free buffer of the
///   same size from the pool (one a completed write freed while the save waited for room is
///   handed back instead of freed), so a trainer computes each layer into the memory of the
///   layer written before it; the buffer handed back is no longer counted as resident.
/// Resident bytes are the capacities of every buffer the stash holds (tensors, reads in
/// flight and its free pool); the budget and peak_resident_bytes count exactly these.
///
/// The life cycle of a tensor:
///  1. save(): the trainer describes the tensor and hands over its bytes. A live tensor of the
///     same identity gains a reference (bytes_deduplicated) and its handle is returned.
///     Otherwise the stash takes room under the budget (waiting for writes, or writing this
///     tensor synchronously when nothing can make room), copies or adopts the bytes, and
///     decides: keep (small, or in a kept layer) or offload (queue a write). The profiling
///     step of the adaptive split offloads every tensor above the threshold, so that it needs
///     no more memory than offloading does.
///  2. A writer thread writes the queued tensor to the tier under a key
///     "<key_prefix>-<stash serial>-<n>": the key of a released tensor's blob when one is
///     retired (step 6; one of the same size first), so that the write rewrites that blob
///     instead of the tier creating one and deleting another per tensor; a new key otherwise.
///     When the write completes, the resident buffer is
///     freed (returned to the pool), unless backward already took the tensor or it lies in the
///     prefetch window, in which case it stays resident (forwarded).
///  3. Backward begins with start_backward() or the first load(). On the profiling step the
///     split is planned now (forward time measured; tier bandwidth given or probed). Later
///     adaptive steps re-plan when the next step begins, from the bandwidth the tier
///     delivered during the step that ended.
///  4. Prefetch: for the layer backward is in, every tensor of its own layer and of the
///     prefetch_layers offloading layers before it (kept layers need no reads and do not
///     count) is made resident, newest first: a queued write is cancelled (write skip), an
///     offloaded tensor is read by a reader thread when the budget has room (otherwise later,
///     when room is freed). Beyond that window prefetch goes on reading while the bytes held
///     stay within the high-water mark the step already reached, so it never lifts the peak.
///  5. load(handle) returns a view of the resident bytes, waiting for a read in flight or
///     issuing one (load_wait_seconds); the view stays valid until the handle is released.
///  6. release(handle) drops the handle's reference; with the last one the buffer is freed, a
///     queued write is skipped, and the tier blob is retired once any I/O in flight on it
///     ends: it stays on the tier for a later write to rewrite (step 2). Retired blobs are at
///     most as many as the stash ever had on the tier at once; flush(), reset() and the
///     destructor erase them (on the writer thread), so afterwards the tier holds exactly
///     the blobs of live tensors. A key is reused only after every I/O on it ended, and never
///     once its erase was issued.
///  7. A save() or begin_layer() after backward began starts the next step.
/// Errors: a failed write is reported by the next save(), begin_layer() or flush() (once)
/// and by every load() of that tensor (unless backward already held it: its resident copy
/// is exact and stays); a failed read is reported by the load() that needed it
/// (a later load() retries). Both are std::system_error (the tier's errno) or
/// std::runtime_error naming the tensor and the tier. Misuse of a handle (empty, moved-from,
/// released, of another stash) is std::invalid_argument naming the tensor.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/buffer_arena.hpp"
#include "spillway/stash/split_rule.hpp"
#include "spillway/stash/tensor_desc.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway {

/// How the stash chooses which layers stay in memory. In every mode tensors under
/// stash_options::keep_below_bytes stay in memory, and the memory budget may still force
/// writes of kept tensors (stash_stats::forced_writes).
enum class split_mode {
    /// The first step (and the one after replan()) profiles: it offloads every tensor at or
    /// above keep_below_bytes while recording layer start times and bytes; when its backward
    /// begins, tba_split() picks the first kept layer from the tier's bandwidth. Later steps
    /// re-plan from the bandwidth the tier delivered (see stash_options::tier_bandwidth).
    adaptive,
    /// Layers at forward positions from stash_options::first_kept_layer on are kept, those
    /// before it offloaded; no profiling, no probe.
    fixed,
    /// Every tensor at or above keep_below_bytes is offloaded, whatever its layer.
    offload_all,
    /// Nothing is offloaded unless the budget forces it: the baseline, or a switch to turn
    /// offloading off without changing the trainer.
    keep_all,
};

/// How an activation_stash behaves; fixed at construction (options() returns it).
/// Byte quantities are bytes, bandwidths bytes per second.
struct stash_options {
    /// Tensors of fewer bytes (extent_bytes()) stay in memory in every mode and never count
    /// in a layer's offloadable bytes (TBA keeps tensors under 8 Mi elements). Default 1 MiB.
    std::size_t keep_below_bytes = std::size_t{1} << 20;
    /// Most resident bytes at any time (see "Memory ownership"; the pool and reads in flight
    /// count); never exceeded. When nothing can make room, save() writes synchronously and
    /// load() throws std::length_error. Unbounded by default.
    std::size_t memory_budget = std::numeric_limits<std::size_t>::max();
    /// Which layers stay in memory (split_mode); adaptive by default.
    split_mode split = split_mode::adaptive;
    /// split_mode::fixed: forward position of the first layer kept (layers are numbered in
    /// the order they first appear in a step); SIZE_MAX keeps no layer.
    std::size_t first_kept_layer = std::numeric_limits<std::size_t>::max();
    /// Tier bandwidth in bytes per second for the adaptive rule. 0: measured with a probe
    /// blob of probe_bytes written and read back (best of three rounds, the slower
    /// direction) when the profiling step ends, then re-measured at every backward from what
    /// the tier delivered (its stats(): bytes over busy seconds), so the split follows a tier
    /// that slows down or speeds up. A stated bandwidth is used as is.
    /// Only split_mode::adaptive reads it; a negative value is std::invalid_argument at
    /// construction.
    double tier_bandwidth = 0;
    /// Size in bytes of the probe blob written and read back when tier_bandwidth is 0. Its
    /// buffer counts against memory_budget: at most the room the budget has left when the
    /// probe runs is used (whole 4 KiB blocks; at least 4 KiB). The probe runs when a
    /// profiling step's backward begins, under the key "<key_prefix>-<stash serial>-probe",
    /// erased afterwards, also when it failed; a failed probe throws the tier's error naming
    /// the tier and the probe size. Default 16 MiB.
    std::size_t probe_bytes = std::size_t{16} << 20;
    /// Offloading layers ahead of the current backward layer that prefetch always brings
    /// back (more when memory the step already used is free; see step 4).
    std::size_t prefetch_layers = 2;
    /// Writer threads (>= 1, else std::invalid_argument at construction); each runs one
    /// tier write (or blob erase) at a time, so this bounds the writes in flight.
    std::size_t write_threads = 1;
    /// Reader threads (>= 1, else std::invalid_argument at construction); each runs one
    /// tier read at a time, so this bounds the prefetch and load reads in flight.
    std::size_t read_threads = 1;
    /// Free buffers are kept for reuse (counted as resident) up to pool_limit bytes, and
    /// beyond that while resident bytes stay within the most the stash held in this step or
    /// the last: the pool never lifts the peak by more than pool_limit.
    std::size_t pool_limit = std::size_t{64} << 20;
    /// Buffers of less than 2 MiB that the stash allocates (allocate(), and the buffers loads
    /// read into) are carved from huge-page slabs shared by many tensors (buffer_arena), so
    /// that the disk moves them as it moves large buffers; false: each from malloc. The
    /// budget and the resident counts are buffer capacities; the memory the arena holds
    /// beyond them (free pieces of partly used slabs) is stash_stats::arena_slack_bytes.
    bool huge_page_arena = true;
    /// First part of every tier key ("<key_prefix>-<stash serial>-<n>"); must pass
    /// validate_key (std::invalid_argument naming it at construction). Each stash in a
    /// process has its own serial, so stashes sharing a tier and a prefix never collide;
    /// stashes of different processes sharing a tier need different prefixes.
    std::string key_prefix = "act";
};

/// What an activation_stash did, as returned by activation_stash::stats(): a consistent
/// snapshot taken under the stash's lock. Counters are cumulative since construction (reset()
/// does not clear them); resident_bytes and pooled_bytes are the state at the snapshot.
struct stash_stats {
    std::uint64_t saves = 0;               ///< save() calls that returned a handle (duplicates included).
    std::uint64_t tensors = 0;             ///< Distinct tensors stored (saves that were not deduplicated).
    std::uint64_t bytes_saved = 0;         ///< Bytes handed to save(), duplicates included.
    std::uint64_t bytes_deduplicated = 0;  ///< Of bytes_saved, those of saves that hit a live tensor (stored once).
    std::uint64_t bytes_kept = 0;          ///< Distinct bytes kept in memory when saved (small or in a kept layer).
    std::uint64_t bytes_offloaded = 0;     ///< Bytes written to the tier by completed writes (synchronous ones included).
    std::uint64_t bytes_forwarded = 0;     ///< Bytes meant for offload but served from memory without a read (once per tensor).
    std::uint64_t bytes_loaded = 0;        ///< Bytes read back from the tier by completed reads.
    std::uint64_t write_skips = 0;         ///< Queued writes cancelled: backward took the tensor, or it was released.
    std::uint64_t forced_writes = 0;       ///< Writes the budget forced: synchronous saves, or writes of kept tensors.
    std::uint64_t failed_writes = 0;       ///< Tier writes that threw (who reports them: see "Errors").
    std::uint64_t failed_reads = 0;        ///< Tier reads that threw (reported by the load() that needed them).
    std::size_t resident_bytes = 0;        ///< Now: capacities of buffers held by tensors and reads, plus the pool.
    std::size_t pooled_bytes = 0;          ///< Now: capacities of free buffers kept for reuse (part of resident_bytes).
    std::size_t peak_resident_bytes = 0;   ///< Most resident_bytes since construction or reset_peak().
    double load_wait_seconds = 0;          ///< Seconds load() blocked waiting for bytes, summed over calls and threads.
    double budget_wait_seconds = 0;        ///< Seconds save() and load() blocked waiting for room under the budget.
    std::size_t arena_slack_bytes = 0;     ///< Now: memory the huge-page arena holds beyond its live buffers' capacities.
};

/// The split the stash uses, and what it was planned from (activation_stash::plan()).
struct split_plan {
    /// True once split_mode::adaptive planned a split (the profiling step's backward began);
    /// false before, after replan() until the next plan, and always in the other modes.
    bool planned = false;
    /// Forward position of the first layer kept in memory; every layer from it on is kept.
    /// SIZE_MAX when no layer is kept (also when every layer can be offloaded). In
    /// split_mode::fixed it is stash_options::first_kept_layer.
    std::size_t first_kept_layer = std::numeric_limits<std::size_t>::max();
    /// Bytes per second the rule was applied with: stated, probed, or delivered by the tier
    /// in the last step (0 before the first plan).
    double tier_bandwidth = 0;
    /// Forward time in seconds the rule was applied with: the profiling step's, then the
    /// previous step's at each re-plan (0 before the first plan).
    double forward_seconds = 0;
    /// The layers the rule saw, in forward order (empty before the first plan).
    std::vector<layer_profile> layers;
};

template <storage_tier Tier>
class activation_stash;

/// A move-only reference to one saved tensor. Obtained from save(); give it back to
/// release(). It names its tensor so that misuse errors can say which one. It does not
/// release on destruction (it holds no pointer to its stash): a handle dropped or assigned
/// over while live keeps its tensor until reset() or the stash's destruction.
class stash_handle {
public:
    /// An empty handle: valid() is false and every stash call with it throws
    /// std::invalid_argument.
    stash_handle() = default;
    /// Takes over `o`'s reference; `o` becomes moved-from (using it with the stash throws
    /// std::invalid_argument saying so), unless it was empty.
    stash_handle(stash_handle&& o) noexcept
        : owner_(o.owner_), id_(o.id_), nbytes_(o.nbytes_), label_(o.label_), state_(o.state_) {
        if (o.state_ != state::empty) o.state_ = state::moved_from;
    }
    /// Takes over `o`'s reference as the move constructor does. A live reference this
    /// handle held is not released: its tensor stays until reset() or the stash's
    /// destruction, so release() before assigning over a live handle.
    stash_handle& operator=(stash_handle&& o) noexcept {
        if (this != &o) {
            owner_ = o.owner_;
            id_ = o.id_;
            nbytes_ = o.nbytes_;
            label_ = o.label_;
            state_ = o.state_;
            if (o.state_ != state::empty) o.state_ = state::moved_from;
        }
        return *this;
    }
    stash_handle(const stash_handle&) = delete;
    stash_handle& operator=(const stash_handle&) = delete;

    /// True while the handle refers to a tensor it has not released.
    [[nodiscard]] bool valid() const noexcept { return state_ == state::live; }
    /// The tensor's size in bytes (extent_bytes() of its description); 0 for an empty handle.
    /// Stays readable after release or move.
    [[nodiscard]] std::size_t nbytes() const noexcept { return nbytes_; }
    /// How messages name the tensor: describe() of the description it was first saved with
    /// (a deduplicated save shares it); "" for an empty handle.
    [[nodiscard]] std::string label() const { return label_ ? *label_ : std::string(); }

private:
    template <storage_tier>
    friend class activation_stash;
    enum class state { empty, live, released, moved_from };
    std::uint64_t owner_ = 0;  // serial of the stash that issued it
    std::uint64_t id_ = 0;     // handle id, unique within that stash
    std::size_t nbytes_ = 0;
    std::shared_ptr<const std::string> label_;
    state state_ = state::empty;
};

namespace detail {
inline std::atomic<std::uint64_t>& stash_serial_counter() {
    static std::atomic<std::uint64_t> counter{0};
    return counter;
}
/// Re-throwable copy of `error` with `context` in front of its message; keeps the errno.
inline std::exception_ptr with_context(std::exception_ptr error, const std::string& context) {
    try {
        std::rethrow_exception(error);
    } catch (const std::system_error& e) {
        return std::make_exception_ptr(spillway::with_context(e, context));
    } catch (const std::exception& e) {
        return std::make_exception_ptr(std::runtime_error(context + ": " + e.what()));
    } catch (...) {
        return std::make_exception_ptr(std::runtime_error(context + ": unknown error"));
    }
}
}  // namespace detail

/// Holds the tensors a trainer saves in forward for backward, offloading them to `Tier`
/// and prefetching them back in reverse order; see the file comment for its guarantees,
/// memory ownership, the life cycle of a tensor and how errors are reported. Not copyable
/// or movable. Every public member function is thread-safe (one internal mutex, never held
/// across tier I/O or copies).
/// @tparam Tier any storage_tier; the stash holds a reference to it.
template <storage_tier Tier>
class activation_stash {
public:
    /// The monotonic clock that times layers, forward and the waits in stash_stats.
    using clock = std::chrono::steady_clock;

    /// Holds a reference to `tier`, which must outlive the stash. Throws
    /// std::invalid_argument for a bad key prefix or zero threads.
    explicit activation_stash(Tier& tier, stash_options options = {})
        : tier_(tier), opt_(std::move(options)), serial_(++detail::stash_serial_counter()) {
        validate_key(opt_.key_prefix, "activation_stash: key_prefix");
        expect_argument(opt_.key_prefix.size() <= 200,
                        "activation_stash: key_prefix " + quoted(opt_.key_prefix) + " is longer than 200 bytes (" +
                            std::to_string(opt_.key_prefix.size()) +
                            "): its keys \"<key_prefix>-<serial>-<n>\" must fit a tier's 255-byte limit");
        expect_argument(opt_.write_threads >= 1 && opt_.read_threads >= 1,
                        "activation_stash: write_threads and read_threads must be at least 1, got " +
                            std::to_string(opt_.write_threads) + " and " + std::to_string(opt_.read_threads) +
                            " (a stash never moves data on the compute thread)");
        if (opt_.split == split_mode::fixed) first_kept_ = opt_.first_kept_layer;
        if (opt_.split == split_mode::adaptive && opt_.tier_bandwidth < 0)
            throw std::invalid_argument("activation_stash: tier_bandwidth must be >= 0 (0 measures it)");
        writer_.emplace(opt_.write_threads, "spw-stash-write");
        reader_.emplace(opt_.read_threads, "spw-stash-read");
    }
    activation_stash(const activation_stash&) = delete;
    activation_stash& operator=(const activation_stash&) = delete;

    /// Skips queued writes, waits for the I/O in flight, erases this stash's tier blobs.
    /// Handles still live become dangling (any use is undefined).
    ~activation_stash() {
        {
            std::lock_guard lock(mutex_);
            shutting_down_ = true;
        }
        reader_.reset();
        writer_.reset();
        for (auto& [id, e] : entries_)
            if (e->on_tier) erase_blob(e->key);
        for (auto& [size, key] : retired_keys_) erase_blob(key);
    }

    // ---- forward ----------------------------------------------------------------------

    /// Opens the layer scope `layer` (an id of the trainer's choosing); saves without an
    /// explicit scope belong to it. Scopes nest; end_layer() closes the innermost.
    void begin_layer(std::uint32_t layer) {
        std::lock_guard lock(mutex_);
        throw_pending();
        enter_forward();
        scopes_.push_back(layer);
        position_of(layer);
    }
    /// Closes the innermost layer scope opened by begin_layer(); does nothing when none is
    /// open. Never throws and never reports pending errors.
    void end_layer() {
        std::lock_guard lock(mutex_);
        if (!scopes_.empty()) scopes_.pop_back();
    }

    /// Saves a copy of `bytes` (exactly extent_bytes(desc) of them) and returns its handle.
    /// Throws std::invalid_argument for a malformed description or a size mismatch, the
    /// pending error of an earlier failed write, or the error of a synchronous write the
    /// budget forced (naming the tensor). Nothing is stored when it throws.
    [[nodiscard]] stash_handle save(const tensor_desc& desc, std::span<const std::byte> bytes) {
        return save_impl(desc, bytes, nullptr, nullptr);
    }
    /// Saves a buffer the trainer hands over (bytes().size() == extent_bytes(desc)); no copy.
    /// On an exception the buffer is left with the caller.
    [[nodiscard]] stash_handle save(const tensor_desc& desc, aligned_buffer&& buffer) {
        return save_impl(desc, buffer.bytes(), &buffer, nullptr);
    }
    /// Saves `buffer` as save(desc, aligned_buffer&&) does and leaves in it a free buffer of
    /// the same size() for the next tensor to be computed into (stale contents, no longer the
    /// stash's, as from allocate()), or an empty one when none is free. When the save waits
    /// for room under the budget, a buffer of that size that a completed write frees is
    /// handed back rather than freed, so a trainer that saves a layer while the one before
    /// is being written computes the next layer in that layer's buffers, without faulting in
    /// fresh memory. On an exception `buffer` is left with the caller unchanged.
    [[nodiscard]] stash_handle save_and_exchange(const tensor_desc& desc, aligned_buffer& buffer) {
        return save_impl(desc, buffer.bytes(), &buffer, &buffer);
    }

    /// A buffer of nbytes for the trainer to compute into and hand over with save(desc,
    /// aligned_buffer&&): taken from the stash's pool when one of that size is free (its
    /// contents are then stale), newly allocated (zeroed) otherwise.
    [[nodiscard]] aligned_buffer allocate(std::size_t nbytes) {
        {
            std::lock_guard lock(mutex_);
            if (auto b = take_pooled(nbytes)) {
                resident_ -= b->capacity();
                return std::move(*b);
            }
        }
        return new_buffer(nbytes, buffer_fill::zeroed);
    }

    // ---- backward ---------------------------------------------------------------------

    /// Marks the start of backward (optional: the first load() does it) so that prefetch of
    /// the last layers starts at once. Plans the split on the profiling step.
    void start_backward() {
        std::unique_lock lock(mutex_);
        enter_backward(lock);
        prefetch();
    }

    /// The tensor's bytes, resident; blocks while they are being read. The view stays valid
    /// until `handle` is released. Throws std::invalid_argument on a misused handle, the
    /// tier's error naming the tensor when its write or read failed, std::length_error when
    /// the budget is held entirely by loaded tensors not yet released.
    [[nodiscard]] std::span<const std::byte> load(const stash_handle& handle) {
        std::unique_lock lock(mutex_);
        (void)entry_of(handle, "load");  // a misused handle throws before anything starts
        enter_backward(lock);            // (may unlock: the probe)
        {
            entry& e = entry_of(handle, "load");
            if (e.step == step_ && e.position < backward_position_) backward_position_ = e.position;
        }
        prefetch();
        std::optional<clock::time_point> waited_since;
        for (;;) {
            // Looked up again after every wait: a reset() from another thread meanwhile drops
            // the entry, and the lookup then throws (unknown handle) instead of reading it.
            entry& e = entry_of(handle, "load");
            switch (e.state) {
                case entry_state::queued:
                    cancel_write(e);
                    [[fallthrough]];
                case entry_state::kept:
                case entry_state::fetched:
                case entry_state::writing:
                    if (e.buffer.data() || e.nbytes == 0) {
                        if (e.state == entry_state::writing) note_forwarded(e);
                        e.pinned = true;
                        if (waited_since) stats_.load_wait_seconds += seconds_since(*waited_since);
                        return {e.buffer.data(), e.nbytes};
                    }
                    break;  // a synchronous write without a resident copy: wait for it
                case entry_state::lost:
                    std::rethrow_exception(e.error);
                case entry_state::offloaded:
                    if (e.read_error) {
                        auto err = std::exchange(e.read_error, nullptr);
                        std::rethrow_exception(err);
                    }
                    if (pool_.contains(e.nbytes)) {  // a free buffer of its size: no room to make
                        start_read(e, reserved::no);
                        continue;
                    }
                    {
                        const std::size_t nbytes = e.nbytes;
                        const bool room = make_room(lock, charge_of(nbytes));  // (may wait)
                        entry& again = entry_of(handle, "load");
                        if (!room) {
                            if (again.state != entry_state::offloaded) continue;  // a prefetch read it meanwhile
                            throw std::length_error(
                                "activation_stash: loading " + again.label() + " (" + bytes_str(nbytes) +
                                ") would exceed the memory budget of " + bytes_str(opt_.memory_budget) +
                                (charge_of(nbytes) > opt_.memory_budget
                                     ? std::string(": the tensor alone is larger; raise the budget")
                                     : ": " + bytes_str(resident_) +
                                           " are held by loaded tensors not yet released; release tensors once "
                                           "backward used them, or raise the budget"));
                        }
                        account(charge_of(nbytes));
                        if (again.state == entry_state::offloaded) start_read(again, reserved::yes);
                        else resident_ -= charge_of(nbytes);  // someone else started it meanwhile
                    }
                    continue;
                case entry_state::reading:
                    break;
            }
            if (!waited_since) waited_since = clock::now();
            cv_.wait(lock);
        }
    }

    /// True when load(handle) would return without waiting for a read. Never blocks on I/O.
    [[nodiscard]] bool ready(const stash_handle& handle) const {
        std::lock_guard lock(mutex_);
        const entry& e = const_cast<activation_stash*>(this)->entry_of(handle, "ready");
        switch (e.state) {
            case entry_state::kept:
            case entry_state::queued:
            case entry_state::fetched:
            case entry_state::writing: return e.buffer.data() != nullptr || e.nbytes == 0;
            default: return false;
        }
    }

    /// Drops the handle's reference (the handle becomes released). The last reference frees
    /// the tensor: its buffer, any queued write, its tier blob (retired for a later write to
    /// rewrite, erased by flush(); see step 6). Throws std::invalid_argument
    /// on a misused handle (double release, moved-from, empty, another stash's).
    void release(stash_handle& handle) {
        std::unique_lock lock(mutex_);
        entry& e = entry_of(handle, "release");
        handles_.erase(handle.id_);
        handle.state_ = stash_handle::state::released;
        if (--e.refs == 0) drop(e);
        prefetch();
        cv_.notify_all();
    }

    // ---- whole-stash ------------------------------------------------------------------

    /// Waits for every write issued so far, then erases the blobs of released tensors kept
    /// for rewriting (step 6) and waits for every erase: afterwards the tier holds exactly the
    /// blobs of live tensors. Throws the first unreported write failure.
    void flush() {
        std::unique_lock lock(mutex_);
        wait_for_io_and_erase_retired(lock, io_scope::writes);
        throw_pending();
    }

    /// Releases every live handle (they become unknown to the stash), waits for the I/O in
    /// flight, erases the retired blobs and forgets any unreported error: the way back to a
    /// clean state after a failed step.
    void reset() {
        std::unique_lock lock(mutex_);
        std::vector<std::uint64_t> ids;
        for (auto& [h, id] : handles_) ids.push_back(id);
        handles_.clear();
        for (auto id : ids) {
            auto it = entries_.find(id);
            if (it != entries_.end() && --it->second->refs == 0) drop(*it->second);
        }
        wait_for_io_and_erase_retired(lock, io_scope::reads_and_writes);
        pending_error_ = nullptr;
        phase_ = phase::backward;  // the next save starts a new step
    }

    /// Makes the next step a profiling step again (adaptive mode): the split is re-planned.
    void replan() {
        std::lock_guard lock(mutex_);
        if (opt_.split == split_mode::adaptive) plan_.planned = false;
    }

    /// A snapshot of the counters and of the resident and pooled bytes now (stash_stats).
    /// Never blocks on I/O.
    [[nodiscard]] stash_stats stats() const {
        std::lock_guard lock(mutex_);
        stash_stats s = stats_;
        s.resident_bytes = resident_;
        s.pooled_bytes = pool_bytes_;
        s.arena_slack_bytes = arena_.slack_bytes();
        return s;
    }
    /// Frees every pooled buffer (gives the memory back: a piece of the huge-page arena goes
    /// back to it, which unmaps a slab with its last piece); returns the bytes freed.
    std::size_t trim() {
        std::lock_guard lock(mutex_);
        std::size_t freed = pool_bytes_;
        resident_ -= pool_bytes_;
        pool_bytes_ = 0;
        pool_.clear();
        return freed;
    }
    /// Restarts peak_resident_bytes from the current resident bytes.
    /// Also restarts the held high-water mark that lets the pool grow past pool_limit.
    void reset_peak() {
        std::lock_guard lock(mutex_);
        restart_high_water();
    }
    /// A copy of the split in use and what it was planned from (split_plan). Never blocks
    /// on I/O.
    [[nodiscard]] split_plan plan() const {
        std::lock_guard lock(mutex_);
        split_plan p = plan_;
        p.first_kept_layer = first_kept_;
        return p;
    }
    /// The options given at construction; they never change, so the reference needs no lock.
    [[nodiscard]] const stash_options& options() const noexcept { return opt_; }
    /// The tier the stash writes to. Blobs under the stash's keys belong to it: do not
    /// write or erase them through this reference while the stash lives.
    [[nodiscard]] Tier& tier() noexcept { return tier_; }

private:
    enum class entry_state {
        kept,       // resident, no write planned
        queued,     // resident, write queued
        writing,    // write in flight (resident unless written synchronously)
        offloaded,  // on the tier only
        reading,    // read in flight, its buffer charged
        fetched,    // resident and on the tier
        lost,       // the write failed: error holds why
    };
    enum class phase { forward, backward };
    enum class reserved { no, yes };

    struct entry {
        std::uint64_t id = 0;
        std::shared_ptr<const std::string> label_ptr;
        tensor_identity identity;
        std::string key;
        std::size_t nbytes = 0;
        std::size_t position = 0;  // layer position in forward order within its step
        std::uint64_t step = 0;
        entry_state state = entry_state::kept;
        aligned_buffer buffer;
        std::size_t refs = 0;
        bool pinned = false;     // loaded: stays resident until the last release
        bool on_tier = false;    // a completed write put it on the tier
        bool forwarded = false;  // counted in bytes_forwarded
        std::exception_ptr error;       // why the write failed
        std::exception_ptr read_error;  // the last failed read, for the next load()
        [[nodiscard]] const std::string& label() const { return *label_ptr; }
    };

    struct layer_record {
        std::uint32_t id = 0;
        layer_profile profile;
        bool offloads = false;  // some tensor of this layer was queued for a write
    };

    static double seconds_since(clock::time_point t) {
        return std::chrono::duration<double>(clock::now() - t).count();
    }
    static std::size_t charge_of(std::size_t nbytes) noexcept { return align_up(nbytes == 0 ? 1 : nbytes); }
    // A new buffer for bytes copied or read into it in full: zeroing it first would only
    // double the cost of faulting its pages in.
    aligned_buffer buffer_to_overwrite(std::size_t nbytes) { return new_buffer(nbytes, buffer_fill::uninitialized); }
    // Under 2 MiB from the huge-page arena (stash_options::huge_page_arena), else on its own.
    aligned_buffer new_buffer(std::size_t nbytes, buffer_fill fill) {
        if (opt_.huge_page_arena && charge_of(nbytes) < huge_page_bytes) return arena_.allocate(nbytes, fill);
        return aligned_buffer(nbytes, memory_lock::unlocked, default_alignment, fill);
    }

    // `exchange` (only with `adopt`, the same buffer) receives a free buffer of the same size.
    stash_handle save_impl(const tensor_desc& desc, std::span<const std::byte> bytes, aligned_buffer* adopt,
                           aligned_buffer* exchange) {
        const std::size_t nbytes = extent_bytes(desc);
        expect_argument(bytes.size() == nbytes, "activation_stash::save: " + describe(desc) + " addresses " +
                                                    bytes_str(nbytes) + " but the buffer handed over holds " +
                                                    bytes_str(bytes.size()));
        auto label = std::make_shared<const std::string>(describe(desc));
        auto identity = tensor_identity::of(desc);

        std::unique_lock lock(mutex_);
        throw_pending();
        enter_forward();
        const std::size_t position = position_of(desc.layer == current_layer
                                                     ? (scopes_.empty() ? 0u : scopes_.back())
                                                     : desc.layer);
        if (entry* hit = find_live(identity)) return add_reference(*hit, nbytes);

        if (nbytes == 0) {  // nothing to hold or write
            entry& e = new_entry(identity, label, 0, position);
            e.state = entry_state::kept;
            return make_handle(e);
        }
        const bool offload = decide_offload(nbytes, position);
        // 1. Room under the budget, 2. a resident copy, 3. the entry.
        aligned_buffer buffer;
        aligned_buffer swapped;  // the free buffer `exchange` receives
        std::size_t charge = 0;
        bool resident = true;
        if (adopt) {
            charge = adopt->capacity();
            resident = make_room(lock, charge, exchange ? &swapped : nullptr, nbytes);
            if (resident) account(charge);
        } else if (auto pooled = take_pooled(nbytes)) {
            buffer = std::move(*pooled);  // its bytes move from the pool to the tensor
            charge = buffer.capacity();
            note_peaks();
        } else {
            charge = charge_of(nbytes);
            resident = make_room(lock, charge);
            if (resident) account(charge);
        }
        if (!resident) {
            give_back(std::move(swapped));
            return save_synchronously(lock, desc, identity, label, bytes, adopt, position);
        }

        lock.unlock();
        if (adopt) {
            buffer = std::move(*adopt);
        } else {
            try {
                if (!buffer.data()) buffer = buffer_to_overwrite(nbytes);
            } catch (...) {
                lock.lock();
                resident_ -= charge;
                throw;
            }
            if (nbytes) std::memcpy(buffer.data(), bytes.data(), nbytes);
        }
        lock.lock();
        if (entry* hit = find_live(identity)) {  // another thread saved it meanwhile
            if (adopt) *adopt = std::move(buffer);
            else free_buffer(std::move(buffer));
            if (adopt) resident_ -= charge;
            give_back(std::move(swapped));
            return add_reference(*hit, nbytes);
        }
        entry& e = new_entry(identity, label, nbytes, position);
        e.buffer = std::move(buffer);
        if (exchange) *exchange = std::move(swapped);
        stats_.bytes_saved += nbytes;
        if (offload) {
            e.state = entry_state::queued;
            queue_write(e);
        } else {
            e.state = entry_state::kept;
            stats_.bytes_kept += nbytes;
        }
        return make_handle(e);
    }

    // Writes e's bytes to the tier with the stash's lock released. On return the lock is held
    // again, writes_pending_ is one lower, and a failure is recorded on e (its error names
    // the tensor) and returned.
    std::exception_ptr write_entry(std::unique_lock<std::mutex>& lock, entry& e, std::span<const std::byte> bytes) {
        e.key = take_key(e.nbytes);
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
            e.error = detail::with_context(error, write_context(e));
            erase_later(std::exchange(e.key, std::string()));  // it may hold a stale or torn blob
        }
        return error;
    }

    // The budget leaves no room even after every write finished: write the caller's bytes
    // from the compute thread (the one case where compute blocks on a write).
    stash_handle save_synchronously(std::unique_lock<std::mutex>& lock, const tensor_desc& desc,
                                    const tensor_identity& identity, std::shared_ptr<const std::string> label,
                                    std::span<const std::byte> bytes, aligned_buffer* adopt, std::size_t position) {
        (void)desc;
        entry& e = new_entry(identity, std::move(label), bytes.size(), position);
        e.state = entry_state::writing;
        ++stats_.forced_writes;
        ++writes_pending_;
        std::exception_ptr error = write_entry(lock, e, bytes);
        if (error) {
            e.state = entry_state::lost;
            --stats_.tensors;
            auto err = e.error;
            forget_identity(e);
            if (--e.refs == 0) entries_.erase(e.id);
            cv_.notify_all();
            std::rethrow_exception(err);
        }
        e.on_tier = true;
        e.state = entry_state::offloaded;
        stats_.bytes_saved += e.nbytes;
        stats_.bytes_offloaded += e.nbytes;
        if (adopt) {
            aligned_buffer done = std::move(*adopt);
            if (pool_bytes_ + done.capacity() <= opt_.pool_limit &&
                resident_ + done.capacity() <= opt_.memory_budget) {
                account(done.capacity());
                pool_bytes_ += done.capacity();
                std::size_t size = done.size();
                pool_.emplace(size, std::move(done));
            }
        }
        cv_.notify_all();
        return make_handle(e);
    }

    entry& new_entry(const tensor_identity& identity, std::shared_ptr<const std::string> label, std::size_t nbytes,
                     std::size_t position) {
        auto owned = std::make_unique<entry>();
        entry& e = *owned;
        e.id = ++next_entry_;
        e.label_ptr = std::move(label);
        e.identity = identity;
        e.nbytes = nbytes;
        e.position = position;
        e.step = step_;
        e.refs = 1;
        entries_.emplace(e.id, std::move(owned));
        dedup_[identity] = e.id;
        order_.push_back(e.id);
        if (nbytes >= opt_.keep_below_bytes && nbytes > 0 && position < layers_.size())
            layers_[position].profile.offload_bytes += nbytes;
        ++stats_.tensors;
        return e;
    }

    stash_handle add_reference(entry& e, std::size_t nbytes) {
        ++e.refs;
        stats_.bytes_saved += nbytes;
        stats_.bytes_deduplicated += nbytes;
        return make_handle(e);
    }

    stash_handle make_handle(entry& e) {
        stash_handle h;
        h.owner_ = serial_;
        h.id_ = ++next_handle_;
        h.nbytes_ = e.nbytes;
        h.label_ = e.label_ptr;
        h.state_ = stash_handle::state::live;
        handles_.emplace(h.id_, e.id);
        ++stats_.saves;
        return h;
    }

    entry* find_live(const tensor_identity& identity) {
        auto it = dedup_.find(identity);
        if (it == dedup_.end()) return nullptr;
        auto e = entries_.find(it->second);
        if (e == entries_.end() || e->second->refs == 0 || e->second->state == entry_state::lost) return nullptr;
        return e->second.get();
    }
    void forget_identity(const entry& e) {
        auto it = dedup_.find(e.identity);
        if (it != dedup_.end() && it->second == e.id) dedup_.erase(it);
    }

    entry& entry_of(const stash_handle& h, const char* op) {
        std::string who = std::string("activation_stash::") + op + ": ";
        std::string name = h.label_ ? *h.label_ : std::string("tensor");
        switch (h.state_) {
            case stash_handle::state::empty:
                throw std::invalid_argument(who + "empty handle (default-constructed; use the handle save() returned)");
            case stash_handle::state::moved_from:
                throw std::invalid_argument(who + "the handle of " + name +
                                            " was moved from; use the handle it was moved to");
            case stash_handle::state::released:
                throw std::invalid_argument(who + "the handle of " + name + " was already released");
            case stash_handle::state::live: break;
        }
        if (h.owner_ != serial_)
            throw std::invalid_argument(who + "the handle of " + name + " belongs to another activation_stash");
        auto it = handles_.find(h.id_);
        if (it == handles_.end())
            throw std::invalid_argument(who + "unknown handle of " + name + " (the stash was reset since it was saved)");
        return *entries_.at(it->second);
    }

    bool decide_offload(std::size_t nbytes, std::size_t position) const {
        if (nbytes == 0 || nbytes < opt_.keep_below_bytes) return false;
        switch (opt_.split) {
            case split_mode::keep_all: return false;
            case split_mode::offload_all: return true;
            case split_mode::adaptive:
                if (!plan_.planned) return true;  // the profiling step offloads everything
                return position < first_kept_;
            case split_mode::fixed: return position < first_kept_;
        }
        return false;
    }

    // ---- steps and layers ---------------------------------------------------------------

    void enter_forward() {
        if (phase_ == phase::backward) {
            if (opt_.split == split_mode::adaptive && plan_.planned && !after_profiling_ && opt_.tier_bandwidth == 0)
                replan_from_tier();
            phase_ = phase::forward;
            ++step_;
            layers_.clear();
            positions_.clear();
            order_.clear();
            cursor_ = 0;
            step_open_ = false;
            roll_high_water();
            if (after_profiling_) {
                // The profiling step held everything: that peak must not size the pool.
                after_profiling_ = false;
                std::size_t peak = stats_.peak_resident_bytes;
                restart_high_water();
                stats_.peak_resident_bytes = peak;
            }
        }
        if (!step_open_) {
            step_open_ = true;
            step_start_ = clock::now();
            if (opt_.split == split_mode::adaptive) forward_stats_ = tier_.stats();
            profiling_ = opt_.split == split_mode::adaptive && !plan_.planned;
        }
    }

    std::size_t position_of(std::uint32_t layer) {
        auto it = positions_.find(layer);
        if (it != positions_.end()) return it->second;
        std::size_t pos = layers_.size();
        layer_record r;
        r.id = layer;
        r.profile.start_seconds = seconds_since(step_start_);
        layers_.push_back(r);
        positions_.emplace(layer, pos);
        return pos;
    }

    void enter_backward(std::unique_lock<std::mutex>& lock) {
        if (phase_ == phase::backward) return;
        phase_ = phase::backward;
        backward_position_ = layers_.size();
        cursor_ = order_.size();
        if (profiling_ && !plan_.planned) {
            const double forward = step_open_ ? seconds_since(step_start_) : 0.0;  // before the probe
            apply_plan(opt_.tier_bandwidth > 0 ? opt_.tier_bandwidth : probe_bandwidth(lock), forward);
            after_profiling_ = true;
        }
        profiling_ = false;
        forward_seconds_ = step_open_ ? seconds_since(step_start_) : 0.0;
    }

    // Re-plans, as the next step begins, from the step that ended: its layers, its forward
    // time, and the bandwidth the tier delivered during it (bytes over busy seconds of its
    // writes and of its reads, the slower direction; whole step, so no operation is cut in
    // half). A slower tier is believed at once (waiting costs more than keeping); a faster
    // one half way per step.
    void replan_from_tier() {
        const double observed = delivered_bandwidth(forward_stats_);
        if (observed <= 0) return;  // nothing moved: nothing learned
        double bw = observed < plan_.tier_bandwidth ? observed : 0.5 * (plan_.tier_bandwidth + observed);
        apply_plan(bw, forward_seconds_);
    }

    // The bandwidth the tier delivered since `since`: bytes over busy seconds of its writes and
    // of its reads, the slower direction (0 when nothing moved).
    double delivered_bandwidth(const tier_stats& since) const {
        tier_stats now = tier_.stats();
        auto rate = [](std::uint64_t bytes, double busy) {
            return bytes > 0 && busy > 0 ? static_cast<double>(bytes) / busy : 0.0;
        };
        double w = rate(now.bytes_written - since.bytes_written, now.write_busy_seconds - since.write_busy_seconds);
        double r = rate(now.bytes_read - since.bytes_read, now.read_busy_seconds - since.read_busy_seconds);
        return w > 0 && r > 0 ? std::min(w, r) : std::max(w, r);
    }

    void apply_plan(double bandwidth, double forward_seconds) {
        split_plan p;
        p.forward_seconds = forward_seconds;
        for (auto& l : layers_) p.layers.push_back(l.profile);
        p.tier_bandwidth = bandwidth;
        first_kept_ = tba_split(p.layers, p.forward_seconds, p.tier_bandwidth);
        if (first_kept_ >= p.layers.size()) first_kept_ = std::numeric_limits<std::size_t>::max();
        p.first_kept_layer = first_kept_;
        p.planned = true;
        plan_ = std::move(p);
    }

    // Writes and reads back probe_bytes; the slower direction's bytes per second.
    double probe_bandwidth(std::unique_lock<std::mutex>& lock) {
        std::string key = opt_.key_prefix + "-" + std::to_string(serial_) + "-probe";
        // The probe's buffer counts against the budget like any other: at most the room left,
        // in whole 4 KiB blocks. Its first 4 KiB are made room for as any save's (make_room:
        // the pool, then writes finishing); a full budget once let the probe lift the resident
        // bytes 4 KiB above it. If nothing can free 4 KiB, the forward's own writes say what
        // the tier delivered.
        if (!make_room(lock, 4096)) return delivered_bandwidth(forward_stats_);
        const std::size_t room = opt_.memory_budget > resident_ ? opt_.memory_budget - resident_ : 0;
        const std::size_t n = std::max<std::size_t>(std::min(opt_.probe_bytes, room) / 4096 * 4096, 4096);
        resident_ += n;
        note_peaks();
        lock.unlock();
        double bw = 0;
        try {
            aligned_buffer buf(n);
            for (std::size_t i = 0; i < n; i += 4096) buf.data()[i] = std::byte{1};
            for (int round = 0; round < 3; ++round) {  // noise only slows a round: keep the best
                auto t0 = clock::now();
                tier_.write(key, buf.bytes()).wait();
                auto t1 = clock::now();
                tier_.read(key, buf.bytes()).wait();
                auto t2 = clock::now();
                double w = std::chrono::duration<double>(t1 - t0).count();
                double r = std::chrono::duration<double>(t2 - t1).count();
                bw = std::max(bw, static_cast<double>(n) / std::max({w, r, 1e-9}));
            }
            erase_blob(key);
        } catch (...) {
            erase_blob(key);  // (noexcept; the tier's error below says what failed)
            lock.lock();
            resident_ -= n;
            std::rethrow_exception(detail::with_context(
                std::current_exception(), "activation_stash: measuring the bandwidth of tier " +
                                              quoted(std::string(tier_.name())) + " with a probe of " + bytes_str(n) +
                                              " failed (set stash_options::tier_bandwidth to skip the probe)"));
        }
        lock.lock();
        resident_ -= n;
        return bw;
    }

    // ---- memory -----------------------------------------------------------------------

    // `charge` bytes of fresh memory. Pooled buffers that would lift resident bytes above
    // what the stash already needed (the high-water mark of held bytes) plus pool_limit are
    // given back first.
    void account(std::size_t charge) {
        auto allowed = [&] {  // resident bytes the pool may keep us at after this charge
            return std::max(held_peak_, resident_ - pool_bytes_ + charge + opt_.pool_limit);
        };
        while (!pool_.empty() && resident_ + charge > allowed()) {
            auto it = std::prev(pool_.end());
            pool_bytes_ -= it->second.capacity();
            resident_ -= it->second.capacity();
            pool_.erase(it);
        }
        resident_ += charge;
        note_peaks();
    }
    // The pool shrinks to pool_limit and the high-water marks restart from now.
    void restart_high_water() {
        while (!pool_.empty() && pool_bytes_ > opt_.pool_limit) {
            auto it = std::prev(pool_.end());
            pool_bytes_ -= it->second.capacity();
            resident_ -= it->second.capacity();
            pool_.erase(it);
        }
        held_peak_ = step_held_peak_ = resident_ - pool_bytes_;
        stats_.peak_resident_bytes = resident_;
    }
    // A new step: the high-water mark becomes the last step's (one bad step, a stalled
    // tier, must not keep its memory in the pool for ever), and the pool shrinks to it.
    void roll_high_water() {
        const std::size_t held = resident_ - pool_bytes_;
        held_peak_ = std::max(step_held_peak_, held);
        step_held_peak_ = held;
        while (!pool_.empty() && resident_ > std::max(held_peak_, held + opt_.pool_limit)) {
            auto it = std::prev(pool_.end());
            pool_bytes_ -= it->second.capacity();
            resident_ -= it->second.capacity();
            pool_.erase(it);
        }
    }
    void note_peaks() {
        stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, resident_);
        held_peak_ = std::max(held_peak_, resident_ - pool_bytes_);
        step_held_peak_ = std::max(step_held_peak_, resident_ - pool_bytes_);
    }

    std::optional<aligned_buffer> take_pooled(std::size_t nbytes) {
        auto it = pool_.find(nbytes);
        if (it == pool_.end()) return std::nullopt;
        aligned_buffer b = std::move(it->second);
        pool_.erase(it);
        pool_bytes_ -= b.capacity();
        return b;
    }

    // A buffer the stash no longer needs: into the pool (still resident) or freed. The pool
    // keeps it while it holds at most pool_limit bytes, or while resident bytes stay within
    // the held high-water mark of this step and the last (memory the stash needed anyway:
    // reusing it costs no peak, and saves the allocation and page faults of a fresh buffer).
    void free_buffer(aligned_buffer&& b) {
        if (!b.data()) return;
        if (pool_bytes_ + b.capacity() <= opt_.pool_limit || resident_ <= held_peak_) {
            pool_bytes_ += b.capacity();
            std::size_t size = b.size();
            pool_.emplace(size, std::move(b));
        } else {
            resident_ -= b.capacity();
            aligned_buffer gone = std::move(b);
        }
    }

    // Returns a buffer taken for an exchange that did not happen: to the pool when the budget
    // has room for it, else freed.
    void give_back(aligned_buffer&& b) {
        if (!b.data() || resident_ + b.capacity() > opt_.memory_budget) return;
        resident_ += b.capacity();
        pool_bytes_ += b.capacity();
        std::size_t size = b.size();
        pool_.emplace(size, std::move(b));
        note_peaks();
    }

    void trim_pool(std::size_t need) {
        while (!pool_.empty() && resident_ + need > opt_.memory_budget) {
            auto it = std::prev(pool_.end());  // largest first
            pool_bytes_ -= it->second.capacity();
            resident_ -= it->second.capacity();
            pool_.erase(it);
        }
    }

    // Makes room for `charge` more resident bytes without exceeding the budget. Blocking:
    // trims the pool, drops prefetched tensors not yet loaded (they are on the tier), waits
    // for writes to free their buffers, and as a last resort queues writes of kept tensors.
    // False when nothing can make room.
    // With `swapped`, a free buffer of size() `swap_size` found in the pool (at once, or
    // freed by a write while waiting) goes there instead of being trimmed; it leaves the
    // stash's resident bytes, so it makes room too.
    bool make_room(std::unique_lock<std::mutex>& lock, std::size_t charge, aligned_buffer* swapped = nullptr,
                   std::size_t swap_size = 0) {
        auto take_swap = [&] {
            if (!swapped || swapped->data()) return false;
            auto b = take_pooled(swap_size);
            if (!b) return false;
            resident_ -= b->capacity();
            *swapped = std::move(*b);
            return true;
        };
        take_swap();
        if (charge > opt_.memory_budget) return false;
        std::optional<clock::time_point> since;
        auto done = [&](bool ok) {
            if (since) stats_.budget_wait_seconds += seconds_since(*since);
            return ok;
        };
        while (resident_ + charge > opt_.memory_budget) {
            if (take_swap()) continue;
            trim_pool(charge);
            if (resident_ + charge <= opt_.memory_budget) break;
            entry* drop_candidate = nullptr;
            entry* demote_candidate = nullptr;
            bool writes_will_free = false;
            for (auto& [id, p] : entries_) {
                entry& e = *p;
                if (e.state == entry_state::reading) {
                    // A read in flight (a prefetch) is charged already; once fetched it is a
                    // drop candidate, unless a load pins it (then the next pass says no).
                    writes_will_free = true;
                    continue;
                }
                if (!e.buffer.data()) continue;
                if (e.refs == 0 && e.state == entry_state::writing) {
                    writes_will_free = true;  // released while written (loaded or not): its end frees it
                    continue;
                }
                if (e.pinned) continue;
                if (e.state == entry_state::fetched && (!drop_candidate || e.id < drop_candidate->id)) drop_candidate = &e;
                if (e.state == entry_state::queued || e.state == entry_state::writing) writes_will_free = true;
                if (e.state == entry_state::kept && e.nbytes > 0 && (!demote_candidate || e.id < demote_candidate->id))
                    demote_candidate = &e;
            }
            if (drop_candidate) {
                drop_candidate->state = entry_state::offloaded;
                resident_ -= drop_candidate->buffer.capacity();
                aligned_buffer gone = std::move(drop_candidate->buffer);
                continue;
            }
            if (!writes_will_free && demote_candidate) {
                ++stats_.forced_writes;
                demote_candidate->state = entry_state::queued;
                queue_write(*demote_candidate);
                writes_will_free = true;
            }
            if (!writes_will_free) return done(false);
            if (!since) since = clock::now();
            cv_.wait(lock);
        }
        return done(true);
    }

    // ---- writes -----------------------------------------------------------------------

    void queue_write(entry& e) {
        if (e.step == step_ && e.position < layers_.size()) layers_[e.position].offloads = true;
        ++writes_pending_;
        writer_->submit([this, id = e.id] { run_write(id); });
    }

    std::string write_context(const entry& e) const {
        return "activation_stash: offloading " + e.label() + " (" + bytes_str(e.nbytes) + ") to tier " +
               quoted(std::string(tier_.name())) + " failed";
    }
    std::string read_context(const entry& e) const {
        return "activation_stash: loading " + e.label() + " (" + bytes_str(e.nbytes) + ") back from tier " +
               quoted(std::string(tier_.name())) + " failed";
    }

    void run_write(std::uint64_t id) {
        std::unique_lock lock(mutex_);
        auto it = entries_.find(id);
        if (it == entries_.end() || it->second->state != entry_state::queued || shutting_down_) {
            --writes_pending_;  // cancelled: released, taken by backward, or shutting down
            cv_.notify_all();
            return;
        }
        entry& e = *it->second;
        e.state = entry_state::writing;
        std::span<const std::byte> bytes(e.buffer.data(), e.nbytes);
        std::exception_ptr error = write_entry(lock, e, bytes);
        if (error) {
            if (!pending_error_) pending_error_ = e.error;
            if (e.refs == 0) {
                free_buffer(std::move(e.buffer));
                entries_.erase(e.id);
            } else if (e.pinned) {
                e.state = entry_state::kept;  // backward holds the resident copy: still exact
            } else {
                e.state = entry_state::lost;
                forget_identity(e);
                resident_ -= e.buffer.capacity();
                aligned_buffer gone = std::move(e.buffer);
            }
        } else {
            e.on_tier = true;
            stats_.bytes_offloaded += e.nbytes;
            if (e.refs == 0) {
                free_buffer(std::move(e.buffer));
                retire_key(e);
                entries_.erase(e.id);
            } else if (e.pinned || in_prefetch_window(e)) {
                note_forwarded(e);
                e.state = entry_state::fetched;
            } else {
                free_buffer(std::move(e.buffer));
                e.state = entry_state::offloaded;
            }
            prefetch();
        }
        cv_.notify_all();
    }

    void cancel_write(entry& e) {
        // The writer will find the entry no longer queued and skip it.
        e.state = entry_state::kept;
        ++stats_.write_skips;
        note_forwarded(e);
    }
    void note_forwarded(entry& e) {
        if (!e.forwarded) {
            e.forwarded = true;
            stats_.bytes_forwarded += e.nbytes;
        }
    }

    // A key for the write of `nbytes`: a retired one (its blob is rewritten in place, which
    // spares a tier the creation and deletion of a file per tensor), of that size when there
    // is one, else a new one "<key_prefix>-<stash serial>-<n>".
    std::string take_key(std::size_t nbytes) {
        if (!retired_keys_.empty()) {
            auto it = retired_keys_.find(nbytes);
            if (it == retired_keys_.end()) it = retired_keys_.begin();
            std::string key = std::move(it->second);
            retired_keys_.erase(it);
            return key;
        }
        return opt_.key_prefix + "-" + std::to_string(serial_) + "-" + std::to_string(++next_key_);
    }

    // The tensor on the tier under e.key is gone and no I/O on the key is in flight: its blob
    // stays for the next write to rewrite (flush(), reset() and the destructor erase it).
    void retire_key(entry& e) {
        if (shutting_down_) {
            erase_blob(e.key);
            return;
        }
        retired_keys_.emplace(e.nbytes, std::move(e.key));
        e.key.clear();
    }

    enum class io_scope { writes, reads_and_writes };
    // Waits for the writes (and with io_scope::reads_and_writes the reads) in flight and for
    // every erase, then erases the retired blobs and waits for those erases too.
    void wait_for_io_and_erase_retired(std::unique_lock<std::mutex>& lock, io_scope scope) {
        auto idle = [&] {
            return writes_pending_ == 0 && erases_pending_ == 0 &&
                   (scope == io_scope::writes || reads_pending_ == 0);
        };
        cv_.wait(lock, idle);
        for (auto& [size, key] : std::exchange(retired_keys_, {})) erase_later(std::move(key));
        cv_.wait(lock, idle);
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

    // ---- reads and prefetch -----------------------------------------------------------

    // The lowest layer position of the prefetch window: the current backward layer and the
    // prefetch_layers layers below it that offload anything (layers kept in memory need no
    // reads, so they do not use up the window).
    std::size_t window_low() const {
        std::size_t pos = std::min(backward_position_, layers_.size()), io = 0;
        while (pos > 0 && io < opt_.prefetch_layers) {
            --pos;
            if (layers_[pos].offloads) ++io;
        }
        return pos;
    }

    bool in_prefetch_window(const entry& e) const {
        if (phase_ != phase::backward || e.step != step_) return false;
        return e.position >= window_low();
    }

    // Reads `e` back on a reader thread. With reserved::yes the caller already charged its
    // bytes; otherwise it charges them here.
    void start_read(entry& e, reserved r) {
        std::optional<aligned_buffer> pooled = take_pooled(e.nbytes);
        if (r == reserved::yes && pooled) resident_ -= charge_of(e.nbytes);  // the pooled buffer was counted
        if (r == reserved::no && !pooled) account(charge_of(e.nbytes));
        note_peaks();
        e.state = entry_state::reading;
        ++reads_pending_;
        auto buffer = std::make_shared<aligned_buffer>(pooled ? std::move(*pooled) : aligned_buffer());
        reader_->submit([this, id = e.id, buffer] { run_read(id, std::move(*buffer)); });
    }

    void run_read(std::uint64_t id, aligned_buffer buffer) {
        std::unique_lock lock(mutex_);
        entry& e = *entries_.at(id);  // a reading entry is never erased before this ends
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
            if (buffer.data()) free_buffer(std::move(buffer));
            else resident_ -= charge_of(nbytes);
            retire_key(e);
            entries_.erase(e.id);
        } else if (error) {
            ++stats_.failed_reads;
            if (buffer.data()) free_buffer(std::move(buffer));
            else resident_ -= charge_of(nbytes);
            e.read_error = detail::with_context(error, read_context(e));
            e.state = entry_state::offloaded;
        } else {
            e.buffer = std::move(buffer);
            e.state = entry_state::fetched;
            stats_.bytes_loaded += nbytes;
        }
        cv_.notify_all();
    }

    // Issues the prefetches the current backward position calls for, newest save first:
    // every tensor of the window (within the budget), then further tensors while the bytes
    // held stay within the high-water mark the step already reached (memory that is there
    // anyway: reading ahead into it costs no peak). Stops at the first read that has no
    // room (retried when room is freed).
    void prefetch() {
        if (phase_ != phase::backward || shutting_down_) return;
        const std::size_t lo = window_low();
        while (cursor_ > 0) {
            auto it = entries_.find(order_[cursor_ - 1]);
            if (it == entries_.end() || it->second->refs == 0) {
                --cursor_;
                continue;
            }
            entry& e = *it->second;
            const bool ahead = e.position < lo;
            if (e.state == entry_state::queued) {
                cancel_write(e);  // resident already: keeping it costs nothing
            } else if (e.state == entry_state::writing && ahead) {
                return;  // its completion frees the buffer and calls prefetch() again
            } else if (e.state == entry_state::offloaded && !e.read_error) {
                std::size_t charge = charge_of(e.nbytes);
                if (ahead && resident_ - pool_bytes_ + charge > held_peak_) return;
                if (!pool_.contains(e.nbytes)) {
                    trim_pool(charge);
                    if (resident_ + charge > opt_.memory_budget) return;
                }
                start_read(e, reserved::no);
            }
            --cursor_;
        }
    }

    // The last reference is gone.
    void drop(entry& e) {
        forget_identity(e);
        switch (e.state) {
            case entry_state::queued:
                ++stats_.write_skips;
                [[fallthrough]];
            case entry_state::kept:
            case entry_state::fetched:
            case entry_state::offloaded:
            case entry_state::lost:
                free_buffer(std::move(e.buffer));
                if (e.on_tier) retire_key(e);
                entries_.erase(e.id);
                break;
            case entry_state::writing:
            case entry_state::reading:
                break;  // the I/O thread finishes the job
        }
    }

    void throw_pending() {
        if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
    }

    Tier& tier_;
    const stash_options opt_;
    buffer_arena arena_;  // small buffers (new_buffer); they keep its memory alive, wherever they go
    const std::uint64_t serial_;

    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::unordered_map<std::uint64_t, std::unique_ptr<entry>> entries_;
    std::unordered_map<tensor_identity, std::uint64_t, tensor_identity_hash> dedup_;
    std::unordered_map<std::uint64_t, std::uint64_t> handles_;  // handle id -> entry id
    std::multimap<std::size_t, aligned_buffer> pool_;          // by size()
    std::size_t pool_bytes_ = 0;
    std::size_t resident_ = 0;
    std::size_t held_peak_ = 0;       // most bytes held (resident minus pool) this step and the last
    std::size_t step_held_peak_ = 0;  // most bytes held this step
    stash_stats stats_;
    std::exception_ptr pending_error_;
    std::uint64_t next_entry_ = 0, next_handle_ = 0, next_key_ = 0;
    std::multimap<std::size_t, std::string> retired_keys_;  // by blob size: blobs kept to be rewritten
    std::size_t writes_pending_ = 0, reads_pending_ = 0, erases_pending_ = 0;
    bool shutting_down_ = false;

    // The current step.
    phase phase_ = phase::forward;
    std::uint64_t step_ = 0;
    bool step_open_ = false;
    bool profiling_ = false;
    bool after_profiling_ = false;
    clock::time_point step_start_{};
    std::vector<std::uint32_t> scopes_;
    std::vector<layer_record> layers_;
    std::unordered_map<std::uint32_t, std::size_t> positions_;
    std::vector<std::uint64_t> order_;  // entry ids in save order
    std::size_t cursor_ = 0;            // prefetch walks order_ down from here
    std::size_t backward_position_ = 0;

    split_plan plan_;
    tier_stats forward_stats_{};   // the tier's counters when the step began
    double forward_seconds_ = 0;   // the last forward's duration
    std::size_t first_kept_ = std::numeric_limits<std::size_t>::max();

    // Last: destroyed (drained and joined) first, while everything above is alive.
    std::optional<thread_pool> writer_;
    std::optional<thread_pool> reader_;
};

}  // namespace spillway
