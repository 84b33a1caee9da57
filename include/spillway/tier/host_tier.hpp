/// @file
/// spillway/tier/host_tier.hpp: a storage tier in host memory, with a capacity bound.
///
/// Guarantees: operations complete before they return (the completion is already ready);
/// a write that would take used() past capacity() fails with ENOSPC naming the key, the size
/// and the capacity, and leaves the previous blob of that key in place; reads and writes of
/// different keys run concurrently (copies happen outside the tier's lock); a rewrite builds
/// the new blob first and swaps it in, so a concurrent reader of the old blob is never torn.
#pragma once

#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway {

/// A storage_tier that keeps each blob in its own heap allocation; synchronous, thread-safe.
///
/// The fastest tier and the reference model of the contract: the conformance suite and the
/// decorators' tests run over it. Also the natural inner tier of throttled_tier for a
/// simulated device. Not copyable, not movable (it owns a mutex).
class host_tier {
public:
    /// Volatile host memory, no page cache involved.
    static constexpr tier_properties properties{
        .persistent = false, .direct_io = false, .host_accessible = true};

    /// An empty tier.
    /// @param capacity the most bytes of blobs held at once (unbounded by default)
    /// @param name     the name used in error messages and reports
    explicit host_tier(std::size_t capacity = std::numeric_limits<std::size_t>::max(),
                       std::string name = "host")
        : capacity_(capacity), name_(std::move(name)) {}
    /// Owns its blobs: not copyable.
    host_tier(const host_tier&) = delete;
    /// Owns its blobs: not copyable.
    host_tier& operator=(const host_tier&) = delete;

    /// Copies `bytes` into a new blob under `key`, replacing any earlier one; done when it
    /// returns (`bytes` may be reused at once).
    /// Errors through the completion: std::system_error(ENOSPC) naming the tier, the key, the
    /// size, the capacity and the bytes used, when the blob would not fit (the old blob of
    /// `key` stays); std::bad_alloc when the copy cannot be allocated.
    /// @return a ready completion: the size, or the error
    /// @throws std::invalid_argument at once for a bad key (see validate_key()), naming the tier
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        check_key(key);
        stats_.begin(io_direction::write);
        std::exception_ptr error;
        try {
            auto blob = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
            std::lock_guard lock(mutex_);
            auto it = blobs_.find(std::string(key));
            std::size_t old = it == blobs_.end() ? 0 : it->second->size();
            if (used_ - old + bytes.size() > capacity_) {
                throw std::system_error(ENOSPC, std::generic_category(),
                                        name_ + ": write of key " + quoted(key) + " (" +
                                            bytes_str(bytes.size()) + ") exceeds the capacity of " +
                                            bytes_str(capacity_) + " (" + bytes_str(used_) +
                                            " used)");
            }
            used_ = used_ - old + bytes.size();
            if (it == blobs_.end())
                blobs_.emplace(std::string(key), std::move(blob));
            else
                it->second = std::move(blob);
        } catch (...) {
            error = std::current_exception();
        }
        stats_.end(io_direction::write, bytes.size(), !error);
        return error ? io_completion::failed(error) : io_completion::completed(bytes.size());
    }

    /// Copies the blob of `key` into `bytes`, whose size must equal size_of(key); done when
    /// it returns.
    /// Errors through the completion: std::system_error(ENOENT) naming the tier and the key
    /// for a missing key; std::invalid_argument naming the key and both sizes for a buffer
    /// of the wrong size (the buffer is left as it was).
    /// @return a ready completion: the size, or the error
    /// @throws std::invalid_argument at once for a bad key (see validate_key()), naming the tier
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        check_key(key);
        stats_.begin(io_direction::read);
        std::exception_ptr error;
        try {
            std::shared_ptr<const std::vector<std::byte>> blob;
            {
                std::lock_guard lock(mutex_);
                auto it = blobs_.find(std::string(key));
                if (it == blobs_.end())
                    throw std::system_error(
                        ENOENT, std::generic_category(),
                        name_ + ": read of key " + quoted(key) + ": no such key");
                blob = it->second;
            }
            if (blob->size() != bytes.size())
                throw std::invalid_argument(name_ + ": read of key " + quoted(key) +
                                            " into a buffer of " + bytes_str(bytes.size()) +
                                            ", but the blob has " + bytes_str(blob->size()));
            if (!bytes.empty()) std::memcpy(bytes.data(), blob->data(), bytes.size());
        } catch (...) {
            error = std::current_exception();
        }
        stats_.end(io_direction::read, bytes.size(), !error);
        return error ? io_completion::failed(error) : io_completion::completed(bytes.size());
    }

    /// Removes the blob of `key` and frees its memory (a reader that already holds it keeps
    /// its copy alive until it is done).
    /// @return false when there was no such key
    /// @throws std::invalid_argument for a bad key
    bool erase(std::string_view key) {
        check_key(key);
        std::lock_guard lock(mutex_);
        auto it = blobs_.find(std::string(key));
        if (it == blobs_.end()) return false;
        used_ -= it->second->size();
        blobs_.erase(it);
        return true;
    }
    /// True when a blob is stored under `key` (no key validation: a bad key is never stored).
    [[nodiscard]] bool contains(std::string_view key) const {
        std::lock_guard lock(mutex_);
        return blobs_.contains(std::string(key));
    }
    /// The size in bytes of the blob under `key`, or std::nullopt when there is none.
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = blobs_.find(std::string(key));
        if (it == blobs_.end()) return std::nullopt;
        return it->second->size();
    }
    /// The bound given to the constructor, in bytes (SIZE_MAX when unbounded).
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// The bytes of all stored blobs together.
    [[nodiscard]] std::size_t used() const {
        std::lock_guard lock(mutex_);
        return used_;
    }
    /// The traffic counters so far; failed operations count as failures, not bytes.
    [[nodiscard]] tier_stats stats() const { return stats_.snapshot(); }
    /// The name given to the constructor.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

private:
    // validate_key() with the tier's name in front of its message.
    void check_key(std::string_view key) const {
        try {
            validate_key(key);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(name_ + ": " + e.what());
        }
    }

    std::size_t capacity_;
    std::string name_;
    mutable std::mutex mutex_;
    std::unordered_map<std::string, std::shared_ptr<const std::vector<std::byte>>> blobs_;
    std::size_t used_ = 0;
    stats_recorder stats_;
};

static_assert(storage_tier<host_tier>);

}  // namespace spillway
