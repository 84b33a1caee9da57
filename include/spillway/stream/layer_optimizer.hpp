// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/layer_optimizer.hpp: a model's layers trained out of core: each layer's
/// fp32 params on a param_stream, their AdamW moments m|v on a second stream, and each layer
/// updated as soon as the step's verdict allows: in backward (fp32, bf16 gradients) or, for
/// fp16 with loss scaling, in the next forward, after the step's overflow verdict.
///
/// What it guarantees:
/// - Memory: the two streams' windows (never exceeded: param_stream's guarantee), the fp16
///   spill's buffers (allocated once), one layer's float gradients and, for bf16, a narrowing
///   buffer of at most 1 Mi elements (layer_optimizer_resident_bytes()). Nothing of the
///   model's size.
/// - Bits: each layer's update is adamw_step (optim/adam.hpp) over the layer's span with the
///   step's number, loss scale (grad_scale) and hyper-parameters, on the gradients as given
///   (fp32), narrowed element by element (bf16, fp16: spillway::narrow) exactly as an
///   in-memory trainer narrows its gradients: the same floats as adamw_step over the whole
///   model, since the formula is element by element.
/// - backward_layer() hands out the layer's gradient buffer zeroed, for kernels that add
///   into it.
/// - fp16: no parameter or moment changes before the verdict of end_step() over every
///   gradient of the step (this rank's, agreed by agree_overflow); a step with an inf or NaN
///   changes nothing and is reported skipped. The pending update of step t uses step t's
///   number, loss scale and step_hparams, whenever it runs.
/// - fp32, bf16: a layer is updated in grads_done(), so an inf or NaN gradient cannot skip
///   the step (the layers above are already updated): grads_done() throws std::runtime_error
///   naming the step and the layer. With fp32 gradients the layer is unchanged; with bf16,
///   narrowed and stepped 1 Mi elements at a time, the pieces before the bad one are applied:
///   the run cannot go on from that state (resume from a save).
/// - Tier errors come from the streams and the spill, naming the layer, its key and the tier.
/// - Not thread-safe: the trainer's thread drives it (the update itself runs on the pool).
///
/// The protocol, per step t (layers 0..L-1):
///  1. begin_step(t, loss_scale, hparams): the step number (1-based; a resumed run passes its
///     own), the loss scale backward multiplied the loss by, and this step's lr and weight
///     decay.
///  2. Forward, l = 0..L-1: forward_layer(l) returns the params (fp16: a pending update of l
///     is applied first), forward_done(l) ends the use.
///  3. Backward, l = L-1..0: backward_layer(l) returns the params and the zeroed gradient
///     buffer; the trainer writes l's gradients into it; grads_done(l):
///     a. reduce_grads(l, grads) sums them over the ranks (data parallelism);
///     b. fp32, bf16: m|v acquired, adamw_step over the layer (bf16: narrowed piece by piece),
///        both released as updated;
///        fp16: narrowed into the spill (written to the tier while backward goes on), their
///        sum of squares added to the step's check; params released unchanged.
///  4. end_step(extra): fp16: a layer still pending from an earlier step (not visited since)
///     is updated first, with that step's figures; then the verdict over the layers' check
///     plus `extra` (the sum of squares of the trainer's own resident gradients): on
///     overflow the spill is dropped and step_result::skipped_overflow returned; else the
///     update of every layer whose gradients were given is pending (applied by the layer's
///     next forward_layer or backward_layer, or by settle()).
///  5. settle() applies what is pending now: before reading the params for a save.
/// The order of the two streams' visits is their visit_pattern's in every mode: the m|v
/// stream numbers layers L-1-l for fp16, whose updates walk upwards in forward.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "spillway/io/durable_file.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/optim/step_hparams.hpp"
#include "spillway/stream/detail/grad_spill.hpp"
#include "spillway/stream/detail/narrowed_step.hpp"
#include "spillway/stream/detail/offset_file.hpp"
#include "spillway/stream/layer_optimizer_options.hpp"
#include "spillway/stream/param_stream.hpp"

namespace spillway {

/// A model's layers with their AdamW state streamed through memory windows and updated layer
/// by layer (see the file comment for the guarantees and the protocol). Not copyable.
/// @tparam Tier any storage_tier; the optimizer holds references to its tiers.
template <storage_tier Tier>
class layer_optimizer {
public:
    /// What backward_layer() gives: the layer's params (read them only) and its gradient
    /// buffer (zeroed, the layer's size).
    struct backward_view {
        std::span<const float> params;  ///< the layer's params, read-only
        std::span<float> grads;         ///< the layer's gradient buffer, zeroed
    };

    /// An optimizer for layers of `layer_floats` floats (any sizes, none 0): params and the
    /// fp16 spill on `param_tier`, m|v on `state_tier` (may be the same tier). The streams
    /// start empty: fill() every layer, or load().
    /// @throws std::invalid_argument for no layers, a window under its smallest (naming it),
    ///         and what param_stream's constructor throws (a bounded tier without room)
    layer_optimizer(Tier& param_tier, Tier& state_tier, std::vector<std::size_t> layer_floats,
                    layer_optimizer_options options)
        : floats_(std::move(layer_floats)), o_(std::move(options)) {
        if (floats_.empty()) throw std::invalid_argument("layer_optimizer: no layers");
        validate(o_.adam);
        params_ = std::make_unique<stream_type>(
            param_tier, detail::scaled(floats_, sizeof(float)),
            detail::layer_stream_options(o_.param_window, o_.params_prefix, false));
        // The m|v stream's layer i is model layer state_layer(i) (reversed for fp16).
        std::vector<std::size_t> state_floats(floats_.size());
        for (std::size_t l = 0; l < floats_.size(); ++l) state_floats[state_layer(l)] = floats_[l];
        state_ = std::make_unique<stream_type>(
            state_tier, detail::scaled(state_floats, 2 * sizeof(float)),
            detail::layer_stream_options(o_.state_window, o_.state_prefix, true));
        const std::size_t most = detail::largest(floats_);
        if (o_.grads == grad_dtype::fp16) {
            const std::size_t least = smallest_spill_window(floats_);
            if (o_.spill_window < least)
                throw std::invalid_argument("layer_optimizer: spill_window of " +
                                            std::to_string(o_.spill_window) +
                                            " bytes is under one layer's fp16 gradients (" +
                                            std::to_string(least) + " bytes)");
            spill_ = std::make_unique<detail::grad_spill<Tier>>(
                param_tier, o_.spill_prefix, detail::scaled(floats_, sizeof(float16)),
                o_.spill_window / least);
        }
        grads_.assign(most, 0.0f);
        if (o_.grads == grad_dtype::bf16) narrow_.resize(std::min(narrow_piece, most));
        pending_layer_.assign(floats_.size(), false);
        put_layer_.assign(floats_.size(), false);
        hparams_ = hparams_of(o_.adam);
    }
    /// One tier for params, m|v and the spill.
    layer_optimizer(Tier& tier, std::vector<std::size_t> layer_floats,
                    layer_optimizer_options options)
        : layer_optimizer(tier, tier, std::move(layer_floats), std::move(options)) {}

    ~layer_optimizer() {
        spill_.reset();  // (erases its blobs)
        state_.reset();
        params_.reset();
    }
    layer_optimizer(const layer_optimizer&) = delete;
    layer_optimizer& operator=(const layer_optimizer&) = delete;

    /// Layers of the model.
    [[nodiscard]] std::size_t layer_count() const noexcept { return floats_.size(); }
    /// Floats of layer `layer` (std::out_of_range past the last).
    [[nodiscard]] std::size_t layer_floats(std::size_t layer) const { return floats_.at(layer); }
    /// The options it was built with.
    [[nodiscard]] const layer_optimizer_options& options() const noexcept { return o_; }

    // ---- First contents ------------------------------------------------------------------
    /// Layer `layer`'s first contents: `fn(std::span<float> params)` writes every param (the
    /// moments start at zero), or `fn(params, m, v)` writes all three. Straight into the
    /// streams' buffers (param_stream::fill); if fn throws the layer keeps its earlier contents.
    template <class Fn>
    void fill(std::size_t layer, Fn&& fn) {
        check_layer(layer, "fill");
        const std::size_t n = floats_[layer];
        params_->fill(layer, [&](layer_update_view pv) {
            state_->fill(state_layer(layer), [&](layer_update_view sv) {
                const auto p = pv.as<float>(), mv = sv.as<float>();
                if constexpr (std::invocable<Fn&, std::span<float>, std::span<float>,
                                             std::span<float>>) {
                    fn(p, mv.first(n), mv.subspan(n));
                } else {
                    fn(p);
                    std::fill(mv.begin(), mv.end(), 0.0f);
                }
            });
        });
    }
    /// As fill(), from a copy of the layer's params (zero moments).
    void store(std::size_t layer, std::span<const float> params) {
        check_size(layer, params.size(), "store");
        fill(layer,
             [&](std::span<float> p) { std::copy(params.begin(), params.end(), p.begin()); });
    }
    /// How far the first contents reached the tiers (both streams together).
    [[nodiscard]] store_progress progress() {
        const auto a = params_->progress(), b = state_->progress();
        return {a.layers_stored + b.layers_stored, a.layer_count + b.layer_count,
                a.bytes_stored + b.bytes_stored, a.bytes_total + b.bytes_total};
    }
    /// Writes every dirty layer of both streams and waits (param_stream::flush()).
    void flush() {
        params_->flush();
        state_->flush();
    }

    // ---- The step ------------------------------------------------------------------------
    /// Step t's number (>= 1), loss scale (the gradients are divided by it; 1 for none) and
    /// hyper-parameters.
    void begin_step(std::int64_t t, float loss_scale, const step_hparams& h) {
        adamw_step_args a;
        a.step = t;
        a.grad_scale = loss_scale;
        validate(a);
        validate(with_step(o_.adam, h));
        step_ = t;
        scale_ = loss_scale;
        hparams_ = h;
    }
    /// As above with the options' own lr and weight decay.
    void begin_step(std::int64_t t, float loss_scale = 1.0f) {
        begin_step(t, loss_scale, hparams_of(o_.adam));
    }

    /// The params of `layer` for forward, valid until forward_done(layer); a pending update
    /// of the layer is applied first.
    std::span<const float> forward_layer(std::size_t layer) {
        return acquire_params(layer, hold::forward);
    }
    /// Ends forward's use of `layer`'s params.
    void forward_done(std::size_t layer) { release_params(layer, hold::forward); }

    /// The params of `layer` and its zeroed gradient buffer, valid until grads_done(layer).
    backward_view backward_layer(std::size_t layer) {
        const auto p = acquire_params(layer, hold::backward);
        const auto g = std::span<float>(grads_).first(floats_[layer]);
        std::fill(g.begin(), g.end(), 0.0f);
        return {p, g};
    }
    /// The gradients of `layer` are final: reduced, then the layer updated (fp32, bf16) or
    /// spilled for the update after the verdict (fp16). See the protocol, step 3.
    void grads_done(std::size_t layer) {
        if (held_ != layer || mode_ != hold::backward)
            throw std::logic_error("layer_optimizer: grads_done(" + std::to_string(layer) +
                                   ") without backward_layer(" + std::to_string(layer) + ")");
        const std::size_t n = floats_[layer];
        const auto g = std::span<float>(grads_).first(n);
        if (o_.reduce_grads) o_.reduce_grads(layer, g);
        if (o_.grads == grad_dtype::fp16) {
            spill_->put(layer, [&](std::span<std::byte> b) {
                const std::span<float16> h(reinterpret_cast<float16*>(b.data()), n);
                narrow(std::span<const float>(g), h);
                sum_squares_ += grad_sum_squares(std::span<const float16>(h), scale_, o_.pool);
            });
            put_layer_[layer] = true;
            release_params(layer, hold::backward);
            return;
        }
        const std::size_t sl = state_layer(layer);
        auto mv = state_->acquire_for_update(sl).template as<float>();
        adamw_step_args a;
        a.step = step_;
        a.grad_scale = scale_;
        a.check = grad_check::scan;
        const adamw_config c = with_step(o_.adam, hparams_);
        const auto p = held_view_.template as<float>();
        step_result r;
        try {
            r = o_.grads == grad_dtype::bf16
                    ? detail::narrowed_step<bfloat16>(c, a, p, mv.first(n), mv.subspan(n), g,
                                                      std::span<bfloat16>(narrow_), o_.pool)
                    : detail::narrowed_step<float>(c, a, p, mv.first(n), mv.subspan(n), g, {},
                                                   o_.pool);
        } catch (...) {
            state_->release(sl);
            release_params(layer, hold::backward);
            throw;
        }
        if (r == step_result::skipped_overflow) {
            // bf16's pieces before the bad one are applied: the layer's state is torn.
            state_->release(sl, layer_change::updated);
            held_change_ = layer_change::updated;
            release_params(layer, hold::backward);
            throw std::runtime_error(
                "layer_optimizer: step " + std::to_string(step_) +
                ": an inf or NaN gradient in layer " + std::to_string(layer) +
                ": with fp32 or bf16 gradients each layer is updated as soon as backward "
                "finishes it, so the step cannot be skipped (the layers above are already "
                "updated); fp16 gradients with loss scaling skip such a step");
        }
        state_->release(sl, layer_change::updated);
        held_change_ = layer_change::updated;
        release_params(layer, hold::backward);
    }

    /// After backward: fp32, bf16: step_result::applied (the layers were updated). fp16: the
    /// verdict over the layers' gradients and `extra_sum_squares` (the trainer's resident
    /// gradients' sum of squares, divided by the loss scale; 0 for none), agreed by
    /// agree_overflow: skipped_overflow changes nothing (the spill is dropped); applied makes
    /// every layer whose gradients were given this step pending.
    step_result end_step(double extra_sum_squares = 0) {
        if (held_ != none)
            throw std::logic_error("layer_optimizer: end_step() while layer " +
                                   std::to_string(held_) + " is acquired");
        if (o_.grads != grad_dtype::fp16) {
            last_step_ = step_;
            return step_result::applied;
        }
        // A layer still waiting for an earlier step's update (no forward or backward visited
        // it since) gets it now, with that step's figures, before they are replaced or the
        // spill is dropped.
        for (std::size_t l = 0; l < floats_.size(); ++l)
            if (pending_layer_[l] && !put_layer_[l]) settle_layer(l);
        const double sum = sum_squares_ + extra_sum_squares;
        sum_squares_ = 0;
        bool overflow = !std::isfinite(sum);
        if (o_.agree_overflow) overflow = o_.agree_overflow(overflow);
        if (overflow) {
            spill_->discard();
            std::fill(put_layer_.begin(), put_layer_.end(), false);
            return step_result::skipped_overflow;
        }
        pending_ = {step_, scale_, hparams_};
        for (std::size_t l = 0; l < floats_.size(); ++l)
            if (put_layer_[l]) pending_layer_[l] = true;
        std::fill(put_layer_.begin(), put_layer_.end(), false);
        last_step_ = step_;
        return step_result::applied;
    }

    /// Applies every pending update now (fp16; nothing otherwise): before the params are read
    /// for a save or the final model. Idempotent.
    void settle() {
        for (std::size_t l = 0; l < floats_.size(); ++l)
            if (pending_layer_[l]) settle_layer(l);
    }
    /// Whether a layer's update waits (fp16).
    [[nodiscard]] bool pending() const noexcept {
        return std::find(pending_layer_.begin(), pending_layer_.end(), true) !=
               pending_layer_.end();
    }
    /// The step number of the last applied (or pending) update; 0 before any, or load()'s.
    [[nodiscard]] std::int64_t last_step() const noexcept { return last_step_; }

    // ---- Reading, saving, loading --------------------------------------------------------
    /// Calls fn(params, m, v) with layer `layer`'s newest contents (a pending update is
    /// applied first), read-only, one layer held at a time.
    template <class Fn>
    void read_layer(std::size_t layer, Fn&& fn) {
        check_layer(layer, "read_layer");
        if (held_ != none)
            throw std::logic_error("layer_optimizer: read_layer(" + std::to_string(layer) +
                                   ") while layer " + std::to_string(held_) + " is acquired");
        if (pending_layer_[layer]) settle_layer(layer);
        const std::size_t n = floats_[layer], sl = state_layer(layer);
        const auto p = params_->acquire(layer).template as<float>();
        std::span<const float> mv;
        try {
            mv = state_->acquire(sl).template as<float>();
        } catch (...) {
            params_->release(layer);
            throw;
        }
        try {
            fn(p, mv.first(n), mv.subspan(n));
        } catch (...) {
            state_->release(sl);
            params_->release(layer);
            throw;
        }
        state_->release(sl);
        params_->release(layer);
    }

    /// Writes every layer's params and moments and last_step() to `file`, created anew
    /// (O_EXCL, mode 0600) and fsynced, each piece under a CRC-32C (layout below). Pending
    /// updates are applied first.
    /// Layout (little-endian): "SPWLOPT1", u64 layers L, i64 last_step, u64 floats of each
    /// layer (L of them), u32 CRC-32C of all that; then per layer its params, m and v (floats)
    /// and a u32 CRC-32C of them.
    /// @throws std::system_error naming the file (it exists, cannot be written)
    void save(const std::filesystem::path& file) {
        settle();
        detail::offset_writer out(file);
        const auto head = header();
        out.write(0, head.data(), head.size());
        std::size_t at = head.size();
        for (std::size_t l = 0; l < floats_.size(); ++l) {
            read_layer(l, [&](std::span<const float> p, std::span<const float> m,
                              std::span<const float> v) {
                std::uint32_t crc = 0;
                for (auto s : {p, m, v}) {
                    out.write(at, s.data(), s.size_bytes());
                    crc = crc32c(std::as_bytes(s), crc);
                    at += s.size_bytes();
                }
                out.write(at, &crc, sizeof crc);
                at += sizeof crc;
            });
        }
        out.finish();
    }
    /// Fills every layer from a file save() wrote for layers of these sizes, and sets
    /// last_step(). Drops a pending update. A layer whose CRC fails keeps its earlier
    /// contents (the layers before it are loaded).
    /// @throws std::system_error naming the file (missing, not a regular file, of another size);
    ///         std::runtime_error naming the file (another header, a layer's CRC)
    void load(const std::filesystem::path& file) {
        const auto want = header();
        std::size_t size = want.size();
        for (auto n : floats_) size += 3 * n * sizeof(float) + sizeof(std::uint32_t);
        detail::offset_reader in(file, "layer_optimizer::load");
        if (in.size() != size)
            throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                                    file.string() + ": " + std::to_string(in.size()) +
                                        " bytes, a save of these layers has " +
                                        std::to_string(size));
        std::vector<std::byte> got(want.size());
        in.read(0, got.data(), got.size());
        // The step may differ; everything else must match (the CRC covers the step).
        std::int64_t step = 0;
        std::memcpy(&step, got.data() + 16, sizeof step);
        auto expect = header(step);
        if (got != expect)
            throw std::runtime_error(file.string() +
                                     ": not a layer_optimizer save of these layers (its header "
                                     "or the header's CRC differs)");
        if (spill_) spill_->discard();
        std::fill(pending_layer_.begin(), pending_layer_.end(), false);
        std::fill(put_layer_.begin(), put_layer_.end(), false);
        std::size_t at = want.size();
        for (std::size_t l = 0; l < floats_.size(); ++l) {
            fill(l, [&](std::span<float> p, std::span<float> m, std::span<float> v) {
                std::uint32_t crc = 0, stored = 0;
                for (auto s : {p, m, v}) {
                    in.read(at, s.data(), s.size_bytes());
                    crc = crc32c(std::as_bytes(s), crc);
                    at += s.size_bytes();
                }
                in.read(at, &stored, sizeof stored);
                if (crc != stored)
                    throw std::runtime_error(file.string() + ": layer " + std::to_string(l) +
                                             "'s CRC-32C does not match its bytes");
            });
            at += sizeof(std::uint32_t);
        }
        flush();
        last_step_ = step;
    }

    // ---- Figures -------------------------------------------------------------------------
    /// Both streams' counters and the spill's (cumulative; subtract two for a step).
    [[nodiscard]] layer_optimizer_stats stats() const {
        layer_optimizer_stats s;
        s.params = params_->stats();
        s.state = state_->stats();
        if (spill_) {
            s.spill_read = spill_->bytes_read();
            s.spill_written = spill_->bytes_written();
            s.spill_resident = spill_->resident_bytes();
        }
        return s;
    }
    /// Bytes in memory now: the windows' buffers, the spill's, the gradient and narrowing
    /// buffers.
    [[nodiscard]] std::size_t resident_bytes() const noexcept {
        return params_->resident_bytes() + state_->resident_bytes() +
               (spill_ ? spill_->resident_bytes() : 0) + grads_.size() * sizeof(float) +
               narrow_.size() * sizeof(bfloat16);
    }
    /// The params stream (its stats, peaks and budget).
    [[nodiscard]] const param_stream<Tier>& params_stream() const noexcept { return *params_; }
    /// The m|v stream.
    [[nodiscard]] const param_stream<Tier>& state_stream() const noexcept { return *state_; }
    /// Starts both streams' peaks over.
    void reset_peaks() noexcept {
        params_->reset_peak();
        state_->reset_peak();
    }

private:
    using stream_type = param_stream<Tier>;
    enum class hold { forward, backward };
    static constexpr std::size_t none = static_cast<std::size_t>(-1);
    static constexpr std::size_t narrow_piece = std::size_t{1} << 20;
    static constexpr char magic[8] = {'S', 'P', 'W', 'L', 'O', 'P', 'T', '1'};

    void check_layer(std::size_t layer, const char* what) const {
        if (layer >= floats_.size())
            throw std::invalid_argument("layer_optimizer::" + std::string(what) + ": layer " +
                                        std::to_string(layer) + " of " +
                                        std::to_string(floats_.size()));
    }
    void check_size(std::size_t layer, std::size_t n, const char* what) const {
        check_layer(layer, what);
        if (n != floats_[layer])
            throw std::invalid_argument("layer_optimizer::" + std::string(what) + ": layer " +
                                        std::to_string(layer) + " has " +
                                        std::to_string(floats_[layer]) + " floats, " +
                                        std::to_string(n) + " given");
    }
    std::size_t state_layer(std::size_t layer) const noexcept {
        return o_.grads == grad_dtype::fp16 ? floats_.size() - 1 - layer : layer;
    }

    std::span<const float> acquire_params(std::size_t layer, hold mode) {
        check_layer(layer, mode == hold::forward ? "forward_layer" : "backward_layer");
        if (held_ != none)
            throw std::logic_error("layer_optimizer: layer " + std::to_string(layer) +
                                   " acquired while layer " + std::to_string(held_) +
                                   " is (one layer at a time)");
        const bool update =
            pending_layer_[layer] || (mode == hold::backward && o_.grads != grad_dtype::fp16);
        if (update) {
            held_view_ = params_->acquire_for_update(layer);
            held_change_ = layer_change::unchanged;
            if (pending_layer_[layer]) {
                try {
                    apply_pending(layer, held_view_.template as<float>());
                } catch (...) {
                    params_->release(layer);
                    held_view_ = {};
                    throw;
                }
                held_change_ = layer_change::updated;
            }
        } else {
            held_view_ = layer_update_view{};
            read_view_ = params_->acquire(layer);
        }
        held_ = layer;
        mode_ = mode;
        held_for_update_ = update;
        return update ? std::span<const float>(held_view_.template as<float>())
                      : read_view_.template as<float>();
    }
    void release_params(std::size_t layer, hold mode) {
        if (held_ != layer || mode_ != mode)
            throw std::logic_error("layer_optimizer: release of layer " + std::to_string(layer) +
                                   ", which is not acquired for " +
                                   (mode == hold::forward ? "forward" : "backward"));
        held_ = none;
        held_view_ = {};
        if (held_for_update_)
            params_->release(layer, held_change_);
        else
            params_->release(layer);
        held_change_ = layer_change::unchanged;
    }

    /// fp16: applies the pending update of `layer` (not held) now.
    void settle_layer(std::size_t layer) {
        auto v = params_->acquire_for_update(layer);
        try {
            apply_pending(layer, v.template as<float>());
        } catch (...) {
            params_->release(layer);
            throw;
        }
        params_->release(layer, layer_change::updated);
    }

    /// fp16: the pending update of `layer`, whose params (acquired for update) are `params`.
    void apply_pending(std::size_t layer, std::span<float> params) {
        const std::size_t n = floats_[layer], sl = state_layer(layer);
        auto mv = state_->acquire_for_update(sl).template as<float>();
        try {
            const auto g = spill_->take(layer);
            adamw_step_args a;
            a.step = pending_.t;
            a.grad_scale = pending_.scale;
            a.check = grad_check::caller_verified;  // (end_step's verdict)
            adamw_step<float16>(
                with_step(o_.adam, pending_.h), a, params, mv.first(n), mv.subspan(n),
                std::span<const float16>(reinterpret_cast<const float16*>(g.data()), n), {},
                o_.pool);
        } catch (...) {
            state_->release(sl);
            throw;
        }
        spill_->done(layer);
        pending_layer_[layer] = false;
        state_->release(sl, layer_change::updated);
    }

    std::vector<std::byte> header(std::int64_t step) const {
        const std::uint64_t L = floats_.size();
        std::vector<std::byte> h(sizeof magic + 16 + 8 * L + 4);
        std::byte* p = h.data();
        auto put = [&](const void* src, std::size_t n) {
            std::memcpy(p, src, n);
            p += n;
        };
        put(magic, sizeof magic);
        put(&L, 8);
        put(&step, 8);
        for (std::uint64_t n : floats_) put(&n, 8);
        const std::uint32_t crc = crc32c(std::span<const std::byte>(h.data(), h.size() - 4));
        put(&crc, 4);
        return h;
    }
    std::vector<std::byte> header() const { return header(last_step_); }

    std::vector<std::size_t> floats_;
    layer_optimizer_options o_;
    std::unique_ptr<stream_type> params_, state_;
    std::unique_ptr<detail::grad_spill<Tier>> spill_;  // fp16 only
    std::vector<float> grads_;      // one layer's gradients (the largest layer's size)
    std::vector<bfloat16> narrow_;  // bf16: a piece of gradients narrowed
    // The layer the trainer holds: its view (for update) or read-only view, and how.
    std::size_t held_ = none;
    hold mode_ = hold::forward;
    bool held_for_update_ = false;
    layer_change held_change_ = layer_change::unchanged;
    layer_update_view held_view_;
    layer_view read_view_;
    std::int64_t step_ = 1, last_step_ = 0;
    float scale_ = 1.0f;
    step_hparams hparams_;
    double sum_squares_ = 0;  // fp16: this step's check so far
    struct {
        std::int64_t t = 0;
        float scale = 1.0f;
        step_hparams h;
    } pending_;                        // fp16: the update the pending layers wait for
    std::vector<bool> pending_layer_;  // fp16: the layer's update of pending_ waits
    std::vector<bool> put_layer_;      // fp16: the layer's gradients of this step are spilled
};

}  // namespace spillway
