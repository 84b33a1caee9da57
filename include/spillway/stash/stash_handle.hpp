// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/stash_handle.hpp: the move-only reference to one tensor an
/// activation_stash holds.
///
/// Guarantees: a handle names its tensor (label()) so that every misuse error can say which
/// one; it knows whether it is empty, live, released or moved-from, so that the stash
/// refuses each misuse with std::invalid_argument instead of undefined behaviour. It holds
/// no pointer to its stash and never releases on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace spillway {

namespace detail {
class tensor_table;
}

/// A move-only reference to one saved tensor. Obtained from save(); give it back to
/// release(). It does not release on destruction: a handle dropped or assigned over while
/// live keeps its tensor until reset() or the stash's destruction.
class stash_handle {
public:
    /// An empty handle: valid() is false and every stash call with it throws
    /// std::invalid_argument.
    stash_handle() = default;
    /// Takes over `o`'s reference; `o` becomes moved-from (using it with the stash throws
    /// std::invalid_argument saying so), unless it was empty.
    stash_handle(stash_handle&& o) noexcept
        : owner_(o.owner_), id_(o.id_), nbytes_(o.nbytes_), label_(o.label_), state_(o.state_) {
        if (o.state_ != state::empty) o.state_ = state::moved_from;
    }
    /// Takes over `o`'s reference as the move constructor does. A live reference this
    /// handle held is not released: its tensor stays until reset() or the stash's
    /// destruction, so release() before assigning over a live handle.
    stash_handle& operator=(stash_handle&& o) noexcept {
        if (this != &o) {
            owner_ = o.owner_;
            id_ = o.id_;
            nbytes_ = o.nbytes_;
            label_ = o.label_;
            state_ = o.state_;
            if (o.state_ != state::empty) o.state_ = state::moved_from;
        }
        return *this;
    }
    stash_handle(const stash_handle&) = delete;
    stash_handle& operator=(const stash_handle&) = delete;

    /// True while the handle refers to a tensor it has not released.
    [[nodiscard]] bool valid() const noexcept { return state_ == state::live; }
    /// The tensor's size in bytes (extent_bytes() of its description); 0 for an empty handle.
    /// Stays readable after release or move.
    [[nodiscard]] std::size_t nbytes() const noexcept { return nbytes_; }
    /// How messages name the tensor: describe() of the description it was first saved with
    /// (a deduplicated save shares it); "" for an empty handle.
    [[nodiscard]] std::string label() const { return label_ ? *label_ : std::string(); }

private:
    friend class detail::tensor_table;  // issues handles and checks them
    enum class state { empty, live, released, moved_from };
    std::uint64_t owner_ = 0;  // serial of the stash that issued it
    std::uint64_t id_ = 0;     // handle id, unique within that stash
    std::size_t nbytes_ = 0;
    std::shared_ptr<const std::string> label_;
    state state_ = state::empty;
};

}  // namespace spillway
