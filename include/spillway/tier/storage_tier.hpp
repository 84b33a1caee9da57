// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/storage_tier.hpp: the storage_tier concept.
///
/// A storage tier stores byte blobs under keys. The contract every model keeps (and the
/// conformance suite in tests/tier/ checks):
///  1. write(key, bytes) stores a copy of `bytes` under `key`, replacing any earlier blob of
///     that key, and returns an io_completion at once. The caller keeps `bytes` alive and
///     unchanged until the completion is ready (or destroyed, which waits).
///  2. read(key, bytes) fills `bytes` with the blob; bytes.size() must equal the stored size
///     (size_of(key)). Errors: a missing key is std::system_error(ENOENT) naming the key; a
///     size mismatch is std::invalid_argument naming the key and both sizes. On any error the
///     caller's buffer holds either its old contents or the blob, never a mix it could mistake
///     for data: callers must treat the buffer as undefined after a failed read.
///  3. A failed write (ENOSPC, EIO, capacity) throws from wait() with the key, the size and
///     the errno in the message; it never modifies the caller's buffer, and the tier stays
///     usable for the other keys.
///  4. erase(key) removes the blob (returns false if there was none); it must not race with
///     an in-flight operation on the same key (the caller orders them).
///  5. Operations on different keys may be issued concurrently from several threads.
///  6. Destroying a tier waits for every operation in flight.
///  7. Keys are validated by validate_key(): no '/', no "..", at most 255 bytes.
/// Optional abilities are properties (tier_properties), not extra virtual functions.
#pragma once

#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "spillway/io/completion.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway {

/// Optional abilities of a tier, read at compile time: `T::properties`.
struct tier_properties {
    bool persistent = false;       ///< blobs survive the process (files)
    bool direct_io = false;        ///< transfers bypass the page cache when the FS allows
    bool host_accessible = true;   ///< buffers are host memory
};

/// A type that stores byte blobs under keys and moves them asynchronously, keeping the
/// numbered contract of this header. Requires:
/// - `write(key, bytes)` and `read(key, bytes)` returning an io_completion;
/// - `erase(key)` -> bool, `contains(key)` -> bool, `size_of(key)` ->
///   `std::optional<std::size_t>` (bytes; empty for a missing key);
/// - `capacity()` and `used()` in bytes (capacity() is SIZE_MAX when unbounded);
/// - `stats()` -> tier_stats, `name()` convertible to std::string (for messages);
/// - a static `properties` convertible to tier_properties.
///
/// Models: host_tier, file_tier, throttled_tier, faulty_tier, virtual_tier and
/// cuda::device_tier; each header checks its model with a static_assert.
template <class T>
concept storage_tier = requires(T& tier, const T& ctier, std::string_view key,
                                std::span<const std::byte> in, std::span<std::byte> out) {
    { tier.write(key, in) } -> std::same_as<io_completion>;
    { tier.read(key, out) } -> std::same_as<io_completion>;
    { tier.erase(key) } -> std::same_as<bool>;
    { ctier.contains(key) } -> std::same_as<bool>;
    { ctier.size_of(key) } -> std::same_as<std::optional<std::size_t>>;
    { ctier.capacity() } -> std::same_as<std::size_t>;   // bytes; SIZE_MAX when unbounded
    { ctier.used() } -> std::same_as<std::size_t>;       // bytes of blobs stored
    { ctier.stats() } -> std::same_as<tier_stats>;
    { ctier.name() } -> std::convertible_to<std::string>;  // for messages and reports
    { T::properties } -> std::convertible_to<tier_properties>;
};

}  // namespace spillway
