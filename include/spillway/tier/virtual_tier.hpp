/// @file
/// spillway/tier/virtual_tier.hpp: one storage tier over several child tiers (storage
/// paths), used together in proportion to their bandwidth, with node-level concurrency
/// control and fail-over.
///
/// Two ways to name the children, both without boilerplate:
///   virtual_tier<node_lock, file_tier<>, throttled_tier<file_tier<>>> vt(opts,
///       child_args("/nvme/ckpt"), child_args(limit, std::in_place, "/pfs/ckpt"));  // built in place
///   virtual_tier<node_lock, host_tier&, host_tier&> vt(opts, a, b);               // borrowed
///   virtual_tier<thread_lock, std::vector<file_tier<>>> vt(opts, paths);           // run-time list
/// The vector form takes any range whose elements construct one child each (an argument, or
/// a child_args tuple), a count and a factory, or a vector of unique_ptr children.
///
/// Guarantees (the storage_tier contract of storage_tier.hpp holds, plus):
///  - Placement. Each key lives on one child. When a key is written, the number of keys each
///    child should hold is n_i = N * B_i / sum_j B_j with largest-remainder rounding
///    (split_by_bandwidth), over the healthy children that have room for the blob. A key
///    stays where it is while its child is not above its share; otherwise it goes to the
///    child furthest below its share. B_i comes from options.bandwidths (bytes per second, or
///    any ratio) or, when none are given, from a probe at construction (per child, one
///    warm-up and three timed writes and reads of probe_nbytes, erased afterwards). A child of bandwidth 0 gets no key.
///  - Adaptation (placement_mode::adaptive, the default). The tier times every transfer it
///    makes to each child and keeps a moving average of each child's read and write
///    bandwidth (bytes over busy time, each sample weighted by 1 - exp(-busy / window), so a
///    burst that finishes at once barely counts). A child's placement weight is
///    1 / (1/read + 1/write) once both are known, else the one known; a child not measured
///    yet keeps its given bandwidth scaled by the measured-over-given ratio of the others.
///    A rewrite is the move: no extra I/O is done, and the old copy is erased only after the
///    new write completed (a failure before that leaves the old copy in place).
///  - Concurrency control. Every transfer to child i runs under the lock policy: the read
///    lock of child i for reads, its write lock for writes (path_locks: names
///    "<lock name>.read" and "<lock name>.write", lock name options.lock_names[i] or
///    "<name>.<i>"). With node_lock, at most one process of the node reads, and one writes,
///    a child at a time. Operations wait in one queue; a worker takes the first queued
///    operation whose child lock it can take with try_lock(), so a worker that finds a child
///    busy serves another key from a free child first (write_batch / read_batch submit many
///    at once). When nothing can be taken, a worker sleeps in the lock() of a queued
///    operation's lock that no worker of this tier holds (so it is held outside the tier,
///    e.g. by another process): the release wakes it at once, with no polling. One worker
///    sleeps per lock and one always stays awake; it polls with a back-off up to
///    options.poll_interval, and a worker's release of a lock wakes it.
///  - Fail-over. A write that fails on a child with std::system_error (EIO, ENOSPC, ...) marks
///    that child degraded (no new keys go there) and is written to another child; nothing is
///    lost while the caller's buffer is intact. Only when every usable child failed does the
///    write fail, naming the key, the size and each child's error. A read whose only copy is
///    on a child that fails raises an error naming the key and the child (and marks the child
///    degraded unless the error is ENOENT or a size mismatch). restore(i) clears the mark.
///    A read that finds the key's file gone from its child (ENOENT) makes the tier forget
///    the key, as the child did.
///  - Stale copies. When a rewrite moved a key and the old child refuses to erase the old
///    copy (a child gone read-only), that copy is remembered as stale: it is never adopted
///    back (contains(), size_of(), reads), a later write of the key to that child replaces
///    it, and erase(key) and the destructor try to erase it again. used() counts it while
///    it lasts. A new virtual tier over the same children cannot tell such a copy from the
///    current one; restore the child's writability before reopening.
///  - Statistics: stats() counts the virtual tier's own operations (issue to completion);
///    report() gives, per child, the bytes and operations the virtual tier moved to and from
///    it, its bandwidth estimates, weight, key count and health.
///  - The index of keys lives in memory. A key the index does not know is looked up in the
///    children (contains()), so blobs a persistent child already held are found and adopted.
///  - Destruction finishes every queued operation, then joins the workers.
///
/// Operation protocol:
///  1. write()/read() validate the key (std::invalid_argument, thrown at once). A write picks
///     its child now (placement above) and counts the key there; a read takes the key's
///     current child, or fails at once (ENOENT, size mismatch) through its completion.
///  2. The operation joins the queue and a worker is woken.
///  3. A worker scans the queue in order and takes the first operation whose child lock
///     (read or write) try_lock() grants. If none: it picks the first queued operation whose
///     lock no worker of this tier holds or sleeps on, sleeps in that lock's lock(), and
///     then takes the first operation still queued on that lock (releasing the lock if
///     none is left); when every such lock is taken care of, or it is the last worker
///     awake, it waits on the queue (back-off poll, woken by the tier's own releases).
///  4. The worker runs the child's read or write and waits for it, then releases the lock
///     and wakes the others.
///  5. Write success: the index points the key at the new child, then the old copy (on
///     another child) is erased, then the completion becomes ready. Write failure: step 6.
///     Read: the completion becomes ready with the bytes or the wrapped error.
///  6. The failed child is marked degraded; the placement is recomputed without the children
///     already tried; the operation goes back to the front of the queue with the new child
///     (step 3), or fails when no child is left.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

#include "spillway/detail/thread_name.hpp"
#include "spillway/error.hpp"
#include "spillway/lock/lock_policy.hpp"
#include "spillway/tier/bandwidth_split.hpp"
#include "spillway/tier/host_tier.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway {

/// Arguments of one child, built in place by the virtual tier: child_args(path, options).
/// @return the arguments, decayed and copied into a tuple (so temporaries may be passed)
template <class... Args>
std::tuple<std::decay_t<Args>...> child_args(Args&&... args) {
    return std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...);
}

/// Whether placement follows measured bandwidth or stays with the initial figures.
enum class placement_mode {
    adaptive,  ///< weights follow the moving averages of measured bandwidth (the default)
    fixed,     ///< weights stay the given (or probed) bandwidths
};

/// A child's condition as the virtual tier sees it.
enum class child_health {
    healthy,   ///< receives new keys
    degraded,  ///< a write or read failed there: no new keys until restore()
};

/// Settings of a virtual_tier, checked eagerly by its constructor.
struct virtual_tier_options {
    /// The tier's name in messages and reports, and the prefix of the default lock names.
    std::string name = "virtual";
    /// Bandwidth of each child (bytes per second, or any ratio); empty: probe at construction.
    std::vector<double> bandwidths{};
    /// Whether placement follows measured bandwidth (adaptive) or keeps the initial figures.
    placement_mode placement = placement_mode::adaptive;
    /// Time constant of the bandwidth moving average, in seconds of busy time: long enough
    /// to average a few transfers delayed by a busy machine, short enough to follow a path
    /// that slows down within one pass over the keys.
    double bandwidth_window_seconds = 0.5;
    /// Bytes of each probe transfer at construction (one warm-up and three timed writes, then
    /// reads, per child).
    std::size_t probe_nbytes = std::size_t{1} << 20;
    /// The most bytes of blobs the virtual tier holds at once (SIZE_MAX: the children's sum).
    std::size_t capacity = std::numeric_limits<std::size_t>::max();
    /// Worker threads; 0: two per child (one reader and one writer each).
    std::size_t workers = 0;
    /// Where named lock policies keep their files (node_lock).
    lock_options locks{};
    /// The lock name of each child (empty: `"<name>.<index>"`); one entry per child when
    /// given. Processes that share a path must use one name for it.
    std::vector<std::string> lock_names{};
    /// Longest wait between scans of the queue for the one worker that stays awake when every
    /// wanted child lock is taken (the others sleep in the locks held outside the tier).
    std::chrono::microseconds poll_interval{500};
};

/// One child as report() shows it.
struct child_report {
    std::size_t index = 0;         ///< position among the children
    std::string name;              ///< the child's name()
    child_health health = child_health::healthy;  ///< degraded after a failure, until restore()
    std::string fault;             ///< the error that degraded the child, if any
    std::size_t keys = 0;          ///< keys placed on the child (including writes in flight)
    double read_bandwidth = 0;     ///< moving average, bytes per second (0: not measured yet)
    double write_bandwidth = 0;    ///< moving average, bytes per second (0: not measured yet)
    double weight = 0;             ///< placement weight now (bytes per second, or the given ratio)
    tier_stats moved{};            ///< transfers the virtual tier made to and from the child
};

/// One write of a batch; the caller keeps `bytes` alive until its completion is ready.
struct write_request {
    std::string_view key;               ///< validated like any key; copied at submission
    std::span<const std::byte> bytes;   ///< the blob to store
};
/// One read of a batch; the caller keeps `bytes` alive until its completion is ready.
struct read_request {
    std::string_view key;          ///< validated like any key; copied at submission
    std::span<std::byte> bytes;    ///< receives the blob; its size must equal size_of(key)
};

namespace detail {

template <class T>
inline constexpr bool is_std_tuple_v = false;
template <class... A>
inline constexpr bool is_std_tuple_v<std::tuple<A...>> = true;
template <class T>
concept std_tuple = is_std_tuple_v<std::remove_cvref_t<T>>;

template <class T>
inline constexpr bool is_std_vector_v = false;
template <class T, class A>
inline constexpr bool is_std_vector_v<std::vector<T, A>> = true;

/// An owned child, built in place from a tuple of constructor arguments.
template <class T>
class vt_child_box {
public:
    vt_child_box()
        requires std::default_initializable<T>
    = default;
    template <std_tuple Tuple>
    explicit vt_child_box(Tuple&& args) : tier_(std::make_from_tuple<T>(std::forward<Tuple>(args))) {}
    T& get() noexcept { return tier_; }

private:
    T tier_;
};
/// A borrowed child: the caller keeps it alive longer than the virtual tier.
template <class T>
class vt_child_box<T&> {
public:
    explicit vt_child_box(T& tier) noexcept : tier_(&tier) {}
    T& get() noexcept { return *tier_; }

private:
    T* tier_;
};

template <class C>
inline constexpr tier_properties vt_child_properties = std::remove_reference_t<C>::properties;

/// Compile-time heterogeneous children.
template <class... C>
class vt_children {
public:
    static constexpr tier_properties properties{
        .persistent = (vt_child_properties<C>.persistent && ...),
        .direct_io = (vt_child_properties<C>.direct_io && ...),
        .host_accessible = (vt_child_properties<C>.host_accessible && ...)};

    vt_children() = default;
    template <class... A>
    explicit vt_children(std::in_place_t, A&&... a) : boxes_(std::forward<A>(a)...) {}

    [[nodiscard]] static constexpr std::size_t size() noexcept { return sizeof...(C); }

    /// Calls f(child i) and returns its result.
    template <class F>
    decltype(auto) visit(std::size_t i, F&& f) {
        return visit_impl(i, f, std::index_sequence_for<C...>{});
    }

    template <std::size_t I>
    auto& get() noexcept {
        return std::get<I>(boxes_).get();
    }

private:
    template <class F, std::size_t... I>
    decltype(auto) visit_impl(std::size_t i, F& f, std::index_sequence<I...>) {
        using R = std::common_type_t<std::invoke_result_t<F&, std::remove_reference_t<C>&>...>;
        using fn = R (*)(vt_children&, F&);
        static constexpr fn table[] = {+[](vt_children& self, F& g) -> R { return g(self.template get<I>()); }...};
        return table[i](*this, f);
    }
    std::tuple<vt_child_box<C>...> boxes_;
};

/// A run-time list of children of one type.
template <class C>
class vt_children<std::vector<C>> {
public:
    static constexpr tier_properties properties = C::properties;

    explicit vt_children(std::vector<std::unique_ptr<C>> owned) : owned_(std::move(owned)) {
        for (std::size_t i = 0; i < owned_.size(); ++i)
            expect_argument(owned_[i] != nullptr, std::string("virtual_tier: child ") + std::to_string(i) + " is a null pointer");
    }
    [[nodiscard]] std::size_t size() const noexcept { return owned_.size(); }
    template <class F>
    decltype(auto) visit(std::size_t i, F&& f) {
        return f(*owned_[i]);
    }
    C& at(std::size_t i) { return *owned_.at(i); }

private:
    std::vector<std::unique_ptr<C>> owned_;
};

template <class... C>
inline constexpr bool vt_runtime_list_v = false;
template <class C>
inline constexpr bool vt_runtime_list_v<C> = is_std_vector_v<C>;

template <class C>
inline constexpr bool vt_valid_child_v = storage_tier<std::remove_reference_t<C>>;
template <class C, class A>
inline constexpr bool vt_valid_child_v<std::vector<C, A>> = storage_tier<C>;

/// The child type of the run-time list form; a placeholder for the compile-time form.
struct vt_not_a_list {};
template <class... C>
struct vt_list_child {
    using type = vt_not_a_list;
};
template <class C, class A>
struct vt_list_child<std::vector<C, A>> {
    using type = C;
};

inline std::size_t saturating_add(std::size_t a, std::size_t b) noexcept {
    return a > std::numeric_limits<std::size_t>::max() - b ? std::numeric_limits<std::size_t>::max() : a + b;
}

}  // namespace detail

/// One storage_tier over several child tiers (storage paths), with bandwidth-proportional
/// placement, per-path locks and fail-over; the guarantees and the operation protocol are in
/// the file comment.
///
/// Thread-safe: any member may be called from any thread; operations on different keys run
/// concurrently on a pool of workers. Not copyable, not movable (the workers point at it).
/// @tparam LockPolicy a lock_policy guarding each child's reads and writes (node_lock across
///         processes, thread_lock within one, null_lock for none)
/// @tparam Children   either one or more storage_tier types (a reference type borrows a
///         child the caller keeps alive), or one `std::vector<T>` of a storage_tier T for a
///         list fixed at run time
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
        : options_(std::move(options)), children_(build_list(std::forward<R>(args))) {
        start();
    }
    /// Run-time list: `count` children, child i built from the prvalue factory(i).
    template <class Factory>
        requires runtime_list && std::invocable<Factory&, std::size_t>
    virtual_tier(virtual_tier_options options, std::size_t count, Factory factory)
        : options_(std::move(options)), children_(build_count(count, factory)) {
        start();
    }
    /// Run-time list: children built by the caller.
    virtual_tier(virtual_tier_options options, std::vector<std::unique_ptr<list_child>> owned)
        requires runtime_list
        : options_(std::move(options)), children_(std::move(owned)) {
        start();
    }

    /// Owns threads and locks: not copyable.
    virtual_tier(const virtual_tier&) = delete;
    /// Owns threads and locks: not copyable.
    virtual_tier& operator=(const virtual_tier&) = delete;

    /// Finishes every queued operation, then joins the workers; owned children are destroyed
    /// after that (borrowed ones are left to the caller).
    ~virtual_tier() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        for (auto& w : workers_) w.join();
        for (auto& [key, children] : stale_)
            for (std::size_t i : children) (void)erase_on_child(i, key);
    }

    // ---- storage_tier ----------------------------------------------------------------------
    /// Places `key` (see the header comment) and writes `bytes` there. Keep `bytes` alive and
    /// unchanged until the completion is ready. Throws std::invalid_argument for a bad key;
    /// other errors come from wait().
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        validate_key(key);
        std::unique_lock lock(mutex_);
        auto c = submit_write(key, bytes);
        lock.unlock();
        cv_.notify_one();
        return c;
    }

    /// Reads `key` from the child that holds it. bytes.size() must equal size_of(key).
    /// Errors through the completion: std::system_error(ENOENT) for an unknown key and
    /// std::invalid_argument for a size mismatch (both naming the key), or the child's error
    /// naming the key and the child.
    /// @throws std::invalid_argument at once for a bad key
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        validate_key(key);
        std::unique_lock lock(mutex_);
        auto c = submit_read(key, bytes);
        lock.unlock();
        cv_.notify_one();
        return c;
    }

    /// Submits many writes at once; completions come back in request order, but the
    /// operations run in the order their children's locks become free. Every key is
    /// validated before any is submitted.
    std::vector<io_completion> write_batch(std::span<const write_request> requests) {
        return submit_batch(requests, [this](const write_request& r) { return submit_write(r.key, r.bytes); });
    }
    /// Submits many reads at once (see write_batch).
    std::vector<io_completion> read_batch(std::span<const read_request> requests) {
        return submit_batch(requests, [this](const read_request& r) { return submit_read(r.key, r.bytes); });
    }

    /// Removes the key from the child that holds it. Must not race with an operation on the
    /// same key. Returns false if no child held it.
    bool erase(std::string_view key) {
        validate_key(key);
        std::unique_lock lock(mutex_);
        auto it = find_entry(key);
        std::optional<std::size_t> home;
        if (it != index_.end()) {
            home = it->second.home;
            if (auto placed = intended(it->second)) --slots_[*placed]->keys;
            index_.erase(it);
        }
        std::vector<std::size_t> stale;
        if (auto st = stale_.find(std::string(key)); st != stale_.end()) {
            stale = std::move(st->second);
            stale_.erase(st);
        }
        lock.unlock();
        std::vector<std::size_t> still;  // stale copies that again refused to go
        for (std::size_t i : stale)
            if (!erase_on_child(i, key)) still.push_back(i);
        if (!still.empty()) {
            lock.lock();
            auto& owed = stale_[std::string(key)];
            owed.insert(owed.end(), still.begin(), still.end());
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
        std::size_t total = 0;
        for (std::size_t i = 0; i < slots_.size(); ++i)
            total = detail::saturating_add(total, children_.visit(i, [](auto& c) { return std::size_t{c.capacity()}; }));
        return std::min(total, options_.capacity);
    }
    /// Sum of the children's used bytes (blobs written through this tier or found in the
    /// children; a child shared with other users counts theirs too).
    [[nodiscard]] std::size_t used() const {
        std::size_t total = 0;
        for (std::size_t i = 0; i < slots_.size(); ++i)
            total = detail::saturating_add(total, children_.visit(i, [](auto& c) { return std::size_t{c.used()}; }));
        return total;
    }
    /// The virtual tier's own operations, issue to completion.
    [[nodiscard]] tier_stats stats() const { return stats_.snapshot(); }
    /// options.name.
    [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

    // ---- Beyond the concept ----------------------------------------------------------------
    /// The number of children (fixed for the tier's life).
    [[nodiscard]] std::size_t child_count() const noexcept { return slots_.size(); }
    /// Child I (compile-time form).
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
    /// The locks guarding child i's reads and writes.
    path_locks<LockPolicy>& locks(std::size_t i) { return slots_.at(i)->locks; }

    /// The child a key is placed on (the target of a write in flight, else where it is).
    [[nodiscard]] std::optional<std::size_t> child_of(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = find_entry(key);
        if (it == index_.end()) return std::nullopt;
        return intended(it->second);
    }
    /// Per-child figures: bytes moved, bandwidth estimates, weights, keys, health.
    [[nodiscard]] std::vector<child_report> report() const {
        std::lock_guard lock(mutex_);
        std::vector<child_report> out;
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            auto& s = *slots_[i];
            child_report r;
            r.index = i;
            r.name = s.name;
            r.health = s.health;
            r.fault = s.fault;
            r.keys = s.keys;
            r.read_bandwidth = s.est[0];
            r.write_bandwidth = s.est[1];
            r.weight = weight(i);
            r.moved = s.moved.snapshot();
            out.push_back(std::move(r));
        }
        return out;
    }
    /// The share of `count` keys each child should hold now (0 for degraded children).
    [[nodiscard]] std::vector<std::size_t> target_split(std::size_t count) const {
        std::lock_guard lock(mutex_);
        std::vector<double> w(slots_.size());
        for (std::size_t i = 0; i < slots_.size(); ++i) w[i] = slots_[i]->health == child_health::healthy ? weight(i) : 0;
        if (std::all_of(w.begin(), w.end(), [](double x) { return x == 0; })) return std::vector<std::size_t>(w.size(), 0);
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

    // Validates every key, then submits all requests under one lock and wakes the workers.
    template <class Request, class Submit>
    std::vector<io_completion> submit_batch(std::span<const Request> requests, Submit submit) {
        for (auto& r : requests) validate_key(r.key);
        std::vector<io_completion> out;
        out.reserve(requests.size());
        {
            std::lock_guard lock(mutex_);
            for (auto& r : requests) out.push_back(submit(r));
        }
        cv_.notify_all();
        return out;
    }
    enum : std::size_t { rd = 0, wr = 1 };

    struct slot {
        slot(std::string child_name, std::string_view lock_name, const lock_options& opts)
            : name(std::move(child_name)), locks(lock_name, opts) {}
        std::string name;
        path_locks<LockPolicy> locks;
        stats_recorder moved;
        // Guarded by the tier's mutex_:
        double given = 0;        // bandwidth from the options (0 when probed)
        double est[2] = {0, 0};  // moving averages [read, write], bytes per second
        double avg[2] = {0, 0}, avg_weight[2] = {0, 0};  // behind est (see fold_sample)
        std::uint64_t seen_bytes[2] = {0, 0};
        double seen_busy[2] = {0, 0};
        child_health health = child_health::healthy;
        std::string fault;
        std::size_t keys = 0;
        std::size_t pending = 0;  // bytes of writes headed to this child
        std::size_t holders[2] = {0, 0};   // [read, write]: workers of this tier holding the lock
        bool awaited[2] = {false, false};  // a worker of this tier sleeps in its lock()
    };

    struct entry {
        std::size_t size = 0;
        std::optional<std::size_t> home;    // child holding the committed copy
        std::optional<std::size_t> target;  // child of the write in flight
    };

    struct operation {
        io_direction dir;
        std::string key;
        std::span<const std::byte> in;
        std::span<std::byte> out;
        std::size_t nbytes = 0;
        std::size_t child = 0;
        std::vector<std::size_t> tried;  // children that failed this write
        std::string failures;
        int last_errno = 0;
        completion_source done;
    };

    // ---- set-up ----
    template <class R>
    static std::vector<std::unique_ptr<list_child>> build_list(R&& args) {
        using C = list_child;
        std::vector<std::unique_ptr<C>> out;
        for (auto&& a : args) {
            if constexpr (detail::std_tuple<decltype(a)>) out.push_back(std::unique_ptr<C>(new C(std::make_from_tuple<C>(a))));
            else out.push_back(std::unique_ptr<C>(new C(a)));
        }
        return out;
    }
    template <class Factory>
    static std::vector<std::unique_ptr<list_child>> build_count(std::size_t count, Factory& f) {
        using C = list_child;
        std::vector<std::unique_ptr<C>> out;
        out.reserve(count);
        for (std::size_t i = 0; i < count; ++i) out.push_back(std::unique_ptr<C>(new C(f(i))));
        return out;
    }

    void start() {
        const std::size_t n = children_.size();
        const std::string& nm = options_.name;
        expect_argument(n >= 1, "virtual_tier " + spillway::quoted(nm) + ": needs at least one child");
        expect_argument(options_.bandwidths.empty() || options_.bandwidths.size() == n,
                        "virtual_tier " + spillway::quoted(nm) + ": " + std::to_string(options_.bandwidths.size()) +
                            " bandwidths given for " + std::to_string(n) + " children");
        if (!options_.bandwidths.empty()) (void)split_by_bandwidth(1, options_.bandwidths);  // validates the values
        expect_argument(options_.bandwidth_window_seconds > 0 && std::isfinite(options_.bandwidth_window_seconds),
                        "virtual_tier " + spillway::quoted(nm) + ": bandwidth_window_seconds must be positive");
        expect_argument(options_.lock_names.empty() || options_.lock_names.size() == n,
                        "virtual_tier " + spillway::quoted(nm) + ": " + std::to_string(options_.lock_names.size()) +
                            " lock names given for " + std::to_string(n) + " children");
        expect_argument(!options_.bandwidths.empty() || options_.probe_nbytes > 0,
                        "virtual_tier " + spillway::quoted(nm) + ": probe_nbytes must be positive when no bandwidths are given");
        slots_.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
            std::string child_name = children_.visit(i, [](auto& c) { return std::string(c.name()); });
            std::string lock_name = options_.lock_names.empty() ? nm + "." + std::to_string(i) : options_.lock_names[i];
            slots_.push_back(std::make_unique<slot>(std::move(child_name), lock_name, options_.locks));
            if (!options_.bandwidths.empty()) slots_[i]->given = options_.bandwidths[i];
        }
        if (options_.bandwidths.empty()) probe();
        std::size_t workers = options_.workers ? options_.workers : 2 * n;
        workers_.reserve(workers);
        for (std::size_t w = 0; w < workers; ++w) detail::name_thread(workers_.emplace_back([this] { work(); }), "spw-vtier");
    }

    /// Measures each child with writes and reads of probe_nbytes (less when the child
    /// has less room; a full child is not probed and gets no key until measured), under its
    /// locks. A child whose probe fails is marked degraded.
    void probe() {
        std::vector<std::byte> pattern(options_.probe_nbytes);
        for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>(i * 131 + 7);
        std::vector<std::byte> back(pattern.size());
        using clock = std::chrono::steady_clock;
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            auto& s = *slots_[i];
            auto [cap, used] =
                children_.visit(i, [](auto& c) { return std::pair<std::size_t, std::size_t>(c.capacity(), c.used()); });
            std::size_t room = cap - std::min(cap, used);
            // A rewrite may hold the old and the new copy for a moment: half the room at most.
            std::span<const std::byte> buf(pattern.data(), std::min(room / 2, pattern.size()));
            if (buf.empty()) continue;
            std::string key;
            for (int n = 0;; ++n) {
                key = std::string("spillway-probe-") + std::to_string(::getpid()) + "-" + std::to_string(n);
                if (!children_.visit(i, [&](auto& c) { return c.contains(key); })) break;
            }
            // One warm-up transfer, then `timed` timed ones each way: the warm-up absorbs first-
            // touch costs and a throttle's burst allowance, which would flatter one lone transfer.
            constexpr int timed = 3;
            auto secs = [](auto d) { return std::max(1e-9, std::chrono::duration<double>(d).count()); };
            try {
                clock::time_point t0;
                {
                    std::scoped_lock guard(s.locks.write_lock);
                    for (int r = 0; r <= timed; ++r) {
                        if (r == 1) t0 = clock::now();
                        children_.visit(i, [&](auto& c) { return c.write(key, buf); }).wait();
                    }
                }
                double busy = secs(clock::now() - t0);
                fold_sample(s, wr, static_cast<double>(timed * buf.size()) / busy, busy);
                {
                    std::scoped_lock guard(s.locks.read_lock);
                    for (int r = 0; r <= timed; ++r) {
                        if (r == 1) t0 = clock::now();
                        children_.visit(i, [&](auto& c) { return c.read(key, std::span(back).first(buf.size())); }).wait();
                    }
                }
                busy = secs(clock::now() - t0);
                fold_sample(s, rd, static_cast<double>(timed * buf.size()) / busy, busy);
                children_.visit(i, [&](auto& c) { return c.erase(key); });
            } catch (const std::exception& e) {
                s.health = child_health::degraded;
                s.fault = std::string("bandwidth probe failed: ") + e.what();
                children_.visit(i, [&](auto& c) {
                    try {
                        return c.erase(key);
                    } catch (...) {
                        return false;
                    }
                });
            }
        }
    }

    // ---- placement (all under mutex_) ----
    static std::optional<std::size_t> intended(const entry& e) { return e.target ? e.target : e.home; }

    /// Placement weight of child i: measured, else given scaled to the measured ones.
    double weight(std::size_t i) const {
        auto measured = [&](std::size_t j) {
            const auto& s = *slots_[j];
            if (s.est[rd] > 0 && s.est[wr] > 0) return 1.0 / (1.0 / s.est[rd] + 1.0 / s.est[wr]);
            return std::max(s.est[rd], s.est[wr]);
        };
        if (double m = measured(i); m > 0) return m;
        double given = slots_[i]->given;
        if (given == 0) return 0;
        double ratio_sum = 0;
        int ratio_count = 0;
        for (std::size_t j = 0; j < slots_.size(); ++j) {
            double m = measured(j);
            if (m > 0 && slots_[j]->given > 0) {
                ratio_sum += m / slots_[j]->given;
                ++ratio_count;
            }
        }
        return given * (ratio_count ? ratio_sum / ratio_count : 1.0);
    }

    /// The child a write of `key` (nbytes) should go to, avoiding `exclude`; nullopt when no
    /// healthy child with room is left.
    std::optional<std::size_t> place(std::size_t nbytes, const entry* current,
                                     const std::vector<std::size_t>& exclude) {
        const std::size_t n = slots_.size();
        std::vector<char> candidate(n, 0);
        std::vector<double> w(n, 0);
        bool any = false, any_weight = false;
        auto cur = current ? intended(*current) : std::nullopt;
        for (std::size_t i = 0; i < n; ++i) {
            if (slots_[i]->health != child_health::healthy) continue;
            if (std::find(exclude.begin(), exclude.end(), i) != exclude.end()) continue;
            std::size_t old = current && current->home == i ? current->size : 0;
            auto [child_cap, child_used] =
                children_.visit(i, [](auto& c) { return std::pair<std::size_t, std::size_t>(c.capacity(), c.used()); });
            // Room left on the child once the key's old copy there is replaced and the writes
            // already headed there have landed.
            std::size_t taken = detail::saturating_add(child_used - std::min(child_used, old), slots_[i]->pending);
            if (taken > child_cap || child_cap - taken < nbytes) continue;
            candidate[i] = 1;
            any = true;
            w[i] = weight(i);
            any_weight = any_weight || w[i] > 0;
        }
        if (!any) return std::nullopt;
        if (!any_weight)  // only zero-bandwidth children are left: better them than a lost blob
            for (std::size_t i = 0; i < n; ++i) w[i] = candidate[i] ? 1.0 : 0.0;
        std::size_t total = index_.size() + (current ? 0 : 1);
        auto share = split_by_bandwidth(total, w);
        auto count = [&](std::size_t i) { return slots_[i]->keys - (cur == i ? 1 : 0); };
        if (cur && candidate[*cur] && w[*cur] > 0 && count(*cur) + 1 <= share[*cur]) return cur;
        std::optional<std::size_t> best;
        double best_gap = -std::numeric_limits<double>::infinity();
        for (std::size_t i = 0; i < n; ++i) {
            if (!candidate[i] || w[i] == 0) continue;
            double gap = static_cast<double>(share[i]) - static_cast<double>(count(i));
            if (gap > best_gap) {
                best_gap = gap;
                best = i;
            }
        }
        return best;
    }

    void move_count(const std::optional<std::size_t>& from, const std::optional<std::size_t>& to) {
        if (from) --slots_[*from]->keys;
        if (to) ++slots_[*to]->keys;
    }

    // ---- submission (under mutex_) ----
    io_completion submit_write(std::string_view key, std::span<const std::byte> bytes) {
        stats_.begin(io_direction::write);
        auto it = index_.find(std::string(key));
        const entry* current = it == index_.end() ? nullptr : &it->second;
        std::size_t old = current && current->home ? current->size : 0;
        std::size_t used_now = used(), cap = capacity();
        std::size_t after = detail::saturating_add(used_now - std::min(used_now, old), detail::saturating_add(pending_, bytes.size()));
        if (after > cap) {
            stats_.end(io_direction::write, bytes.size(), false);
            return io_completion::failed(std::make_exception_ptr(std::system_error(
                ENOSPC, std::generic_category(),
                options_.name + ": write of key " + spillway::quoted(key) + " (" + bytes_str(bytes.size()) +
                    ") exceeds the capacity of " + bytes_str(cap) + " (" + bytes_str(used_now) + " used, " +
                    bytes_str(pending_) + " being written)")));
        }
        auto target = place(bytes.size(), current, {});
        if (!target) {
            stats_.end(io_direction::write, bytes.size(), false);
            return io_completion::failed(std::make_exception_ptr(std::system_error(
                ENOSPC, std::generic_category(),
                options_.name + ": write of key " + spillway::quoted(key) + " (" + bytes_str(bytes.size()) +
                    "): no healthy child has room for it (capacity " + bytes_str(cap) + ", " + bytes_str(used_now) +
                    " used)" + health_summary())));
        }
        pending_ += bytes.size();
        if (it == index_.end()) it = index_.emplace(std::string(key), entry{}).first;
        move_count(intended(it->second), target);
        it->second.target = target;
        auto op = std::make_unique<operation>();
        op->dir = io_direction::write;
        op->key = std::string(key);
        op->in = bytes;
        op->nbytes = bytes.size();
        op->child = *target;
        slots_[op->child]->pending += op->nbytes;
        auto handle = op->done.handle();
        queue_.push_back(std::move(op));
        return handle;
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
                ENOENT, std::generic_category(), options_.name + ": read of key " + spillway::quoted(key) + ": no such key")));
        if (it->second.size != bytes.size())
            return fail(std::make_exception_ptr(std::invalid_argument(
                options_.name + ": read of key " + spillway::quoted(key) + " into a buffer of " + bytes_str(bytes.size()) +
                ", but the blob has " + bytes_str(it->second.size))));
        auto op = std::make_unique<operation>();
        op->dir = io_direction::read;
        op->key = std::string(key);
        op->out = bytes;
        op->nbytes = bytes.size();
        op->child = *it->second.home;
        auto handle = op->done.handle();
        queue_.push_back(std::move(op));
        return handle;
    }

    /// Finds the key in the index, or adopts it from the first child that holds it (never
    /// from a child whose copy is stale).
    typename std::unordered_map<std::string, entry>::iterator find_entry(std::string_view key) const {
        auto it = index_.find(std::string(key));
        if (it != index_.end()) return it;
        const auto stale = stale_.find(std::string(key));
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            if (stale != stale_.end() && std::ranges::find(stale->second, i) != stale->second.end()) continue;
            auto size = children_.visit(i, [&](auto& c) -> std::optional<std::size_t> {
                try {
                    return c.size_of(key);
                } catch (...) {
                    return std::nullopt;
                }
            });
            if (size) {
                ++slots_[i]->keys;
                return index_.emplace(std::string(key), entry{*size, i, std::nullopt}).first;
            }
        }
        return index_.end();
    }

    std::string health_summary() const {
        std::string s;
        for (std::size_t i = 0; i < slots_.size(); ++i)
            if (slots_[i]->health == child_health::degraded)
                s += std::string("; child ") + std::to_string(i) + " (" + spillway::quoted(slots_[i]->name) + ") is degraded: " + slots_[i]->fault;
        return s;
    }

    std::string child_label(std::size_t i) const {
        return std::string("child ") + std::to_string(i) + " (" + spillway::quoted(slots_[i]->name) + ")";
    }

    /// Folds the moved-bytes counters of child i into its moving averages (under mutex_).
    void update_estimate(std::size_t i, io_direction dir) {
        if (options_.placement != placement_mode::adaptive) return;
        auto& s = *slots_[i];
        auto snap = s.moved.snapshot();
        std::size_t d = dir_index(dir);
        std::uint64_t bytes = d == rd ? snap.bytes_read : snap.bytes_written;
        double busy = d == rd ? snap.read_busy_seconds : snap.write_busy_seconds;
        double dbusy = busy - s.seen_busy[d];
        std::uint64_t dbytes = bytes - s.seen_bytes[d];
        if (dbusy <= 0 || dbytes == 0) return;
        fold_sample(s, d, static_cast<double>(dbytes) / dbusy, dbusy);
        s.seen_busy[d] = busy;
        s.seen_bytes[d] = bytes;
    }

    /// Adds one bandwidth sample that took `busy` seconds to child s's moving average: an
    /// exponential average over busy time with the start-up bias removed (the average of the
    /// samples so far, each weighted by 1 - exp(-busy / window), older ones decayed), so an
    /// early transfer that finished at once cannot dominate.
    void fold_sample(slot& s, std::size_t d, double sample, double busy) {
        double alpha = 1.0 - std::exp(-busy / options_.bandwidth_window_seconds);
        s.avg[d] = s.avg[d] * (1 - alpha) + alpha * sample;
        s.avg_weight[d] = s.avg_weight[d] * (1 - alpha) + alpha;
        if (s.avg_weight[d] > 0) s.est[d] = s.avg[d] / s.avg_weight[d];
    }

    // ---- workers ----
    LockPolicy& lock_of(const operation& op) {
        auto& l = slots_[op.child]->locks;
        return op.dir == io_direction::read ? l.read_lock : l.write_lock;
    }

    static std::size_t dir_index(io_direction dir) noexcept { return dir == io_direction::read ? rd : wr; }
    std::size_t& holders(const operation& op) { return slots_[op.child]->holders[dir_index(op.dir)]; }
    bool& awaited(const operation& op) { return slots_[op.child]->awaited[dir_index(op.dir)]; }

    // The first queued operation on the lock of `child` for `dir`.
    typename std::deque<std::unique_ptr<operation>>::iterator first_on_lock(std::size_t child, io_direction dir) {
        return std::find_if(queue_.begin(), queue_.end(),
                            [&](const auto& o) { return o->child == child && o->dir == dir; });
    }

    // Worker loop (protocol steps 3-4 in the file comment).
    void work() {
        using namespace std::chrono;
        const microseconds min_backoff{20};
        microseconds backoff = min_backoff;
        std::unique_lock lock(mutex_);
        for (;;) {
            if (queue_.empty()) {
                if (stopping_) return;
                cv_.wait(lock);
                continue;
            }
            std::unique_ptr<operation> op;
            std::exception_ptr lock_error;
            for (auto it = queue_.begin(); it != queue_.end(); ++it) {
                bool taken = false;
                try {
                    taken = lock_of(**it).try_lock();
                } catch (...) {
                    lock_error = std::current_exception();
                    taken = true;
                }
                if (taken) {
                    op = std::move(*it);
                    queue_.erase(it);
                    break;
                }
            }
            if (!op && !lock_error) {
                // Every wanted lock is taken. A lock that no worker of this tier holds is held
                // outside it (another process): sleep in its lock() and be woken by its
                // release, rather than poll. A lock one of ours holds wakes us through cv_.
                // One worker sleeps per lock, and one worker always stays to scan the queue.
                auto it = awaited_workers_ + 1 < workers_.size()
                              ? std::find_if(queue_.begin(), queue_.end(),
                                             [&](const auto& o) { return holders(*o) == 0 && !awaited(*o); })
                              : queue_.end();
                if (it == queue_.end()) {
                    cv_.wait_for(lock, backoff);
                    backoff = std::min<microseconds>(backoff * 2, std::max(min_backoff, options_.poll_interval));
                    continue;
                }
                const std::size_t child = (*it)->child;
                const io_direction dir = (*it)->dir;
                LockPolicy& wanted = lock_of(**it);
                bool& waiting = awaited(**it);
                waiting = true;
                ++awaited_workers_;
                lock.unlock();
                try {
                    wanted.lock();
                } catch (...) {
                    lock_error = std::current_exception();
                }
                lock.lock();
                waiting = false;
                --awaited_workers_;
                // With node_lock no other worker could take operations on that lock while this
                // one slept (their try_lock() fails on the lock's own mutex), so they are still
                // queued. A policy whose try_lock() can win against a sleeping lock() may have
                // let another worker serve them all; then the lock goes back.
                auto mine = first_on_lock(child, dir);
                if (mine == queue_.end()) {
                    if (!lock_error) wanted.unlock();
                    continue;
                }
                op = std::move(*mine);
                queue_.erase(mine);
            }
            backoff = min_backoff;
            if (lock_error) {
                if (op->dir == io_direction::write) slots_[op->child]->pending -= op->nbytes;
                fail_op(*op, lock_error, lock);
                continue;
            }
            ++holders(*op);
            lock.unlock();
            run(std::move(op), lock);  // returns with `lock` held, and the child lock released
            cv_.notify_all();  // a child lock was released: waiting operations may go
        }
    }

    // Completes a failed operation (called with mutex_ held, keeps it held).
    void fail_op(operation& op, std::exception_ptr error, std::unique_lock<std::mutex>& lock) {
        if (op.dir == io_direction::write) {
            revert_write(op);
            pending_ -= op.nbytes;
        }
        lock.unlock();
        stats_.end(op.dir, op.nbytes, false);
        op.done.fail(std::move(error));
        lock.lock();
    }

    // Undoes a write's placement: the key is counted where its committed copy is (if any).
    void revert_write(const operation& op) {
        auto it = index_.find(op.key);
        if (it == index_.end()) return;
        move_count(intended(it->second), it->second.home);
        it->second.target.reset();
        if (!it->second.home) index_.erase(it);
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
                n = children_.visit(op.child, [&](auto& c) { return c.write(op.key, op.in); }).wait();
            else
                n = children_.visit(op.child, [&](auto& c) { return c.read(op.key, op.out); }).wait();
        } catch (...) {
            error = std::current_exception();
        }
        s.moved.end(op.dir, op.nbytes, !error);
        lock.lock();
        --holders(op);
        lock_of(op).unlock();
        if (op.dir == io_direction::write) s.pending -= op.nbytes;
        if (!error) {
            update_estimate(op.child, op.dir);
            if (op.dir == io_direction::read) return succeed(op, n, lock);
            auto it = index_.find(op.key);
            if (it == index_.end()) {  // erased while the write was in flight: the write wins
                it = index_.emplace(op.key, entry{}).first;
                ++s.keys;
            }
            auto& e = it->second;
            auto old = e.home;
            e.home = op.child;
            e.target.reset();
            e.size = op.nbytes;
            forget_stale(op.key, op.child);  // this write replaced a stale copy there, if any
            lock.unlock();
            const bool old_gone = !old || *old == op.child || erase_on_child(*old, op.key);
            lock.lock();
            if (!old_gone) stale_[op.key].push_back(*old);  // the index no longer points there
            pending_ -= op.nbytes;
            return succeed(op, n, lock);
        }
        if (op.dir == io_direction::read) {
            auto wrapped = wrap_read_error(op, error);
            if (errno_of(error) == ENOENT) forget_vanished(op);
            return fail_op(op, wrapped, lock);
        }
        // A failed write: degrade the child and try another (protocol step 6).
        int err = 0;
        std::string what;
        try {
            std::rethrow_exception(error);
        } catch (const std::system_error& e) {
            err = e.code().value();
            what = e.what();
        } catch (...) {
            return fail_op(op, error, lock);  // not an I/O failure (e.g. a bad argument): no fail-over
        }
        if (s.health == child_health::healthy) {
            s.health = child_health::degraded;
            s.fault = what;
        }
        op.tried.push_back(op.child);
        op.failures += "; " + child_label(op.child) + ": " + what;
        op.last_errno = err;
        auto it = index_.find(op.key);
        const entry* current = it == index_.end() ? nullptr : &it->second;
        auto next = place(op.nbytes, current, op.tried);
        if (!next) {
            auto ex = std::make_exception_ptr(std::system_error(
                err, std::generic_category(),
                options_.name + ": write of key " + spillway::quoted(op.key) + " (" + bytes_str(op.nbytes) +
                    ") failed on every usable child" + op.failures));
            return fail_op(op, ex, lock);
        }
        if (it != index_.end()) {
            move_count(intended(it->second), next);
            it->second.target = next;
        }
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

    // Child i now holds the current copy of `key`: not a stale one. Caller holds mutex_.
    void forget_stale(const std::string& key, std::size_t i) {
        auto it = stale_.find(key);
        if (it == stale_.end()) return;
        std::erase(it->second, i);
        if (it->second.empty()) stale_.erase(it);
    }

    // A read found the key's file gone from its child (ENOENT): the child forgot the key, so
    // does the index (unless a write of the key is in flight). Caller holds mutex_.
    void forget_vanished(const operation& op) {
        auto it = index_.find(op.key);
        if (it == index_.end() || it->second.home != op.child || it->second.target) return;
        --slots_[op.child]->keys;
        index_.erase(it);
    }

    static int errno_of(const std::exception_ptr& error) {
        try {
            std::rethrow_exception(error);
        } catch (const std::system_error& e) {
            return e.code().value();
        } catch (...) {
            return 0;
        }
    }

    std::exception_ptr wrap_read_error(const operation& op, std::exception_ptr error) {
        auto& s = *slots_[op.child];
        std::string where = options_.name + ": read of key " + spillway::quoted(op.key) + " (" + bytes_str(op.nbytes) +
                            ") from " + child_label(op.child);
        try {
            std::rethrow_exception(error);
        } catch (const std::system_error& e) {
            if (e.code().value() != ENOENT && s.health == child_health::healthy) {
                s.health = child_health::degraded;
                s.fault = e.what();
            }
            if (s.health == child_health::degraded) where += ", which is degraded,";
            return std::make_exception_ptr(spillway::with_context(e, where + " failed"));
        } catch (const std::invalid_argument& e) {
            return std::make_exception_ptr(std::invalid_argument(where + " failed: " + e.what()));
        } catch (...) {
            return error;
        }
    }

    virtual_tier_options options_;
    mutable children_type children_;
    std::vector<std::unique_ptr<slot>> slots_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    mutable std::unordered_map<std::string, entry> index_;
    std::unordered_map<std::string, std::vector<std::size_t>> stale_;  // copies owed an erase, by key
    std::deque<std::unique_ptr<operation>> queue_;
    std::size_t pending_ = 0;  // bytes of writes submitted and not finished
    stats_recorder stats_;
    bool stopping_ = false;
    std::size_t awaited_workers_ = 0;  // workers asleep in a child lock's lock()
    std::vector<std::thread> workers_;  // last: started once everything else exists
};

static_assert(storage_tier<virtual_tier<null_lock, host_tier, host_tier&>>);
static_assert(storage_tier<virtual_tier<thread_lock, std::vector<host_tier>>>);

}  // namespace spillway
