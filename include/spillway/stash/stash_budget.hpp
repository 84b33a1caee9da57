// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/stash_budget.hpp: how much memory a layer_stash needs: the smallest
/// stash_options::memory_budget with which every layer can be offloaded, and the most the
/// activations then take in all (the stash's budget and the buffers the trainer holds).
///
/// The figures, for a trainer that follows layer_stash's protocol (each layer acquired,
/// computed into, saved; backward loads a layer's tensors, releases each after its last
/// use, then release_layer()):
///  1. backward loads one layer scope at once: the layer's saved tensors and those of the
///     layer before that it saved in its own scope (a block's output, the next block's
///     input: layer_stash_use::carried);
///  2. tensors under keep_below_bytes stay resident in every layer until their backward;
///  3. smallest_stash_budget() = (1) + (layers - 1) x (2) (the scope's own kept tensors are
///     in (1)), each tensor counted as the stash counts it (its buffer's capacity: whole
///     4 KiB blocks). At or above it every layer can be offloaded, whatever the split (the
///     budget forces writes of kept layers: stash_stats::forced_writes), and no tensor kept
///     for its size is written to make room. Below (1) a load finds no room and throws
///     std::length_error; between (1) and the figure, kept tensors are written on the
///     compute thread to make room;
///  4. stash_footprint() = the budget + two layers of buffers outside the stash (the one
///     forward computes into, and the spares layer_stash keeps for the next acquire) + the
///     huge-page arena's slack allowance when the arena is on.
///
/// Guarantees: pure functions of their arguments, so a plan built on them names the same
/// figure in every run. A budget below the activations' size saves memory only when it is
/// at least smallest_stash_budget(); between the two, every layer's tensors pass through
/// the tier.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "spillway/io/aligned_buffer.hpp"
#include "spillway/stash/layer_tensor.hpp"
#include "spillway/stash/stash_options.hpp"

namespace spillway {

/// How a trainer uses its layer_stash's declared tensors (names as declared).
struct layer_stash_use {
    /// Declared tensors never saved: recycle()d, because backward recomputes them.
    std::vector<std::string> recomputed;
    /// Tensors of layer l-1 that layer l saves in its own scope (save(l - 1, name, l)).
    std::vector<std::string> carried;
};

/// Memory the huge-page arena may hold beyond its live buffers' capacities
/// (stash_stats::arena_slack_bytes): partly used slabs, at most a few per size class.
inline constexpr std::size_t stash_arena_allowance = 8 * huge_page_bytes;

namespace detail {

inline bool named_in(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

inline std::size_t buffer_bytes(const layer_tensor& t) {
    const std::size_t n = t.count * dtype_size(t.type);
    return align_up(n == 0 ? 1 : n);
}

}  // namespace detail

/// Bytes of the buffers of one layer's declared tensors, as the stash counts them.
[[nodiscard]] inline std::size_t layer_buffer_bytes(std::span<const layer_tensor> tensors) {
    std::size_t n = 0;
    for (const auto& t : tensors) n += detail::buffer_bytes(t);
    return n;
}

/// The smallest stash_options::memory_budget with which a layer_stash of `layers` layers
/// of `tensors`, used as `use` says, offloads every layer (see the file comment). Reads
/// options.keep_below_bytes only.
[[nodiscard]] inline std::size_t smallest_stash_budget(std::span<const layer_tensor> tensors,
                                                       std::size_t layers,
                                                       const layer_stash_use& use,
                                                       const stash_options& options) {
    std::size_t scope = 0, kept = 0;
    for (const auto& t : tensors) {
        const std::size_t n = detail::buffer_bytes(t);
        const bool saved = !detail::named_in(use.recomputed, t.name);
        if (saved) scope += n;
        if (detail::named_in(use.carried, t.name)) scope += n;
        if (saved && t.count * dtype_size(t.type) < options.keep_below_bytes) kept += n;
    }
    return scope + kept * (layers > 0 ? layers - 1 : 0);
}

/// The most bytes the activations take with `options` (its memory_budget the stash's):
/// the budget, two layers of buffers held outside the stash, and stash_arena_allowance
/// when options.huge_page_arena is set. A trainer that lends spare() buffers as scratch
/// adds nothing: they are the second layer.
[[nodiscard]] inline std::size_t stash_footprint(std::span<const layer_tensor> tensors,
                                                 const stash_options& options) {
    return options.memory_budget + 2 * layer_buffer_bytes(tensors) +
           (options.huge_page_arena ? stash_arena_allowance : 0);
}

}  // namespace spillway
