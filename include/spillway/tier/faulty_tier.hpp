// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/faulty_tier.hpp: a decorator that injects failures into any storage tier, so
/// tests can prove that every layer above a tier survives them.
///
/// Fault model. Every read() and write() with a valid key is one operation; its faults are
/// decided when it is issued, in this order:
///  1. Persistent fault (fail_always): the operation fails with the given errno without
///     reaching the inner tier: a dead path, until clear_faults().
///  2. Counted fault (fail_nth): the n-th matching operation issued after the call fails with
///     the given errno without reaching the inner tier. Several may be armed at once.
///  3. Transient faults (inject_transient): the modelled device answers an attempt with
///     EAGAIN or with a short transfer. The decorator retries the attempt inside, as a real
///     tier retries EAGAIN and short counts, so the caller sees success and counters() shows
///     the retries. Only the attempt that completes reaches the inner tier, so a short
///     attempt never commits a partial blob. When one operation meets more than
///     max_retries() consecutive transient faults, it gives up: EAGAIN for EAGAIN, EIO for
///     a short transfer.
///  4. Torn write (inject_torn_write): the write stores only the first half of the blob in
///     the inner tier and reports full success: a device that lies. The next read of that
///     key with the right buffer size must fail with the inner tier's size check; it must
///     never return the prefix as data. A torn write waits for the inner write before
///     write() returns (the fault path is synchronous).
///  5. Otherwise the operation goes to the inner tier unchanged.
/// Guarantees: injected errors are std::system_error whose message names the tier, the
/// operation, the key, the size and the errno; an injected write failure leaves the previous
/// blob of the key intact (the inner tier is not touched) and never writes the caller's
/// buffer; an injected read failure leaves the caller's buffer untouched. All methods are
/// thread-safe; the counters are exact under concurrent use. stats() are the inner tier's
/// with the injected failures added to failed_reads / failed_writes.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <concepts>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/tier/host_tier.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway {

/// Which operations a fault applies to.
enum class fault_op {
    read,   ///< read() only
    write,  ///< write() only
    any,    ///< read() and write()
};

/// The kinds of transient fault that a tier retries inside.
enum class transient_fault {
    eagain,          ///< the attempt is refused with EAGAIN (a full submission queue)
    short_transfer,  ///< the attempt moves fewer bytes than asked
};

/// Counts of what a faulty_tier injected.
struct fault_counters {
    std::uint64_t operations = 0;        ///< reads and writes issued with a valid key
    std::uint64_t injected_errors = 0;   ///< operations failed by fail_always / fail_nth
    std::uint64_t transient_faults = 0;  ///< attempts answered with EAGAIN or a short transfer
    std::uint64_t retries = 0;           ///< attempts repeated inside after a transient fault
    std::uint64_t gave_up = 0;           ///< operations failed after max_retries() retries
    std::uint64_t torn_writes = 0;       ///< writes that stored only a prefix
};

/// A short name for common errno values (`"EIO"`, `"ENOSPC"`, ...) for error messages;
/// `"errno N"` for the others.
inline std::string errno_name(int err) {
    switch (err) {
        case EIO: return "EIO";
        case ENOSPC: return "ENOSPC";
        case EAGAIN: return "EAGAIN";
        case ENOENT: return "ENOENT";
        case EFBIG: return "EFBIG";
        case EROFS: return "EROFS";
        case ENODEV: return "ENODEV";
        case ETIMEDOUT: return "ETIMEDOUT";
        case EINTR: return "EINTR";
        case EACCES: return "EACCES";
        case EPERM: return "EPERM";
        case EDQUOT: return "EDQUOT";
        case ENOMEM: return "ENOMEM";
        default: return std::string("errno ") + std::to_string(err);
    }
}

/// A storage_tier decorator that injects the faults of the fault model in the file comment
/// (persistent, counted, transient with retries, torn writes) into the operations it
/// forwards to `Inner`.
///
/// Thread-safe: faults may be armed while operations run on other threads; each operation's
/// faults are decided atomically when it is issued. Owns its inner tier; not copyable, not
/// movable.
/// @tparam Inner any storage_tier; its properties pass through unchanged
template <storage_tier Inner>
class faulty_tier {
public:
    /// The inner tier's properties: injecting faults changes no ability.
    static constexpr tier_properties properties = Inner::properties;
    /// The decorated tier's type.
    using inner_type = Inner;

    /// Builds the inner tier in place from `args`; no fault is armed.
    template <class... Args>
    explicit faulty_tier(std::in_place_t, Args&&... args)
        : inner_(std::forward<Args>(args)...), name_(std::string("faulty(") + std::string(inner_.name()) + ")") {}
    /// A default-constructed inner tier; no fault is armed.
    faulty_tier()
        requires std::default_initializable<Inner>
        : faulty_tier(std::in_place) {}
    /// Owns its inner tier: not copyable.
    faulty_tier(const faulty_tier&) = delete;
    /// Owns its inner tier: not copyable.
    faulty_tier& operator=(const faulty_tier&) = delete;

    // ---- Arming faults -------------------------------------------------------------------
    /// The n-th (n >= 1) operation of kind `op` issued from now on fails with `err`, without
    /// reaching the inner tier; the fault is then used up. Several may be armed at once.
    /// @throws std::invalid_argument naming the tier for n == 0 or err <= 0
    void fail_nth(fault_op op, std::uint64_t n, int err) {
        expect_argument(n >= 1, name_ + ": fail_nth counts from 1, got 0");
        expect_argument(err > 0, name_ + ": fail_nth needs a positive errno, got " + std::to_string(err));
        std::lock_guard lock(mutex_);
        counted_.push_back({op, n, err});
    }
    /// Every operation of kind `op` fails with `err` until clear_faults(): a dead path.
    /// @throws std::invalid_argument naming the tier for err <= 0
    void fail_always(fault_op op, int err) {
        expect_argument(err > 0, name_ + ": fail_always needs a positive errno, got " + std::to_string(err));
        std::lock_guard lock(mutex_);
        persistent_.push_back({op, 0, err});
    }
    /// The next `count` attempts of kind `op` meet a transient fault of `kind`, retried
    /// inside; an operation that meets more than max_retries() in a row fails (EAGAIN, or EIO
    /// for short transfers).
    void inject_transient(fault_op op, transient_fault kind, std::uint64_t count) {
        std::lock_guard lock(mutex_);
        transient_.push_back({op, kind, count});
    }
    /// The next `count` writes store only the first half of their blob and report success.
    void inject_torn_write(std::uint64_t count = 1) {
        std::lock_guard lock(mutex_);
        torn_ += count;
    }
    /// Disarms every fault (counters are kept).
    void clear_faults() {
        std::lock_guard lock(mutex_);
        persistent_.clear();
        counted_.clear();
        transient_.clear();
        torn_ = 0;
    }
    /// Consecutive transient faults one operation absorbs before it gives up (default 4).
    void set_max_retries(unsigned retries) noexcept { max_retries_.store(retries, std::memory_order_relaxed); }
    /// Consecutive transient faults one operation absorbs before it gives up.
    [[nodiscard]] unsigned max_retries() const noexcept { return max_retries_.load(std::memory_order_relaxed); }

    /// What was injected so far (each counter read atomically; counters are never reset,
    /// clear_faults() included).
    [[nodiscard]] fault_counters counters() const noexcept {
        fault_counters c;
        c.operations = operations_.load();
        c.injected_errors = injected_errors_.load();
        c.transient_faults = transient_faults_.load();
        c.retries = retries_.load();
        c.gave_up = gave_up_.load();
        c.torn_writes = torn_writes_.load();
        return c;
    }

    // ---- storage_tier --------------------------------------------------------------------
    /// Decides this write's faults (file comment, steps 1 to 5), then fails it, tears it, or
    /// forwards it to the inner tier.
    /// Errors through the completion: an injected std::system_error naming the tier, "write",
    /// the key, the size and the errno (the inner tier untouched); the inner tier's own errors.
    /// @throws std::invalid_argument at once for a bad key, naming this tier
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        check_key(key);
        auto d = decide(io_direction::write);
        if (d.err) return fail(io_direction::write, key, bytes.size(), d);
        if (d.torn) {
            // A device that lies: a prefix is stored, success of the whole blob is reported.
            auto prefix = bytes.first(bytes.size() / 2);
            try {
                inner_.write(key, prefix).wait();
            } catch (...) {
                return io_completion::failed(std::current_exception());
            }
            return io_completion::completed(bytes.size());
        }
        return inner_.write(key, bytes);
    }

    /// Decides this read's faults (file comment, steps 1 to 3 and 5), then fails it or
    /// forwards it to the inner tier.
    /// Errors through the completion: an injected std::system_error naming the tier, "read",
    /// the key, the size and the errno (`bytes` untouched); the inner tier's own errors.
    /// @throws std::invalid_argument at once for a bad key, naming this tier
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        check_key(key);
        auto d = decide(io_direction::read);
        if (d.err) return fail(io_direction::read, key, bytes.size(), d);
        return inner_.read(key, bytes);
    }

    /// Forwards to the inner tier (no fault applies to metadata).
    /// @throws std::invalid_argument naming this tier for a bad key; what the inner erase throws
    bool erase(std::string_view key) {
        check_key(key);
        return inner_.erase(key);
    }
    /// Forwards to the inner tier.
    [[nodiscard]] bool contains(std::string_view key) const { return inner_.contains(key); }
    /// Forwards to the inner tier: the blob's size in bytes, or std::nullopt.
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const { return inner_.size_of(key); }
    /// The inner tier's capacity, in bytes.
    [[nodiscard]] std::size_t capacity() const { return inner_.capacity(); }
    /// The inner tier's bytes stored.
    [[nodiscard]] std::size_t used() const { return inner_.used(); }
    /// The inner tier's counters, with the failures injected here added to failed_reads and
    /// failed_writes.
    [[nodiscard]] tier_stats stats() const {
        tier_stats s = inner_.stats();
        s.failed_reads += failed_reads_.load();
        s.failed_writes += failed_writes_.load();
        return s;
    }
    /// `"faulty(<inner name>)"`.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// The decorated tier. Operations issued on it directly meet no fault.
    [[nodiscard]] Inner& inner() noexcept { return inner_; }
    /// @copydoc inner()
    [[nodiscard]] const Inner& inner() const noexcept { return inner_; }

private:
    struct errno_rule {
        fault_op op;
        std::uint64_t remaining;  // counted faults: matching operations until it fires
        int err;
    };
    struct transient_rule {
        fault_op op;
        transient_fault kind;
        std::uint64_t remaining;
    };
    struct decision {
        int err = 0;              // 0: no injected error
        enum class why { none, injected, gave_up } reason = why::none;
        transient_fault kind = transient_fault::eagain;
        unsigned attempts = 0;
        bool torn = false;
    };

    // validate_key() with the tier's name in front of its message: "<name>: key '...' ...",
    // as the base tiers say it (the name is added only when the key is refused).
    void check_key(std::string_view key) const {
        try {
            validate_key(key);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(name_ + ": " + e.what());
        }
    }

    static bool matches(fault_op rule, io_direction dir) noexcept {
        return rule == fault_op::any || (rule == fault_op::read) == (dir == io_direction::read);
    }

    // Steps 1-4 of the fault model, under the lock.
    decision decide(io_direction dir) {
        decision d;
        std::lock_guard lock(mutex_);
        operations_.fetch_add(1);
        for (auto& r : persistent_) {
            if (matches(r.op, dir)) {
                d.err = r.err;
                d.reason = decision::why::injected;
                break;
            }
        }
        for (auto it = counted_.begin(); it != counted_.end();) {
            if (matches(it->op, dir) && --it->remaining == 0) {
                if (d.err == 0) {
                    d.err = it->err;
                    d.reason = decision::why::injected;
                }
                it = counted_.erase(it);
            } else {
                ++it;
            }
        }
        if (d.err) {
            injected_errors_.fetch_add(1);
            return d;
        }
        unsigned limit = max_retries();
        for (;;) {
            auto it = std::find_if(transient_.begin(), transient_.end(),
                                   [&](const transient_rule& r) { return r.remaining > 0 && matches(r.op, dir); });
            if (it == transient_.end()) break;
            --it->remaining;
            d.kind = it->kind;
            ++d.attempts;
            transient_faults_.fetch_add(1);
            if (d.attempts > limit) {
                d.err = d.kind == transient_fault::eagain ? EAGAIN : EIO;
                d.reason = decision::why::gave_up;
                gave_up_.fetch_add(1);
                return d;
            }
            retries_.fetch_add(1);
        }
        std::erase_if(transient_, [](const transient_rule& r) { return r.remaining == 0; });
        if (dir == io_direction::write && torn_ > 0) {
            --torn_;
            d.torn = true;
            torn_writes_.fetch_add(1);
        }
        return d;
    }

    io_completion fail(io_direction dir, std::string_view key, std::size_t nbytes, const decision& d) {
        (dir == io_direction::read ? failed_reads_ : failed_writes_).fetch_add(1);
        std::string msg = name_ + ": " + (dir == io_direction::read ? "read" : "write") + " of key " + quoted(key) +
                          " (" + bytes_str(nbytes) + "): ";
        if (d.reason == decision::why::gave_up) {
            msg += (d.kind == transient_fault::eagain ? std::string("EAGAIN") : std::string("short transfer")) +
                   " persisted after " + std::to_string(d.attempts - 1) + " retries; giving up with " +
                   errno_name(d.err);
        } else {
            msg += "injected " + errno_name(d.err);
        }
        return io_completion::failed(std::make_exception_ptr(std::system_error(d.err, std::generic_category(), msg)));
    }

    Inner inner_;
    std::string name_;
    mutable std::mutex mutex_;
    std::vector<errno_rule> persistent_, counted_;
    std::vector<transient_rule> transient_;
    std::uint64_t torn_ = 0;
    std::atomic<unsigned> max_retries_{4};
    std::atomic<std::uint64_t> operations_{0}, injected_errors_{0}, transient_faults_{0}, retries_{0}, gave_up_{0},
        torn_writes_{0}, failed_reads_{0}, failed_writes_{0};
};

static_assert(storage_tier<faulty_tier<host_tier>>);

}  // namespace spillway
