// SPDX-License-Identifier: Apache-2.0
// spillway/optim/pipeline_config.hpp: what an update_pipeline is built with and called with.
//
// pipeline_config is the shape of the optimizer and the host memory it may use;
// pipeline_options are the switches of the ablation (order, resident set, gradient path:
// the DeepSpeed-like baseline is the same engine with them switched off) and the caller's
// hooks; update_args are the per-call arguments, including the gate of a streamed update,
// whose overflow is reported as gradient_overflow_error.
//
// Guarantees:
// - Plain values: copying one is the way to build a second pipeline like the first.
// - validate(config, options) refuses, with std::invalid_argument naming the field, its
//   value and the limit, every setting the pipeline cannot run with; update_pipeline's
//   constructors call it before anything is allocated or written.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/step_hparams.hpp"
#include "spillway/schedule/alternating_order.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/trace/recorder.hpp"

namespace spillway {

/// The order in which one update call visits the subgroups.
enum class subgroup_order {
    alternating,  ///< 0..N-1, then N-1..0, ... (MLP-Offload)
    ascending,    ///< 0..N-1 every time (DeepSpeed)
};

/// What happens to the buffers of the last subgroups a call updates.
enum class resident_policy {
    keep_last_updated,  ///< the last host_buffers - streaming_buffers stay in memory for the next
                        ///< call
    none,               ///< every subgroup is written back (DeepSpeed)
};

/// How gradients reach the update.
enum class gradient_path {
    lazy_widening,  ///< stay fp16/bf16 in host memory, widened inside the Adam step
    fp32_on_tier,   ///< widened to fp32 and written to the tier in backward, read back (DeepSpeed)
};

/// The shape of the optimizer and the memory it may use.
struct pipeline_config {
    std::size_t param_count = 0;    ///< parameters in total (> 0)
    std::size_t subgroup_size = 0;  ///< parameters per subgroup (> 0; the last one may be smaller)
    std::size_t host_buffers =
        3;  ///< subgroup buffers (>= streaming_buffers); the rest form the resident set
    /// Buffers that stream (read ahead, update, write behind); at least 3 and at most
    /// host_buffers. More of them keep more reads and writes queued for the tier (a virtual
    /// tier's slower path then idles less) at the price of a smaller resident set, that is
    /// more traffic per call; with resident_policy::none every buffer streams.
    std::size_t streaming_buffers = 3;
    memory_lock lock = memory_lock::unlocked;  ///< mlock() the buffers
    /// The buffers' pages: page_size::automatic (transparent huge pages, see aligned_buffer;
    /// buffers under 2 MiB, when not locked, share one huge-page slab of a buffer_arena, their
    /// total rounded up to 2 MiB) or page_size::base (e.g. to compare with a program that uses
    /// base pages).
    page_size pages = page_size::automatic;
    adamw_config adam{};       ///< AdamW hyper-parameters (lr, betas, eps, weight decay)
    double max_grad_norm = 0;  ///< global-norm clipping threshold; 0 turns clipping off
    /// Bytes of one piece (> 0, a multiple of 4096): a subgroup's blob is stored as
    /// ceil(12 * elements / piece_bytes) tier keys and moved piece by piece. The default is
    /// half of a file tier's default ring (32 x 1 MiB), which then holds a read and a write.
    std::size_t piece_bytes = std::size_t{16} << 20;
    /// Pieces each direction may have in the tier at once (> 0): reads and writes take turns
    /// within their own window, so the tier always holds some of both. A tier with children
    /// (a virtual tier) gets no window: it runs one read and one write per child at a time
    /// itself, and a window over children of different speeds would fill up with pieces of
    /// the slow one while the fast one idles.
    std::size_t pieces_in_flight = 2;

    /// Number of subgroups: ceil(param_count / subgroup_size) (0 when subgroup_size is 0).
    [[nodiscard]] std::size_t subgroup_count() const noexcept {
        if (subgroup_size == 0) return 0;
        return param_count / subgroup_size + (param_count % subgroup_size != 0 ? 1 : 0);
    }
    /// Parameters in subgroup s (< subgroup_count()); only the last one may be smaller.
    [[nodiscard]] std::size_t subgroup_elements(std::size_t s) const noexcept {
        return std::min(subgroup_size, param_count - s * subgroup_size);
    }
};

/// How the pipeline runs: the switches of the ablation, and hooks.
struct pipeline_options {
    /// Visiting order: alternating (0..N-1, then N-1..0) or always ascending (DeepSpeed).
    subgroup_order order = subgroup_order::alternating;
    direction first_direction = direction::ascending;  ///< the first call's direction
    /// Whether buffers beyond the streaming ones keep the last-updated subgroups between calls (the
    /// next, reversed, call then neither reads nor writes them) or are only used for read-ahead.
    resident_policy resident = resident_policy::keep_last_updated;
    /// How gradients reach the Adam step (see gradient_path).
    gradient_path gradients = gradient_path::lazy_widening;
    std::string key_prefix = "optim";  ///< tier keys are "<prefix>-<i>" (and "<prefix>-<i>.grad")
    /// Where the fp32 master params live. Empty (the default): on the tier with m and v (12
    /// bytes per parameter), and update() writes the compute copy into its copy_out. Set to
    /// the caller's param_count fp32 params (only with ParamCopy = float: a trainer whose
    /// compute copy is fp32 holds the master params in memory anyway): the tier holds m and v
    /// only (8 bytes per parameter, a third less traffic per update and smaller buffers),
    /// update() updates these params in place (its copy_out must be empty or this same
    /// span), save() takes them from here and restore() puts the saved ones here. The save
    /// format is the same either way. The caller keeps this memory alive and changes it only
    /// through the pipeline (as it would an in-memory optimizer's params).
    std::span<float> master_params{};
    thread_pool* pool = nullptr;          ///< Adam's threads; nullptr: the shared pool
    trace::recorder* recorder = nullptr;  ///< timeline (tracks "reads", "compute", "writes")
    /// Called by the thread that drives update(), once per subgroup in visiting order, as soon
    /// as subgroup s's new params are written (the master params' slice, or copy_out's) and
    /// before the call moves on; the call does not touch those params again. A trainer that
    /// runs update() on a thread of its own can let its next forward use each layer's params
    /// as they arrive, so that the rest of the update (its I/O above all) runs under the
    /// forward. Not called for a skipped step; a failed call has called it for the subgroups
    /// it finished, and a retried call calls it again for every subgroup. It must not throw.
    std::function<void(std::size_t subgroup)> on_subgroup_updated{};
};

/// Whether the gradients of parameters [begin, end) are final: returns true once they are,
/// waiting at most `wait_at_most` for them and returning false if they are not final by then
/// (see update_args::gradients_final).
using gradient_gate =
    std::function<bool(std::size_t begin, std::size_t end, std::chrono::microseconds wait_at_most)>;

/// Per-call arguments.
struct update_args {
    float grad_scale = 1.0f;  ///< the loss scale the gradients carry (divided out)
    /// This step's learning rate and weight decay (a schedule's output, validated as
    /// adamw_config's); empty: pipeline_config::adam's. The other Adam settings (betas, eps)
    /// stay the config's. A retried call (after a failed one) must pass the same values: the
    /// subgroups that already hold the step keep what they got.
    std::optional<step_hparams> hparams{};
    /// A streamed update: set by a trainer that calls update() while its backward pass is
    /// still computing the gradients (on a thread of its own), so that the update's I/O and
    /// Adam steps run under backward. The call then reads ahead as usual, but before the Adam
    /// step of each subgroup it asks this gate until the subgroup's gradients are final,
    /// topping up the I/O (and the reads ahead) between asks; it reads no gradient before
    /// its gate says so. Backward finishes the gradients of the last layers first, so a
    /// descending walk (every other call of the alternating order) follows it.
    ///
    /// The gradients are then checked subgroup by subgroup, as each is taken, instead of all
    /// at once before the first update, so a streamed update cannot skip an overflow: an
    /// inf or NaN gradient throws gradient_overflow_error naming the subgroup, with the
    /// subgroups visited before it already holding the new step (no state is lost, as after
    /// a fault: update() again with finite gradients of this step finishes it exactly once).
    /// Use it where the step is not expected to overflow (fp32 or bf16 gradients without
    /// loss scaling); with fp16 loss scaling, whose overflows are routine, check first.
    /// Refused (std::invalid_argument) with clipping (max_grad_norm > 0: the norm needs every
    /// gradient first) and with gradient_path::fp32_on_tier (its hand-over checks first).
    gradient_gate gradients_final{};
};

/// Refuses a configuration the pipeline cannot run with, before anything is allocated.
/// Checks every field of `config` (sizes, buffers, clipping, the Adam settings, pieces) and
/// `options.key_prefix`; what depends on the tier or on the element types is checked by
/// update_pipeline itself.
/// @throws std::invalid_argument naming the first bad field, its value and the limit
inline void validate(const pipeline_config& config, const pipeline_options& options) {
    expect_argument(config.param_count > 0, "update_pipeline: param_count must be > 0");
    expect_argument(config.subgroup_size > 0, "update_pipeline: subgroup_size must be > 0");
    expect_argument(config.host_buffers >= 3,
                    "update_pipeline: host_buffers is " + std::to_string(config.host_buffers) +
                        "; the pipeline needs at least 3 (read, update, write)");
    expect_argument(
        config.streaming_buffers >= 3 && config.streaming_buffers <= config.host_buffers,
        "update_pipeline: streaming_buffers is " + std::to_string(config.streaming_buffers) +
            "; it must be at least 3 (read, update, write) and at most host_buffers (" +
            std::to_string(config.host_buffers) + ")");
    expect_argument(
        std::isfinite(config.max_grad_norm) && config.max_grad_norm >= 0,
        "update_pipeline: max_grad_norm must be finite and >= 0 (0: no clipping), got " +
            std::to_string(config.max_grad_norm));
    validate(config.adam);
    validate_key(options.key_prefix, "update_pipeline key_prefix");
    expect_argument(options.key_prefix.size() <= 200,
                    "update_pipeline: key_prefix is longer than 200 bytes");
    expect_argument(config.piece_bytes > 0 && config.piece_bytes % 4096 == 0,
                    "update_pipeline: piece_bytes is " + std::to_string(config.piece_bytes) +
                        "; it must be a positive multiple of 4096");
    expect_argument(config.pieces_in_flight > 0, "update_pipeline: pieces_in_flight must be > 0");
}

/// Thrown by a streamed update (update_args::gradients_final) that finds an inf or NaN
/// gradient: the step is only partly applied (see update_args).
class gradient_overflow_error : public std::runtime_error {
public:
    /// `what`: the message; `subgroup`: the one with the inf/NaN; `updated`: how many already hold
    /// the step.
    gradient_overflow_error(const std::string& what, std::size_t subgroup, std::size_t updated)
        : std::runtime_error(what), subgroup_(subgroup), updated_(updated) {}
    /// The subgroup whose gradients are not finite.
    [[nodiscard]] std::size_t subgroup() const noexcept { return subgroup_; }
    /// Subgroups that already hold the new step.
    [[nodiscard]] std::size_t subgroups_updated() const noexcept { return updated_; }

private:
    std::size_t subgroup_, updated_;
};

}  // namespace spillway
