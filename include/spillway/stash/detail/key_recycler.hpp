// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/detail/key_recycler.hpp: the tier keys of one activation stash, and the
/// blobs of released tensors kept on the tier to be rewritten.
///
/// A released tensor's blob is not erased at once: its key is retired, and the next write
/// takes it, so the tier rewrites a blob in place instead of creating one and deleting
/// another per tensor. Keys are "<prefix>-<serial>-<n>"; the probe's is
/// "<prefix>-<serial>-probe".
///
/// Guarantees: take() prefers a retired key of the same blob size, then any retired key
/// (smallest size first), and only then makes a new key, never one made before. The caller
/// retires a key only once no I/O on it is in flight, and never retires a key whose erase
/// it issued. Not synchronised: the stash calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace spillway::detail {

class key_recycler {
public:
    /// @param prefix stash_options::key_prefix (validated by the stash)
    /// @param serial the stash's serial, unique within the process
    key_recycler(std::string prefix, std::uint64_t serial)
        : stem_(std::move(prefix) + "-" + std::to_string(serial) + "-") {}

    /// The key for a write of a blob of `nbytes`: a retired one, of that size when there is
    /// one, else a new one.
    std::string take(std::size_t nbytes) {
        if (!retired_.empty()) {
            auto it = retired_.find(nbytes);
            if (it == retired_.end()) it = retired_.begin();
            std::string key = std::move(it->second);
            retired_.erase(it);
            return key;
        }
        return stem_ + std::to_string(++next_);
    }
    /// Keeps `key`, whose blob of `nbytes` no live tensor needs, for a later take().
    void retire(std::size_t nbytes, std::string key) { retired_.emplace(nbytes, std::move(key)); }
    /// Every retired key, smallest blob first; none is retired afterwards. The caller erases
    /// their blobs.
    std::vector<std::string> drain() {
        std::vector<std::string> keys;
        keys.reserve(retired_.size());
        for (auto& [nbytes, key] : std::exchange(retired_, {})) keys.push_back(std::move(key));
        return keys;
    }
    /// Retired keys now.
    [[nodiscard]] std::size_t retired() const noexcept { return retired_.size(); }
    /// The key of the bandwidth probe's blob.
    [[nodiscard]] std::string probe_key() const { return stem_ + "probe"; }

private:
    std::string stem_;  // "<prefix>-<serial>-"
    std::uint64_t next_ = 0;
    std::multimap<std::size_t, std::string> retired_;  // by blob size
};

}  // namespace spillway::detail
