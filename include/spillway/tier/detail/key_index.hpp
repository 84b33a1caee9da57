// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/detail/key_index.hpp: the virtual tier's in-memory index of keys: which
/// child holds each key's committed copy, which child a write in flight goes to, how many
/// keys and bytes each child is counted for, and which old copies are stale.
///
/// Guarantees:
///  - A key is counted on exactly one child: the target of its write in flight, else its
///    home (the child of its committed copy); keys_on(i) is the number counted on child i,
///    bytes_on(i) their bytes: the size of the write in flight for a key counted on its
///    target, else its committed size (placement balances these, detail/placement.hpp).
///  - An entry exists only while its key has a home or a target.
///  - A stale copy is an old copy that its child refused to erase after a rewrite moved the
///    key; it is remembered per key and child until forget_stale() or take_stale().
///  - Pure bookkeeping: no I/O, no locks; the owner guards it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spillway::detail {

/// What the index knows of one key.
struct key_entry {
    std::size_t size = 0;               ///< bytes of the committed blob
    std::optional<std::size_t> home;    ///< child holding the committed copy
    std::optional<std::size_t> target;  ///< child of the write in flight
    std::size_t target_size = 0;        ///< bytes of the write in flight (with `target`)

    /// The child the key is counted on: the target of a write in flight, else its home.
    [[nodiscard]] std::optional<std::size_t> placed() const { return target ? target : home; }
    /// The bytes the key is counted for on placed().
    [[nodiscard]] std::size_t counted_size() const noexcept { return target ? target_size : size; }
};

/// The index of the file comment.
class key_index {
public:
    using map_type = std::unordered_map<std::string, key_entry>;
    using iterator = map_type::iterator;

    /// An empty index over `children` children.
    explicit key_index(std::size_t children = 0) : keys_(children, 0), bytes_(children, 0) {}

    [[nodiscard]] iterator find(std::string_view key) { return entries_.find(std::string(key)); }
    [[nodiscard]] iterator end() noexcept { return entries_.end(); }
    /// The number of keys known.
    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    /// The keys counted on child i.
    [[nodiscard]] std::size_t keys_on(std::size_t i) const { return keys_.at(i); }
    /// The bytes of the keys counted on child i (see the file comment).
    [[nodiscard]] std::size_t bytes_on(std::size_t i) const { return bytes_.at(i); }

    /// Adds a key whose committed copy of `nbytes` a child already held. The key is unknown.
    iterator adopt(std::string_view key, std::size_t nbytes, std::size_t child) {
        auto it = entries_.emplace(std::string(key), key_entry{nbytes, child, std::nullopt}).first;
        count(it->second, +1);
        return it;
    }

    /// A write of `key` (`nbytes`) goes to `child`: it is counted there, for `nbytes` (no
    /// longer where it was).
    void start_write(std::string_view key, std::size_t child, std::size_t nbytes) {
        auto it = entries_.find(std::string(key));
        if (it == entries_.end()) it = entries_.emplace(std::string(key), key_entry{}).first;
        auto& e = it->second;
        count(e, -1);
        e.target = child;
        e.target_size = nbytes;
        count(e, +1);
    }

    /// The write of `key` in flight moves to `child` (fail-over); nothing when the key was
    /// erased meanwhile.
    void retarget(const std::string& key, std::size_t child) {
        auto it = entries_.find(key);
        if (it == entries_.end()) return;
        auto& e = it->second;
        count(e, -1);
        if (!e.target) e.target_size = e.size;
        e.target = child;
        count(e, +1);
    }

    /// The write of `key` (`nbytes`) completed on `child`: its home, counted there for
    /// `nbytes` (also when the key was erased meanwhile: the write wins), and no longer a
    /// stale copy there.
    /// @return the previous home, if any
    std::optional<std::size_t> commit_write(const std::string& key, std::size_t child,
                                            std::size_t nbytes) {
        auto it = entries_.find(key);
        if (it == entries_.end()) it = entries_.emplace(key, key_entry{}).first;
        auto& e = it->second;
        count(e, -1);
        auto old = e.home;
        e.home = child;
        e.target.reset();
        e.size = nbytes;
        count(e, +1);
        forget_stale(key, child);
        return old;
    }

    /// The write of `key` failed: the key is counted where its committed copy is (if any).
    void revert_write(const std::string& key) {
        auto it = entries_.find(key);
        if (it == entries_.end()) return;
        auto& e = it->second;
        count(e, -1);
        e.target.reset();
        count(e, +1);
        if (!e.home) entries_.erase(it);
    }

    /// A read found the key gone from `child`: forgotten, unless a write of it is in flight
    /// or its home moved.
    void forget_vanished(const std::string& key, std::size_t child) {
        auto it = entries_.find(key);
        if (it == entries_.end() || it->second.home != child || it->second.target) return;
        count(it->second, -1);
        entries_.erase(it);
    }

    /// Removes the entry; returns the key's home.
    std::optional<std::size_t> erase(iterator it) {
        auto home = it->second.home;
        count(it->second, -1);
        entries_.erase(it);
        return home;
    }

    /// Whether child i's copy of `key` is stale.
    [[nodiscard]] bool is_stale(std::string_view key, std::size_t i) const {
        auto it = stale_.find(std::string(key));
        return it != stale_.end() && std::ranges::find(it->second, i) != it->second.end();
    }
    /// Remembers stale copies of `key` on `children`.
    void add_stale(std::string_view key, const std::vector<std::size_t>& children) {
        auto& owed = stale_[std::string(key)];
        owed.insert(owed.end(), children.begin(), children.end());
    }
    /// Child i now holds the current copy of `key`: not a stale one.
    void forget_stale(const std::string& key, std::size_t i) {
        auto it = stale_.find(key);
        if (it == stale_.end()) return;
        std::erase(it->second, i);
        if (it->second.empty()) stale_.erase(it);
    }
    /// Removes and returns the children holding stale copies of `key`.
    std::vector<std::size_t> take_stale(std::string_view key) {
        std::vector<std::size_t> out;
        if (auto it = stale_.find(std::string(key)); it != stale_.end()) {
            out = std::move(it->second);
            stale_.erase(it);
        }
        return out;
    }
    /// Every stale copy: key to children.
    [[nodiscard]] const std::unordered_map<std::string, std::vector<std::size_t>>& stale()
        const noexcept {
        return stale_;
    }

private:
    // Adds (+1) or removes (-1) the entry's count, and its counted bytes, on placed().
    void count(const key_entry& e, int sign) {
        const auto at = e.placed();
        if (!at) return;
        if (sign > 0) {
            ++keys_[*at];
            bytes_[*at] += e.counted_size();
        } else {
            --keys_[*at];
            bytes_[*at] -= e.counted_size();
        }
    }

    map_type entries_;
    std::unordered_map<std::string, std::vector<std::size_t>> stale_;  // copies owed an erase
    std::vector<std::size_t> keys_;                                    // per child
    std::vector<std::size_t> bytes_;                                   // per child
};

}  // namespace spillway::detail
