// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/streamed_params.hpp: the parameter store of `--offload params`: every
// transformer layer's fp32 params and its AdamW moments leave memory, each layer is updated
// as soon as the step's verdict allows: in backward (fp32, bf16) or in the next forward
// (fp16 with loss scaling).
//
// What it guarantees:
// - No buffer of the model's size: resident are the ends (wte, wpe, lnfw, lnfb with their
//   gradients, m and v), one layer's gradient buffer, a 1 Mi-element narrowing buffer (bf16,
//   fp16), and the windows of two param_streams (spillway/stream/param_stream.hpp) over
//   every --path (striped_tier: layer l on path l mod P): the layers' params (4 B/param) and
//   their moments m|v (8 B/param); with fp16, the window of the gradient spill (grad_spill
//   in the .cpp: 2 B/param). No window is ever exceeded (the stream's guarantee; the spill
//   allocates its buffers once).
// - The same bits as the in-memory trainer for every --grad-dtype: the same init
//   (init_gpt2_layer), the same kernels on the same values, the gradients narrowed as
//   step.cpp narrows them (spillway::narrow, element by element), and Spillway's AdamW
//   element formula (adamw_step) over each layer's span with the in-memory optimizer's
//   hyper-parameters, step number and grad_scale; the formula does not depend on how the
//   parameters are split.
// - Per step and layer l (backward, l = L-1..0), the protocol:
//    1. backward_layer(l): params acquire_for_update(l) (fp16: acquire(l)), read if not
//       resident;
//    2. backward writes l's gradients into the layer buffer (every one overwritten);
//    3. grads_done(l): under mpirun the buffer is summed over the ranks (the bucket is the
//       layer); then
//       - fp32, bf16: m|v acquire_for_update(l); adamw_step over the layer's span (bf16: the
//         gradients narrowed piece by piece; an inf or NaN throws: a step already partly
//         applied cannot be skipped, see docs/param_stream.md); both released as updated;
//       - fp16: the gradients narrowed into the spill (written while backward goes on) and
//         their sum of squares added to the step's check; params released unchanged;
//    4. after backward, end_step(): the ends' gradients reduced; fp16: the verdict (the
//       layers' checks and the ends', agreed by every rank): on overflow the spill is
//       dropped and nothing changes (the trainer halves the loss scale), else the update is
//       pending; the ends are stepped in memory.
//    5. fp16, the next forward (or settle(), before anything reads the params): forward_layer(l)
//       acquires l for update and applies the pending update first (m|v acquired, the
//       spill's fp16 gradients widened in adamw_step with the step's loss scale), then the
//       layer's forward reads the new params.
// - Bytes per parameter of a streamed layer per step, with windows of k of the N layers:
//   params read 2(N-k)/N * 4 B, written <= 4 B; m|v read and written 8 B each (the update
//   visits every layer once a step): at most 28 B; fp16 adds the spill, 2 B written and
//   2 B read (less the layers it keeps): at most 32 B.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpt2.hpp"
#include "optimizer.hpp"
#include "spillway/lock/owned_directory.hpp"
#include "spillway/stream/param_stream.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/tier/file_tier.hpp"

namespace mini_gpt {

/// The streams' tier over every --path: one file tier per path (in <path>/mini_gpt-params/
/// proc-*, named by its path), and each layer's blobs (keys "<prefix>-<layer>": its params,
/// m|v and fp16 gradients) on path `layer mod P`. Round robin by layer: every path holds
/// the same share of each stream (known at start, so each path's free space is checked
/// exactly), and the walk alternates paths layer by layer, so the read of the next layer
/// and the write-back of the last go to different devices. A storage_tier.
class striped_tier {
public:
    using child_type = spillway::file_tier<>;
    static constexpr spillway::tier_properties properties = child_type::properties;
    /// Over `children` (at least one), in --path order.
    explicit striped_tier(std::vector<std::unique_ptr<child_type>> children);
    /// The path (index into the children) of a key "<prefix>-<layer>": layer mod P.
    [[nodiscard]] std::size_t child_of(std::string_view key) const;
    [[nodiscard]] std::size_t child_count() const noexcept { return children_.size(); }
    [[nodiscard]] const child_type& child(std::size_t i) const { return *children_.at(i); }

    spillway::io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        return children_[child_of(key)]->write(key, bytes);
    }
    spillway::io_completion read(std::string_view key, std::span<std::byte> bytes) {
        return children_[child_of(key)]->read(key, bytes);
    }
    bool erase(std::string_view key) { return children_[child_of(key)]->erase(key); }
    [[nodiscard]] bool contains(std::string_view key) const {
        return children_[child_of(key)]->contains(key);
    }
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const {
        return children_[child_of(key)]->size_of(key);
    }
    /// SIZE_MAX (unbounded) when any path is; else their sum.
    [[nodiscard]] std::size_t capacity() const noexcept;
    [[nodiscard]] std::size_t used() const;
    /// Every path's counters summed (busy seconds too).
    [[nodiscard]] spillway::tier_stats stats() const;
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

private:
    std::vector<std::unique_ptr<child_type>> children_;
    std::string name_;  // the paths, joined by ", "
};

struct streamed_params_settings {
    /// Every --path: the streams' files go in <path>/mini_gpt-params/proc-*/{params,moments}
    /// (two striped_tiers: params and the fp16 spill, and m|v), layer l's on paths[l mod P].
    std::vector<std::filesystem::path> paths;
    std::size_t param_window = 0;  // the params stream's memory budget (bytes)
    std::size_t state_window = 0;  // the m|v stream's memory budget (bytes)
    std::size_t grad_window = 0;   // fp16: the gradient spill's buffers (bytes; >= one layer)
    adam_hparams adam;             // as the in-memory optimizer's
    grad_dtype grads = grad_dtype::fp32;    // --grad-dtype
    spillway::thread_pool* pool = nullptr;  // the AdamW step's threads
    bool reduce_gradients = false;  // under mpirun: sum each layer's gradients over the ranks
};

/// Bytes of the params and m|v streams and of the fp16 gradient spill so far, in all and
/// per --path (a plain value: subtract two for a step).
struct stream_traffic {
    std::uint64_t param_read = 0, param_written = 0, state_read = 0, state_written = 0;
    std::uint64_t grad_read = 0, grad_written = 0;
    struct path_bytes {
        std::uint64_t read = 0, written = 0;
    };
    std::vector<path_bytes> paths;  // the three together, per --path, in --path order
    friend stream_traffic operator-(const stream_traffic& a, const stream_traffic& b) {
        stream_traffic d{a.param_read - b.param_read,
                         a.param_written - b.param_written,
                         a.state_read - b.state_read,
                         a.state_written - b.state_written,
                         a.grad_read - b.grad_read,
                         a.grad_written - b.grad_written,
                         a.paths};
        for (std::size_t i = 0; i < d.paths.size() && i < b.paths.size(); ++i)
            d.paths[i] = {a.paths[i].read - b.paths[i].read,
                          a.paths[i].written - b.paths[i].written};
        return d;
    }
};

class grad_spill;

class streamed_params final : public param_store {
public:
    using tier_type = striped_tier;
    using stream_type = spillway::param_stream<tier_type>;

    /// Bytes of one layer's params, of its m|v, and of its fp16 gradients (the spill's).
    static std::size_t layer_param_bytes(const gpt2_config& c);
    static std::size_t layer_state_bytes(const gpt2_config& c);
    static std::size_t layer_grad_bytes(const gpt2_config& c);
    /// The smallest windows the streams and the spill take (one layer each: backward holds
    /// one).
    static std::size_t smallest_param_window(const gpt2_config& c);
    static std::size_t smallest_state_window(const gpt2_config& c);
    static std::size_t smallest_grad_window(const gpt2_config& c);
    /// Bytes resident outside the windows: the ends' params, grads, m, v, the layer
    /// gradient buffer and, for bf16/fp16, the narrowing buffer.
    static std::size_t resident_bytes(const gpt2_config& c, grad_dtype g = grad_dtype::fp32);
    /// Bytes the streams put on the paths (params and m|v of every layer; fp16: the spill's
    /// gradients too), and on path `path` of `paths` (its layers: l mod paths == path).
    static std::size_t stored_bytes(const gpt2_config& c, grad_dtype g = grad_dtype::fp32);
    static std::size_t stored_bytes_on(const gpt2_config& c, grad_dtype g, std::size_t path,
                                       std::size_t paths);

    /// Creates the streams (empty); fill them with init_gpt2(), load_model() or load().
    /// @throws input_error when the path cannot hold the folder; std::invalid_argument for a
    ///         window under the smallest
    streamed_params(const gpt2_config& c, const streamed_params_settings& s);
    ~streamed_params() override;
    streamed_params(const streamed_params&) = delete;
    streamed_params& operator=(const streamed_params&) = delete;

    /// How far the first state has reached the path: (bytes done, bytes in all).
    using progress_fn = std::function<void(std::size_t done, std::size_t total)>;

    /// The first contents: gpt2::init_gpt2(seed)'s bits, layer by layer straight into the
    /// stream (ps.fill), and zero moments. `progress(done, total)` hears the bytes that
    /// reached the path, after each layer and at the end.
    void init_gpt2(std::uint64_t seed, const progress_fn& progress);
    /// The first contents from an llm.c checkpoint (--model), layer by layer at offsets (no
    /// model-sized buffer), and zero moments: what gpt2::load_llmc_params gives the in-memory
    /// trainer. The file's header must describe this model (its config was read from it).
    /// @throws input_error naming the file (size, header, a NaN or infinite parameter)
    void load_model(const std::filesystem::path& model_file, const progress_fn& progress);
    /// The AdamW step number (1-based) of this step's update, the loss scale backward
    /// multiplies the loss by (grad_scale of the update and of the fp16 check), and the
    /// step's lr and weight decay `h` (the schedule's). Called after the step's forward: the
    /// fp16 update that forward applies is the previous step's, with the previous `h`.
    void begin_step(std::int64_t t, float loss_scale, const spillway::step_hparams& h) noexcept {
        step_ = t;
        scale_ = loss_scale;
        s_.adam.lr = h.lr;
        s_.adam.weight_decay = h.weight_decay;
    }
    /// After backward (every rank): sums the ends' gradients over the ranks when
    /// reduce_gradients, then
    /// - fp32, bf16: steps the ends (the layers were updated in backward); returns true;
    /// - fp16: the verdict over every gradient of the step, agreed by the ranks. False (an
    ///   inf or NaN): the step is skipped, nothing changed. True: the ends are stepped and
    ///   the layers' update is pending (applied by the next forward, or settle()).
    bool end_step();
    /// Applies a pending update to every layer now (fp16; nothing otherwise): before the
    /// params are read for a save or the final model. Idempotent.
    void settle();

    /// Saving, --save-model and resuming (--save, --resume) without a model-sized buffer:
    /// each layer's params and m|v are read from the stream (acquire, release) and written
    /// straight to their places in the file, one layer at a time (a pending update is
    /// applied first).
    /// - write_llmc: an llm.c checkpoint of the model (the bytes write_checkpoint would write
    ///   for the model in llm.c's order); the layer's twelve tensors go to their llm.c
    ///   offsets.
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
    /// The gradient spill's buffers (fp16; 0 otherwise): allocated once, so also its peak.
    [[nodiscard]] std::size_t grad_resident_bytes() const noexcept;
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
    /// The m|v stream's layer of model layer `layer`: the same, or (fp16, whose updates walk
    /// the layers upwards in forward) L-1-layer, so that the stream sees its layers in the
    /// same order (descending) in every mode.
    [[nodiscard]] std::size_t state_layer(int layer) const noexcept;
    /// fp16: the pending update of `layer`, whose params (acquired for update) are `params`.
    void apply_pending(int layer, std::span<float> params);
    /// Fills the streams from `model_file` and `moments_file` (empty: zero moments).
    void fill_from(const std::filesystem::path& model_file,
                   const std::filesystem::path& moments_file, const progress_fn& progress);

    gpt2_config config_;
    param_layout layout_;
    streamed_params_settings s_;
    std::vector<std::filesystem::path> dirs_;         // <path>/mini_gpt-params, per path
    std::vector<spillway::owned_directory> folders_;  // this process's folder in each
    std::unique_ptr<tier_type> tier_;                 // params (and the fp16 spill)
    std::unique_ptr<tier_type> state_tier_;           // m|v
    std::unique_ptr<stream_type> params_, state_;
    std::unique_ptr<grad_spill> spill_;  // fp16 only
    // The ends: wte | wpe | lnfw | lnfb in one block each (params, grads, m, v).
    std::vector<float> ends_p_, ends_g_, ends_m_, ends_v_;
    std::vector<float> layer_g_;  // one layer's gradients
    // bf16/fp16: a piece of gradients narrowed (one of the two is allocated).
    std::vector<spillway::bfloat16> narrow_bf16_;
    std::vector<spillway::float16> narrow_fp16_;
    spillway::layer_update_view held_;  // the layer backward (or an updating forward) holds
    bool forward_updates_ = false;      // forward_layer applied a pending update
    std::int64_t step_ = 1;
    float scale_ = 1.0f;
    double sum_squares_ = 0;  // fp16: this step's check so far
    struct {
        bool due = false;  // fp16: the layers' update of step t waits for the next forward
        std::int64_t t = 0;
        float scale = 1.0f;
    } pending_;
};

}  // namespace mini_gpt
