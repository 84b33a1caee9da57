// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/layer_optimizer_options.hpp: what a layer_optimizer is built with, what it
/// reports, and the arithmetic of its windows and of the bytes it stores.
///
/// Guarantees:
/// - Plain values: copying options builds a second optimizer like the first.
/// - smallest_*_window() are the smallest windows the constructor accepts: the params and m|v
///   streams' smallest_budget() (param_stream_options.hpp) and one charged buffer of the
///   largest layer's fp16 gradients; one byte less is refused, naming the figure.
/// - stored_bytes() bounds every byte the optimizer's blobs occupy on the tiers' file
///   systems at any moment of a run, when its tiers are file tiers (file_tier.hpp) laid out
///   as `disk_layout` says: each blob rounded up to the allocation block, plus per file tier
///   the spare files it keeps and the temporary files of the rewrites in flight (a rewrite
///   creates its new file before the old one goes), each as large as that tier's largest
///   blob.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "spillway/optim/adam.hpp"
#include "spillway/stream/param_stream_options.hpp"
#include "spillway/thread_pool.hpp"

namespace spillway {

/// The type a trainer's gradients are narrowed to before the update (as an in-memory trainer
/// narrows them), or fp32 for none.
enum class grad_dtype {
    fp32,  ///< updated in backward from the float gradients
    bf16,  ///< narrowed to bfloat16, updated in backward (an inf or NaN stops the run)
    fp16,  ///< narrowed to float16 with loss scaling, spilled, updated after the verdict
};

/// How a layer_optimizer runs.
struct layer_optimizer_options {
    /// The params stream's memory budget (bytes), >= smallest_param_window().
    std::size_t param_window = 0;
    /// The m|v stream's memory budget (bytes), >= smallest_state_window().
    std::size_t state_window = 0;
    /// fp16: the gradient spill's buffers (bytes), >= smallest_spill_window(); whole buffers
    /// of the largest layer's fp16 gradients. Ignored for fp32 and bf16.
    std::size_t spill_window = 0;
    grad_dtype grads = grad_dtype::fp32;  ///< see grad_dtype
    /// AdamW's constants; lr and weight_decay are this step's unless begin_step() gives its own.
    adamw_config adam{};
    thread_pool* pool = nullptr;  ///< the update's threads (nullptr: thread_pool::shared_pool())
    /// Data parallelism: called by grads_done(layer) before anything reads the gradients, to
    /// sum them over the ranks in place (every rank then holds the same gradients). Empty:
    /// one rank.
    std::function<void(std::size_t layer, std::span<float> grads)> reduce_grads{};
    /// Data parallelism, fp16: turns this rank's overflow into the ranks' agreed one (true when
    /// any rank saw an inf or NaN). Empty: this rank's.
    std::function<bool(bool overflow)> agree_overflow{};
    /// Tier keys: "<prefix>-<layer>" of the params, of m|v and of the fp16 gradients. Two
    /// optimizers on one tier need other prefixes.
    std::string params_prefix = "params";  ///< the params' keys
    std::string state_prefix = "adam";     ///< the m|v keys
    std::string spill_prefix = "grads";    ///< the fp16 gradients' keys
};

/// How the optimizer's blobs sit on the file systems, for stored_bytes().
struct disk_layout {
    /// Paths the layers are spread over: layer l's blobs on path l mod paths.
    std::size_t paths = 1;
    /// Whether m|v live in file tiers of their own (one per path), or share the params' ones.
    bool separate_state_tier = true;
    /// file_tier_options::spare_files of each file tier.
    std::size_t spare_files = 2;
    /// The file system's allocation unit (a blob occupies whole blocks).
    std::size_t block = 4096;
};

/// The optimizer's counters, per stream (plain values: subtract two for one step).
struct layer_optimizer_stats {
    param_stream_stats params{};                      ///< the params stream
    param_stream_stats state{};                       ///< the m|v stream
    std::uint64_t spill_read = 0;     ///< fp16: bytes the gradient spill read back
    std::uint64_t spill_written = 0;  ///< fp16: bytes the gradient spill wrote
    std::size_t spill_resident = 0;  ///< fp16: the spill's buffers (allocated once)
};

namespace detail {

/// The params stream's options, or with `moments` the m|v stream's: updated only in backward's
/// (or, for fp16, the next forward's) walk, which the optimizer's layer numbering makes
/// descending (visit_pattern::backward_only), and prefetched one layer ahead, so Belady's rule
/// keeps the rest of its window across steps (fewer bytes than reading further ahead, which
/// gives up layers the next step needs).
inline param_stream_options layer_stream_options(std::size_t window, const std::string& prefix,
                                                 bool moments) {
    param_stream_options o;
    o.memory_budget = window;
    o.held_layers = 1;  // backward holds the layer it computes and updates, nothing more
    o.key_prefix = prefix;
    if (moments) {
        o.pattern = visit_pattern::backward_only;
        o.prefetch_depth = 1;
    }
    return o;
}

inline std::vector<std::size_t> scaled(std::span<const std::size_t> floats, std::size_t bytes) {
    std::vector<std::size_t> out;
    out.reserve(floats.size());
    for (auto n : floats) out.push_back(n * bytes);
    return out;
}

inline std::size_t largest(std::span<const std::size_t> v) {
    return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

inline std::size_t round_up(std::size_t n, std::size_t block) {
    return block <= 1 ? n : (n + block - 1) / block * block;
}

}  // namespace detail

/// The smallest params window for layers of `layer_floats` floats.
inline std::size_t smallest_param_window(std::span<const std::size_t> layer_floats) {
    return smallest_budget(detail::scaled(layer_floats, sizeof(float)),
                           detail::layer_stream_options(1, "params", false));
}
/// The smallest m|v window (8 B per float).
inline std::size_t smallest_state_window(std::span<const std::size_t> layer_floats) {
    return smallest_budget(detail::scaled(layer_floats, 2 * sizeof(float)),
                           detail::layer_stream_options(1, "adam", true));
}
/// The smallest fp16 spill window: one buffer of the largest layer's fp16 gradients.
inline std::size_t smallest_spill_window(std::span<const std::size_t> layer_floats) {
    return charge_of(detail::largest(layer_floats) * 2);
}

/// Bytes the optimizer keeps in memory outside its windows: one layer's float gradients (the
/// largest layer's) and, for bf16, the narrowing buffer.
inline std::size_t layer_optimizer_resident_bytes(std::span<const std::size_t> layer_floats,
                                                  grad_dtype g) {
    const std::size_t n = detail::largest(layer_floats);
    constexpr std::size_t narrow_piece = std::size_t{1} << 20;
    return n * sizeof(float) + (g == grad_dtype::bf16 ? std::min(narrow_piece, n) * 2 : 0);
}

/// The most bytes the optimizer's blobs occupy on path `path` (see the file comment), with the
/// windows and the grad dtype of `o` and the layout `d`. `path` < d.paths.
inline std::size_t stored_bytes_on(std::span<const std::size_t> layer_floats,
                                   const layer_optimizer_options& o, const disk_layout& d,
                                   std::size_t path) {
    const std::size_t P = std::max<std::size_t>(d.paths, 1);
    const bool fp16 = o.grads == grad_dtype::fp16;
    std::size_t blobs = 0, layers = 0, big_p = 0, big_s = 0, big_g = 0;
    for (std::size_t l = path; l < layer_floats.size(); l += P) {
        const std::size_t n = layer_floats[l];
        blobs += detail::round_up(4 * n, d.block) + detail::round_up(8 * n, d.block) +
                 (fp16 ? detail::round_up(2 * n, d.block) : 0);
        big_p = std::max(big_p, detail::round_up(4 * n, d.block));
        big_s = std::max(big_s, detail::round_up(8 * n, d.block));
        big_g = std::max(big_g, detail::round_up(2 * n, d.block));
        ++layers;
    }
    if (layers == 0) return 0;
    // Rewrites in flight: each of a stream's buffers holds at most one write; the spill's
    // buffers likewise; never more than the layers on the path.
    auto buffers = [&](std::size_t window, std::size_t floats_bytes) {
        std::size_t least = 0;
        for (auto n : layer_floats) {
            const std::size_t c = charge_of(n * floats_bytes);
            least = least == 0 ? c : std::min(least, c);
        }
        return std::min(layers, least == 0 ? layers : window / least);
    };
    const std::size_t w_p = buffers(o.param_window, 4), w_s = buffers(o.state_window, 8),
                      w_g = fp16 ? buffers(o.spill_window, 2) : 0;
    if (d.separate_state_tier)
        return blobs + (d.spare_files + w_p + w_g) * std::max(big_p, fp16 ? big_g : 0) +
               (d.spare_files + w_s) * big_s;
    return blobs + (d.spare_files + w_p + w_g + w_s) * big_s;
}

/// stored_bytes_on() summed over every path.
inline std::size_t stored_bytes(std::span<const std::size_t> layer_floats,
                                const layer_optimizer_options& o, const disk_layout& d = {}) {
    std::size_t sum = 0;
    for (std::size_t p = 0; p < std::max<std::size_t>(d.paths, 1); ++p)
        sum += stored_bytes_on(layer_floats, o, d, p);
    return sum;
}

}  // namespace spillway
