// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/lock/lock_name.hpp: the lock name of a storage path, the same in every process
/// and every build.
///
/// Processes of a node that share a path must open the same node_lock name for it, so the
/// name is derived from the path, never from the process or the rank. std::hash is no good
/// for this: its value may differ between standard libraries, builds and (with hash
/// randomisation) runs. Guarantees:
/// - fnv1a_64() is FNV-1a with the 64-bit offset basis 0xcbf29ce484222325 and prime
///   0x100000001b3, over the bytes as given: fnv1a_64("") == 0xcbf29ce484222325 and
///   fnv1a_64("foobar") == 0x85944171f73967e8.
/// - path_lock_name(path, prefix) is `prefix` followed by the 16 lower-case hex digits of
///   fnv1a_64 of the bytes of std::filesystem::weakly_canonical(path): every spelling of one
///   directory (relative, with "..", through a symbolic link to it) gives one name, and
///   distinct directories give distinct names unless their 64-bit hashes collide.
/// - The name is a valid node_lock name (no '/', no "..") when the prefix is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace spillway {

/// FNV-1a, 64 bits, of `bytes` (see the file comment for the constants and test values).
/// Never throws; usable in constant expressions.
constexpr std::uint64_t fnv1a_64(std::string_view bytes) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return h;
}
/// @copydoc fnv1a_64(std::string_view)
constexpr std::uint64_t fnv1a_64(std::span<const std::byte> bytes) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::byte b : bytes) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
    return h;
}

/// The lock name of the directory `path`: `prefix` + 16 lower-case hex digits of
/// fnv1a_64(weakly_canonical(path)'s bytes). The path need not exist (the part that does not
/// is normalised lexically). Throws std::filesystem::filesystem_error when the existing part
/// cannot be resolved (a permission error, a symbolic-link loop).
inline std::string path_lock_name(const std::filesystem::path& path, std::string_view prefix = {}) {
    const std::string canonical = std::filesystem::weakly_canonical(path).string();
    std::uint64_t h = fnv1a_64(canonical);
    std::string name(prefix);
    name.resize(prefix.size() + 16);
    for (std::size_t i = 0; i < 16; ++i, h >>= 4)
        name[name.size() - 1 - i] = "0123456789abcdef"[h & 0xf];
    return name;
}

}  // namespace spillway
