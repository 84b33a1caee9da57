// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/lock/owned_directory.hpp: a scratch directory that records its owner's life, so
/// that what a killed process left behind can be told from what a living one still uses.
///
/// A process that dies by SIGKILL (or an OOM kill, or a power cut of the job) runs no
/// destructor, and its temporary directories stay: a half-written checkpoint, a trainer's
/// default storage paths, gigabytes each. A process id written into the name cannot tell
/// whether the owner lives (ids are reused, and on a shared file system the id belongs to
/// another host). A lock can: the kernel drops it when the holder dies, whatever the cause.
///
/// Guarantees:
///  - owned_directory::create(parent, prefix) makes a new directory `<parent>/<prefix>XXXXXX`
///    (mkdtemp: mode 0700, a name no other process has) holding one empty file,
///    ".spillway.owner" (mode 0600), on which the object holds an exclusive flock() for its
///    whole life. The file name starts with ".spillway.", which a file_tier placed in the
///    same directory ignores.
///  - reclaim_abandoned(parent, prefix) removes every directory `<parent>/<prefix>*` whose
///    owner file it can lock: its owner is gone. It never touches an entry that is not a
///    directory owned by the calling user, never follows a symbolic link, and never removes
///    a directory without an owner file (made by someone else, disowned, or being made right
///    now: the owner file appears only once it is locked, protocol step 3).
///  - The destructor removes the directory and everything in it, unless disown() was called:
///    the directory is then the caller's to keep (e.g. to rename it into place).
///  - A prefix is a plain name: validated like a key (no '/', no ".."), so the directory stays
///    in `parent`. Errors name the path and the call.
///
/// Protocol:
///  1. create(): mkdtemp("<parent>/<prefix>XXXXXX"), then open the new directory
///     (O_DIRECTORY | O_NOFOLLOW).
///  2. Create ".spillway.owner.new" in it (O_CREAT | O_EXCL | O_NOFOLLOW, 0600) and take
///     flock(LOCK_EX) on it.
///  3. Rename it to ".spillway.owner". Only now can a reclaimer find it, already locked.
///  4. reclaim_abandoned(): for each entry of `parent` whose name starts with the prefix,
///     lstat it; skip it unless it is a directory owned by this user. Open it (O_DIRECTORY |
///     O_NOFOLLOW) and check it is the entry just examined (device and inode); open its
///     ".spillway.owner" (O_NOFOLLOW | O_NONBLOCK), skip if there is none or it is not a
///     regular file of this user.
///  5. flock(LOCK_EX | LOCK_NB): if another holds it (the owner, or a reclaimer already at
///     work) skip; otherwise the owner is dead: remove the directory while holding the lock.
///  6. disown(): unlink ".spillway.owner", then drop the lock (closing the file). A crash
///     between the two leaves a directory without an owner file, which no reclaimer removes.
///
/// flock() locks belong to the open file description: an owned_directory in this process is
/// as alive to a reclaimer in this process as to one in another. On NFS, Linux turns flock()
/// into a lock every client sees.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "spillway/error.hpp"

namespace spillway {

/// A scratch directory whose owner's life is a lock held inside it (guarantees and protocol
/// in the file comment). Movable, not copyable.
class owned_directory {
public:
    /// The owner file's name inside every owned directory.
    static constexpr std::string_view owner_file = ".spillway.owner";

    /// Makes `<parent>/<prefix>XXXXXX` and holds its owner lock (protocol steps 1-3).
    /// @throws std::invalid_argument for a prefix that is not a plain name (see validate_key)
    /// @throws std::system_error naming the path when the directory or its owner file cannot
    ///         be made or locked (missing parent, no permission, full disk)
    [[nodiscard]] static owned_directory create(const std::filesystem::path& parent, std::string_view prefix) {
        validate_key(prefix, "directory prefix");
        std::string templ = (parent / (std::string(prefix) + "XXXXXX")).string();
        std::vector<char> name(templ.begin(), templ.end());
        name.push_back('\0');
        if (!::mkdtemp(name.data())) throw_system_error(errno, "mkdtemp", "owned_directory in " + parent.string());
        owned_directory d;  // from here on, a failure removes the directory again (~owned_directory)
        d.path_ = name.data();
        const std::string what = "owned_directory " + d.path_.string();
        const int dirfd = ::open(name.data(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dirfd < 0) throw_system_error(errno, "open", what);
        auto fail = [&](const char* call) {
            const int err = errno;
            ::close(dirfd);
            throw_system_error(err, call, what + ": owner file");
        };
        const std::string staged = std::string(owner_file) + ".new";
        d.owner_fd_ = ::openat(dirfd, staged.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (d.owner_fd_ < 0) fail("openat");
        if (::flock(d.owner_fd_, LOCK_EX | LOCK_NB) != 0) fail("flock(LOCK_EX)");
        if (::renameat(dirfd, staged.c_str(), dirfd, std::string(owner_file).c_str()) != 0) fail("renameat");
        ::close(dirfd);
        return d;
    }

    /// Removes every abandoned `<parent>/<prefix>*` directory (protocol steps 4-5); returns
    /// how many it removed. Entries it cannot examine are skipped, never removed.
    /// @throws std::invalid_argument for a prefix that is not a plain name
    /// @throws std::system_error naming `parent` when it cannot be read
    static std::size_t reclaim_abandoned(const std::filesystem::path& parent, std::string_view prefix) {
        validate_key(prefix, "directory prefix");
        int parent_fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (parent_fd < 0) throw_system_error(errno, "open", "owned_directory::reclaim_abandoned: " + parent.string());
        DIR* listing = ::fdopendir(parent_fd);
        if (!listing) {
            int err = errno;
            ::close(parent_fd);
            throw_system_error(err, "fdopendir", "owned_directory::reclaim_abandoned: " + parent.string());
        }
        std::vector<std::string> candidates;
        while (dirent* e = ::readdir(listing)) {
            std::string_view n(e->d_name);
            if (n.size() > prefix.size() && n.substr(0, prefix.size()) == prefix) candidates.emplace_back(n);
        }
        std::size_t removed = 0;
        for (const auto& n : candidates)
            if (remove_if_abandoned(::dirfd(listing), parent / n, n)) ++removed;
        ::closedir(listing);
        return removed;
    }

    /// Takes over `o`'s directory and lock; `o` then owns nothing.
    owned_directory(owned_directory&& o) noexcept
        : path_(std::move(o.path_)), owner_fd_(std::exchange(o.owner_fd_, -1)) {
        o.path_.clear();
    }
    /// Removes this object's directory (as the destructor does), then takes over `o`'s.
    owned_directory& operator=(owned_directory&& o) noexcept {
        if (this != &o) {
            remove();
            path_ = std::move(o.path_);
            o.path_.clear();
            owner_fd_ = std::exchange(o.owner_fd_, -1);
        }
        return *this;
    }
    /// One owner per directory: not copyable.
    owned_directory(const owned_directory&) = delete;
    /// One owner per directory: not copyable.
    owned_directory& operator=(const owned_directory&) = delete;
    /// Removes the directory and its contents unless disowned; errors are ignored.
    ~owned_directory() { remove(); }

    /// The directory (empty after disown() or a move).
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

    /// Gives the directory up (protocol step 6): the owner file goes, the lock is dropped,
    /// and the destructor leaves the directory alone. Returns its path.
    /// @throws std::system_error naming the path when the owner file cannot be removed (the
    ///         object still owns the directory then)
    std::filesystem::path disown() {
        const auto owner = path_ / std::string(owner_file);
        if (::unlink(owner.c_str()) != 0 && errno != ENOENT)
            throw_system_error(errno, "unlink", "owned_directory::disown: " + owner.string());
        close_owner();
        return std::exchange(path_, {});
    }

private:
    owned_directory() = default;

    void close_owner() noexcept {
        if (owner_fd_ >= 0) ::close(owner_fd_);  // drops the flock
        owner_fd_ = -1;
    }

    void remove() noexcept {
        if (!path_.empty()) {
            std::error_code ec;
            std::filesystem::remove_all(path_, ec);  // while the lock is held: no reclaimer races
            path_.clear();
        }
        close_owner();
    }

    // Steps 4-5 for one entry of the parent directory.
    static bool remove_if_abandoned(int parent_fd, const std::filesystem::path& path, const std::string& name) {
        struct stat entry {}, opened {}, owner {};
        if (::fstatat(parent_fd, name.c_str(), &entry, AT_SYMLINK_NOFOLLOW) != 0) return false;
        if (!S_ISDIR(entry.st_mode) || entry.st_uid != ::geteuid()) return false;
        int dir_fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dir_fd < 0) return false;
        bool same = ::fstat(dir_fd, &opened) == 0 && opened.st_dev == entry.st_dev && opened.st_ino == entry.st_ino;
        int owner_fd = same ? ::openat(dir_fd, std::string(owner_file).c_str(),
                                       O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
                            : -1;
        ::close(dir_fd);
        if (owner_fd < 0) return false;
        bool abandoned = ::fstat(owner_fd, &owner) == 0 && S_ISREG(owner.st_mode) && owner.st_uid == ::geteuid() &&
                         ::flock(owner_fd, LOCK_EX | LOCK_NB) == 0;
        bool removed = false;
        if (abandoned) {
            std::error_code ec;
            std::filesystem::remove_all(path, ec);
            removed = !ec;
        }
        ::close(owner_fd);
        return removed;
    }

    std::filesystem::path path_;
    int owner_fd_ = -1;
};

}  // namespace spillway
