// SPDX-License-Identifier: Apache-2.0
// spillway/io/durable_file.hpp: whole files written and read so that a crash or a bad file
// never passes unnoticed: CRC-32C, create-write-fsync, exact reads with clear errors, and the
// directory swap that keeps the previous good save until the new one is complete.
//
// Guarantees:
// - crc32c() is the Castagnoli CRC (iSCSI polynomial, reflected, init and final xor
//   0xffffffff): crc32c("123456789") == 0xe3069283. It uses the SSE4.2 instruction where the
//   CPU has it and a table otherwise; both give the same value.
// - write_file() creates a new file (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600), writes every
//   byte and fsyncs it; errors are std::system_error naming the call, the path and the size.
// - open_regular_file() / open_regular_file_at() are the one way the library opens a file it
//   did not just create: with O_NONBLOCK|O_NOFOLLOW|O_CLOEXEC, so a FIFO, a device or a
//   symbolic link planted under the name can never block the open or redirect it; then
//   fstat() on the descriptor (not on the path, which may change in between) refuses
//   anything but a regular file with a std::system_error naming the path and what it is
//   ("is a FIFO", "is a directory", "is a character device", "is a symbolic link"); only
//   then is O_NONBLOCK cleared. Callers that must not write into a file shared with others
//   ask for regular_file_rules (owned by this user, one link). Every reader of saves (the
//   update pipeline's restore, a trainer's checkpoint reader) should open through it.
// - read_file() reads exactly the bytes asked for, or reports the file's real size; it opens
//   through open_regular_file(), so it never blocks on a FIFO and calls a directory one.
// - sync_directory() makes renames inside a directory durable.
// - replace_directory(tmp, dir) makes `tmp` appear at `dir` atomically (rename, or
//   renameat2(RENAME_EXCHANGE) when `dir` already exists, then the old contents are
//   removed): a crash at any point leaves either the old or the new directory at `dir`.
//   Where the file system cannot exchange (EINVAL, ENOSYS), it falls back to two renames
//   through "<dir>.old-<pid>", the one window in which `dir` is missing and the previous
//   save sits at that name.
#pragma once

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "spillway/error.hpp"

namespace spillway {

namespace detail {

inline const std::array<std::uint32_t, 256>& crc32c_table() {
    static const std::array<std::uint32_t, 256> table = [] {
        std::array<std::uint32_t, 256> t{};
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    return table;
}

inline std::uint32_t crc32c_table_update(std::uint32_t crc, const unsigned char* p,
                                         std::size_t n) noexcept {
    const auto& t = crc32c_table();
    for (std::size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hw_update(std::uint32_t crc,
                                                                        const unsigned char* p,
                                                                        std::size_t n) noexcept {
    std::uint64_t c = crc;
    while (n >= 8) {
        std::uint64_t w;
        std::memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    auto c32 = static_cast<std::uint32_t>(c);
    while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
#endif

}  // namespace detail

/// Whether crc32c() uses the CPU's instruction.
inline bool crc32c_hardware() noexcept {
#if defined(__x86_64__)
    static const bool has = __builtin_cpu_supports("sse4.2");
    return has;
#else
    return false;
#endif
}

/// Continues a CRC-32C over `bytes` (start with crc = 0).
inline std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept {
    auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    std::uint32_t c = ~crc;
#if defined(__x86_64__)
    if (crc32c_hardware()) return ~detail::crc32c_hw_update(c, p, bytes.size());
#endif
    return ~detail::crc32c_table_update(c, p, bytes.size());
}

/// The portable path, exposed so tests can prove both paths agree.
inline std::uint32_t crc32c_portable(std::span<const std::byte> bytes,
                                     std::uint32_t crc = 0) noexcept {
    return ~detail::crc32c_table_update(~crc, reinterpret_cast<const unsigned char*>(bytes.data()),
                                        bytes.size());
}

/// Owns a file descriptor: closes it at scope exit unless released. Movable, not copyable.
class unique_fd {
public:
    /// No descriptor.
    unique_fd() = default;
    /// Takes ownership of `fd` (-1: none).
    explicit unique_fd(int fd) noexcept : fd_(fd) {}
    /// Takes the descriptor of `o`, which is left empty.
    unique_fd(unique_fd&& o) noexcept : fd_(o.release()) {}
    /// Closes the held descriptor and takes the one of `o`.
    unique_fd& operator=(unique_fd&& o) noexcept {
        if (this != &o) {
            reset();
            fd_ = o.release();
        }
        return *this;
    }
    /// One owner per descriptor: not copyable.
    unique_fd(const unique_fd&) = delete;
    /// One owner per descriptor: not copyable.
    unique_fd& operator=(const unique_fd&) = delete;
    /// Closes the descriptor, if any.
    ~unique_fd() { reset(); }
    /// The descriptor, or -1.
    [[nodiscard]] int get() const noexcept { return fd_; }
    /// Gives the descriptor up without closing it; returns it.
    int release() noexcept { return std::exchange(fd_, -1); }
    /// Closes the descriptor (errors ignored), leaving none.
    void reset() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
};

/// What a file of mode `mode` (st_mode) is, for messages: "a regular file", "a directory",
/// "a FIFO", "a character device", "a block device", "a socket", "a symbolic link", "a file of an
/// unknown type".
inline std::string_view file_type_name(mode_t mode) noexcept {
    switch (mode & S_IFMT) {
        case S_IFREG:
            return "a regular file";
        case S_IFDIR:
            return "a directory";
        case S_IFIFO:
            return "a FIFO";
        case S_IFCHR:
            return "a character device";
        case S_IFBLK:
            return "a block device";
        case S_IFSOCK:
            return "a socket";
        case S_IFLNK:
            return "a symbolic link";
        default:
            return "a file of an unknown type";
    }
}

/// Further conditions open_regular_file_at() checks on the descriptor, for callers that write
/// into an existing file in place (or hold it as a lock): a file owned by another user, or
/// with a second hard link, is someone else's too.
struct regular_file_rules {
    /// st_uid == geteuid(), else EPERM "belongs to another user (uid N)".
    bool owned_by_user = false;
    /// st_nlink == 1, else EMLINK "has N hard links".
    bool single_link = false;
};

/// Opens `name` (relative to `dirfd`, or AT_FDCWD for a path) with
/// `flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC` (`mode` when flags has O_CREAT), fstat()s the
/// descriptor and refuses anything but a regular file, then clears O_NONBLOCK so transfers
/// block as usual.
/// @param dirfd a directory descriptor `name` is relative to, or AT_FDCWD
/// @param name  the file's name under `dirfd`, or a path
/// @param flags O_RDONLY, O_WRONLY or O_RDWR, plus O_CREAT, O_DIRECT, ... as needed (never
///              O_NONBLOCK: it is added and cleared here)
/// @param what  how messages call the file, e.g. "update_pipeline::restore of subgroup 6"
/// @param rules further checks on the descriptor (owner, link count); none by default
/// @param mode  the new file's mode when `flags` has O_CREAT
/// @return the descriptor, blocking, of a regular file that meets `rules`
/// @throws std::system_error "<what>: <path> is a FIFO, not a regular file" (EINVAL; EISDIR
///         for a directory, ELOOP for a symbolic link), EPERM or EMLINK for a broken rule, or
///         the errno of open/fstat/fcntl (ENOENT, EACCES, ...), always naming the path
inline unique_fd open_regular_file_at(int dirfd, const char* name, int flags, std::string_view what,
                                      regular_file_rules rules = {}, mode_t mode = 0600) {
    const auto label = [&] {
        std::string l(what);
        if (!l.empty()) l += ": ";
        return l + name;
    };
    const auto refuse = [&](const struct stat& st) {
        const int code = S_ISDIR(st.st_mode) ? EISDIR : S_ISLNK(st.st_mode) ? ELOOP : EINVAL;
        throw std::system_error(
            code, std::generic_category(),
            label() + " is " + std::string(file_type_name(st.st_mode)) + ", not a regular file");
    };
    unique_fd fd(::openat(dirfd, name, flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, mode));
    if (fd.get() < 0) {
        const int err = errno;
        // O_NOFOLLOW on a link (ELOOP), O_WRONLY on a directory (EISDIR), a FIFO without a
        // reader or a device without a driver (ENXIO), a socket (ENXIO), O_DIRECT on a FIFO
        // (EINVAL): say what is there.
        struct stat st {};
        if ((err == ELOOP || err == EISDIR || err == ENXIO || err == EOPNOTSUPP || err == EINVAL) &&
            ::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
            refuse(st);
        throw_system_error(err, "open", label());
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_system_error(errno, "fstat", label());
    if (!S_ISREG(st.st_mode)) refuse(st);
    if (rules.owned_by_user && st.st_uid != ::geteuid())
        throw std::system_error(
            EPERM, std::generic_category(),
            label() + " belongs to another user (uid " + std::to_string(st.st_uid) + ")");
    if (rules.single_link && st.st_nlink != 1)
        throw std::system_error(EMLINK, std::generic_category(),
                                label() + " has " + std::to_string(st.st_nlink) +
                                    " hard links (another name shares its contents)");
    const int fl = ::fcntl(fd.get(), F_GETFL);
    if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0)
        throw_system_error(errno, "fcntl(F_SETFL)", label());
    return fd;
}

/// Opens `path` for reading: open_regular_file_at(AT_FDCWD, path, O_RDONLY, what). Use it
/// for every file a save is read back from, so that a FIFO, a device or a directory put in
/// its place is refused at once, with its name, instead of hanging or reading nonsense.
inline unique_fd open_regular_file(const std::filesystem::path& path, std::string_view what) {
    return open_regular_file_at(AT_FDCWD, path.c_str(), O_RDONLY, what);
}

/// Creates `path` (mode 0600, must not exist), writes `bytes`, fsyncs, closes.
inline void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes,
                       std::string_view what) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) throw_system_error(errno, "open", std::string(what) + ": " + path.string());
    std::size_t done = 0;
    while (done < bytes.size()) {
        ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            ::close(fd);
            throw_system_error(
                err, "write",
                std::string(what) + ": " + path.string() + " (" + bytes_str(bytes.size()) + ")");
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) {
        int err = errno;
        ::close(fd);
        throw_system_error(err, "fsync", std::string(what) + ": " + path.string());
    }
    if (::close(fd) != 0)
        throw_system_error(errno, "close", std::string(what) + ": " + path.string());
}

/// Reads exactly out.size() bytes of `path`, opened by open_regular_file() (so a FIFO, a
/// device, a directory or a symbolic link is refused at once, naming the path and what it
/// is). Returns the file's size; when it differs from out.size() nothing is read and the
/// caller reports the mismatch.
inline std::size_t read_file(const std::filesystem::path& path, std::span<std::byte> out,
                             std::string_view what) {
    unique_fd fd = open_regular_file(path, what);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
        throw_system_error(errno, "fstat", std::string(what) + ": " + path.string());
    auto size = static_cast<std::size_t>(st.st_size);
    if (size != out.size()) return size;
    std::size_t done = 0;
    while (done < out.size()) {
        ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw_system_error(
                errno, "read",
                std::string(what) + ": " + path.string() + " (" + bytes_str(out.size()) + ")");
        }
        if (n == 0) break;  // shrank behind our back
        done += static_cast<std::size_t>(n);
    }
    return done;
}

/// fsyncs a directory so renames inside it are durable.
inline void sync_directory(const std::filesystem::path& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw_system_error(errno, "open", "directory " + dir.string());
    ::fsync(fd);  // best effort: some file systems refuse fsync on directories
    ::close(fd);
}

/// Puts `tmp` at `dir` atomically (see the file comment); the old contents are removed, but
/// only once the swap is durable: the parent directory is fsynced between the two, so a crash
/// never leaves `dir` naming a half-removed previous save.
inline void replace_directory(const std::filesystem::path& tmp, const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
    bool exists = fs::exists(fs::symlink_status(dir, ec));
    if (!exists) {
        if (::rename(tmp.c_str(), dir.c_str()) != 0)
            throw_system_error(errno, "rename", tmp.string() + " -> " + dir.string());
        sync_directory(parent);
        return;
    }
    fs::path previous;  // where the previous save is once the new one is in place
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
        previous = tmp;
    } else {
        int err = errno;
        if (err != EINVAL && err != ENOSYS && err != ENOTSUP)
            throw_system_error(err, "renameat2(RENAME_EXCHANGE)",
                               tmp.string() + " <-> " + dir.string());
        previous = dir.string() + ".old-" + std::to_string(::getpid());
        if (::rename(dir.c_str(), previous.c_str()) != 0)
            throw_system_error(errno, "rename", dir.string() + " -> " + previous.string());
        if (::rename(tmp.c_str(), dir.c_str()) != 0) {
            int e2 = errno;
            ::rename(previous.c_str(), dir.c_str());  // put the previous save back
            throw_system_error(e2, "rename", tmp.string() + " -> " + dir.string());
        }
    }
    sync_directory(parent);  // the swap is durable before the previous save goes
    fs::remove_all(previous, ec);
}

}  // namespace spillway
