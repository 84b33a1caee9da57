// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/tensor_desc.hpp: how a trainer names a tensor it saves in an
/// activation_stash, and the identity the stash deduplicates on.
///
/// Guarantees:
/// - A tensor's identity is what the trainer states: storage id, version (the trainer bumps it
///   whenever it mutates the storage in place), dtype, shape, strides and byte offset. The raw
///   address is never part of it: allocators reuse addresses, so an address key would merge
///   two different tensors. Content is never hashed.
/// - Two descriptions with equal identity are the same tensor; a view with other strides (a
///   transpose), another offset, shape or dtype is a different tensor.
/// - Empty strides mean contiguous row-major; they are normalised, so a description that
///   spells out the contiguous strides has the same identity as one that leaves them empty.
/// - extent_bytes() is the exact byte span that shape and strides address from the first
///   element: the bytes a caller hands to save() must have exactly this size.
/// - validate() throws std::invalid_argument naming the tensor for a rank mismatch, a
///   negative extent or stride; extent_bytes() also for an extent that overflows
///   std::size_t.
/// - Everything here is a pure function of its arguments: safe to call from any thread.
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

/// Element types a stash knows the size of (dtype_size()). The stash never interprets
/// elements: the dtype only sizes the tensor and is part of its identity, so the same bytes
/// saved as f32 and as i32 are two tensors.
enum class dtype : std::uint8_t {
    f64,     ///< IEEE 754 binary64, 8 bytes.
    f32,     ///< IEEE 754 binary32, 4 bytes (the default of tensor_desc::type).
    f16,     ///< IEEE 754 binary16 (half), 2 bytes.
    bf16,    ///< bfloat16 (binary32 with the low 16 mantissa bits dropped), 2 bytes.
    i64,     ///< Signed 64-bit integer, 8 bytes.
    i32,     ///< Signed 32-bit integer, 4 bytes.
    i16,     ///< Signed 16-bit integer, 2 bytes.
    i8,      ///< Signed 8-bit integer, 1 byte.
    u8,      ///< Unsigned 8-bit integer, 1 byte.
    boolean  ///< Boolean stored as one byte per element (named "bool" by dtype_name()).
};

/// Every dtype enumerator once, in declaration order, for tests and tools that iterate
/// over them.
inline constexpr dtype all_dtypes[] = {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64,
                                       dtype::i32, dtype::i16, dtype::i8,  dtype::u8,   dtype::boolean};

/// Bytes per element of `t` (1, 2, 4 or 8). Usable in constant expressions; never throws.
constexpr std::size_t dtype_size(dtype t) noexcept {
    switch (t) {
        case dtype::f64: case dtype::i64: return 8;
        case dtype::f32: case dtype::i32: return 4;
        case dtype::f16: case dtype::bf16: case dtype::i16: return 2;
        case dtype::i8: case dtype::u8: case dtype::boolean: return 1;
    }
    return 1;
}

/// The short name messages and reports use for `t` ("f32", "bf16", "bool", ...): the
/// enumerator's name, except "bool" for dtype::boolean; "?" for a value outside the
/// enumeration. The view refers to a string literal (valid for the program's lifetime).
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

/// The tensor_desc::layer value meaning "no explicit layer": the save belongs to the
/// innermost scope opened by activation_stash::begin_layer(), or to layer 0 when no scope
/// is open. Reserved: not usable as a layer id of its own.
inline constexpr std::uint32_t current_layer = std::numeric_limits<std::uint32_t>::max();

/// A tensor as a trainer describes it to activation_stash::save(). Everything except
/// `name` and `layer` forms its identity (tensor_identity); the bytes handed to save()
/// must be exactly extent_bytes() long. A plain value: copy it freely.
struct tensor_desc {
    /// How error messages and reports name the tensor (describe()); may be empty. Not part
    /// of the identity: two names for the same storage view are one tensor.
    std::string name;
    /// The trainer's id of the underlying storage (allocation), stable while it lives.
    /// Views of one storage share it; the stash never derives it from an address.
    std::uint64_t storage_id = 0;
    /// The storage's version: the trainer must bump it on every in-place mutation, so that
    /// a mutated tensor is not deduplicated against the bytes saved before the mutation.
    std::uint64_t version = 0;
    /// Element type; sizes the elements (dtype_size()) and is part of the identity.
    dtype type = dtype::f32;
    /// Elements per dimension, outermost first; each must be >= 0 (validate()). Empty means
    /// a scalar (one element); any 0 extent means an empty tensor of 0 bytes.
    std::vector<std::int64_t> shape;
    /// Step between neighbouring elements of each dimension, in elements (not bytes); each
    /// >= 0, one per dimension of `shape`. Empty means contiguous row-major
    /// (contiguous_strides()), the same identity as spelling those strides out.
    std::vector<std::int64_t> strides;
    /// Byte offset of the first element within the storage; part of the identity (two
    /// slices of one storage are different tensors). The bytes handed to save() start at it.
    std::size_t offset = 0;
    /// The layer scope the save belongs to: a trainer-chosen layer id (layers are ordered by
    /// first appearance in a step's forward), or current_layer for the innermost scope opened
    /// by activation_stash::begin_layer(). Decides keep or offload under the split; not part
    /// of the identity.
    std::uint32_t layer = current_layer;
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

/// How messages name a tensor: "tensor 'name' (storage 3 v0 f32 [4, 8] strides [8, 1]
/// offset 16)", with "tensor" alone for an empty name, and the strides and offset parts
/// left out when empty or 0. Throws only std::bad_alloc.
inline std::string describe(const tensor_desc& d) {
    std::string s = d.name.empty() ? std::string("tensor") : "tensor " + quoted(d.name);
    s += " (storage " + std::to_string(d.storage_id) + " v" + std::to_string(d.version) + " " +
         std::string(dtype_name(d.type)) + " " + detail::dims_str(d.shape);
    if (!d.strides.empty()) s += " strides " + detail::dims_str(d.strides);
    if (d.offset) s += " offset " + std::to_string(d.offset);
    return s + ")";
}

/// Row-major (C order) strides for `shape`, in elements: the last dimension has stride 1
/// and each other the product of the extents after it; extents of 0 or below count as 1,
/// so the result is defined for any shape. Empty for a scalar. A product past INT64_MAX
/// saturates there (no signed overflow); extent_bytes() refuses such a tensor.
inline std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
    std::vector<std::int64_t> s(shape.size());
    std::int64_t acc = 1;
    for (std::size_t i = shape.size(); i-- > 0;) {
        s[i] = acc;
        const std::int64_t n = shape[i] > 0 ? shape[i] : 1;
        acc = acc > std::numeric_limits<std::int64_t>::max() / n ? std::numeric_limits<std::int64_t>::max() : acc * n;
    }
    return s;
}

/// Checks that `d` is well formed: strides empty or one per dimension, no negative extent,
/// no negative stride. Throws std::invalid_argument whose message starts with
/// "activation_stash: " and names the tensor (describe()) and what is wrong; returns
/// normally otherwise. Overflow is checked by extent_bytes().
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

/// The bytes shape and strides address from the first element up to and including the
/// last one: (sum over dimensions of (extent - 1) x stride + 1) x dtype_size(); 0 when any
/// extent is 0, dtype_size() for a scalar. Elements that overlap (stride 0) are counted
/// once. Throws std::invalid_argument naming the tensor when validate() fails or the span
/// overflows std::size_t.
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
/// and layer scope. Two tensors are the same exactly when their identities compare equal;
/// the address of the bytes and their content never take part.
struct tensor_identity {
    std::uint64_t storage_id = 0;     ///< tensor_desc::storage_id.
    std::uint64_t version = 0;        ///< tensor_desc::version.
    dtype type = dtype::f32;          ///< tensor_desc::type.
    std::size_t offset = 0;           ///< tensor_desc::offset, in bytes.
    std::vector<std::int64_t> shape;  ///< tensor_desc::shape, in elements.
    /// tensor_desc::strides in elements, normalised: empty strides become
    /// contiguous_strides(shape), so this is never empty for rank > 0.
    std::vector<std::int64_t> strides;

    /// The identity of `d`, its strides normalised. Does not validate `d`.
    static tensor_identity of(const tensor_desc& d) {
        return {d.storage_id, d.version, d.type, d.offset, d.shape,
                d.strides.empty() ? contiguous_strides(d.shape) : d.strides};
    }
    /// Member-wise equality: true exactly when the two describe the same tensor.
    friend bool operator==(const tensor_identity&, const tensor_identity&) = default;
};

/// Hash of a tensor_identity for unordered containers, consistent with operator== (equal
/// identities hash equal). It mixes every field; not cryptographic and not stable across
/// library versions (never persist it).
struct tensor_identity_hash {
    /// The hash of `t`; never throws.
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
