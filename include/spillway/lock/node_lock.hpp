// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/lock/node_lock.hpp: a lock shared by every process of one node, keyed by name.
///
/// node_lock is a lock_policy (lock, try_lock, unlock) whose exclusion reaches every process
/// on the node that opens a node_lock of the same name in the same directory: an open file
/// description (OFD) lock, or flock() where the kernel lacks OFD locks, on an empty lock file
/// in a node-local directory (default /dev/shm, else $XDG_RUNTIME_DIR, else the temporary
/// directory).
///
/// Guarantees:
///  - Mutual exclusion between node_lock objects of the same name and directory, in one
///    process or in many. Each object opens its own open file description, and OFD and
///    flock locks belong to the description, not to the process: two objects exclude each
///    other even in one thread (a thread locking two objects of one name deadlocks itself).
///  - One object may be shared by several threads: an internal std::mutex serialises them
///    before the file lock is taken. unlock() must come from the thread that locked.
///  - A holder that dies, even by SIGKILL, releases the lock: the kernel closes its
///    descriptors and drops the lock with the last reference to the description.
///    Caveats: a child forked while the parent holds the lock shares the description and
///    so keeps the lock alive until it exits or closes it; a forked child must build its
///    own node_lock objects and never use the parent's. The descriptor is close-on-exec.
///  - Lock files are created mode 0600, never through a symbolic link (O_NOFOLLOW), must be
///    regular files owned by the calling user (opened with open_regular_file_at(), so a FIFO
///    or a device planted under the name is refused, naming what it is, never blocked on).
///    If something else deletes or replaces one (a cleaner of /dev/shm, systemd's
///    RemoveIPC at logout), a holder of the old file and one of the new would not exclude
///    each other: every acquisition checks that the file it locked is still the one under
///    the name, and otherwise lets go, opens the name again and retries (protocol step 3),
///    so at most the hold that was current when the file went overlaps a new one.
///  - What the lock files are and when they may go: one empty file
///    "spillway-<name>.lock" per name, so two per storage path under path_locks<node_lock>
///    ("<name>.read" and "<name>.write"). They hold no data; the lock itself lives in the
///    kernel, on the open file. node_lock never deletes them on its own (a file deleted
///    while another process is about to lock it is what step 3 repairs), so they stay after
///    the processes end. They may be removed whenever no process is running that uses the
///    name; while some may be, remove them only with node_lock::remove_file() or
///    remove_path_lock_files() (protocol step 7), which never lets two holders overlap and
///    leaves a file that is held where it is.
///  - Names are validated with validate_key(): no '/', no "..", so a name never leaves the
///    lock directory. Errors name the lock, the path and the call.
///
/// Protocol:
///  1. Construction validates the name, resolves the directory, opens it (O_DIRECTORY; kept
///     open for step 3) and
///     opens or creates "spillway-<name>.lock" in it with openat(O_RDWR | O_CREAT |
///     O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600). O_NONBLOCK only keeps the open from
///     hanging on a FIFO planted under that name; it does not affect locking.
///  2. fstat() checks that the file is a regular file owned by this user, and fchmod() sets
///     0600 if a umask narrowed it. The mechanism is settled now: automatic probes
///     F_OFD_GETLK and falls back to flock() when the kernel answers EINVAL. Every process
///     of a node must use the same mechanism (the two kinds do not see each other);
///     automatic picks the same one on one kernel.
///  3. lock(): take the internal mutex, then fcntl(F_OFD_SETLKW, write lock over the whole
///     file) (or flock(LOCK_EX)), retrying on EINTR. If the file lock fails the mutex is
///     released and std::system_error is thrown. Then fstatat() the name in the directory
///     (no links followed): if it is gone or is another file than the descriptor's (device
///     and inode), release the file lock, open the name again as in steps 1-2 and lock again.
///  4. try_lock(): try the internal mutex, then fcntl(F_OFD_SETLK) (or flock(LOCK_EX |
///     LOCK_NB)); EAGAIN/EACCES/EWOULDBLOCK means another holder: release the mutex, return
///     false. The check of step 3 follows; a replaced file is opened again and tried once
///     more.
///  5. unlock(): fcntl(F_OFD_SETLK, F_UNLCK) (or flock(LOCK_UN)), then release the mutex.
///  6. Destruction closes the descriptors, which drops the lock if it is still held.
///  7. remove_file(name): (a) open the name without creating it (O_NONBLOCK, no link
///     followed; none there: done) and check it as in step 2; (b) take its lock without
///     waiting (F_OFD_SETLK or LOCK_EX|LOCK_NB): held by another process or object, leave the
///     file and return false; (c) check as in step 3 that the name still names the locked
///     file, else close it and go back to (a) for the name's new file; (d) unlink the name
///     while holding the lock; (e) close, which drops the lock.
///     No race with a process opening the name: one that opened the file before (d) locks it
///     only after (e) (the lock excludes it until then), and its step-3 check then finds the
///     name gone or naming a newer file, so it lets go and opens the name again; one that
///     opens after (d) creates a new file. A holder that passed step 3 thus always holds the
///     file the name names, and the remover never unlinks a file someone holds.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>

#include "spillway/error.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/lock/lock_policy.hpp"

namespace spillway {

/// How a node_lock locks its file.
enum class lock_mechanism {
    automatic,  ///< OFD locks when the kernel has them (Linux >= 3.15), else flock()
    ofd,        ///< fcntl(F_OFD_SETLK[W]); std::system_error at construction if unsupported
    flock,      ///< flock(); also per open file description on Linux
};

/// The directory node locks use when lock_options::directory is empty: /dev/shm when it is
/// a directory, else $XDG_RUNTIME_DIR when set and non-empty, else the temporary directory.
/// @throws std::filesystem::filesystem_error only when the last fallback cannot be determined
inline std::filesystem::path default_lock_directory() {
    std::error_code ec;
    if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
    if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run && *run) return run;
    return std::filesystem::temp_directory_path();
}

/// A lock_policy whose exclusion reaches every process of the node that opens a node_lock of
/// the same name in the same directory (guarantees and protocol in the file comment).
///
/// Shareable between threads (an internal mutex orders them); not copyable, not movable. A
/// forked child must build its own objects.
class node_lock {
public:
    /// Opens (creating if needed) the lock file for `name` under options.directory.
    /// Throws std::invalid_argument for a bad name (see validate_key) and std::system_error
    /// naming the path when the directory or the file cannot be opened, when the file is a
    /// symbolic link, not a regular file or owned by another user, or when `mechanism` is
    /// ofd on a kernel without OFD locks. Does not take the lock.
    explicit node_lock(std::string_view name, const lock_options& options = {},
                       lock_mechanism mechanism = lock_mechanism::automatic)
        : name_(name) {
        validate_key(name, "lock name");
        std::string file = "spillway-" + name_ + ".lock";
        expect_argument(file.size() <= 255, "lock name " + spillway::quoted(name) +
                                                " is too long: the lock file name " +
                                                spillway::quoted(file) + " would exceed 255 bytes");
        auto dir = options.directory.empty() ? default_lock_directory() : options.directory;
        path_ = dir / file;
        file_ = file;
        dirfd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dirfd_ < 0)
            throw_system_error(
                errno, "open",
                "node_lock " + spillway::quoted(name_) + ": lock directory " + dir.string());
        try {
            fd_ = open_checked();
            try {
                mechanism_ = settle(mechanism);
            } catch (...) {
                ::close(fd_);
                throw;
            }
        } catch (...) {
            ::close(dirfd_);
            throw;
        }
    }
    /// One object is one open file description: not copyable.
    node_lock(const node_lock&) = delete;
    /// One object is one open file description: not copyable.
    node_lock& operator=(const node_lock&) = delete;
    /// Closes the descriptor, which drops the lock if this object still holds it. The lock
    /// file stays (see the file comment).
    ~node_lock() {
        ::close(fd_);
        ::close(dirfd_);
    }

    /// Blocks until this object holds the lock. Throws std::system_error if the kernel
    /// refuses (e.g. ENOLCK); the lock is then not held.
    void lock() {
        mutex_.lock();
        try {
            for (;;) {
                int rc;
                do {
                    rc = mechanism_ == lock_mechanism::ofd ? ofd(F_OFD_SETLKW, F_WRLCK)
                                                           : ::flock(fd_, LOCK_EX);
                } while (rc != 0 && errno == EINTR);
                if (rc != 0)
                    throw_system_error(
                        errno,
                        mechanism_ == lock_mechanism::ofd ? "fcntl(F_OFD_SETLKW)"
                                                          : "flock(LOCK_EX)",
                        "node_lock " + spillway::quoted(name_) + ": " + path_.string());
                if (still_the_named_file()) return;
                release_file_lock();
                reopen();
            }
        } catch (...) {
            mutex_.unlock();
            throw;
        }
    }

    /// Takes the lock if nobody holds it; never blocks. Throws std::system_error only for an
    /// unexpected kernel error (not for "held by another").
    [[nodiscard]] bool try_lock() {
        if (!mutex_.try_lock()) return false;
        try {
            for (int attempt = 0; attempt < 2; ++attempt) {  // (the second on a reopened file)
                int rc;
                do {
                    rc = mechanism_ == lock_mechanism::ofd ? ofd(F_OFD_SETLK, F_WRLCK)
                                                           : ::flock(fd_, LOCK_EX | LOCK_NB);
                } while (rc != 0 && errno == EINTR);
                if (rc != 0) {
                    int err = errno;
                    if (err == EAGAIN || err == EACCES || err == EWOULDBLOCK) break;
                    throw_system_error(
                        err,
                        mechanism_ == lock_mechanism::ofd ? "fcntl(F_OFD_SETLK)"
                                                          : "flock(LOCK_EX|LOCK_NB)",
                        "node_lock " + spillway::quoted(name_) + ": " + path_.string());
                }
                if (still_the_named_file()) return true;
                release_file_lock();
                reopen();
            }
        } catch (...) {
            mutex_.unlock();
            throw;
        }
        mutex_.unlock();
        return false;
    }

    /// Releases the lock; call only while holding it, from the thread that took it.
    void unlock() noexcept {
        release_file_lock();
        mutex_.unlock();
    }

    /// Removes the lock file of `name` in options.directory if no process holds its lock
    /// (protocol step 7), without racing a process that is opening or locking it. Use the
    /// mechanism the users of the name use (automatic picks the same on one kernel).
    /// @return true when the file is gone (removed now, or there was none); false when the
    ///         lock is held (by another process, or another object in this one): the file
    ///         stays
    /// @throws std::invalid_argument for a bad name; std::system_error naming the path when
    ///         the directory or the file cannot be opened, is not a regular file of this
    ///         user, or cannot be unlinked
    static bool remove_file(std::string_view name, const lock_options& options = {},
                            lock_mechanism mechanism = lock_mechanism::automatic) {
        validate_key(name, "lock name");
        const std::string file = "spillway-" + std::string(name) + ".lock";
        const auto dir = options.directory.empty() ? default_lock_directory() : options.directory;
        const std::string label =
            "node_lock::remove_file " + spillway::quoted(name) + " in " + dir.string();
        unique_fd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (dirfd.get() < 0) throw_system_error(errno, "open", label);
        for (int attempt = 0; attempt < 64; ++attempt) {
            unique_fd fd;
            try {  // (a)
                fd = open_regular_file_at(dirfd.get(), file.c_str(), O_RDWR, label,
                                          regular_file_rules{.owned_by_user = true});
            } catch (const std::system_error& e) {
                if (e.code().value() == ENOENT) return true;
                throw;
            }
            bool use_ofd = mechanism == lock_mechanism::ofd;
            if (mechanism == lock_mechanism::automatic)
                use_ofd = ofd_on(fd.get(), F_OFD_GETLK, F_WRLCK) == 0 || errno != EINVAL;
            int rc;  // (b)
            do {
                rc = use_ofd ? ofd_on(fd.get(), F_OFD_SETLK, F_WRLCK)
                             : ::flock(fd.get(), LOCK_EX | LOCK_NB);
            } while (rc != 0 && errno == EINTR);
            if (rc != 0) {
                if (errno == EAGAIN || errno == EACCES || errno == EWOULDBLOCK) return false;
                throw_system_error(errno, use_ofd ? "fcntl(F_OFD_SETLK)" : "flock", label);
            }
            if (!names_file(dirfd.get(), file, fd.get())) continue;  // (c) closes, drops it
            if (::unlinkat(dirfd.get(), file.c_str(), 0) != 0 && errno != ENOENT)  // (d)
                throw_system_error(errno, "unlinkat", label);
            return true;  // (e) the descriptor closes here
        }
        return false;  // the name kept changing under us: someone is busy with it
    }

    /// The name given to the constructor.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// The lock file: `<directory>/spillway-<name>.lock`.
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
    /// The mechanism in use (never automatic).
    [[nodiscard]] lock_mechanism mechanism() const noexcept { return mechanism_; }

private:
    // Steps 1-2 for the name: opens or creates the lock file and checks it.
    int open_checked() const {
        unique_fd fd = open_regular_file_at(dirfd_, file_.c_str(), O_RDWR | O_CREAT, where(),
                                            regular_file_rules{.owned_by_user = true}, 0600);
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0) throw_system_error(errno, "fstat", what());
        if ((st.st_mode & 07777) != 0600 && ::fchmod(fd.get(), 0600) != 0)
            throw_system_error(errno, "fchmod", what());
        return fd.release();
    }

    // "node_lock '<name>' in <directory>", for messages about the file in the directory.
    std::string where() const {
        return "node_lock " + spillway::quoted(name_) + " in " + path_.parent_path().string();
    }
    // "node_lock '<name>': <path>".
    std::string what() const {
        return "node_lock " + spillway::quoted(name_) + ": " + path_.string();
    }

    // Step 3's check: the name in the directory is still the file this object locked.
    bool still_the_named_file() const noexcept { return names_file(dirfd_, file_, fd_); }

    // Whether `name` in `dirfd` is the file open on `fd` (device and inode; no link followed).
    static bool names_file(int dirfd, const std::string& name, int fd) noexcept {
        struct stat mine {
        }, named{};
        if (::fstat(fd, &mine) != 0) return true;  // (cannot tell: keep the lock taken)
        if (::fstatat(dirfd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0) return false;
        return mine.st_dev == named.st_dev && mine.st_ino == named.st_ino;
    }

    void release_file_lock() noexcept {
        if (mechanism_ == lock_mechanism::ofd)
            ofd(F_OFD_SETLK, F_UNLCK);
        else
            ::flock(fd_, LOCK_UN);
    }

    // The lock file went or was replaced: the name's file from now on.
    void reopen() {
        int fd = open_checked();
        ::close(fd_);
        fd_ = fd;
    }

    // fcntl() on the whole file (l_len 0: to the end, however it grows; l_pid must be 0
    // for OFD locks).
    int ofd(int cmd, short type) const noexcept { return ofd_on(fd_, cmd, type); }
    static int ofd_on(int fd, int cmd, short type) noexcept {
        struct flock fl {};
        fl.l_type = type;
        fl.l_whence = SEEK_SET;
        fl.l_start = 0;
        fl.l_len = 0;
        fl.l_pid = 0;
        return ::fcntl(fd, cmd, &fl);
    }

    lock_mechanism settle(lock_mechanism wanted) {
        if (wanted == lock_mechanism::flock) return wanted;
        if (ofd(F_OFD_GETLK, F_WRLCK) == 0) return lock_mechanism::ofd;
        int err = errno;
        if (wanted == lock_mechanism::automatic && err == EINVAL) return lock_mechanism::flock;
        throw_system_error(err, "fcntl(F_OFD_GETLK)",
                           "node_lock " + spillway::quoted(name_) + ": " + path_.string());
    }

    std::string name_;
    std::filesystem::path path_;
    std::string file_;  // "spillway-<name>.lock"
    int dirfd_ = -1;    // the lock directory, where the name is looked up again
    int fd_ = -1;
    lock_mechanism mechanism_ = lock_mechanism::automatic;
    std::mutex mutex_;
};
static_assert(lock_policy<node_lock>);

/// Removes both lock files of path_locks<node_lock>(name, options) ("<name>.read" and
/// "<name>.write") with node_lock::remove_file() (protocol step 7): each one only when no
/// process holds it.
/// @return true when both are gone; false when one is held (that one stays)
/// @throws what node_lock::remove_file() throws
inline bool remove_path_lock_files(std::string_view name, const lock_options& options = {},
                                   lock_mechanism mechanism = lock_mechanism::automatic) {
    const bool read_gone = node_lock::remove_file(std::string(name) + ".read", options, mechanism);
    const bool write_gone =
        node_lock::remove_file(std::string(name) + ".write", options, mechanism);
    return read_gone && write_gone;
}

}  // namespace spillway
