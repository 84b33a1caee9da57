// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/detail/tensor_table.hpp: the tensors an activation stash holds, the
/// deduplication index over their identities, and the handles issued for them.
///
/// Guarantees:
/// - Deduplication by identity only (tensor_identity: storage id, version, dtype, shape,
///   strides, offset), never by address or content: find_live() returns a tensor with
///   references whose write did not fail, and a tensor that lost its last reference or its
///   bytes is forgotten by the index (forget_identity()) so a later save stores it anew.
/// - Every handle the table issued is refused after release, move, reset or by another
///   stash, with std::invalid_argument naming the tensor (entry_of()).
/// - Entries are owned by the table and keep their address until erase(); neither entry ids
///   nor handle ids are ever reused within a stash.
/// The states of an entry follow the life cycle in docs/design.md, section "The activation
/// stash". Not synchronised: the stash calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "spillway/io/aligned_buffer.hpp"
#include "spillway/stash/stash_handle.hpp"
#include "spillway/stash/tensor_desc.hpp"

namespace spillway::detail {

enum class entry_state {
    kept,       // resident, no write planned
    queued,     // resident, write queued
    writing,    // write in flight (resident unless written synchronously)
    offloaded,  // on the tier only
    reading,    // read in flight, its buffer charged
    fetched,    // resident and on the tier
    lost,       // the write failed: error holds why
};

/// One distinct tensor the stash holds.
struct stash_entry {
    std::uint64_t id = 0;
    std::shared_ptr<const std::string> label_ptr;
    tensor_identity identity;
    std::string key;  // its blob on the tier, while it has one
    std::size_t nbytes = 0;
    std::size_t position = 0;  // layer position in forward order within its step
    std::uint64_t step = 0;
    entry_state state = entry_state::kept;
    aligned_buffer buffer;
    std::size_t refs = 0;
    bool pinned = false;            // loaded: stays resident until the last release
    bool on_tier = false;           // a completed write put it on the tier
    bool forwarded = false;         // counted in bytes_forwarded
    std::exception_ptr error;       // why the write failed
    std::exception_ptr read_error;  // the last failed read, for the next load()
    [[nodiscard]] const std::string& label() const { return *label_ptr; }
};

/// What the entries offer to free memory now (tensor_table::room_candidates()).
struct room_candidates {
    /// The oldest fetched tensor not loaded: its bytes are on the tier, drop them.
    stash_entry* drop = nullptr;
    /// The oldest kept tensor not loaded: writing it would free its bytes.
    stash_entry* demote = nullptr;
    /// A write or read in flight or queued will free (or make droppable) memory by itself.
    bool io_will_free = false;
};

class tensor_table {
public:
    /// @param serial the stash's serial: handles carry it, so another stash's are refused
    explicit tensor_table(std::uint64_t serial) noexcept : serial_(serial) {}

    /// A new entry with one reference, indexed under `identity` (replacing any older one).
    stash_entry& add(const tensor_identity& identity, std::shared_ptr<const std::string> label,
                     std::size_t nbytes, std::size_t position, std::uint64_t step) {
        auto owned = std::make_unique<stash_entry>();
        stash_entry& e = *owned;
        e.id = ++next_entry_;
        e.label_ptr = std::move(label);
        e.identity = identity;
        e.nbytes = nbytes;
        e.position = position;
        e.step = step;
        e.refs = 1;
        entries_.emplace(e.id, std::move(owned));
        dedup_[identity] = e.id;
        return e;
    }
    /// The live entry (referenced, not lost) saved under `identity`, or null.
    stash_entry* find_live(const tensor_identity& identity) {
        auto it = dedup_.find(identity);
        if (it == dedup_.end()) return nullptr;
        auto e = entries_.find(it->second);
        if (e == entries_.end() || e->second->refs == 0 || e->second->state == entry_state::lost)
            return nullptr;
        return e->second.get();
    }
    /// Drops `e` from the deduplication index (if the index still points at it).
    void forget_identity(const stash_entry& e) {
        auto it = dedup_.find(e.identity);
        if (it != dedup_.end() && it->second == e.id) dedup_.erase(it);
    }
    /// The entry `id`, or null once erased.
    stash_entry* find(std::uint64_t id) {
        auto it = entries_.find(id);
        return it == entries_.end() ? nullptr : it->second.get();
    }
    /// The entry `id`; std::out_of_range once erased.
    stash_entry& at(std::uint64_t id) { return *entries_.at(id); }
    void erase(std::uint64_t id) { entries_.erase(id); }
    /// Calls fn(stash_entry&) for every entry.
    template <class Fn>
    void for_each(Fn&& fn) {
        for (auto& [id, e] : entries_) fn(*e);
    }

    /// A new live handle to `e` (the caller counted the reference).
    stash_handle issue_handle(const stash_entry& e) {
        stash_handle h;
        h.owner_ = serial_;
        h.id_ = ++next_handle_;
        h.nbytes_ = e.nbytes;
        h.label_ = e.label_ptr;
        h.state_ = stash_handle::state::live;
        handles_.emplace(h.id_, e.id);
        return h;
    }
    /// The entry a live handle of this table refers to. Throws std::invalid_argument naming
    /// the tensor and activation_stash::`op` for an empty, moved-from, released, foreign or
    /// forgotten (reset()) handle.
    stash_entry& entry_of(const stash_handle& h, const char* op) {
        const std::string who = std::string("activation_stash::") + op + ": ";
        const std::string name = h.label_ ? *h.label_ : std::string("tensor");
        switch (h.state_) {
            case stash_handle::state::empty:
                throw std::invalid_argument(
                    who + "empty handle (default-constructed; use the handle save() returned)");
            case stash_handle::state::moved_from:
                throw std::invalid_argument(who + "the handle of " + name +
                                            " was moved from; use the handle it was moved to");
            case stash_handle::state::released:
                throw std::invalid_argument(who + "the handle of " + name +
                                            " was already released");
            case stash_handle::state::live:
                break;
        }
        if (h.owner_ != serial_)
            throw std::invalid_argument(who + "the handle of " + name +
                                        " belongs to another activation_stash");
        auto it = handles_.find(h.id_);
        if (it == handles_.end())
            throw std::invalid_argument(who + "unknown handle of " + name +
                                        " (the stash was reset since it was saved)");
        return *entries_.at(it->second);
    }
    /// Marks a live handle released (its entry's reference is the caller's to drop).
    void release_handle(stash_handle& h) {
        handles_.erase(h.id_);
        h.state_ = stash_handle::state::released;
    }
    /// Forgets every handle issued (their entries' references are the caller's to drop):
    /// the entry id of each, one per handle.
    std::vector<std::uint64_t> forget_handles() {
        std::vector<std::uint64_t> ids;
        for (auto& [h, id] : handles_) ids.push_back(id);
        handles_.clear();
        return ids;
    }

    /// What could free memory now, for a caller that needs room under the budget. Loaded
    /// (pinned) tensors are never candidates.
    room_candidates find_room() {
        room_candidates c;
        for (auto& [id, p] : entries_) {
            stash_entry& e = *p;
            if (e.state == entry_state::reading) {
                // A read in flight (a prefetch) is charged already; once fetched it is a
                // drop candidate, unless a load pins it (then the next pass says no).
                c.io_will_free = true;
                continue;
            }
            if (!e.buffer.data()) continue;
            if (e.refs == 0 && e.state == entry_state::writing) {
                c.io_will_free = true;  // released while written (loaded or not): its end frees it
                continue;
            }
            if (e.pinned) continue;
            if (e.state == entry_state::fetched && (!c.drop || e.id < c.drop->id)) c.drop = &e;
            if (e.state == entry_state::queued || e.state == entry_state::writing)
                c.io_will_free = true;
            if (e.state == entry_state::kept && e.nbytes > 0 && (!c.demote || e.id < c.demote->id))
                c.demote = &e;
        }
        return c;
    }

private:
    std::uint64_t serial_;
    std::uint64_t next_entry_ = 0, next_handle_ = 0;
    std::unordered_map<std::uint64_t, std::unique_ptr<stash_entry>> entries_;
    std::unordered_map<tensor_identity, std::uint64_t, tensor_identity_hash> dedup_;
    std::unordered_map<std::uint64_t, std::uint64_t> handles_;  // handle id -> entry id
};

}  // namespace spillway::detail
