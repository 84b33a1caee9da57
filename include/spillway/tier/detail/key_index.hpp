// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/detail/key_index.hpp: the virtual tier's in-memory index of keys: which
/// child holds each key's committed copy, which child a write in flight goes to, how many
/// keys each child is counted for, and which old copies are stale.
///
/// Guarantees:
///  - A key is counted on exactly one child: the target of its write in flight, else its
///    home (the child of its committed copy); keys_on(i) is the number counted on child i.
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

    /// The child the key is counted on: the target of a write in flight, else its home.
    [[nodiscard]] std::optional<std::size_t> placed() const { return target ? target : home; }
};

/// The index of the file comment.
class key_index {
public:
    using map_type = std::unordered_map<std::string, key_entry>;
    using iterator = map_type::iterator;

    /// An empty index over `children` children.
    explicit key_index(std::size_t children = 0) : keys_(children, 0) {}

    [[nodiscard]] iterator find(std::string_view key) { return entries_.find(std::string(key)); }
    [[nodiscard]] iterator end() noexcept { return entries_.end(); }
    /// The number of keys known.
    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    /// The keys counted on child i.
    [[nodiscard]] std::size_t keys_on(std::size_t i) const { return keys_.at(i); }

    /// Adds a key whose committed copy of `nbytes` a child already held. The key is unknown.
    iterator adopt(std::string_view key, std::size_t nbytes, std::size_t child) {
        ++keys_[child];
        return entries_.emplace(std::string(key), key_entry{nbytes, child, std::nullopt}).first;
    }

    /// A write of `key` goes to `child`: it is counted there (no longer where it was).
    void start_write(std::string_view key, std::size_t child) {
        auto it = entries_.find(std::string(key));
        if (it == entries_.end()) it = entries_.emplace(std::string(key), key_entry{}).first;
        move_count(it->second.placed(), child);
        it->second.target = child;
    }

    /// The write of `key` in flight moves to `child` (fail-over); nothing when the key was
    /// erased meanwhile.
    void retarget(const std::string& key, std::size_t child) {
        auto it = entries_.find(key);
        if (it == entries_.end()) return;
        move_count(it->second.placed(), child);
        it->second.target = child;
    }

    /// The write of `key` (`nbytes`) completed on `child`: its home, counted there (also when
    /// the key was erased meanwhile: the write wins), and no longer a stale copy there.
    /// @return the previous home, if any
    std::optional<std::size_t> commit_write(const std::string& key, std::size_t child,
                                            std::size_t nbytes) {
        auto it = entries_.find(key);
        if (it == entries_.end()) {
            it = entries_.emplace(key, key_entry{}).first;
            ++keys_[child];
        }
        auto& e = it->second;
        auto old = e.home;
        e.home = child;
        e.target.reset();
        e.size = nbytes;
        forget_stale(key, child);
        return old;
    }

    /// The write of `key` failed: the key is counted where its committed copy is (if any).
    void revert_write(const std::string& key) {
        auto it = entries_.find(key);
        if (it == entries_.end()) return;
        move_count(it->second.placed(), it->second.home);
        it->second.target.reset();
        if (!it->second.home) entries_.erase(it);
    }

    /// A read found the key gone from `child`: forgotten, unless a write of it is in flight
    /// or its home moved.
    void forget_vanished(const std::string& key, std::size_t child) {
        auto it = entries_.find(key);
        if (it == entries_.end() || it->second.home != child || it->second.target) return;
        --keys_[child];
        entries_.erase(it);
    }

    /// Removes the entry; returns the key's home.
    std::optional<std::size_t> erase(iterator it) {
        auto home = it->second.home;
        if (auto placed = it->second.placed()) --keys_[*placed];
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
    void move_count(const std::optional<std::size_t>& from, const std::optional<std::size_t>& to) {
        if (from) --keys_[*from];
        if (to) ++keys_[*to];
    }

    map_type entries_;
    std::unordered_map<std::string, std::vector<std::size_t>> stale_;  // copies owed an erase
    std::vector<std::size_t> keys_;                                    // per child
};

}  // namespace spillway::detail
