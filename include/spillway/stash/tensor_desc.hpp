// spillway/stash/tensor_desc.hpp: how a trainer names a tensor it saves in an
// activation_stash, and the identity the stash deduplicates on.
//
// Guarantees:
// - A tensor's identity is what the trainer states: storage id, version (the trainer bumps it
//   whenever it mutates the storage in place), dtype, shape, strides and byte offset. The raw
//   address is never part of it: allocators reuse addresses, so an address key would merge
//   two different tensors. Content is never hashed.
// - Two descriptions with equal identity are the same tensor; a view with other strides (a
//   transpose), another offset, shape or dtype is a different tensor.
// - Empty strides mean contiguous row-major; they are normalised, so a description that
//   spells out the contiguous strides has the same identity as one that leaves them empty.
// - extent_bytes() is the exact byte span that shape and strides address from the first
//   element: the bytes a caller hands to save() must have exactly this size.
// - validate() throws std::invalid_argument naming the tensor for a rank mismatch, a
//   negative extent or stride, or an extent that overflows std::size_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "spillway/error.hpp"

namespace spillway {

/// Element types a stash knows the size of.
enum class dtype : std::uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean };

/// All dtypes, for tests and tools that iterate over them.
inline constexpr dtype all_dtypes[] = {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64,
                                       dtype::i32, dtype::i16, dtype::i8,  dtype::u8,   dtype::boolean};

/// Bytes per element.
constexpr std::size_t dtype_size(dtype t) noexcept {
    switch (t) {
        case dtype::f64: case dtype::i64: return 8;
        case dtype::f32: case dtype::i32: return 4;
        case dtype::f16: case dtype::bf16: case dtype::i16: return 2;
        case dtype::i8: case dtype::u8: case dtype::boolean: return 1;
    }
    return 1;
}

constexpr std::string_view dtype_name(dtype t) noexcept {
    switch (t) {
        case dtype::f64: return "f64";
        case dtype::f32: return "f32";
        case dtype::f16: return "f16";
        case dtype::bf16: return "bf16";
        case dtype::i64: return "i64";
        case dtype::i32: return "i32";
        case dtype::i16: return "i16";
        case dtype::i8: return "i8";
        case dtype::u8: return "u8";
        case dtype::boolean: return "bool";
    }
    return "?";
}

/// The layer scope a save uses when it names none: the scope opened by begin_layer().
inline constexpr std::uint32_t current_layer = std::numeric_limits<std::uint32_t>::max();

/// A tensor as a trainer describes it to save().
struct tensor_desc {
    std::string name;                   // for error messages and reports; may be empty
    std::uint64_t storage_id = 0;       // the trainer's id of the underlying buffer
    std::uint64_t version = 0;          // bumped by the trainer on every in-place mutation
    dtype type = dtype::f32;
    std::vector<std::int64_t> shape;    // elements per dimension; empty = a scalar
    std::vector<std::int64_t> strides;  // in elements; empty = contiguous row-major
    std::size_t offset = 0;             // byte offset of the first element in the storage
    std::uint32_t layer = current_layer;  // layer scope (forward order); see activation_stash
};

namespace detail {
inline std::string dims_str(const std::vector<std::int64_t>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(v[i]);
    }
    return s + "]";
}
}  // namespace detail

/// "'name' (storage 3 v0 f32 [4, 8] strides [8, 1] offset 0)": how messages name a tensor.
inline std::string describe(const tensor_desc& d) {
    std::string s = d.name.empty() ? std::string("tensor") : "tensor " + quoted(d.name);
    s += " (storage " + std::to_string(d.storage_id) + " v" + std::to_string(d.version) + " " +
         std::string(dtype_name(d.type)) + " " + detail::dims_str(d.shape);
    if (!d.strides.empty()) s += " strides " + detail::dims_str(d.strides);
    if (d.offset) s += " offset " + std::to_string(d.offset);
    return s + ")";
}

/// Row-major strides for `shape`.
inline std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
    std::vector<std::int64_t> s(shape.size());
    std::int64_t acc = 1;
    for (std::size_t i = shape.size(); i-- > 0;) {
        s[i] = acc;
        acc *= shape[i] > 0 ? shape[i] : 1;
    }
    return s;
}

/// Throws std::invalid_argument naming the tensor when the description is malformed.
inline void validate(const tensor_desc& d) {
    expect_argument(d.strides.empty() || d.strides.size() == d.shape.size(),
                    "activation_stash: " + describe(d) + " has " + std::to_string(d.strides.size()) +
                        " strides for " + std::to_string(d.shape.size()) + " dimensions");
    for (auto n : d.shape)
        expect_argument(n >= 0, "activation_stash: " + describe(d) + " has a negative extent");
    for (auto s : d.strides)
        expect_argument(s >= 0, "activation_stash: " + describe(d) +
                                    " has a negative stride (save a contiguous copy instead)");
}

/// The bytes shape and strides address from the first element (0 for an empty tensor).
/// Throws std::invalid_argument naming the tensor when the description is malformed.
inline std::size_t extent_bytes(const tensor_desc& d) {
    validate(d);
    auto strides = d.strides.empty() ? contiguous_strides(d.shape) : d.strides;
    constexpr auto max = std::numeric_limits<std::size_t>::max();
    std::size_t last = 0;  // index of the last element addressed
    for (std::size_t i = 0; i < d.shape.size(); ++i) {
        if (d.shape[i] == 0) return 0;
        auto n = static_cast<std::size_t>(d.shape[i] - 1), s = static_cast<std::size_t>(strides[i]);
        expect_argument(s == 0 || n <= (max - last) / s, "activation_stash: " + describe(d) + " overflows size_t");
        last += n * s;
    }
    std::size_t esize = dtype_size(d.type);
    expect_argument(last < max / esize - 1, "activation_stash: " + describe(d) + " overflows size_t");
    return (last + 1) * esize;
}

/// What deduplication compares: everything a trainer states about a tensor except its name
/// and layer scope.
struct tensor_identity {
    std::uint64_t storage_id = 0;
    std::uint64_t version = 0;
    dtype type = dtype::f32;
    std::size_t offset = 0;
    std::vector<std::int64_t> shape;
    std::vector<std::int64_t> strides;  // normalised: never empty for rank > 0

    static tensor_identity of(const tensor_desc& d) {
        return {d.storage_id, d.version, d.type, d.offset, d.shape,
                d.strides.empty() ? contiguous_strides(d.shape) : d.strides};
    }
    friend bool operator==(const tensor_identity&, const tensor_identity&) = default;
};

struct tensor_identity_hash {
    std::size_t operator()(const tensor_identity& t) const noexcept {
        std::uint64_t h = 0x9e3779b97f4a7c15ull;
        auto mix = [&](std::uint64_t v) {
            h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        };
        mix(t.storage_id);
        mix(t.version);
        mix(static_cast<std::uint64_t>(t.type));
        mix(t.offset);
        for (auto v : t.shape) mix(static_cast<std::uint64_t>(v));
        for (auto v : t.strides) mix(static_cast<std::uint64_t>(v) * 31u);
        return static_cast<std::size_t>(h);
    }
};

}  // namespace spillway
