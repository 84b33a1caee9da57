// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/detail/offset_file.hpp: a save's file written or read at offsets, a piece
/// at a time, so no buffer of the file's size is needed.
///
/// Guarantees:
/// - offset_writer creates the file anew (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600: an existing
///   file or a link planted under the name is refused), writes every byte asked (EINTR
///   retried), and finish() fsyncs it.
/// - offset_reader opens through open_regular_file() (a FIFO, a device, a directory or a
///   symbolic link is refused at once) and reads exactly the bytes asked (a short file is
///   an error).
/// - Errors are std::system_error naming the path, what failed and the errno.
#pragma once

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "spillway/error.hpp"
#include "spillway/io/durable_file.hpp"

namespace spillway::detail {

/// A file created anew and written at offsets (see the file comment).
class offset_writer {
public:
    explicit offset_writer(const std::filesystem::path& path) : path_(path) {
        fd_ = unique_fd(
            ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (fd_.get() < 0) throw_system_error(errno, "open (create)", path_.string());
    }
    void write(std::size_t offset, const void* data, std::size_t nbytes) {
        const auto* p = static_cast<const char*>(data);
        while (nbytes > 0) {
            const ssize_t n = ::pwrite(fd_.get(), p, nbytes, static_cast<off_t>(offset));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) throw_system_error(n < 0 ? errno : ENOSPC, "pwrite", path_.string());
            p += n;
            offset += static_cast<std::size_t>(n);
            nbytes -= static_cast<std::size_t>(n);
        }
    }
    /// fsyncs and closes the file.
    void finish() {
        if (::fsync(fd_.get()) != 0) throw_system_error(errno, "fsync", path_.string());
        fd_.reset();
    }

private:
    std::filesystem::path path_;
    unique_fd fd_;
};

/// A regular file read at offsets (see the file comment).
class offset_reader {
public:
    /// @param what how messages call the file
    offset_reader(const std::filesystem::path& path, std::string_view what) : path_(path) {
        fd_ = open_regular_file(path, what);
        const off_t got = ::lseek(fd_.get(), 0, SEEK_END);
        if (got < 0) throw_system_error(errno, "lseek", path.string());
        size_ = static_cast<std::size_t>(got);
    }
    /// The file's size when it was opened.
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    void read(std::size_t offset, void* data, std::size_t nbytes) {
        auto* p = static_cast<char*>(data);
        while (nbytes > 0) {
            const ssize_t n = ::pread(fd_.get(), p, nbytes, static_cast<off_t>(offset));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0)
                throw std::system_error(
                    n == 0 ? std::make_error_code(std::errc::io_error)
                           : std::error_code(errno, std::generic_category()),
                    path_.string() + ": read failed" + (n == 0 ? std::string(": short file") : ""));
            p += n;
            offset += static_cast<std::size_t>(n);
            nbytes -= static_cast<std::size_t>(n);
        }
    }

private:
    std::filesystem::path path_;
    unique_fd fd_;
    std::size_t size_ = 0;
};

}  // namespace spillway::detail
