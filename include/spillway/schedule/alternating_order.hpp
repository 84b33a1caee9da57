// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/schedule/alternating_order.hpp: the alternating subgroup order as a C++20 view.
///
/// MLP-Offload iterates the optimizer's subgroups 0..N-1, then N-1..0, then 0..N-1 again:
/// the subgroups processed last in one iteration are the first ones of the next, so the
/// ones still held in host buffers need neither a write nor a read.
///
/// Guarantees:
/// - alternating_order(count, iteration, first) is a std::ranges::view (cheap to copy: three
///   integers), random access, sized and common, whose elements are the subgroup ids
///   0..count-1, each exactly once: ascending when iteration has the same parity as 0 and
///   `first` is direction::ascending; the direction flips on every iteration.
/// - count == 0 gives an empty range; count == 1 gives {0} on every iteration.
/// - Works with the non-modifying std::ranges algorithms (find, copy, binary_search with the
///   matching comparator, reverse views, ...). Elements are std::size_t prvalues, so the
///   view itself cannot be sorted or permuted in place: copy it to a vector first.
/// - direction_of(iteration, first) says which way iteration `iteration` goes.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <ranges>

namespace spillway {

/// The way one iteration walks the subgroup ids.
enum class direction {
    ascending,   ///< 0, 1, ..., count-1
    descending,  ///< count-1, ..., 1, 0
};

/// The direction of iteration `iteration` (0-based) when iteration 0 goes `first`.
constexpr direction direction_of(std::uint64_t iteration, direction first = direction::ascending) noexcept {
    bool flip = (iteration % 2) == 1;
    if (!flip) return first;
    return first == direction::ascending ? direction::descending : direction::ascending;
}

/// The other direction.
constexpr direction reversed(direction d) noexcept {
    return d == direction::ascending ? direction::descending : direction::ascending;
}

/// The subgroup ids of one iteration, in the order the update phase visits them.
// Derives from view_base (not view_interface, whose CRTP instantiation clang 14 rejects with
// libstdc++ 12) and provides view_interface's members itself.
class alternating_order : public std::ranges::view_base {
public:
    /// A random-access iterator over the ids of one iteration. It yields ids by value (no
    /// storage behind it), so it stays valid after its alternating_order is gone (the view is
    /// a borrowed range). Iterators compare by position; comparing iterators of different
    /// orders is meaningless.
    class iterator {
    public:
        using iterator_concept = std::random_access_iterator_tag;   ///< random access
        using iterator_category = std::random_access_iterator_tag;  ///< random access (legacy tag)
        using value_type = std::size_t;                             ///< a subgroup id
        using difference_type = std::ptrdiff_t;                     ///< a distance in positions
        using reference = std::size_t;  ///< a prvalue: the id is computed, not stored

        /// A singular iterator (only assignable and comparable to other default ones).
        constexpr iterator() noexcept = default;
        /// The iterator at position `pos` of an order over `count` ids walking `dir`;
        /// alternating_order::begin() and end() are the usual way to get one.
        constexpr iterator(std::size_t pos, std::size_t count, direction dir) noexcept
            : pos_(pos), count_(count), dir_(dir) {}

        /// The subgroup id at this position: `pos` ascending, `count - 1 - pos` descending.
        constexpr std::size_t operator*() const noexcept {
            return dir_ == direction::ascending ? pos_ : count_ - 1 - pos_;
        }
        /// The id `n` positions further on.
        constexpr std::size_t operator[](difference_type n) const noexcept { return *(*this + n); }

        /// Next position.
        constexpr iterator& operator++() noexcept { ++pos_; return *this; }
        /// Next position; returns the old iterator.
        constexpr iterator operator++(int) noexcept { auto t = *this; ++pos_; return t; }
        /// Previous position.
        constexpr iterator& operator--() noexcept { --pos_; return *this; }
        /// Previous position; returns the old iterator.
        constexpr iterator operator--(int) noexcept { auto t = *this; --pos_; return t; }
        /// Moves `n` positions (negative: back).
        constexpr iterator& operator+=(difference_type n) noexcept {
            pos_ = static_cast<std::size_t>(static_cast<difference_type>(pos_) + n);
            return *this;
        }
        /// Moves `n` positions back.
        constexpr iterator& operator-=(difference_type n) noexcept { return *this += -n; }
        /// `it` moved `n` positions on.
        friend constexpr iterator operator+(iterator it, difference_type n) noexcept { return it += n; }
        /// `it` moved `n` positions on.
        friend constexpr iterator operator+(difference_type n, iterator it) noexcept { return it += n; }
        /// `it` moved `n` positions back.
        friend constexpr iterator operator-(iterator it, difference_type n) noexcept { return it -= n; }
        /// The number of positions from `b` to `a`.
        friend constexpr difference_type operator-(const iterator& a, const iterator& b) noexcept {
            return static_cast<difference_type>(a.pos_) - static_cast<difference_type>(b.pos_);
        }
        /// Same position.
        friend constexpr bool operator==(const iterator& a, const iterator& b) noexcept { return a.pos_ == b.pos_; }
        /// Orders by position (the visiting order, whatever the ids).
        friend constexpr std::strong_ordering operator<=>(const iterator& a, const iterator& b) noexcept {
            return a.pos_ <=> b.pos_;
        }

        /// The position within the iteration (0 for the first subgroup visited).
        [[nodiscard]] constexpr std::size_t position() const noexcept { return pos_; }

    private:
        std::size_t pos_ = 0;
        std::size_t count_ = 0;
        direction dir_ = direction::ascending;
    };

    /// An empty order (count 0).
    constexpr alternating_order() noexcept = default;
    /// The order of iteration `iteration` (0-based) over `count` subgroups, iteration 0 going
    /// `first`.
    constexpr alternating_order(std::size_t count, std::uint64_t iteration,
                                direction first = direction::ascending) noexcept
        : count_(count), dir_(direction_of(iteration, first)) {}

    /// The first position.
    [[nodiscard]] constexpr iterator begin() const noexcept { return {0, count_, dir_}; }
    /// One past the last position.
    [[nodiscard]] constexpr iterator end() const noexcept { return {count_, count_, dir_}; }
    /// The number of subgroups, `count`.
    [[nodiscard]] constexpr std::size_t size() const noexcept { return count_; }
    /// True for count 0.
    [[nodiscard]] constexpr bool empty() const noexcept { return count_ == 0; }
    /// True unless empty().
    constexpr explicit operator bool() const noexcept { return count_ != 0; }
    /// The id visited at position i (i < size()).
    [[nodiscard]] constexpr std::size_t operator[](std::size_t i) const noexcept { return begin()[static_cast<std::ptrdiff_t>(i)]; }
    /// The first id visited (the range must not be empty).
    [[nodiscard]] constexpr std::size_t front() const noexcept { return *begin(); }
    /// The last id visited (the range must not be empty): the first one of the next iteration.
    [[nodiscard]] constexpr std::size_t back() const noexcept { return *(end() - 1); }
    /// The direction this iteration walks.
    [[nodiscard]] constexpr direction walk() const noexcept { return dir_; }

private:
    std::size_t count_ = 0;
    direction dir_ = direction::ascending;
};

/// The fixed ascending order (DeepSpeed's): the same ids every iteration, as the same type.
constexpr alternating_order ascending_order(std::size_t count) noexcept {
    return alternating_order(count, 0, direction::ascending);
}

static_assert(std::ranges::view<alternating_order>);
static_assert(std::ranges::random_access_range<alternating_order>);
static_assert(std::ranges::sized_range<alternating_order>);
static_assert(std::ranges::common_range<alternating_order>);
static_assert(std::random_access_iterator<alternating_order::iterator>);

}  // namespace spillway

// An iterator holds no reference to its alternating_order: a borrowed range. (Kept out of
// the API reference, which cannot place a specialisation of a standard template.)
/// @cond
template <>
inline constexpr bool std::ranges::enable_borrowed_range<spillway::alternating_order> = true;
/// @endcond
