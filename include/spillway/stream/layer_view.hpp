// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/layer_view.hpp: the view of one layer's parameter bytes that a
/// param_stream hands out between acquire and release.
///
/// Guarantees: a view names its layer and its bytes (exactly the layer's declared size,
/// aligned to 4 KiB, so as<T>() suits any scalar type); as<T>() refuses a layer whose size
/// is not a whole number of T with std::invalid_argument naming the layer. A view does not
/// own the bytes: it dangles once its layer is released (or its stream destroyed).
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace spillway {

/// One layer's parameter bytes, read-only (`Byte` = const std::byte, from
/// param_stream::acquire) or writable (`Byte` = std::byte, from acquire_for_update).
/// A plain value: copying it copies the reference, not the bytes.
template <class Byte>
class basic_layer_view {
    static_assert(std::is_same_v<std::remove_const_t<Byte>, std::byte>,
                  "basic_layer_view: Byte must be std::byte or const std::byte");

public:
    /// An empty view (no layer).
    basic_layer_view() = default;
    /// The view of `bytes`, the parameters of layer `layer`.
    basic_layer_view(std::size_t layer, std::span<Byte> bytes) noexcept
        : layer_(layer), bytes_(bytes) {}
    /// A writable view converts to a read-only one.
    template <class Other>
    requires(std::is_const_v<Byte> && !std::is_const_v<Other>)
        basic_layer_view(const basic_layer_view<Other>& other)
    noexcept  // NOLINT(implicit)
        : layer_(other.layer()), bytes_(other.bytes()) {}

    /// The layer's index.
    [[nodiscard]] std::size_t layer() const noexcept { return layer_; }
    /// The layer's bytes, exactly its declared size.
    [[nodiscard]] std::span<Byte> bytes() const noexcept { return bytes_; }
    /// The layer's size in bytes.
    [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }
    /// The bytes as size() / sizeof(T) objects of a trivially copyable `T` (const when the
    /// view is read-only).
    /// @throws std::invalid_argument naming the layer when size() is not a multiple of
    ///         sizeof(T)
    template <class T>
    [[nodiscard]] auto as() const {
        static_assert(std::is_trivially_copyable_v<T>, "as<T>: T must be trivially copyable");
        using elem = std::conditional_t<std::is_const_v<Byte>, const T, T>;
        if (bytes_.size() % sizeof(T) != 0)
            throw std::invalid_argument(
                "layer " + std::to_string(layer_) + " has " + std::to_string(bytes_.size()) +
                " bytes, not a whole number of " + std::to_string(sizeof(T)) + "-byte elements");
        return std::span<elem>(reinterpret_cast<elem*>(bytes_.data()), bytes_.size() / sizeof(T));
    }

private:
    std::size_t layer_ = 0;
    std::span<Byte> bytes_{};
};

/// A read-only view of a layer's parameters (param_stream::acquire).
using layer_view = basic_layer_view<const std::byte>;
/// A writable view of a layer's parameters (param_stream::acquire_for_update).
using layer_update_view = basic_layer_view<std::byte>;

}  // namespace spillway
