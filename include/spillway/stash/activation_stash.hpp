// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/activation_stash.hpp: offload the tensors a trainer saves in forward for
/// backward to any storage_tier, and bring them back in reverse order before backward needs
/// them (TBA / SSDTrain as a primitive). The public entry point of the stash: it includes
/// its options and stats (stash_options.hpp) and its handle (stash_handle.hpp).
///
/// What it guarantees:
/// - Round trips are exact: load() gives back the bytes save() was handed, or throws an error
///   naming the tensor; it never returns wrong or partial data.
/// - Deduplication: saving a tensor whose identity (tensor_desc.hpp: storage id, version,
///   dtype, shape, strides, offset) equals a live one stores it once and counts a reference.
///   A transpose (other strides) is another tensor. Raw addresses are never a key.
/// - Forwarding: a tensor still in memory when backward (or prefetch) asks for it, because
///   its write is queued or in flight, is served from memory without a read; a write that has
///   not started by then is skipped.
/// - Adaptive keep: tensors under keep_below_bytes stay in memory; the layers at the end of
///   forward whose I/O cannot be hidden stay in memory (split_mode); memory_budget caps
///   resident bytes and is never exceeded (save waits for writes to finish, or writes
///   synchronously).
/// - Prefetch: in backward, reads are issued in reverse order of saving, at least
///   prefetch_layers offloading layers ahead of the layer backward is in.
/// - Compute never blocks on a write, except when the memory budget leaves no room.
/// - The stash owns the resident copy of every tensor it holds: save(desc, bytes) copies, so
///   the caller may reuse its buffer at once; save(desc, aligned_buffer&&) and
///   save_and_exchange() adopt the caller's buffer. Resident bytes are the capacities of
///   every buffer the stash holds (tensors, reads in flight, its free pool).
/// - All public member functions are thread-safe.
///
/// The life cycle of a tensor (save, write, backward, prefetch, load, release, next step),
/// the reuse of released blobs' keys, and who reports which error are written as numbered
/// steps in docs/design.md, section "The activation stash".
/// Errors: a failed write is reported by the next save(), begin_layer() or flush() (once)
/// and by every load() of that tensor (unless backward already held it: its resident copy
/// is exact and stays); a failed read by the load() that needed it (a later load() retries).
/// Both name the tensor and the tier, and keep the tier's kind of error (spillway::
/// with_context): std::system_error with its errno, std::invalid_argument, or else
/// std::runtime_error. Misuse of a handle (empty, moved-from, released, of another stash) is
/// std::invalid_argument naming the tensor.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/stash/detail/budget_pool.hpp"
#include "spillway/stash/detail/split_planner.hpp"
#include "spillway/stash/detail/stash_io.hpp"
#include "spillway/stash/detail/tensor_table.hpp"
#include "spillway/stash/split_rule.hpp"
#include "spillway/stash/stash_handle.hpp"
#include "spillway/stash/stash_options.hpp"
#include "spillway/stash/tensor_desc.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway {

namespace detail {
inline std::atomic<std::uint64_t>& stash_serial_counter() {
    static std::atomic<std::uint64_t> counter{0};
    return counter;
}
}  // namespace detail

/// Holds the tensors a trainer saves in forward for backward, offloading them to `Tier`
/// and prefetching them back in reverse order; see the file comment for its guarantees and
/// docs/design.md for the life cycle of a tensor. Not copyable or movable. Every public
/// member function is thread-safe (one internal mutex, never held across tier I/O or copies).
/// @tparam Tier any storage_tier; the stash holds a reference to it.
/// @tparam Clock the clock that times layers, forward, the bandwidth probe and the waits
///         (std::chrono::steady_clock; a test may supply a clock it moves by hand).
template <storage_tier Tier, class Clock = std::chrono::steady_clock>
class activation_stash {
public:
    /// The monotonic clock that times layers, forward, the probe and the waits in stash_stats.
    using clock = Clock;

    /// Holds a reference to `tier`, which must outlive the stash. Throws
    /// std::invalid_argument for a bad key prefix or zero threads.
    explicit activation_stash(Tier& tier, stash_options options = {})
        : tier_(tier),
          serial_(++detail::stash_serial_counter()),
          opt_(checked(std::move(options))),
          table_(serial_),
          pool_(opt_.memory_budget, opt_.pool_limit),
          planner_(opt_),
          io_(tier_, opt_, serial_, mutex_, cv_, table_, pool_, stats_, step_) {}
    activation_stash(const activation_stash&) = delete;
    activation_stash& operator=(const activation_stash&) = delete;

    /// Skips queued writes, waits for the I/O in flight, erases this stash's tier blobs.
    /// Handles still live become dangling (any use is undefined).
    ~activation_stash() = default;

    // ---- forward ----------------------------------------------------------------------

    /// Opens the layer scope `layer` (an id of the trainer's choosing); saves without an
    /// explicit scope belong to it. Scopes nest; end_layer() closes the innermost.
    void begin_layer(std::uint32_t layer) {
        std::lock_guard lock(mutex_);
        io_.throw_pending();
        if (no_grad_ > 0) {  // an eval forward: no step, no layer profile
            scopes_.push_back(layer);
            return;
        }
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
            if (auto b = pool_.take(nbytes)) {
                pool_.uncount(b->capacity());
                return std::move(*b);
            }
        }
        return io_.new_buffer(nbytes, buffer_fill::zeroed);
    }

    // ---- evaluation -------------------------------------------------------------------

    /// Opens a no-grad scope (a forward with no backward: evaluation, inference): until the
    /// matching end_no_grad(), save() stores nothing, writes nothing to the tier and returns
    /// an empty handle (valid() false; layer_stash treats it as not saved); a buffer handed
    /// to save(desc, aligned_buffer&&) or save_and_exchange() stays with the caller.
    /// begin_layer() only opens the scope: the step, its profile and the split are
    /// untouched. Scopes nest; saves are counted in stash_stats::no_grad_saves.
    void begin_no_grad() {
        std::lock_guard lock(mutex_);
        ++no_grad_;
    }
    /// Closes the innermost no-grad scope; does nothing when none is open.
    void end_no_grad() noexcept {
        std::lock_guard lock(mutex_);
        if (no_grad_ > 0) --no_grad_;
    }
    /// False inside a no-grad scope.
    [[nodiscard]] bool grad_enabled() const {
        std::lock_guard lock(mutex_);
        return no_grad_ == 0;
    }

    // ---- backward ---------------------------------------------------------------------

    /// Marks the start of backward (optional: the first load() does it) so that prefetch of
    /// the last layers starts at once. Plans the split on the profiling step.
    void start_backward() {
        std::unique_lock lock(mutex_);
        enter_backward(lock);
        io_.prefetch();
    }

    /// The tensor's bytes, resident; blocks while they are being read. The view stays valid
    /// until `handle` is released. Throws std::invalid_argument on a misused handle, the
    /// tier's error naming the tensor when its write or read failed, std::length_error when
    /// the budget is held entirely by loaded tensors not yet released.
    [[nodiscard]] std::span<const std::byte> load(const stash_handle& handle) {
        std::unique_lock lock(mutex_);
        (void)table_.entry_of(handle, "load");  // a misused handle throws before anything starts
        enter_backward(lock);                   // (may unlock: the probe)
        {
            entry& e = table_.entry_of(handle, "load");
            if (e.step == step_.number && e.position < step_.backward_position)
                step_.backward_position = e.position;
        }
        io_.prefetch();
        std::optional<typename clock::time_point> waited_since;
        for (;;) {
            // Looked up again after every wait: a reset() from another thread meanwhile drops
            // the entry, and the lookup then throws (unknown handle) instead of reading it.
            entry& e = table_.entry_of(handle, "load");
            switch (e.state) {
                case entry_state::queued:
                    io_.cancel_write(e);
                    [[fallthrough]];
                case entry_state::kept:
                case entry_state::fetched:
                case entry_state::writing:
                    if (e.buffer.data() || e.nbytes == 0) {
                        if (e.state == entry_state::writing) io_.note_forwarded(e);
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
                        io_.start_read(e, detail::reserved::no);
                        continue;
                    }
                    {
                        const std::size_t nbytes = e.nbytes;
                        const bool room = io_.make_room(lock, charge_of(nbytes));  // (may wait)
                        entry& again = table_.entry_of(handle, "load");
                        if (!room) {
                            if (again.state != entry_state::offloaded)
                                continue;  // a prefetch read it meanwhile
                            throw std::length_error(
                                "activation_stash: loading " + again.label() + " (" +
                                bytes_str(nbytes) + ") would exceed the memory budget of " +
                                bytes_str(opt_.memory_budget) +
                                (charge_of(nbytes) > opt_.memory_budget
                                     ? std::string(": the tensor alone is larger; raise the budget")
                                     : ": " + bytes_str(pool_.resident()) +
                                           " are held by loaded tensors not yet released; release "
                                           "tensors once "
                                           "backward used them, or raise the budget"));
                        }
                        pool_.account(charge_of(nbytes));
                        if (again.state == entry_state::offloaded)
                            io_.start_read(again, detail::reserved::yes);
                        else
                            pool_.uncount(charge_of(nbytes));  // someone else started it meanwhile
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
        const entry& e = const_cast<activation_stash*>(this)->table_.entry_of(handle, "ready");
        switch (e.state) {
            case entry_state::kept:
            case entry_state::queued:
            case entry_state::fetched:
            case entry_state::writing:
                return e.buffer.data() != nullptr || e.nbytes == 0;
            default:
                return false;
        }
    }

    /// Drops the handle's reference (the handle becomes released). The last reference frees
    /// the tensor: its buffer, any queued write, its tier blob (retired for a later write to
    /// rewrite, erased by flush(); see step 6). Throws std::invalid_argument
    /// on a misused handle (double release, moved-from, empty, another stash's).
    void release(stash_handle& handle) {
        std::unique_lock lock(mutex_);
        entry& e = table_.entry_of(handle, "release");
        table_.release_handle(handle);
        if (--e.refs == 0) io_.drop(e);
        io_.prefetch();
        cv_.notify_all();
    }

    // ---- whole-stash ------------------------------------------------------------------

    /// Waits for every write issued so far, then erases the blobs of released tensors kept
    /// for rewriting (step 6) and waits for every erase: afterwards the tier holds exactly the
    /// blobs of live tensors. Throws the first unreported write failure.
    void flush() {
        std::unique_lock lock(mutex_);
        io_.wait_for_io_and_erase_retired(lock, detail::io_scope::writes);
        io_.throw_pending();
    }

    /// Releases every live handle (they become unknown to the stash), waits for the I/O in
    /// flight, erases the retired blobs and forgets any unreported error: the way back to a
    /// clean state after a failed step.
    void reset() {
        std::unique_lock lock(mutex_);
        for (auto id : table_.forget_handles()) {
            entry* e = table_.find(id);
            if (e && --e->refs == 0) io_.drop(*e);
        }
        io_.wait_for_io_and_erase_retired(lock, detail::io_scope::reads_and_writes);
        io_.forget_pending();
        step_.backward = true;  // the next save starts a new step
    }

    /// Makes the next step a profiling step again (adaptive mode): the split is re-planned.
    void replan() {
        std::lock_guard lock(mutex_);
        planner_.forget();
    }

    /// A snapshot of the counters and of the resident and pooled bytes now (stash_stats).
    /// Never blocks on I/O.
    [[nodiscard]] stash_stats stats() const {
        std::lock_guard lock(mutex_);
        stash_stats s = stats_;
        s.resident_bytes = pool_.resident();
        s.pooled_bytes = pool_.pooled();
        s.peak_resident_bytes = pool_.peak();
        s.arena_slack_bytes = io_.arena_slack_bytes();
        return s;
    }
    /// Frees every pooled buffer (gives the memory back: a piece of the huge-page arena goes
    /// back to it, which unmaps a slab with its last piece); returns the bytes freed.
    std::size_t trim() {
        std::lock_guard lock(mutex_);
        return pool_.clear();
    }
    /// Restarts peak_resident_bytes from the current resident bytes.
    /// Also restarts the held high-water mark that lets the pool grow past pool_limit.
    void reset_peak() {
        std::lock_guard lock(mutex_);
        pool_.restart_high_water();
        pool_.reset_peak();
    }
    /// A copy of the split in use and what it was planned from (split_plan). Never blocks
    /// on I/O.
    [[nodiscard]] split_plan plan() const {
        std::lock_guard lock(mutex_);
        return planner_.snapshot();
    }
    /// The options given at construction; they never change, so the reference needs no lock.
    [[nodiscard]] const stash_options& options() const noexcept { return opt_; }
    /// The tier the stash writes to. Blobs under the stash's keys belong to it: do not
    /// write or erase them through this reference while the stash lives.
    [[nodiscard]] Tier& tier() noexcept { return tier_; }

private:
    using entry = detail::stash_entry;
    using entry_state = detail::entry_state;

    // The options, or std::invalid_argument naming what is wrong with them.
    static stash_options checked(stash_options o) {
        validate_key(o.key_prefix, "activation_stash: key_prefix");
        expect_argument(
            o.key_prefix.size() <= 200,
            "activation_stash: key_prefix " + spillway::quoted(o.key_prefix) +
                " is longer than 200 bytes (" + std::to_string(o.key_prefix.size()) +
                "): its keys \"<key_prefix>-<serial>-<n>\" must fit a tier's 255-byte limit");
        expect_argument(
            o.write_threads >= 1 && o.read_threads >= 1,
            "activation_stash: write_threads and read_threads must be at least 1, got " +
                std::to_string(o.write_threads) + " and " + std::to_string(o.read_threads) +
                " (a stash never moves data on the compute thread)");
        if (o.split == split_mode::adaptive && o.tier_bandwidth < 0)
            throw std::invalid_argument(
                "activation_stash: tier_bandwidth must be >= 0 (0 measures it)");
        return o;
    }
    static double seconds_since(typename clock::time_point t) {
        return detail::seconds_since<Clock>(t);
    }
    static std::size_t charge_of(std::size_t nbytes) noexcept {
        return detail::budget_pool::charge_of(nbytes);
    }

    // `exchange` (only with `adopt`, the same buffer) receives a free buffer of the same size.
    stash_handle save_impl(const tensor_desc& desc, std::span<const std::byte> bytes,
                           aligned_buffer* adopt, aligned_buffer* exchange) {
        const std::size_t nbytes = extent_bytes(desc);
        expect_argument(bytes.size() == nbytes, "activation_stash::save: " + describe(desc) +
                                                    " addresses " + bytes_str(nbytes) +
                                                    " but the buffer handed over holds " +
                                                    bytes_str(bytes.size()));
        auto label = std::make_shared<const std::string>(describe(desc));
        auto identity = tensor_identity::of(desc);

        std::unique_lock lock(mutex_);
        io_.throw_pending();
        if (no_grad_ > 0) {  // nothing is kept for a backward that will not come
            ++stats_.no_grad_saves;
            return stash_handle();
        }
        enter_forward();
        const std::size_t position = position_of(
            desc.layer == current_layer ? (scopes_.empty() ? 0u : scopes_.back()) : desc.layer);
        if (entry* hit = table_.find_live(identity)) return add_reference(*hit, nbytes);

        if (nbytes == 0) {  // nothing to hold or write
            entry& e = new_entry(identity, label, 0, position);
            e.state = entry_state::kept;
            return make_handle(e);
        }
        const bool offload = planner_.offloads(nbytes, position);
        // 1. Room under the budget, 2. a resident copy, 3. the entry.
        aligned_buffer buffer;
        aligned_buffer swapped;  // the free buffer `exchange` receives
        std::size_t charge = 0;
        bool resident = true;
        if (adopt) {
            charge = adopt->capacity();
            resident = io_.make_room(lock, charge, exchange ? &swapped : nullptr, nbytes);
            if (resident) pool_.account(charge);
        } else if (auto pooled = pool_.take(nbytes)) {
            buffer = std::move(*pooled);  // its bytes move from the pool to the tensor
            charge = buffer.capacity();
            pool_.note_peaks();
        } else {
            charge = charge_of(nbytes);
            resident = io_.make_room(lock, charge);
            if (resident) pool_.account(charge);
        }
        if (!resident) {
            pool_.give_back(std::move(swapped));
            return save_synchronously(lock, desc, identity, label, bytes, adopt, position);
        }

        lock.unlock();
        if (adopt) {
            buffer = std::move(*adopt);
        } else {
            try {
                if (!buffer.data()) buffer = io_.buffer_to_overwrite(nbytes);
            } catch (...) {
                lock.lock();
                pool_.uncount(charge);
                throw;
            }
            if (nbytes) std::memcpy(buffer.data(), bytes.data(), nbytes);
        }
        lock.lock();
        if (entry* hit = table_.find_live(identity)) {  // another thread saved it meanwhile
            if (adopt)
                *adopt = std::move(buffer);
            else
                pool_.recycle(std::move(buffer));
            if (adopt) pool_.uncount(charge);
            pool_.give_back(std::move(swapped));
            return add_reference(*hit, nbytes);
        }
        entry& e = new_entry(identity, label, nbytes, position);
        e.buffer = std::move(buffer);
        if (exchange) *exchange = std::move(swapped);
        stats_.bytes_saved += nbytes;
        if (offload) {
            e.state = entry_state::queued;
            step_offloaded_ += nbytes;
            io_.queue_write(e);
        } else {
            e.state = entry_state::kept;
            stats_.bytes_kept += nbytes;
        }
        return make_handle(e);
    }

    // The budget leaves no room even after every write finished: write the caller's bytes
    // from the compute thread (the one case where compute blocks on a write).
    stash_handle save_synchronously(std::unique_lock<std::mutex>& lock, const tensor_desc& desc,
                                    const tensor_identity& identity,
                                    std::shared_ptr<const std::string> label,
                                    std::span<const std::byte> bytes, aligned_buffer* adopt,
                                    std::size_t position) {
        (void)desc;
        entry& e = new_entry(identity, std::move(label), bytes.size(), position);
        e.state = entry_state::writing;
        ++stats_.forced_writes;
        step_offloaded_ += bytes.size();
        std::exception_ptr error = io_.write_synchronously(lock, e, bytes);
        if (error) {
            e.state = entry_state::lost;
            --stats_.tensors;
            auto err = e.error;
            table_.forget_identity(e);
            if (--e.refs == 0) table_.erase(e.id);
            cv_.notify_all();
            std::rethrow_exception(err);
        }
        e.on_tier = true;
        e.state = entry_state::offloaded;
        stats_.bytes_saved += e.nbytes;
        stats_.bytes_offloaded += e.nbytes;
        if (adopt) {
            aligned_buffer done = std::move(*adopt);
            pool_.adopt_if_room(std::move(done));
        }
        cv_.notify_all();
        return make_handle(e);
    }

    entry& new_entry(const tensor_identity& identity, std::shared_ptr<const std::string> label,
                     std::size_t nbytes, std::size_t position) {
        entry& e = table_.add(identity, std::move(label), nbytes, position, step_.number);
        step_.order.push_back(e.id);
        if (nbytes >= opt_.keep_below_bytes && nbytes > 0)
            step_.layers.add_offload_bytes(position, nbytes);
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
        ++stats_.saves;
        return table_.issue_handle(e);
    }

    // ---- steps and layers ---------------------------------------------------------------

    void enter_forward() {
        if (step_.backward) {
            if (step_open_) warn_about_ended_step();
            if (opt_.split == split_mode::adaptive && planner_.planned() && !after_profiling_ &&
                opt_.tier_bandwidth == 0)
                replan_from_tier();
            step_.backward = false;
            ++step_.number;
            step_.layers.clear();
            step_.order.clear();
            step_.cursor = 0;
            step_open_ = false;
            pool_.roll_high_water();
            if (after_profiling_) {
                // The profiling step held everything: that peak must not size the pool.
                after_profiling_ = false;
                pool_.restart_high_water();
            }
        }
        if (!step_open_) {
            step_open_ = true;
            step_start_ = clock::now();
            step_saved_from_ = stats_.bytes_saved - stats_.bytes_deduplicated;
            step_offloaded_ = 0;
            pool_.restart_step_peak();
            if (opt_.split == split_mode::adaptive) forward_stats_ = tier_.stats();
            profiling_ = planner_.profiling();
        }
    }

    std::size_t position_of(std::uint32_t layer) {
        return step_.layers.position_of(layer, [&] { return seconds_since(step_start_); });
    }

    void enter_backward(std::unique_lock<std::mutex>& lock) {
        if (step_.backward) return;
        step_.backward = true;
        step_.backward_position = step_.layers.size();
        step_.cursor = step_.order.size();
        if (profiling_ && !planner_.planned()) {
            const double forward =
                step_open_ ? seconds_since(step_start_) : 0.0;  // before the probe
            const double bw = opt_.tier_bandwidth > 0 ? opt_.tier_bandwidth
                                                      : io_.measure_bandwidth(lock, forward_stats_);
            planner_.plan(step_.layers.profiles(), forward, bw);
            after_profiling_ = true;
        }
        profiling_ = false;
        forward_seconds_ = step_open_ ? seconds_since(step_start_) : 0.0;
    }

    // Once for each way a stash can fail to save memory, as the step that shows it ends:
    // (1) it saved tensors and offloaded none; (2) its resident bytes reached what it saved
    // (keeping everything in memory would have taken no more). stash_options::on_warning.
    void warn_about_ended_step() {
        const std::size_t saved = stats_.bytes_saved - stats_.bytes_deduplicated - step_saved_from_;
        if (saved == 0) return;
        std::string text;
        if (step_offloaded_ == 0) {
            if (warned_nothing_offloaded_) return;
            warned_nothing_offloaded_ = true;
            text = "activation_stash: a step saved " + bytes_str(saved) +
                   " and offloaded none of it (every tensor under keep_below_bytes " +
                   bytes_str(opt_.keep_below_bytes) +
                   ", or in a kept layer): the stash saves no memory; lower keep_below_bytes or "
                   "use split_mode::offload_all";
        } else if (pool_.step_peak() >= saved) {
            if (warned_peak_) return;
            warned_peak_ = true;
            text = "activation_stash: a step held up to " + bytes_str(pool_.step_peak()) +
                   " resident to save " + bytes_str(saved) + " (" + bytes_str(step_offloaded_) +
                   " offloaded): keeping every tensor in memory takes no more; set "
                   "memory_budget below the activations' size (at least smallest_stash_budget(), "
                   "stash/stash_budget.hpp), prefetch_layers 1 and a smaller pool_limit";
        } else {
            return;
        }
        ++stats_.warnings;
        if (opt_.on_warning) opt_.on_warning(text);
    }

    // Re-plans, as the next step begins, from the step that ended: its layers, its forward
    // time, and the bandwidth the tier delivered during it (the whole step, so that no
    // operation is cut in half).
    void replan_from_tier() {
        planner_.replan(step_.layers.profiles(), forward_seconds_,
                        detail::delivered_bandwidth(forward_stats_, tier_.stats()));
    }

    Tier& tier_;
    const std::uint64_t serial_;  // taken before the options are checked
    const stash_options opt_;

    mutable std::mutex mutex_;
    std::condition_variable cv_;
    detail::tensor_table table_;  // tensors, the dedup index and the handles
    detail::budget_pool pool_;    // resident bytes and free buffers
    stash_stats stats_;           // counters; the resident and peak bytes are pool_'s

    // The current step: the part its I/O reads (number, phase, layers, prefetch walk), then
    // the profiling and timing.
    detail::stash_step step_;
    bool step_open_ = false;
    bool profiling_ = false;
    bool after_profiling_ = false;
    typename clock::time_point step_start_{};
    std::vector<std::uint32_t> scopes_;

    std::size_t no_grad_ = 0;            // open no-grad scopes
    std::uint64_t step_saved_from_ = 0;  // distinct bytes saved before this step
    std::size_t step_offloaded_ = 0;     // bytes this step queued or forced to the tier
    bool warned_nothing_offloaded_ = false, warned_peak_ = false;

    detail::split_planner planner_;
    tier_stats forward_stats_{};  // the tier's counters when the step began
    double forward_seconds_ = 0;  // the last forward's duration

    // Last: destroyed first (queued writes skipped, I/O drained, blobs erased), while
    // everything above is alive.
    detail::stash_io<Tier, Clock> io_;
};

/// A no-grad scope for the life of this object (activation_stash::begin_no_grad): an eval
/// forward saves nothing and writes nothing to the tier.
template <class Stash>
class no_grad_scope {
public:
    /// Opens a no-grad scope on `stash`, which must outlive this object.
    explicit no_grad_scope(Stash& stash) : stash_(stash) { stash_.begin_no_grad(); }
    /// Closes it.
    ~no_grad_scope() { stash_.end_no_grad(); }
    no_grad_scope(const no_grad_scope&) = delete;
    no_grad_scope& operator=(const no_grad_scope&) = delete;

private:
    Stash& stash_;
};

}  // namespace spillway
