// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/lock/lock_policy.hpp: the lock_policy concept and its in-process models.
///
/// A lock policy says who is kept out while one party does I/O on a storage path. It is the
/// standard Lockable requirement (lock(), try_lock(), unlock()), so std::scoped_lock,
/// std::unique_lock and std::lock work with every model. Models:
///  - null_lock   (the default): no exclusion at all; every call returns at once.
///  - thread_lock : the threads of one process (a std::mutex).
///  - node_lock   : every process of the node (spillway/lock/node_lock.hpp).
///
/// Guarantees:
///  - Every model is constructible from a name and lock_options (make_lock<P>(name, opts)),
///    so code that owns locks (path_locks, the virtual tier) builds any policy the same way;
///    in-process policies ignore the name.
///  - path_locks<P> holds two independent locks for one path, `read_lock` and `write_lock`,
///    named "<name>.read" and "<name>.write": one party may read a path while another
///    writes it (MLP-Offload's rule), while two readers (or two writers) exclude each other.
#pragma once

#include <concepts>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>

namespace spillway {

/// The standard Lockable requirements: `lock()` blocks until the caller holds the lock,
/// `try_lock()` takes it only if free and never blocks, `unlock()` releases it. Models:
/// null_lock, thread_lock, node_lock.
template <class L>
concept lock_policy = requires(L& l) {
    l.lock();
    { l.try_lock() } -> std::convertible_to<bool>;
    l.unlock();
};

/// Settings used by the policies that need them (node_lock); the others ignore them.
struct lock_options {
    /// Directory of the lock files. Empty: /dev/shm when it is a directory, else
    /// $XDG_RUNTIME_DIR when set, else the system temporary directory. It must be local to
    /// the node (a lock on a network file system may not be released when a holder dies).
    std::filesystem::path directory{};
};

/// No exclusion: lock() and unlock() do nothing, try_lock() always succeeds.
class null_lock {
public:
    /// A lock that excludes no one.
    null_lock() = default;
    /// Ignores `name` and `options`; accepts them so that make_lock() builds every policy alike.
    null_lock(std::string_view /*name*/, const lock_options& /*options*/ = {}) noexcept {}
    /// Returns at once.
    void lock() noexcept {}
    /// Always succeeds.
    [[nodiscard]] bool try_lock() noexcept { return true; }
    /// Does nothing.
    void unlock() noexcept {}
};
static_assert(lock_policy<null_lock>);

/// Exclusion between the threads of one process. Not recursive; unlock() must be called by
/// the thread that locked.
class thread_lock {
public:
    /// An unlocked mutex.
    thread_lock() = default;
    /// Ignores `name` and `options` (exclusion stays within this object); accepts them so that
    /// make_lock() builds every policy alike.
    thread_lock(std::string_view /*name*/, const lock_options& /*options*/ = {}) noexcept {}
    /// A mutex is not copyable.
    thread_lock(const thread_lock&) = delete;
    /// A mutex is not copyable.
    thread_lock& operator=(const thread_lock&) = delete;
    /// Blocks until this thread holds the lock. Locking it twice from one thread is undefined
    /// (std::mutex); throws std::system_error only as std::mutex::lock() does.
    void lock() { mutex_.lock(); }
    /// Takes the lock if free; never blocks (may fail spuriously, as std::mutex::try_lock()).
    [[nodiscard]] bool try_lock() noexcept { return mutex_.try_lock(); }
    /// Releases the lock; only the holding thread may call it.
    void unlock() noexcept { mutex_.unlock(); }

private:
    std::mutex mutex_;
};
static_assert(lock_policy<thread_lock>);

/// Builds a lock of policy P for `name`: P(name, options) when P takes them, else P().
/// Returned as a prvalue, so non-movable policies work (guaranteed copy elision).
template <lock_policy P>
P make_lock(std::string_view name, const lock_options& options = {}) {
    if constexpr (std::constructible_from<P, std::string_view, const lock_options&>) return P(name, options);
    else return P();
}

/// Separate read and write exclusion for one path: one party may read the path while another
/// writes it, while two readers (or two writers) exclude each other.
/// @tparam P the lock policy of both locks
template <lock_policy P>
struct path_locks {
    /// Locks named "<name>.read" and "<name>.write". Throws what P's constructor throws
    /// (node_lock: std::invalid_argument for a bad name, std::system_error when the lock
    /// file cannot be opened).
    explicit path_locks(std::string_view name, const lock_options& options = {})
        : read_lock(make_lock<P>(std::string(name) + ".read", options)),
          write_lock(make_lock<P>(std::string(name) + ".write", options)) {}

    P read_lock;   ///< held while reading the path
    P write_lock;  ///< held while writing the path
};

}  // namespace spillway
