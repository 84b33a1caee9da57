// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/streamed_params.hpp: the parameter store of `--offload params`: every
// transformer layer's fp32 params and its AdamW moments leave memory, each layer is updated
// in backward as soon as its gradients are final.
//
// What it guarantees:
// - No buffer of the model's size: resident are the ends (wte, wpe, lnfw, lnfb with their
//   gradients, m and v), one layer's gradient buffer, and the windows of two param_streams
//   (spillway/stream/param_stream.hpp) on a file tier: the layers' params (4 B/param) and
//   their moments m|v (8 B/param). Neither window is ever exceeded (the stream's guarantee).
// - The same bits as the in-memory trainer: the same init (init_gpt2_layer), the same kernels
//   on the same values, and Spillway's AdamW element formula (adamw_step) over each layer's
//   span with the in-memory optimizer's hyper-parameters and step number; the formula does
//   not depend on how the parameters are split.
// - Per step and layer l (backward, l = L-1..0), the protocol:
//    1. backward_layer(l): params acquire_for_update(l) (read if not resident);
//    2. backward writes l's gradients into the layer buffer (every one overwritten);
//    3. grads_done(l): under mpirun the buffer is summed over the ranks (the bucket is the
//       layer); m|v acquire_for_update(l); adamw_step over the layer's span (a gradient inf
//       or NaN throws: a streamed update cannot skip a step, see docs/param_stream.md);
//       both released as updated (written back once, when their room is needed);
//    4. after backward, update_ends() steps the ends in memory (reduced first under mpirun).
// - Bytes per parameter of a streamed layer per step, with windows of k of the N layers:
//   params read 2(N-k)/N * 4 B, written <= 4 B; m|v read and written 8 B each (the update
//   visits every layer once a step, descending): at most 28 B.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "gpt2.hpp"
#include "optimizer.hpp"
#include "spillway/lock/owned_directory.hpp"
#include "spillway/stream/param_stream.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/tier/file_tier.hpp"

namespace mini_gpt {

struct streamed_params_settings {
    std::filesystem::path path;    // the streams' files go in <path>/mini_gpt-params/proc-*
    std::size_t param_window = 0;  // the params stream's memory budget (bytes)
    std::size_t state_window = 0;  // the m|v stream's memory budget (bytes)
    adam_hparams adam;             // as the in-memory optimizer's
    spillway::thread_pool* pool = nullptr;  // the AdamW step's threads
    bool reduce_gradients = false;  // under mpirun: sum each layer's gradients over the ranks
};

/// Bytes of the params and m|v streams so far (a plain value: subtract two for a step).
struct stream_traffic {
    std::uint64_t param_read = 0, param_written = 0, state_read = 0, state_written = 0;
    friend stream_traffic operator-(const stream_traffic& a, const stream_traffic& b) {
        return {a.param_read - b.param_read, a.param_written - b.param_written,
                a.state_read - b.state_read, a.state_written - b.state_written};
    }
};

class streamed_params final : public param_store {
public:
    using tier_type = spillway::file_tier<>;
    using stream_type = spillway::param_stream<tier_type>;

    /// Bytes of one layer's params, and of its m|v.
    static std::size_t layer_param_bytes(const gpt2_config& c);
    static std::size_t layer_state_bytes(const gpt2_config& c);
    /// The smallest windows the streams take (one layer each: backward holds one).
    static std::size_t smallest_param_window(const gpt2_config& c);
    static std::size_t smallest_state_window(const gpt2_config& c);
    /// Bytes resident outside the windows: the ends' params, grads, m, v and the layer
    /// gradient buffer.
    static std::size_t resident_bytes(const gpt2_config& c);
    /// Bytes the streams put on the path (params and m|v of every layer).
    static std::size_t stored_bytes(const gpt2_config& c);

    /// Creates the streams (empty); fill them with init_gpt2() or set_params().
    /// @throws input_error when the path cannot hold the folder; std::invalid_argument for a
    ///         window under the smallest
    streamed_params(const gpt2_config& c, const streamed_params_settings& s);
    ~streamed_params() override;
    streamed_params(const streamed_params&) = delete;
    streamed_params& operator=(const streamed_params&) = delete;

    /// The first contents: gpt2::init_gpt2(seed)'s bits, layer by layer straight into the
    /// stream (ps.fill), and zero moments. `progress(done, total)` hears the bytes that
    /// reached the path, after each layer and at the end.
    void init_gpt2(std::uint64_t seed,
                   const std::function<void(std::size_t done, std::size_t total)>& progress);
    /// The AdamW step number (1-based) the updates in the next backward use.
    void begin_step(std::int64_t t) noexcept { step_ = t; }
    /// Steps the ends (after backward); sums their gradients over the ranks first when
    /// reduce_gradients.
    void update_ends();
    /// The whole model in llm.c's order (for --save-model: the one model-sized buffer, made
    /// after the last step).
    [[nodiscard]] std::vector<float> llmc_params();

    /// Saving and resuming (--save, --resume) without a model-sized buffer: each layer's
    /// params and m|v are read from the stream (acquire, release) and written straight to
    /// their places in the file, one layer at a time.
    /// - write_llmc: an llm.c checkpoint of the model (the bytes write_checkpoint would
    ///   write for llmc_params()); the layer's twelve tensors go to their llm.c offsets.
    /// - write_moments: the AdamW moments, in this layout (little-endian):
    ///     "MGPTMOM1", u64 layers L, u64 floats per layer n, u64 floats of the ends e,
    ///     then for l = 0..L-1 layer l's m (n floats) and v (n floats), then the ends' m and
    ///     v (e floats each).
    /// Both create `file` anew (O_EXCL, mode 0600) and fsync it.
    /// - load: fills the streams from such files (param_stream::fill, layer by layer, under
    ///   the windows) and the ends from them; the model's config must be this one's.
    /// @throws input_error naming the file (exists, cannot be written, read, of another
    ///         config or size)
    void write_llmc(const std::filesystem::path& file);
    void write_moments(const std::filesystem::path& file);
    void load(const std::filesystem::path& model_file, const std::filesystem::path& moments_file);

    [[nodiscard]] stream_traffic traffic() const;
    [[nodiscard]] spillway::param_stream_stats param_stats() const { return params_->stats(); }
    [[nodiscard]] spillway::param_stream_stats state_stats() const { return state_->stats(); }
    void reset_peaks() noexcept {
        params_->reset_peak();
        state_->reset_peak();
    }

    ends_t ends_params() override { return ends_of(ends_p_.data()); }
    ends_t ends_grads() override { return ends_of(ends_g_.data()); }
    layer_params forward_layer(int layer) override;
    void forward_done(int layer) override;
    layer_params backward_layer(int layer) override;
    layer_params layer_grads(int layer) override;
    void grads_done(int layer) override;

private:
    ends_t ends_of(float* base) const noexcept;
    /// Calls fn(llm.c float offset, float offset in the layer's run, floats) for each tensor
    /// of `layer` (-1: the ends, whose run is ends_p_'s layout).
    template <class Fn>
    void for_each_tensor(int layer, Fn&& fn) const;

    gpt2_config config_;
    param_layout layout_;
    streamed_params_settings s_;
    std::filesystem::path dir_;
    std::optional<spillway::owned_directory> folder_;
    std::unique_ptr<tier_type> tier_;
    std::unique_ptr<stream_type> params_, state_;
    // The ends: wte | wpe | lnfw | lnfb in one block each (params, grads, m, v).
    std::vector<float> ends_p_, ends_g_, ends_m_, ends_v_;
    std::vector<float> layer_g_;        // one layer's gradients
    spillway::layer_update_view held_;  // the layer backward holds
    std::int64_t step_ = 1;
};

}  // namespace mini_gpt
