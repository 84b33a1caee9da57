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
///    regular files owned by the calling user, and are never deleted by node_lock. They are
///    empty. If something else deletes or replaces one (a cleaner of /dev/shm, systemd's
///    RemoveIPC at logout), a holder of the old file and one of the new would not exclude
///    each other: every acquisition checks that the file it locked is still the one under
///    the name, and otherwise lets go, opens the name again and retries (protocol step 3),
///    so at most the hold that was current when the file went overlaps a new one.
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
        expect_argument(file.size() <= 255, "lock name " + spillway::quoted(name) + " is too long: the lock file name " +
                                                spillway::quoted(file) + " would exceed 255 bytes");
        auto dir = options.directory.empty() ? default_lock_directory() : options.directory;
        path_ = dir / file;
        file_ = file;
        dirfd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dirfd_ < 0)
            throw_system_error(errno, "open", "node_lock " + spillway::quoted(name_) + ": lock directory " + dir.string());
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
                    rc = mechanism_ == lock_mechanism::ofd ? ofd(F_OFD_SETLKW, F_WRLCK) : ::flock(fd_, LOCK_EX);
                } while (rc != 0 && errno == EINTR);
                if (rc != 0)
                    throw_system_error(errno, mechanism_ == lock_mechanism::ofd ? "fcntl(F_OFD_SETLKW)" : "flock(LOCK_EX)",
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
                    rc = mechanism_ == lock_mechanism::ofd ? ofd(F_OFD_SETLK, F_WRLCK) : ::flock(fd_, LOCK_EX | LOCK_NB);
                } while (rc != 0 && errno == EINTR);
                if (rc != 0) {
                    int err = errno;
                    if (err == EAGAIN || err == EACCES || err == EWOULDBLOCK) break;
                    throw_system_error(err, mechanism_ == lock_mechanism::ofd ? "fcntl(F_OFD_SETLK)" : "flock(LOCK_EX|LOCK_NB)",
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

    /// The name given to the constructor.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// The lock file: `<directory>/spillway-<name>.lock`.
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
    /// The mechanism in use (never automatic).
    [[nodiscard]] lock_mechanism mechanism() const noexcept { return mechanism_; }

private:
    // Steps 1-2 for the name: opens or creates the lock file and checks it.
    int open_checked() const {
        const std::string what = "node_lock " + spillway::quoted(name_) + ": " + path_.string();
        int fd = ::openat(dirfd_, file_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
        if (fd < 0) {
            int err = errno;
            if (err == ELOOP) throw_system_error(err, "openat(O_NOFOLLOW)", what + " is a symbolic link");
            throw_system_error(err, "openat", what);
        }
        try {
            struct stat st {};
            if (::fstat(fd, &st) != 0) throw_system_error(errno, "fstat", what);
            if (!S_ISREG(st.st_mode)) throw_system_error(EINVAL, "fstat", what + " is not a regular file");
            if (st.st_uid != ::geteuid())
                throw_system_error(EPERM, "fstat", what + " belongs to another user (uid " + std::to_string(st.st_uid) + ")");
            if ((st.st_mode & 07777) != 0600 && ::fchmod(fd, 0600) != 0) throw_system_error(errno, "fchmod", what);
        } catch (...) {
            ::close(fd);
            throw;
        }
        return fd;
    }

    // Step 3's check: the name in the directory is still the file this object locked.
    bool still_the_named_file() const noexcept {
        struct stat mine {}, named {};
        if (::fstat(fd_, &mine) != 0) return true;  // (cannot tell: keep the lock taken)
        if (::fstatat(dirfd_, file_.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0) return false;
        return mine.st_dev == named.st_dev && mine.st_ino == named.st_ino;
    }

    void release_file_lock() noexcept {
        if (mechanism_ == lock_mechanism::ofd) ofd(F_OFD_SETLK, F_UNLCK);
        else ::flock(fd_, LOCK_UN);
    }

    // The lock file went or was replaced: the name's file from now on.
    void reopen() {
        int fd = open_checked();
        ::close(fd_);
        fd_ = fd;
    }

    // fcntl() on the whole file (l_len 0: to the end, however it grows; l_pid must be 0
    // for OFD locks).
    int ofd(int cmd, short type) const noexcept {
        struct flock fl {};
        fl.l_type = type;
        fl.l_whence = SEEK_SET;
        fl.l_start = 0;
        fl.l_len = 0;
        fl.l_pid = 0;
        return ::fcntl(fd_, cmd, &fl);
    }

    lock_mechanism settle(lock_mechanism wanted) {
        if (wanted == lock_mechanism::flock) return wanted;
        if (ofd(F_OFD_GETLK, F_WRLCK) == 0) return lock_mechanism::ofd;
        int err = errno;
        if (wanted == lock_mechanism::automatic && err == EINVAL) return lock_mechanism::flock;
        throw_system_error(err, "fcntl(F_OFD_GETLK)", "node_lock " + spillway::quoted(name_) + ": " + path_.string());
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

}  // namespace spillway
