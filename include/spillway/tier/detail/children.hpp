// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/detail/children.hpp: the container of a virtual tier's children, in its two
/// forms, behind one interface (size(), visit(i, f), properties).
///
///  - vt_children<C...>: compile-time heterogeneous children, each owned and built in place
///    from a tuple of constructor arguments (nothing is moved, so non-movable tiers work),
///    default-constructed, or borrowed when C is a reference type. visit() dispatches a
///    run-time index through a table of function pointers: no virtual call on the data path.
///  - vt_children<std::vector<C>>: a run-time list of one type, owned through unique_ptr
///    (built from a range of arguments, a count and a factory, or by the caller).
///
/// Guarantees: children live exactly as long as the container (borrowed ones as long as their
/// owner keeps them); properties hold when they hold for every child; visit(i, f) requires
/// i < size().
#pragma once

#include <concepts>
#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway::detail {

template <class T>
inline constexpr bool is_std_tuple_v = false;
template <class... A>
inline constexpr bool is_std_tuple_v<std::tuple<A...>> = true;
/// A std::tuple (of a child's constructor arguments), any cv-ref.
template <class T>
concept std_tuple = is_std_tuple_v<std::remove_cvref_t<T>>;

template <class T>
inline constexpr bool is_std_vector_v = false;
template <class T, class A>
inline constexpr bool is_std_vector_v<std::vector<T, A>> = true;

/// An owned child, built in place from a tuple of constructor arguments.
template <class T>
class vt_child_box {
public:
    // clang-format off
    vt_child_box()
        requires std::default_initializable<T>
    = default;
    // clang-format on
    template <std_tuple Tuple>
    explicit vt_child_box(Tuple&& args)
        : tier_(std::make_from_tuple<T>(std::forward<Tuple>(args))) {}
    T& get() noexcept { return tier_; }

private:
    T tier_;
};
/// A borrowed child: the caller keeps it alive longer than the virtual tier.
template <class T>
class vt_child_box<T&> {
public:
    explicit vt_child_box(T& tier) noexcept : tier_(&tier) {}
    T& get() noexcept { return *tier_; }

private:
    T* tier_;
};

template <class C>
inline constexpr tier_properties vt_child_properties = std::remove_reference_t<C>::properties;

/// Compile-time heterogeneous children.
template <class... C>
class vt_children {
public:
    static constexpr tier_properties properties{
        .persistent = (vt_child_properties<C>.persistent && ...),
        .direct_io = (vt_child_properties<C>.direct_io && ...),
        .host_accessible = (vt_child_properties<C>.host_accessible && ...)};

    vt_children() = default;
    template <class... A>
    explicit vt_children(std::in_place_t, A&&... a) : boxes_(std::forward<A>(a)...) {}

    [[nodiscard]] static constexpr std::size_t size() noexcept { return sizeof...(C); }

    /// Calls f(child i) and returns its result.
    template <class F>
    decltype(auto) visit(std::size_t i, F&& f) {
        return visit_impl(i, f, std::index_sequence_for<C...>{});
    }

    template <std::size_t I>
    auto& get() noexcept {
        return std::get<I>(boxes_).get();
    }

private:
    template <class F, std::size_t... I>
    decltype(auto) visit_impl(std::size_t i, F& f, std::index_sequence<I...>) {
        using R = std::common_type_t<std::invoke_result_t<F&, std::remove_reference_t<C>&>...>;
        using fn = R (*)(vt_children&, F&);
        static constexpr fn table[] = {
            +[](vt_children& self, F& g) -> R { return g(self.template get<I>()); }...};
        return table[i](*this, f);
    }
    std::tuple<vt_child_box<C>...> boxes_;
};

/// A run-time list of children of one type.
template <class C>
class vt_children<std::vector<C>> {
public:
    static constexpr tier_properties properties = C::properties;

    explicit vt_children(std::vector<std::unique_ptr<C>> owned) : owned_(std::move(owned)) {
        for (std::size_t i = 0; i < owned_.size(); ++i)
            expect_argument(owned_[i] != nullptr, std::string("virtual_tier: child ") +
                                                      std::to_string(i) + " is a null pointer");
    }
    [[nodiscard]] std::size_t size() const noexcept { return owned_.size(); }
    template <class F>
    decltype(auto) visit(std::size_t i, F&& f) {
        return f(*owned_[i]);
    }
    C& at(std::size_t i) { return *owned_.at(i); }

private:
    std::vector<std::unique_ptr<C>> owned_;
};

/// Whether Children... is the run-time list form (one std::vector).
template <class... C>
inline constexpr bool vt_runtime_list_v = false;
template <class C>
inline constexpr bool vt_runtime_list_v<C> = is_std_vector_v<C>;

/// Whether C may name children: a storage_tier (or a reference to one), or a vector of one.
template <class C>
inline constexpr bool vt_valid_child_v = storage_tier<std::remove_reference_t<C>>;
template <class C, class A>
inline constexpr bool vt_valid_child_v<std::vector<C, A>> = storage_tier<C>;

/// The child type of the run-time list form; a placeholder for the compile-time form.
struct vt_not_a_list {};
template <class... C>
struct vt_list_child {
    using type = vt_not_a_list;
};
template <class C, class A>
struct vt_list_child<std::vector<C, A>> {
    using type = C;
};

/// Run-time list: one child per element of `args` (the element, or a std::tuple of
/// constructor arguments, is the child's constructor argument).
template <class C, class R>
std::vector<std::unique_ptr<C>> build_child_list(R&& args) {
    std::vector<std::unique_ptr<C>> out;
    for (auto&& a : args) {
        if constexpr (std_tuple<decltype(a)>)
            out.push_back(std::unique_ptr<C>(new C(std::make_from_tuple<C>(a))));
        else
            out.push_back(std::unique_ptr<C>(new C(a)));
    }
    return out;
}

/// Run-time list: `count` children, child i built from the prvalue factory(i).
template <class C, class Factory>
std::vector<std::unique_ptr<C>> build_child_count(std::size_t count, Factory& factory) {
    std::vector<std::unique_ptr<C>> out;
    out.reserve(count);
    for (std::size_t i = 0; i < count; ++i) out.push_back(std::unique_ptr<C>(new C(factory(i))));
    return out;
}

}  // namespace spillway::detail
