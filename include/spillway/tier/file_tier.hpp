// SPDX-License-Identifier: Apache-2.0
// spillway/tier/file_tier.hpp: a storage tier in a directory, one file per key, written and
// read through an I/O engine (io_uring or POSIX), with O_DIRECT where the file system
// allows it.
//
// Guarantees:
// - Construction opens the directory and proves it writable (a probe file is created and
//   removed); a missing directory, a path under a regular file (ENOTDIR) or an unwritable
//   one throws std::system_error naming the path. It then probes O_DIRECT with one aligned
//   4 KiB write and read; where the file system refuses (ramfs, tmpfs before Linux 6.6:
//   EINVAL), the tier uses buffered I/O and says why in direct_io_note();
//   direct_io_mode::required throws instead.
// - Files are created mode 0600 with O_CREAT|O_EXCL|O_CLOEXEC|O_NOFOLLOW and opened with
//   O_NOFOLLOW|O_NONBLOCK; keys pass validate_key() (no '/', no "..") and may not start
//   with the reserved prefix ".spillway.", so no key names anything outside the directory
//   or collides with the tier's own temporary files. Key errors name the tier.
// - Nothing outside the directory is ever written through a link. The tier writes in place
//   only into a file it reuses (a spare, step 2), and only after fstat() on the open
//   descriptor shows a regular file of this user with exactly one link; a spare that fails
//   (a `cp -al` snapshot of the directory, a link made to it since) is unlinked from the
//   directory, never written, and a new temporary file is used. A key's own file is never
//   written in place: a link planted under a key's name is replaced by the exchange of step
//   4 (and then dropped as above), a symbolic link likewise (O_NOFOLLOW).
// - Reads open the key's file with O_NONBLOCK and fstat() the descriptor: a FIFO, a device
//   or a directory put under a key's name fails the read (naming what it is), never blocks
//   it. A key's file that has other hard links is read like any other: whether a file
//   linked from outside may be read as a key is the caller's choice (it is the caller who
//   planted or allowed the link); the tier only guarantees that it never writes it.
// - Any size round-trips exactly, from any caller buffer. With O_DIRECT the 4 KiB-aligned
//   body of a blob moves straight from or to the caller's buffer when that buffer is 4 KiB
//   aligned, else through an aligned bounce buffer; the tail (size % 4096 bytes) moves
//   through a second, buffered descriptor. Files hold exactly the blob's bytes.
// - Write protocol (a failed rewrite leaves the previous blob intact):
//   1. reserve the size against the capacity (ENOSPC when it would not fit);
//   2. take a spare file (one a rewrite replaced; see file_tier_options::spare_files), open
//      it (O_NONBLOCK|O_NOFOLLOW), check the descriptor (regular, owned by this user, one
//      link; else unlink the name and take no spare) and resize it, or create a temporary file
//      ".spillway.tmp.<pid>.<n>.<host>" and fallocate it to the size (so a full disk fails here,
//      early, and direct writes never extend a file);
//   3. write body and tail through the engine, concurrently;
//   4. on success, under the tier's lock, exchange the temporary file with the key's file
//      (renameat2 RENAME_EXCHANGE; a plain rename when the key had no file) and account
//      the new size; keep the old file as a spare unless a read of the key is in flight (it
//      is unlinked then: the reader keeps its descriptor), or unlink it; on failure unlink
//      the temporary file and release the reservation.
// - Same key at once: a read that overlaps a rewrite returns the old blob or the new one,
//   whole (its size, its descriptors and its reader count are taken under the lock step 4
//   holds); of two overlapping writes, the one installed last is the file and the size.
//   Erasing a key with an operation in flight is the caller's error (storage_tier.hpp).
//   Data is not fsync()ed: the tier is for offloading within a run, not for durability
//   across power loss.
// - Errors name the tier, the key, the path, the sizes and the errno: a missing key is
//   std::system_error(ENOENT); a buffer of the wrong size std::invalid_argument with both
//   sizes; a file deleted behind the tier's back ENOENT (the key is then forgotten); a file
//   whose size changed behind the tier's back EIO with both sizes. The tier stays usable.
// - The index of keys and sizes lives in memory; construction rebuilds it from the files
//   already in the directory (the tier is persistent) and removes temporary files left by
//   processes of this host that no longer exist; another host's are never touched (on a
//   shared file system its tier may be running).
// - Destroying the tier waits for every operation in flight, then the engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/stat.h>
#include <unistd.h>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/io/io_engine.hpp"
#include "spillway/tier/detail/file_helpers.hpp"
#include "spillway/tier/file_tier_options.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway {

/// A storage_tier in a directory, one file per key, moved by `Engine` (io_engine picks
/// io_uring or POSIX at run time); see the guarantees at the top of this header.
template <class Engine = io_engine>
requires io_engine_model<Engine>
class file_tier {
public:
    /// Persistent, direct I/O capable, host accessible.
    static constexpr tier_properties properties{
        .persistent = true, .direct_io = true, .host_accessible = true};
    /// The prefix of the tier's own files (temporary, probe and spare files); no key may
    /// start with it.
    static constexpr std::string_view reserved_prefix = ".spillway.";
    /// The O_DIRECT alignment of offsets, sizes and buffers, in bytes.
    static constexpr std::size_t block = 4096;

    /// Opens (never creates) `directory`. Throws std::system_error naming the path when it is
    /// missing, not a directory, or not writable, or when O_DIRECT is required and refused;
    /// std::invalid_argument for bad engine settings.
    explicit file_tier(std::filesystem::path directory, file_tier_options options = {})
        : dir_(std::move(directory)),
          capacity_(options.capacity),
          name_(std::move(options.name)),
          max_spares_(options.spare_files) {
        options.engine.validate();
        int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) throw_system_error(errno, "open", name_ + ": directory " + dir_.string());
        dirfd_ = detail::unique_fd(fd);
        probe(options.direct_io);
        scan();
        if constexpr (std::is_same_v<Engine, io_engine>)
            engine_ = std::make_unique<Engine>(options.engine, options.backend);
        else
            engine_ = std::make_unique<Engine>(options.engine);
    }
    file_tier(const file_tier&) = delete;
    file_tier& operator=(const file_tier&) = delete;

    /// Waits for every operation in flight.
    ~file_tier() {
        std::unique_lock lock(mutex_);
        idle_cv_.wait(lock, [&] { return pending_ == 0; });
        for (auto& s : spares_) ::unlinkat(dirfd_.get(), s.name.c_str(), 0);
    }

    /// Starts storing `bytes` under `key` (write protocol above). Throws
    /// std::invalid_argument at once for a bad key; every other error comes from wait().
    /// Keep `bytes` alive and unchanged until the completion is ready.
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        check_key(key);
        const std::size_t n = bytes.size();
        stats_.begin(io_direction::write);
        auto op = std::make_shared<write_op>();
        op->key = std::string(key);
        op->nbytes = n;
        try {
            {
                std::lock_guard lock(mutex_);
                auto it = index_.find(op->key);
                std::size_t old = it == index_.end() ? 0 : it->second;
                if (n > old && used_ + reserved_ + (n - old) > capacity_)
                    throw std::system_error(
                        ENOSPC, std::generic_category(),
                        describe("write", key, n) + " exceeds the capacity of " +
                            bytes_str(capacity_) + " (" + bytes_str(used_) + " used, " +
                            bytes_str(reserved_) + " reserved by writes in flight)");
                reserved_ += n;
                ++pending_;
                op->reserved = true;
            }
            open_temporary(*op, key);
            const std::size_t body = direct_ ? n / block * block : n;
            const std::size_t tail = n - body;
            const std::byte* src = bytes.data();
            if (body > 0 && direct_ && !is_aligned(src, block)) {
                op->bounce =
                    aligned_buffer(body, memory_lock::unlocked, block, buffer_fill::uninitialized);
                std::memcpy(op->bounce.data(), src, body);
                src = op->bounce.data();
            }
            if (tail > 0 && direct_) {
                op->tail_fd =
                    open_regular_file_at(dirfd_.get(), op->tmp.c_str(), O_WRONLY, op->label);
                same_file(op->fd.get(), op->tail_fd.get(), op->label);
            }
            completion_source source = op->source;
            auto handle = source.handle();
            op->parts = (body > 0 ? 1 : 0) + (tail > 0 ? 1 : 0);
            if (op->parts == 0) {
                finish_write(op, nullptr);
                return handle;
            }
            auto on_done = [this, op](std::size_t, std::exception_ptr err) {
                part_done_write(op, std::move(err));
            };
            // Read the descriptors now: once the last part is in, the op may finish and close them.
            const int body_fd = op->fd.get();
            const int tail_fd = direct_ ? op->tail_fd.get() : body_fd;
            if (body > 0)
                engine_->submit(
                    {io_op::write, body_fd, const_cast<std::byte*>(src), body, 0, op->label},
                    on_done);
            if (tail > 0)
                engine_->submit({io_op::write, tail_fd, const_cast<std::byte*>(bytes.data() + body),
                                 tail, body, op->label},
                                on_done);
            return handle;
        } catch (...) {
            auto err = std::current_exception();
            if (op->reserved) {
                cleanup_failed_write(*op);
                stats_.end(io_direction::write, n, false);
                std::lock_guard lock(mutex_);
                if (--pending_ == 0) idle_cv_.notify_all();
            } else {
                stats_.end(io_direction::write, n, false);
            }
            return io_completion::failed(err);
        }
    }

    /// Starts reading the blob of `key` into `bytes` (bytes.size() must equal its size).
    /// Throws std::invalid_argument at once for a bad key; every other error comes from
    /// wait(). Keep `bytes` alive until the completion is ready.
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        check_key(key);
        const std::size_t n = bytes.size();
        stats_.begin(io_direction::read);
        auto op = std::make_shared<read_op>();
        op->key = std::string(key);
        op->nbytes = n;
        op->dest = bytes.data();
        try {
            op->label = describe("read", key, n);
            {
                // The size, the file and the reader count are taken together: an install
                // (rename and index) happens entirely before or after, so both descriptors
                // hold the same file, of the size looked up, and the file a reader holds is
                // never recycled as a spare while it reads (install unlinks it instead).
                std::lock_guard lock(mutex_);
                auto it = index_.find(op->key);
                if (it == index_.end())
                    throw std::system_error(ENOENT, std::generic_category(),
                                            describe("read", key, n) + ": no such key");
                if (it->second != n)
                    throw std::invalid_argument(describe("read", key, n) + " into a buffer of " +
                                                bytes_str(n) + ", but the blob has " +
                                                bytes_str(it->second));
                // O_NONBLOCK and the check of the descriptor: a FIFO planted under the key's
                // name fails here, instead of blocking (under the lock) for ever.
                try {
                    op->fd = open_regular_file_at(dirfd_.get(), op->key.c_str(),
                                                  O_RDONLY | (direct_ ? O_DIRECT : 0), op->label);
                } catch (const std::system_error& e) {
                    if (e.code().value() != ENOENT) throw;
                    used_ -= it->second;
                    index_.erase(it);
                    throw_system_error(
                        ENOENT, "openat",
                        op->label + " (the file was deleted behind the tier's back)");
                }
                struct stat st {};
                if (::fstat(op->fd.get(), &st) != 0) throw_system_error(errno, "fstat", op->label);
                if (static_cast<std::uint64_t>(st.st_size) != n)
                    throw std::system_error(EIO, std::generic_category(),
                                            op->label + ": the file has " +
                                                bytes_str(static_cast<std::size_t>(st.st_size)) +
                                                " but the tier stored " + bytes_str(n) +
                                                " (truncated or changed behind the tier's back)");
                if (direct_ && n % block != 0) {
                    op->tail_fd =
                        open_regular_file_at(dirfd_.get(), op->key.c_str(), O_RDONLY, op->label);
                    same_file(op->fd.get(), op->tail_fd.get(), op->label);
                }
                ++pending_;
                ++readers_[op->key];
                op->counted = true;
            }
            const std::size_t body = direct_ ? n / block * block : n;
            const std::size_t tail = n - body;
            std::byte* dst = bytes.data();
            if (body > 0 && direct_ && !is_aligned(dst, block)) {
                op->bounce =
                    aligned_buffer(body, memory_lock::unlocked, block, buffer_fill::uninitialized);
                dst = op->bounce.data();
            }
            completion_source source = op->source;
            auto handle = source.handle();
            op->parts = (body > 0 ? 1 : 0) + (tail > 0 ? 1 : 0);
            op->body = body;
            if (op->parts == 0) {
                finish_read(op, nullptr);
                return handle;
            }
            auto on_done = [this, op](std::size_t, std::exception_ptr err) {
                part_done_read(op, std::move(err));
            };
            const int body_fd = op->fd.get();
            const int tail_fd = direct_ ? op->tail_fd.get() : body_fd;
            if (body > 0) engine_->submit({io_op::read, body_fd, dst, body, 0, op->label}, on_done);
            if (tail > 0)
                engine_->submit({io_op::read, tail_fd, bytes.data() + body, tail, body, op->label},
                                on_done);
            return handle;
        } catch (...) {
            auto err = std::current_exception();
            stats_.end(io_direction::read, n, false);
            op->fd.reset();
            op->tail_fd.reset();
            if (op->counted) {
                std::lock_guard lock(mutex_);
                drop_reader(op->key);
                if (--pending_ == 0) idle_cv_.notify_all();
            }
            return io_completion::failed(err);
        }
    }

    /// Removes the blob of `key`; false when there was none. Throws std::invalid_argument for
    /// a bad key, std::system_error when unlink fails for another reason than ENOENT.
    bool erase(std::string_view key) {
        check_key(key);
        std::string k(key);
        std::lock_guard lock(mutex_);
        auto it = index_.find(k);
        if (::unlinkat(dirfd_.get(), k.c_str(), 0) != 0 && errno != ENOENT)
            throw_system_error(errno, "unlinkat",
                               describe("erase", key, it == index_.end() ? 0 : it->second));
        if (it == index_.end()) return false;
        used_ -= it->second;
        index_.erase(it);
        return true;
    }
    /// True when a blob is stored under `key`.
    [[nodiscard]] bool contains(std::string_view key) const {
        std::lock_guard lock(mutex_);
        return index_.contains(std::string(key));
    }
    /// The size of the blob under `key`, or nullopt when there is none.
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = index_.find(std::string(key));
        if (it == index_.end()) return std::nullopt;
        return it->second;
    }
    /// The most bytes of blobs held at once (file_tier_options::capacity).
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// Bytes of the blobs stored now (spare files and writes in flight not counted).
    [[nodiscard]] std::size_t used() const {
        std::lock_guard lock(mutex_);
        return used_;
    }
    /// Bytes and operations each way, busy time and measured bandwidth so far.
    [[nodiscard]] tier_stats stats() const { return stats_.snapshot(); }
    /// The tier's name in messages and reports (file_tier_options::name).
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// The directory the tier stores its files in.
    [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }
    /// True when transfers use O_DIRECT.
    [[nodiscard]] bool direct_io() const noexcept { return direct_; }
    /// Why O_DIRECT is not used (empty when it is).
    [[nodiscard]] const std::string& direct_io_note() const noexcept { return direct_note_; }
    /// The engine (for its backend name and counters).
    [[nodiscard]] const Engine& engine() const noexcept { return *engine_; }
    /// Replaced files kept for reuse now (at most file_tier_options::spare_files).
    [[nodiscard]] std::size_t spare_files_held() const {
        std::lock_guard lock(mutex_);
        return spares_.size();
    }
    /// The path of the file that holds `key`.
    [[nodiscard]] std::filesystem::path path_of(std::string_view key) const {
        return dir_ / std::string(key);
    }

private:
    struct op_base {
        std::string key, label;
        std::size_t nbytes = 0;
        detail::unique_fd fd, tail_fd;
        aligned_buffer bounce;
        completion_source source;
        std::mutex mutex;  // guards parts and error
        int parts = 0;
        std::exception_ptr error;
    };
    struct write_op : op_base {
        std::string tmp;
        bool reserved = false;
        bool created = false;
    };
    struct spare {
        std::string name;
        std::size_t size = 0;
    };
    struct read_op : op_base {
        std::byte* dest = nullptr;
        std::size_t body = 0;
        bool counted = false;
    };

    std::string describe(std::string_view what, std::string_view key, std::size_t n) const {
        return name_ + ": " + std::string(what) + " of key " + spillway::quoted(key) + " (" +
               bytes_str(n) + ") at " + (dir_ / std::string(key)).string();
    }

    // The two descriptors of one transfer (body and tail) hold one file: a name swapped
    // between the two opens fails the operation instead of mixing two files.
    static void same_file(int a, int b, const std::string& label) {
        struct stat sa {};
        struct stat sb {};
        if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) throw_system_error(errno, "fstat", label);
        if (sa.st_dev != sb.st_dev || sa.st_ino != sb.st_ino)
            throw std::system_error(EIO, std::generic_category(),
                                    label + ": the file was replaced behind the tier's back");
    }

    void check_key(std::string_view key) const {
        try {
            validate_key(key);
        } catch (const std::invalid_argument& e) {  // (the tier's name only when it fails)
            throw std::invalid_argument(name_ + ": " + e.what());
        }
        if (key.substr(0, reserved_prefix.size()) == reserved_prefix)
            throw std::invalid_argument(
                name_ + ": key " + spillway::quoted(key) + " starts with the reserved prefix " +
                spillway::quoted(reserved_prefix) + " (used for the tier's temporary files)");
    }

    // Step 2 of the write protocol: a recycled spare file, resized, or a new file, allocated.
    void open_temporary(write_op& op, std::string_view key) {
        const std::size_t n = op.nbytes;
        std::optional<spare> reuse;
        {
            std::lock_guard lock(mutex_);
            if (!spares_.empty()) {
                // The smallest spare that holds n bytes, else the largest one.
                auto best = spares_.end();
                for (auto it = spares_.begin(); it != spares_.end(); ++it) {
                    bool fits = it->size >= n, best_fits = best != spares_.end() && best->size >= n;
                    if (best == spares_.end() || (fits && (!best_fits || it->size < best->size)) ||
                        (!fits && !best_fits && it->size > best->size))
                        best = it;
                }
                reuse = std::move(*best);
                spares_.erase(best);
            }
        }
        if (reuse && reuse_spare(op, key, std::move(*reuse))) return;
        op.tmp = detail::file_tier_temp_name(reserved_prefix, "tmp.");
        op.label = describe("write", key, n) + " (temporary file " + (dir_ / op.tmp).string() + ")";
        int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
        int fd = ::openat(dirfd_.get(), op.tmp.c_str(), flags | (direct_ ? O_DIRECT : 0), 0600);
        if (fd < 0) throw_system_error(errno, "openat", op.label);
        op.fd = detail::unique_fd(fd);
        op.created = true;
        if (n > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(n)) != 0 && errno != EOPNOTSUPP)
            throw_system_error(errno, "fallocate", op.label);
    }

    // Step 2 with a spare: opens it and checks the descriptor (a regular file of this user
    // with one link: nothing outside the directory shares it), then resizes it. A spare that
    // fails the check, or cannot be opened, is unlinked from the directory (the other names
    // keep their contents) and false returned: the caller creates a new file.
    bool reuse_spare(write_op& op, std::string_view key, spare reuse) {
        const std::size_t n = op.nbytes;
        detail::unique_fd fd;
        try {
            fd = open_regular_file_at(
                dirfd_.get(), reuse.name.c_str(), O_WRONLY | (direct_ ? O_DIRECT : 0),
                name_ + ": spare file",
                regular_file_rules{.owned_by_user = true, .single_link = true});
        } catch (const std::system_error&) {
            ::unlinkat(dirfd_.get(), reuse.name.c_str(), 0);
            return false;
        }
        op.tmp = std::move(reuse.name);
        op.created = true;  // from here on a failure unlinks it
        op.label = describe("write", key, n) + " (temporary file " + (dir_ / op.tmp).string() + ")";
        op.fd = std::move(fd);
        if (reuse.size > n) {
            if (::ftruncate(op.fd.get(), static_cast<off_t>(n)) != 0)
                throw_system_error(errno, "ftruncate", op.label);
        } else if (reuse.size < n) {
            if (::fallocate(op.fd.get(), 0, 0, static_cast<off_t>(n)) != 0 && errno != EOPNOTSUPP)
                throw_system_error(errno, "fallocate", op.label);
        }
        return true;
    }

    // Step 4 of the write protocol: the temporary file takes the key's name. When the key
    // had a file, the two are exchanged atomically and the old one becomes a spare (or is
    // unlinked when enough spares are kept, or when a read has it open: a spare is rewritten
    // by the next write). The rename and the index change under one lock, so that of two
    // writes of one key the file installed last is also the size indexed last, and a read
    // sees the file and its size of the same write.
    void install(write_op& op) {
        std::string
            unlink_after;  // unlinked outside the lock (freeing a large file's blocks is slow)
        {
            std::lock_guard lock(mutex_);
            const bool had_file = index_.contains(op.key) && max_spares_ > 0;
            if (had_file && ::renameat2(dirfd_.get(), op.tmp.c_str(), dirfd_.get(), op.key.c_str(),
                                        RENAME_EXCHANGE) == 0) {
                struct stat st {};
                bool keep =
                    ::fstatat(dirfd_.get(), op.tmp.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                    S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_uid == ::geteuid() &&
                    !readers_.contains(op.key) && spares_.size() < max_spares_;
                if (keep)
                    spares_.push_back({op.tmp, static_cast<std::size_t>(st.st_size)});
                else
                    unlink_after = op.tmp;
            } else if (::renameat(dirfd_.get(), op.tmp.c_str(), dirfd_.get(), op.key.c_str()) !=
                       0) {
                // (No file under the key, or the file system cannot exchange: a plain rename.)
                throw_system_error(errno, "renameat", op.label);
            }
            auto [it, inserted] = index_.try_emplace(op.key, op.nbytes);
            if (!inserted) {
                used_ -= it->second;
                it->second = op.nbytes;
            }
            used_ += op.nbytes;
            reserved_ -= op.nbytes;
        }
        if (!unlink_after.empty()) ::unlinkat(dirfd_.get(), unlink_after.c_str(), 0);
    }

    // Unlinks the temporary file and releases the reservation of a failed write.
    void cleanup_failed_write(write_op& op) noexcept {
        op.fd.reset();
        op.tail_fd.reset();
        if (op.created) ::unlinkat(dirfd_.get(), op.tmp.c_str(), 0);
        std::lock_guard lock(mutex_);
        reserved_ -= op.nbytes;
    }

    template <class Op>
    static bool last_part(Op& op, std::exception_ptr err) {
        std::lock_guard lock(op.mutex);
        if (err && !op.error) op.error = std::move(err);
        return --op.parts == 0;
    }

    void part_done_write(const std::shared_ptr<write_op>& op, std::exception_ptr err) {
        if (last_part(*op, std::move(err))) finish_write(op, op->error);
    }

    void finish_write(const std::shared_ptr<write_op>& op, std::exception_ptr err) noexcept {
        op->fd.reset();
        op->tail_fd.reset();
        op->bounce = aligned_buffer();
        if (!err) {
            try {
                install(*op);
            } catch (...) {
                err = std::current_exception();
            }
        }
        completion_source source = op->source;
        if (err) {
            cleanup_failed_write(*op);
            stats_.end(io_direction::write, op->nbytes, false);
            source.fail(err);
        } else {  // (install() indexed it)
            stats_.end(io_direction::write, op->nbytes, true);
            source.succeed(op->nbytes);
        }
        std::lock_guard lock(mutex_);
        if (--pending_ == 0) idle_cv_.notify_all();
    }

    void part_done_read(const std::shared_ptr<read_op>& op, std::exception_ptr err) {
        if (last_part(*op, std::move(err))) finish_read(op, op->error);
    }

    void finish_read(const std::shared_ptr<read_op>& op, std::exception_ptr err) noexcept {
        op->fd.reset();
        op->tail_fd.reset();
        if (!err && op->bounce.data() && op->body > 0)
            std::memcpy(op->dest, op->bounce.data(), op->body);
        op->bounce = aligned_buffer();
        stats_.end(io_direction::read, op->nbytes, !err);
        completion_source source = op->source;
        if (err)
            source.fail(err);
        else
            source.succeed(op->nbytes);
        std::lock_guard lock(mutex_);
        drop_reader(op->key);
        if (--pending_ == 0) idle_cv_.notify_all();
    }

    // One read of `key` fewer. Caller holds mutex_.
    void drop_reader(const std::string& key) {
        auto it = readers_.find(key);
        if (it != readers_.end() && --it->second == 0) readers_.erase(it);
    }

    // Proves the directory writable and decides on O_DIRECT.
    void probe(direct_io_mode mode) {
        std::string probe_name = detail::file_tier_temp_name(reserved_prefix, "probe.");
        int fd = ::openat(dirfd_.get(), probe_name.c_str(),
                          O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
            throw_system_error(errno, "openat",
                               name_ + ": directory " + dir_.string() + " is not writable");
        ::close(fd);
        struct unlink_probe {
            int dirfd;
            const std::string& name;
            ~unlink_probe() { ::unlinkat(dirfd, name.c_str(), 0); }
        } guard{dirfd_.get(), probe_name};
        if (mode == direct_io_mode::off) {
            direct_note_ = "O_DIRECT switched off (direct_io_mode::off)";
            return;
        }
        std::string why;
        fd = ::openat(dirfd_.get(), probe_name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
        if (fd < 0) {
            why = std::string("open with O_DIRECT failed: ") + std::strerror(errno);
        } else {
            aligned_buffer buf(block, memory_lock::unlocked, block);
            std::memset(buf.data(), 0x5a, block);
            if (::pwrite(fd, buf.data(), block, 0) != static_cast<ssize_t>(block))
                why = std::string("an aligned O_DIRECT write failed: ") + std::strerror(errno);
            else if (::pread(fd, buf.data(), block, 0) != static_cast<ssize_t>(block))
                why = std::string("an aligned O_DIRECT read failed: ") + std::strerror(errno);
            ::close(fd);
        }
        if (why.empty()) {
            direct_ = true;
            return;
        }
        direct_note_ = "the file system under " + dir_.string() + " refuses O_DIRECT (" + why +
                       "); using buffered I/O through the page cache";
        if (mode == direct_io_mode::required)
            throw std::system_error(EINVAL, std::generic_category(),
                                    name_ + ": O_DIRECT is required but " + direct_note_);
    }

    // Rebuilds the index from the regular files in the directory.
    void scan() {
        int fd = ::openat(dirfd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) throw_system_error(errno, "openat", name_ + ": directory " + dir_.string());
        DIR* d = ::fdopendir(fd);
        if (!d) {
            int err = errno;
            ::close(fd);
            throw_system_error(err, "fdopendir", name_ + ": directory " + dir_.string());
        }
        while (dirent* e = ::readdir(d)) {
            std::string_view n(e->d_name);
            if (n == "." || n == "..") continue;
            if (n.substr(0, reserved_prefix.size()) == reserved_prefix) {
                // (Temporary files of a dead process of this host; see file_helpers.hpp.)
                if (detail::file_tier_orphan(n, reserved_prefix))
                    ::unlinkat(dirfd_.get(), e->d_name, 0);
                continue;
            }
            struct stat st {};
            if (::fstatat(dirfd_.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(st.st_mode))
                continue;
            index_.emplace(std::string(n), static_cast<std::size_t>(st.st_size));
            used_ += static_cast<std::size_t>(st.st_size);
        }
        ::closedir(d);
    }

    std::filesystem::path dir_;
    detail::unique_fd dirfd_;
    std::size_t capacity_;
    std::string name_;
    bool direct_ = false;
    std::string direct_note_;
    mutable std::mutex mutex_;
    std::condition_variable idle_cv_;
    std::unordered_map<std::string, std::size_t> index_;
    std::unordered_map<std::string, unsigned> readers_;  // reads in flight per key
    std::vector<spare> spares_;
    std::size_t max_spares_;
    std::size_t used_ = 0;
    std::size_t reserved_ = 0;
    std::size_t pending_ = 0;
    stats_recorder stats_;
    std::unique_ptr<Engine> engine_;
};

static_assert(storage_tier<file_tier<io_engine>>);
static_assert(storage_tier<file_tier<posix_engine>>);

/// file_tier over the POSIX engine.
using posix_file_tier = file_tier<posix_engine>;
#if SPILLWAY_HAS_LIBURING
static_assert(storage_tier<file_tier<uring_engine>>);
/// file_tier over the io_uring engine (only when built with liburing).
using uring_file_tier = file_tier<uring_engine>;
#endif

}  // namespace spillway
