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
// - read_file() reads exactly the bytes asked for, or reports the file's real size.
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
#include <system_error>

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

/// Reads exactly out.size() bytes of `path` (O_NOFOLLOW). Returns the file's size; when it
/// differs from out.size() nothing is read and the caller reports the mismatch.
inline std::size_t read_file(const std::filesystem::path& path, std::span<std::byte> out,
                             std::string_view what) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) throw_system_error(errno, "open", std::string(what) + ": " + path.string());
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        throw_system_error(err, "fstat", std::string(what) + ": " + path.string());
    }
    auto size = static_cast<std::size_t>(st.st_size);
    if (size != out.size()) {
        ::close(fd);
        return size;
    }
    std::size_t done = 0;
    while (done < out.size()) {
        ssize_t n = ::read(fd, out.data() + done, out.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            ::close(fd);
            throw_system_error(
                err, "read",
                std::string(what) + ": " + path.string() + " (" + bytes_str(out.size()) + ")");
        }
        if (n == 0) break;  // shrank behind our back
        done += static_cast<std::size_t>(n);
    }
    ::close(fd);
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
