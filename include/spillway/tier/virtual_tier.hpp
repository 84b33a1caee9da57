// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/virtual_tier.hpp: one storage tier over several child tiers (storage
/// paths), used together in proportion to their bandwidth, with per-path locks and
/// fail-over. The public entry point; its parts sit beside it (virtual_tier_options.hpp:
/// options, report, batch requests, child_args; bandwidth_estimate.hpp) and in detail/
/// (children, placement, key_index, lock_queue, bandwidth_probe, fail_over).
///
/// Children are built in place, borrowed, or a run-time list:
///   virtual_tier<node_lock, file_tier<>, throttled_tier<file_tier<>>> vt(opts,
///       child_args("/nvme/ckpt"), child_args(limit, std::in_place, "/pfs/ckpt"));
///   virtual_tier<node_lock, host_tier&, host_tier&> vt(opts, a, b);
///   virtual_tier<thread_lock, std::vector<file_tier<>>> vt(opts, paths);
///
/// Guarantees (the storage_tier contract holds, plus):
///  - Placement. Each key lives on one child, whole. A write goes to the healthy child with
///    room that would finish its keys soonest with this blob among them (a child's finish
///    time: the bytes of its keys over its weight), and stays where it is unless another
///    child would finish strictly sooner (detail/placement.hpp; the rule in numbered steps in
///    docs/design.md). Weights are options.bandwidths or probed, and follow
///    the measured bandwidth in placement_mode::adaptive: each child's moving average of
///    bytes over busy time as its own stats() count them (the tier's timing of its calls
///    for a child that counts nothing). placement_mode::striped puts a key ending in
///    "-<n>" on child n mod the children while that child is healthy with room (else by
///    finish time: fail-over). A rewrite is the move: the old copy
///    is erased only after the new write completed.
///  - Concurrency. Every transfer to a child runs under the child's read or write lock;
///    workers serve an operation on a free child before one on a busy child.
///  - Fail-over. A write that fails on a child with std::system_error degrades the child and
///    goes to another; it fails only when every usable child failed, naming each error.
///  - Stale copies (an old copy its child refused to erase) are never adopted back and are
///    erased again later. Keys a child already held are found and adopted.
///  - Destruction finishes every queued operation, then joins the workers.
/// The operation protocol and the reasons: docs/design.md ("Multi-path offload").
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "spillway/detail/thread_name.hpp"
#include "spillway/error.hpp"
#include "spillway/lock/lock_policy.hpp"
#include "spillway/tier/bandwidth_estimate.hpp"
#include "spillway/tier/bandwidth_split.hpp"
#include "spillway/tier/detail/bandwidth_probe.hpp"
#include "spillway/tier/detail/children.hpp"
#include "spillway/tier/detail/fail_over.hpp"
#include "spillway/tier/detail/key_index.hpp"
#include "spillway/tier/detail/lock_queue.hpp"
#include "spillway/tier/detail/placement.hpp"
#include "spillway/tier/host_tier.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/tier_stats.hpp"
#include "spillway/tier/virtual_tier_options.hpp"

namespace spillway {

/// One storage_tier over several child tiers (storage paths), with bandwidth-proportional
/// placement, per-path locks and fail-over; the guarantees are in the file comment, the
/// operation protocol in docs/design.md.
///
/// Thread-safe: any member may be called from any thread; operations on different keys run
/// concurrently on a pool of workers. Not copyable, not movable (the workers point at it).
/// @tparam LockPolicy a lock_policy guarding each child's reads and writes (node_lock across
///         processes, thread_lock within one, null_lock for none)
/// @tparam Children   either one or more storage_tier types (a reference type borrows a
///         child the caller keeps alive), or one `std::vector<T>` of a storage_tier T for a
///         list fixed at run time
// clang-format 14 mislays requires-clauses:
// clang-format off
template <lock_policy LockPolicy, class... Children>
    requires(sizeof...(Children) >= 1 && (detail::vt_valid_child_v<Children> && ...))
class virtual_tier {
    static constexpr bool runtime_list = detail::vt_runtime_list_v<Children...>;
    using children_type = detail::vt_children<Children...>;
    using list_child = typename detail::vt_list_child<Children...>::type;

public:
    /// A property holds for the virtual tier when it holds for every child.
    static constexpr tier_properties properties = children_type::properties;
    /// The lock policy type.
    using lock_type = LockPolicy;

    // ---- Construction ----------------------------------------------------------------------
    /// Compile-time children, each built from its child_args(...) tuple in place, or borrowed
    /// (a reference type in Children, passed as an lvalue).
    /// Throws std::invalid_argument for bad options (bandwidth count or values, window,
    /// lock names) and what the children's and the locks' constructors throw.
    template <class... Args>
        requires(!runtime_list && sizeof...(Args) == sizeof...(Children))
    explicit virtual_tier(virtual_tier_options options, Args&&... args)
        : options_(std::move(options)), children_(std::in_place, std::forward<Args>(args)...) {
        start();
    }
    /// Compile-time children, all default-constructed.
    explicit virtual_tier(virtual_tier_options options = {})
        requires(!runtime_list && std::default_initializable<children_type>)
        : options_(std::move(options)) {
        start();
    }

    /// Run-time list: one child per element of `args` (the element, or a child_args tuple,
    /// is the child's constructor argument).
    template <std::ranges::input_range R>
        requires runtime_list &&
                 (std::constructible_from<list_child, std::ranges::range_reference_t<R>> ||
                  detail::std_tuple<std::ranges::range_reference_t<R>>)
    virtual_tier(virtual_tier_options options, R&& args)
        : options_(std::move(options)),
          children_(detail::build_child_list<list_child>(std::forward<R>(args))) {
        start();
    }
    /// Run-time list: `count` children, child i built from the prvalue factory(i).
    template <class Factory>
        requires runtime_list && std::invocable<Factory&, std::size_t>
    virtual_tier(virtual_tier_options options, std::size_t count, Factory factory)
        : options_(std::move(options)),
          children_(detail::build_child_count<list_child>(count, factory)) {
        start();
    }
    /// Run-time list: children built by the caller.
    virtual_tier(virtual_tier_options options, std::vector<std::unique_ptr<list_child>> owned)
        requires runtime_list
        : options_(std::move(options)), children_(std::move(owned)) {
        start();
    }
    // clang-format on

    /// Owns threads and locks: not copyable.
    virtual_tier(const virtual_tier&) = delete;
    /// Owns threads and locks: not copyable.
    virtual_tier& operator=(const virtual_tier&) = delete;

    /// Finishes every queued operation, then joins the workers; owned children are destroyed
    /// after that (borrowed ones are left to the caller).
    ~virtual_tier() {
        {
            std::lock_guard lock(mutex_);
            queue_.stop();
        }
        queue_.notify_all();
        for (auto& w : workers_) w.join();
        for (auto& [key, children] : index_.stale())
            for (std::size_t i : children) (void)erase_on_child(i, key);
    }

    // ---- storage_tier ----------------------------------------------------------------------
    /// Places `key` (see the header comment) and writes `bytes` there. Keep `bytes` alive and
    /// unchanged until the completion is ready. Throws std::invalid_argument for a bad key,
    /// naming the tier; other errors come from wait().
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        check_key(key);
        std::unique_lock lock(mutex_);
        auto c = submit_write(key, bytes);
        lock.unlock();
        queue_.notify_one();
        return c;
    }

    /// Reads `key` from the child that holds it. bytes.size() must equal size_of(key).
    /// Errors through the completion: std::system_error(ENOENT) for an unknown key and
    /// std::invalid_argument for a size mismatch (both naming the key), or the child's error
    /// naming the key and the child.
    /// @throws std::invalid_argument at once for a bad key, naming the tier
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        check_key(key);
        std::unique_lock lock(mutex_);
        auto c = submit_read(key, bytes);
        lock.unlock();
        queue_.notify_one();
        return c;
    }

    /// Submits many writes at once; completions come back in request order, but the
    /// operations run in the order their children's locks become free. Every key is
    /// validated before any is submitted.
    std::vector<io_completion> write_batch(std::span<const write_request> requests) {
        return submit_batch(
            requests, [this](const write_request& r) { return submit_write(r.key, r.bytes); });
    }
    /// Submits many reads at once (see write_batch).
    std::vector<io_completion> read_batch(std::span<const read_request> requests) {
        return submit_batch(requests,
                            [this](const read_request& r) { return submit_read(r.key, r.bytes); });
    }

    /// Removes the key from the child that holds it. Must not race with an operation on the
    /// same key. Returns false if no child held it.
    bool erase(std::string_view key) {
        check_key(key);
        std::unique_lock lock(mutex_);
        auto it = find_entry(key);
        std::optional<std::size_t> home;
        if (it != index_.end()) home = index_.erase(it);
        const std::vector<std::size_t> stale = index_.take_stale(key);
        lock.unlock();
        std::vector<std::size_t> still;  // stale copies that again refused to go
        for (std::size_t i : stale)
            if (!erase_on_child(i, key)) still.push_back(i);
        if (!still.empty()) {
            lock.lock();
            index_.add_stale(key, still);
            lock.unlock();
        }
        if (!home) return false;
        return children_.visit(*home, [&](auto& c) { return c.erase(key); });
    }
    /// True when a child holds a committed copy of `key` (a first write still in flight does
    /// not count). A key unknown to the index is looked up in the children and adopted.
    [[nodiscard]] bool contains(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = find_entry(key);
        return it != index_.end() && it->second.home.has_value();
    }
    /// The size in bytes of the committed blob of `key`, or std::nullopt (same lookup as
    /// contains()).
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = find_entry(key);
        if (it == index_.end() || !it->second.home) return std::nullopt;
        return it->second.size;
    }
    /// options.capacity, or the sum of the children's capacities when smaller (SIZE_MAX when
    /// unbounded).
    [[nodiscard]] std::size_t capacity() const {
        return std::min(sum_children([](auto& c) { return std::size_t{c.capacity()}; }),
                        options_.capacity);
    }
    /// Sum of the children's used bytes (blobs written through this tier or found in the
    /// children; a child shared with other users counts theirs too).
    [[nodiscard]] std::size_t used() const {
        return sum_children([](auto& c) { return std::size_t{c.used()}; });
    }
    /// The virtual tier's own operations, issue to completion.
    [[nodiscard]] tier_stats stats() const { return stats_.snapshot(); }
    /// options.name.
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

    // ---- Beyond the concept ----------------------------------------------------------------
    /// The number of children (fixed for the tier's life).
    [[nodiscard]] std::size_t child_count() const noexcept { return slots_.size(); }
    /// Child I (compile-time form).
    // clang-format off
    template <std::size_t I>
        requires(!runtime_list)
    auto& child() noexcept {
        return children_.template get<I>();
    }
    /// Child i (run-time list). Throws std::out_of_range.
    auto& child(std::size_t i)
        requires runtime_list
    {
        return children_.at(i);
    }
    // clang-format on
    /// The locks guarding child i's reads and writes.
    path_locks<LockPolicy>& locks(std::size_t i) { return slots_.at(i)->locks; }

    /// The child a key is placed on (the target of a write in flight, else where it is).
    [[nodiscard]] std::optional<std::size_t> child_of(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = find_entry(key);
        if (it == index_.end()) return std::nullopt;
        return it->second.placed();
    }
    /// Per-child figures: bytes moved, bandwidth estimates, weights, keys, health.
    [[nodiscard]] std::vector<child_report> report() const {
        std::lock_guard lock(mutex_);
        const auto w = weights();
        std::vector<child_report> out;
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            auto& s = *slots_[i];
            out.push_back({.index = i,
                           .name = s.name,
                           .health = s.health,
                           .fault = s.fault,
                           .keys = index_.keys_on(i),
                           .bytes = index_.bytes_on(i),
                           .read_bandwidth = s.est[rd].bytes_per_second(),
                           .write_bandwidth = s.est[wr].bytes_per_second(),
                           .weight = w[i],
                           .moved = s.moved.snapshot()});
        }
        return out;
    }
    /// The ideal share of `count` keys of one size for each child now, as split_by_bandwidth
    /// gives it (0 for degraded children). A guide, not the rule: placement balances the
    /// children's finish times in bytes (see the header comment), which for keys of one size
    /// ends at these counts or at a split of whole keys whose pass ends no later.
    [[nodiscard]] std::vector<std::size_t> target_split(std::size_t count) const {
        std::lock_guard lock(mutex_);
        std::vector<double> w = weights();
        for (std::size_t i = 0; i < slots_.size(); ++i)
            if (slots_[i]->health != child_health::healthy) w[i] = 0;
        if (std::all_of(w.begin(), w.end(), [](double x) { return x == 0; }))
            return std::vector<std::size_t>(w.size(), 0);
        return split_by_bandwidth(count, w);
    }
    /// Marks child i healthy again (after the operator fixed the path).
    void restore(std::size_t i) {
        std::lock_guard lock(mutex_);
        auto& s = *slots_.at(i);
        s.health = child_health::healthy;
        s.fault.clear();
    }

private:
    // validate_key() with the tier's name in front of its message: "<name>: key '...' ...",
    // as the children say it (the name is added only when the key is refused).
    void check_key(std::string_view key) const {
        try {
            validate_key(key);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(options_.name + ": " + e.what());
        }
    }

    // The saturating sum of f(child) over the children.
    template <class F>
    std::size_t sum_children(F f) const {
        std::size_t total = 0;
        for (std::size_t i = 0; i < slots_.size(); ++i)
            total = detail::saturating_add(total, children_.visit(i, f));
        return total;
    }

    // Validates every key, then submits all requests under one lock and wakes the workers.
    template <class Request, class Submit>
    std::vector<io_completion> submit_batch(std::span<const Request> requests, Submit submit) {
        for (auto& r : requests) check_key(r.key);
        std::vector<io_completion> out;
        out.reserve(requests.size());
        {
            std::lock_guard lock(mutex_);
            for (auto& r : requests) out.push_back(submit(r));
        }
        queue_.notify_all();
        return out;
    }
    enum : std::size_t { rd = 0, wr = 1 };

    struct slot {
        slot(std::string child_name, std::string_view lock_name, const lock_options& opts,
             double window_seconds)
            : name(std::move(child_name)),
              locks(lock_name, opts),
              est{bandwidth_estimate(window_seconds), bandwidth_estimate(window_seconds)} {}
        std::string name;
        path_locks<LockPolicy> locks;
        stats_recorder moved;
        // Guarded by the tier's mutex_:
        double given = 0;                       // bandwidth from the options (0 when probed)
        std::array<bandwidth_estimate, 2> est;  // [read, write], bytes per second
        // [read, write]: the snapshots est has taken in so far, the child's and the tier's own
        // (of seen_x[d] only direction d's fields count).
        std::array<tier_stats, 2> seen_child{}, seen_moved{};
        child_health health = child_health::healthy;
        std::string fault;
        std::size_t pending = 0;  // bytes of writes headed to this child
    };

    struct operation {
        operation(io_direction d, std::string_view k, std::size_t n, std::size_t c)
            : dir(d), key(k), nbytes(n), child(c) {}
        io_direction dir;
        std::string key;
        std::span<const std::byte> in;
        std::span<std::byte> out;
        std::size_t nbytes = 0;
        std::size_t child = 0;
        detail::write_failures failures;  // children that failed this write
        completion_source done;
    };

    static std::size_t dir_index(io_direction dir) noexcept {
        return dir == io_direction::read ? rd : wr;
    }
    // The queue's index of the lock an operation needs: add_lock() order in start().
    struct lock_index {
        std::size_t operator()(const operation& op) const noexcept {
            return 2 * op.child + dir_index(op.dir);
        }
    };

    // ---- set-up ----
    void start() {
        const std::size_t n = children_.size();
        const std::string& nm = options_.name;
        detail::check_options(options_, n);
        slots_.reserve(n);
        index_ = detail::key_index(n);
        for (std::size_t i = 0; i < n; ++i) {
            std::string child_name =
                children_.visit(i, [](auto& c) { return std::string(c.name()); });
            std::string lock_name =
                options_.lock_names.empty() ? nm + "." + std::to_string(i) : options_.lock_names[i];
            slots_.push_back(std::make_unique<slot>(std::move(child_name), lock_name,
                                                    options_.locks,
                                                    options_.bandwidth_window_seconds));
            if (!options_.bandwidths.empty()) slots_[i]->given = options_.bandwidths[i];
            (void)queue_.add_lock(slots_[i]->locks.read_lock);   // lock_index: 2 * i + rd
            (void)queue_.add_lock(slots_[i]->locks.write_lock);  // lock_index: 2 * i + wr
        }
        if (options_.bandwidths.empty()) probe();
        // The estimates take in the children's stats() from here on: the probe's transfers
        // are in already, and what earlier users of a child moved is not this tier's.
        for (std::size_t i = 0; i < n; ++i) {
            const tier_stats now = child_stats(i);
            slots_[i]->seen_child = {now, now};
        }
        std::size_t workers = options_.workers ? options_.workers : 2 * n;
        queue_.set_workers(workers, options_.poll_interval);
        workers_.reserve(workers);
        for (std::size_t w = 0; w < workers; ++w)
            detail::name_thread(workers_.emplace_back([this] { work(); }), "spw-vtier");
    }

    /// Measures each child with writes and reads of probe_nbytes (less when the child
    /// has less room; a full child is not probed and gets no key until measured), under its
    /// locks (detail/bandwidth_probe.hpp). A child whose probe fails is marked degraded.
    void probe() {
        const std::vector<std::byte> pattern = detail::probe_pattern(options_.probe_nbytes);
        std::vector<std::byte> back(pattern.size());
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            auto& s = *slots_[i];
            auto fault = children_.visit(i, [&](auto& c) {
                return detail::probe_child(c, s.locks, std::span(pattern), std::span(back),
                                           [&](io_direction dir, double rate, double busy) {
                                               s.est[dir_index(dir)].add(rate, busy);
                                           });
            });
            if (fault) degrade(s, "bandwidth probe failed: " + *fault);
        }
    }

    // ---- placement (all under mutex_) ----
    /// The placement weight of every child (detail::placement_weights).
    std::vector<double> weights() const {
        std::vector<detail::child_bandwidth> figures(slots_.size());
        for (std::size_t i = 0; i < slots_.size(); ++i)
            figures[i] = {.given = slots_[i]->given,
                          .read = slots_[i]->est[rd].bytes_per_second(),
                          .write = slots_[i]->est[wr].bytes_per_second()};
        return detail::placement_weights(figures);
    }

    /// The child a write of `key` (`nbytes`) should go to, avoiding `exclude`; nullopt when
    /// no healthy child with room is left (placement_mode::striped: the key's striped child
    /// when eligible; else detail::place_key: by finish time, in bytes).
    std::optional<std::size_t> place(std::string_view key, std::size_t nbytes,
                                     const detail::key_entry* current,
                                     const std::vector<std::size_t>& exclude) {
        const std::size_t n = slots_.size();
        const auto w = weights();
        std::vector<detail::placement_child> children(n);
        for (std::size_t i = 0; i < n; ++i) {
            children[i].bytes = index_.bytes_on(i);
            children[i].weight = w[i];
            if (slots_[i]->health != child_health::healthy) continue;
            if (std::find(exclude.begin(), exclude.end(), i) != exclude.end()) continue;
            std::size_t old = current && current->home == i ? current->size : 0;
            auto [child_cap, child_used] = children_.visit(i, [](auto& c) {
                return std::pair<std::size_t, std::size_t>(c.capacity(), c.used());
            });
            children[i].eligible = detail::has_room(
                {.capacity = child_cap, .used = child_used, .pending = slots_[i]->pending}, old,
                nbytes);
        }
        if (options_.placement == placement_mode::striped)
            if (const auto home = detail::striped_child(key, n); home && children[*home].eligible)
                return home;
        if (!current) return detail::place_key(children, nbytes, std::nullopt);
        return detail::place_key(children, nbytes, current->placed(), current->counted_size());
    }

    // ---- submission (under mutex_) ----
    io_completion submit_write(std::string_view key, std::span<const std::byte> bytes) {
        stats_.begin(io_direction::write);
        auto it = index_.find(key);
        const detail::key_entry* current = it == index_.end() ? nullptr : &it->second;
        std::size_t old = current && current->home ? current->size : 0;
        std::size_t used_now = used(), cap = capacity();
        std::size_t after = detail::saturating_add(used_now - std::min(used_now, old),
                                                   detail::saturating_add(pending_, bytes.size()));
        if (after > cap) {
            stats_.end(io_direction::write, bytes.size(), false);
            return io_completion::failed(std::make_exception_ptr(
                std::system_error(ENOSPC, std::generic_category(),
                                  write_label(key, bytes.size()) + " exceeds the capacity of " +
                                      bytes_str(cap) + " (" + bytes_str(used_now) + " used, " +
                                      bytes_str(pending_) + " being written)")));
        }
        auto target = place(key, bytes.size(), current, {});
        if (!target) {
            stats_.end(io_direction::write, bytes.size(), false);
            return io_completion::failed(std::make_exception_ptr(std::system_error(
                ENOSPC, std::generic_category(),
                write_label(key, bytes.size()) + ": no healthy child has room for it (capacity " +
                    bytes_str(cap) + ", " + bytes_str(used_now) + " used)" + health_summary())));
        }
        pending_ += bytes.size();
        index_.start_write(key, *target, bytes.size());
        auto op = std::make_unique<operation>(io_direction::write, key, bytes.size(), *target);
        op->in = bytes;
        slots_[op->child]->pending += op->nbytes;
        return enqueue(std::move(op));
    }

    io_completion submit_read(std::string_view key, std::span<std::byte> bytes) {
        stats_.begin(io_direction::read);
        auto it = find_entry(key);
        auto fail = [&](std::exception_ptr e) {
            stats_.end(io_direction::read, bytes.size(), false);
            return io_completion::failed(std::move(e));
        };
        if (it == index_.end() || !it->second.home)
            return fail(std::make_exception_ptr(std::system_error(
                ENOENT, std::generic_category(),
                options_.name + ": read of key " + spillway::quoted(key) + ": no such key")));
        if (it->second.size != bytes.size())
            return fail(std::make_exception_ptr(std::invalid_argument(
                options_.name + ": read of key " + spillway::quoted(key) + " into a buffer of " +
                bytes_str(bytes.size()) + ", but the blob has " + bytes_str(it->second.size))));
        auto op =
            std::make_unique<operation>(io_direction::read, key, bytes.size(), *it->second.home);
        op->out = bytes;
        return enqueue(std::move(op));
    }

    io_completion enqueue(std::unique_ptr<operation> op) {
        auto handle = op->done.handle();
        queue_.push_back(std::move(op));
        return handle;
    }

    /// Finds the key in the index, or adopts it from the first child that holds it (never
    /// from a child whose copy is stale).
    detail::key_index::iterator find_entry(std::string_view key) const {
        auto it = index_.find(key);
        if (it != index_.end()) return it;
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            if (index_.is_stale(key, i)) continue;
            auto size = children_.visit(i, [&](auto& c) -> std::optional<std::size_t> {
                try {
                    return c.size_of(key);
                } catch (...) {
                    return std::nullopt;
                }
            });
            if (size) return index_.adopt(key, *size, i);
        }
        return index_.end();
    }

    std::string health_summary() const {
        std::string s;
        for (std::size_t i = 0; i < slots_.size(); ++i)
            if (slots_[i]->health == child_health::degraded)
                s += std::string("; child ") + std::to_string(i) + " (" +
                     spillway::quoted(slots_[i]->name) + ") is degraded: " + slots_[i]->fault;
        return s;
    }

    // "<tier>: write of key '<key>' (<n> bytes)", the start of a write's error messages.
    std::string write_label(std::string_view key, std::size_t nbytes) const {
        return options_.name + ": write of key " + spillway::quoted(key) + " (" +
               bytes_str(nbytes) + ")";
    }

    // Marks the child degraded, keeping the first fault (under mutex_).
    static void degrade(slot& s, std::string fault) {
        if (s.health != child_health::healthy) return;
        s.health = child_health::degraded;
        s.fault = std::move(fault);
    }

    std::string child_label(std::size_t i) const {
        return std::string("child ") + std::to_string(i) + " (" +
               spillway::quoted(slots_[i]->name) + ")";
    }

    /// The stats() of child i.
    tier_stats child_stats(std::size_t i) const {
        return children_.visit(i, [](auto& c) { return tier_stats(c.stats()); });
    }

    /// Adds the transfers of direction `dir` on child i since the last update to its moving
    /// average (under mutex_): as the child's stats() count them (bytes over busy seconds),
    /// or, when the child counted none of them, as the tier timed its calls to the child.
    /// The child's count is the path's own (a throttle counts issue to release, without this
    /// tier's queueing), and a test child that reports a bandwidth it is told to makes the
    /// adaptation exact on any machine.
    void update_estimate(std::size_t i, io_direction dir) {
        if (options_.placement != placement_mode::adaptive) return;
        auto& s = *slots_[i];
        const std::size_t d = dir_index(dir);
        const tier_stats child = child_stats(i), moved = s.moved.snapshot();
        auto sample = [&](const tier_stats& now, const tier_stats& then) {
            const auto rate = detail::rate_of(now.since(then), dir);
            if (rate) s.est[d].add(rate->first, rate->second);
            return rate.has_value();
        };
        if (!sample(child, s.seen_child[d]) && !sample(moved, s.seen_moved[d])) return;
        s.seen_child[d] = child;
        s.seen_moved[d] = moved;
    }

    // ---- workers ----
    // Worker loop (protocol steps 3-4 in docs/design.md).
    void work() {
        std::unique_lock lock(mutex_);
        for (;;) {
            auto [op, lock_error] = queue_.take(lock);
            if (!op) return;
            if (lock_error) {
                if (op->dir == io_direction::write) slots_[op->child]->pending -= op->nbytes;
                fail_op(*op, lock_error, lock);
                continue;
            }
            lock.unlock();
            run(std::move(op), lock);  // returns with `lock` held, and the child lock released
            queue_.notify_all();       // a child lock was released: waiting operations may go
        }
    }

    // Completes a failed operation (called with mutex_ held, keeps it held).
    void fail_op(operation& op, std::exception_ptr error, std::unique_lock<std::mutex>& lock) {
        if (op.dir == io_direction::write) {
            index_.revert_write(op.key);
            pending_ -= op.nbytes;
        }
        lock.unlock();
        stats_.end(op.dir, op.nbytes, false);
        op.done.fail(std::move(error));
        lock.lock();
    }

    // Runs one operation whose child lock is held; returns with `lock` (mutex_) held.
    void run(std::unique_ptr<operation> owned, std::unique_lock<std::mutex>& lock) {
        operation& op = *owned;
        auto& s = *slots_[op.child];
        s.moved.begin(op.dir);
        std::exception_ptr error;
        std::size_t n = 0;
        try {
            if (op.dir == io_direction::write)
                n = children_.visit(op.child, [&](auto& c) { return c.write(op.key, op.in); })
                        .wait();
            else
                n = children_.visit(op.child, [&](auto& c) { return c.read(op.key, op.out); })
                        .wait();
        } catch (...) {
            error = std::current_exception();
        }
        s.moved.end(op.dir, op.nbytes, !error);
        lock.lock();
        queue_.release(op);
        if (op.dir == io_direction::write) s.pending -= op.nbytes;
        if (!error) {
            update_estimate(op.child, op.dir);
            if (op.dir == io_direction::read) return succeed(op, n, lock);
            // Also when the key was erased meanwhile: the write wins. This write replaced a
            // stale copy on its child, if there was one.
            const auto old = index_.commit_write(op.key, op.child, op.nbytes);
            lock.unlock();
            const bool old_gone = !old || *old == op.child || erase_on_child(*old, op.key);
            lock.lock();
            if (!old_gone) index_.add_stale(op.key, {*old});  // the index no longer points there
            pending_ -= op.nbytes;
            return succeed(op, n, lock);
        }
        if (op.dir == io_direction::read) {
            auto wrapped = wrap_read_error(op, error);
            if (detail::errno_of(error) == ENOENT) index_.forget_vanished(op.key, op.child);
            return fail_op(op, wrapped, lock);
        }
        // A failed write: degrade the child and try another (protocol step 6, docs/design.md).
        // An error other than an I/O failure (e.g. a bad argument) ends the write at once.
        const auto what = op.failures.record(op.child, child_label(op.child), error);
        if (!what) return fail_op(op, error, lock);
        degrade(s, *what);
        auto it = index_.find(op.key);
        const detail::key_entry* current = it == index_.end() ? nullptr : &it->second;
        auto next = place(op.key, op.nbytes, current, op.failures.tried());
        if (!next) return fail_op(op, op.failures.exhausted(write_label(op.key, op.nbytes)), lock);
        index_.retarget(op.key, *next);
        op.child = *next;
        slots_[op.child]->pending += op.nbytes;
        queue_.push_front(std::move(owned));  // back to the front: it keeps its turn
    }

    void succeed(operation& op, std::size_t n, std::unique_lock<std::mutex>& lock) {
        lock.unlock();
        stats_.end(op.dir, n, true);
        op.done.succeed(n);
        lock.lock();
    }

    // Erases the copy of `key` on child i; false when the child refused (it threw).
    bool erase_on_child(std::size_t i, std::string_view key) noexcept {
        try {
            children_.visit(i, [&](auto& c) { return c.erase(key); });
            return true;
        } catch (...) {
            return false;
        }
    }

    // The read's error with the key and the child in front; an I/O error (other than ENOENT)
    // degrades the child. Other kinds of error pass through unchanged.
    std::exception_ptr wrap_read_error(const operation& op, std::exception_ptr error) {
        auto& s = *slots_[op.child];
        std::string where = options_.name + ": read of key " + spillway::quoted(op.key) + " (" +
                            bytes_str(op.nbytes) + ") from " + child_label(op.child);
        try {
            std::rethrow_exception(error);
        } catch (const std::system_error& e) {
            if (e.code().value() != ENOENT) degrade(s, e.what());
            if (s.health == child_health::degraded) where += ", which is degraded,";
        } catch (const std::invalid_argument&) {
        } catch (...) {
            return error;
        }
        return spillway::with_context(std::move(error), where + " failed");
    }

    virtual_tier_options options_;
    mutable children_type children_;
    std::vector<std::unique_ptr<slot>> slots_;
    mutable std::mutex mutex_;  // guards everything below but stats_ and workers_
    mutable detail::key_index index_;
    detail::lock_queue<operation, LockPolicy, lock_index> queue_;
    std::size_t pending_ = 0;  // bytes of writes submitted and not finished
    stats_recorder stats_;
    std::vector<std::thread> workers_;  // last: started once everything else exists
};

static_assert(storage_tier<virtual_tier<null_lock, host_tier, host_tier&>>);
static_assert(storage_tier<virtual_tier<thread_lock, std::vector<host_tier>>>);

}  // namespace spillway
