// SPDX-License-Identifier: Apache-2.0
// spillway/optim/update_pipeline.hpp: the offloaded optimizer's update phase.
//
// update_pipeline<Tier, Grad, ParamCopy> keeps the AdamW state of `param_count` parameters
// (fp32 master params, m and v; m and v only with pipeline_options::master_params) on a
// storage tier, one blob per subgroup of `subgroup_size` parameters, and runs AdamW over
// every subgroup with a fixed budget of host buffers. The trainer keeps its gradients (Grad)
// and its compute copy (ParamCopy: float16, bfloat16 or float) in host memory.
//
// Guarantees (docs/design.md, "The update pipeline", gives the reasons):
// - Results are bit-identical to adamw_step over the whole arrays in memory, for every
//   order, resident-set size, gradient path and tier, also when each call passes its own
//   lr and weight decay (update_args::hparams: a schedule's step_hparams; the config's
//   adam is the default).
// - A trainer resumes from a checkpoint of its own with write_state() and set_steps() (the
//   step count sets the bias corrections); restore() does both from save()'s directory.
// - An inf/NaN gradient skips the step (step_result::skipped_overflow) before any I/O;
//   nothing changes. A streamed update (update_args::gradients_final) cannot skip and
//   throws gradient_overflow_error instead. Clipping uses the norm summed in subgroup order.
//   The checks read the sums' bits, so they hold under -ffast-math.
// - A tier error is rethrown naming the subgroup, its key and the tier; no state is lost,
//   and calling update() again with the same gradients applies the step exactly once.
// - With R = host_buffers - streaming_buffers, the last R subgroups a call updates stay in
//   host memory, so every call after the first reads and writes min(R, N) subgroups fewer.
// - host_buffers buffers are allocated once; nothing of that size is allocated per call.
// - save(dir) replaces `dir` atomically with a checked save (detail/pipeline_manifest.hpp);
//   restore() refuses a truncated or corrupted one, naming the subgroup.
// - The tier is held by reference; the destructor erases the pipeline's keys. One thread
//   drives a pipeline; the tier and the thread pool may be shared.
//
// One update() call, in short (the numbered protocol in full is in docs/design.md):
//  1. Issue the first reads; check the gradients (or take the hand-over's check); make room.
//  2. Walk the subgroups in this call's order, issuing reads ahead into free buffers.
//  3. Take the subgroup's buffer: a resident one as is, otherwise wait for its read.
//  4. Run the Adam step (a streamed update first waits for and checks the gradients).
//  5. Keep the buffer resident (the last R positions) or issue its write.
//  6. A completed write commits the step for that subgroup on the tier.
//  7. Wait for every write and advance the step; on an error keep every newest state.
//
// The parts: pipeline_config.hpp (config, options, per-call arguments), update_stats.hpp
// (what a call did), detail/subgroup_buffers.hpp (the five-state buffer machine),
// detail/pipeline_io.hpp (piece scheduling), detail/chunked_adam.hpp (one subgroup's step),
// detail/baseline_handover.hpp (the DeepSpeed-like fp32 gradient path),
// detail/gradient_check.hpp (the gradient check, its hand-over and the streamed gate),
// detail/pipeline_save.hpp (the initial state, save and restore) and
// detail/pipeline_manifest.hpp (the save manifest).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/detail/baseline_handover.hpp"
#include "spillway/optim/detail/chunked_adam.hpp"
#include "spillway/optim/detail/gradient_check.hpp"
#include "spillway/optim/detail/pipeline_save.hpp"
#include "spillway/optim/detail/subgroup_buffers.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/optim/pipeline_config.hpp"
#include "spillway/optim/step_hparams.hpp"
#include "spillway/optim/update_stats.hpp"
#include "spillway/schedule/alternating_order.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/trace/recorder.hpp"

namespace spillway {

/// The offloaded optimizer's update phase: AdamW over subgroups whose state (fp32 params,
/// m, v) lives on `Tier`, moved through a bounded set of host buffers (see the file comment
/// for what it guarantees). Not thread-safe: one thread drives a pipeline.
/// @tparam Tier      any storage_tier (file, virtual, host, decorated)
/// @tparam Grad      the gradients' element type
/// @tparam ParamCopy the element type of the trainer's compute copy of the parameters
template <storage_tier Tier, class Grad, class ParamCopy = Grad>
class update_pipeline {
    static_assert(std::is_same_v<Grad, float> || is_half_v<Grad>,
                  "update_pipeline: Grad must be float, float16 or bfloat16");
    static_assert(std::is_same_v<ParamCopy, float> || is_half_v<ParamCopy>,
                  "update_pipeline: ParamCopy must be float, float16 or bfloat16");

public:
    using tier_type = Tier;                   ///< the tier the state lives on
    using grad_type = Grad;                   ///< the gradients' element type
    using copy_type = ParamCopy;              ///< the compute copy's element type
    using clock = std::chrono::steady_clock;  ///< the clock of the stats and the trace

    /// Initialises the state on `tier` from the trainer's fp32 `initial_params` (m = v = 0).
    /// Throws std::invalid_argument for a bad config, options or size; std::system_error
    /// (naming the subgroup) when the tier fails, after erasing what it wrote.
    update_pipeline(Tier& tier, pipeline_config config, std::span<const float> initial_params,
                    pipeline_options options = {})
        : tier_(tier),
          cfg_(checked(config, options)),
          opts_(std::move(options)),
          bufs_(tier, cfg_, opts_.key_prefix, state_floats(), buffer_bytes(), &stats_),
          fp32_grads_(tier, opts_.gradients, bufs_, cfg_, state_floats(), &stats_) {
        start_trace();
        expect_argument(initial_params.size() == cfg_.param_count,
                        "update_pipeline: initial_params has " +
                            std::to_string(initial_params.size()) +
                            " elements but param_count is " + std::to_string(cfg_.param_count));
        try {
            detail::initialise_state(cfg_, bufs_, initial_params, opts_.master_params);
        } catch (...) {
            quiesce_io();
            erase_all();
            throw;
        }
    }
    /// Builds a pipeline from a directory written by save(), over `tier` (any tier). The
    /// config must have the saved param_count and subgroup_size (std::invalid_argument
    /// naming the field otherwise); the buffers, Adam settings and options may differ.
    /// Throws std::runtime_error naming the subgroup for a truncated or corrupted subgroup
    /// file; std::system_error naming the path for a missing file (manifest.txt included) or
    /// one that is a FIFO, a directory or a device (refused at once, never waited on).
    /// Nothing is left on the tier then.
    static update_pipeline restore(const std::filesystem::path& dir, Tier& tier,
                                   pipeline_config config, pipeline_options options = {}) {
        return update_pipeline(restore_tag{}, dir, tier, config, std::move(options));
    }

    update_pipeline(const update_pipeline&) = delete;
    update_pipeline& operator=(const update_pipeline&) = delete;
    ~update_pipeline() {
        quiesce_io();
        erase_all();
    }

    // ---- The update phase -----------------------------------------------------------

    /// Backward's hand-over of this step's gradients; the time goes into
    /// last_stats().handover_seconds of the next update.
    ///  - gradient_path::fp32_on_tier (the DeepSpeed-like backward): checks `grads`, widens
    ///    each subgroup's gradients to fp32 and writes them to the tier ("<prefix>-<i>.grad"),
    ///    pipelined over the free host buffers. The next update(copy_out) uses them.
    ///  - gradient_path::lazy_widening: only the gradient check (sum of squares, overflow),
    ///    which update() then skips: a trainer calls it at the end of backward, e.g. while
    ///    begin_prefetch()'s reads run. Nothing is read or written. The next
    ///    update(grads, ...) uses the result when it gets the same span (data and size) and
    ///    grad_scale, and checks again otherwise; the gradients' values must not change in
    ///    between. One update consumes it (a skipped or failed update included).
    /// With fp32_on_tier, `args.hparams` are the lr and weight decay of the update(copy_out)
    /// that follows; with lazy widening the update's own update_args name them.
    /// Returns the check's sum of squares (of each gradient divided by grad_scale, in double):
    /// +inf or NaN when a gradient is inf or NaN, and the next update is then skipped. A
    /// trainer that shards the parameters over ranks combines the ranks' verdicts from it.
    double hand_over_gradients(std::span<const Grad> grads, update_args args = {}) {
        check_grads_size(grads);
        detail::check_grad_scale(args.grad_scale);
        (void)step_config(args.hparams);  // refused here, before any I/O
        handover_hparams_ = args.hparams;
        auto t0 = clock::now();
        handover_ = check_record{};  // (valid again only once the hand-over is complete)
        auto check = check_record::made(
            steps_ + 1, args.grad_scale,
            detail::subgroup_sum_squares(grads, args.grad_scale, cfg_, opts_.pool, [] {}));
        check.grads = grads.data();
        check.grad_count = grads.size();
        if (detail::finite_bits(check.sum_squares)) fp32_grads_.write(grads, check.bytes);
        check.seconds = seconds_since(t0);
        handover_ = check;
        return check.sum_squares;
    }

    /// Runs one AdamW step over every subgroup (see the protocol in the header comment).
    /// `grads` (param_count elements) are the trainer's gradients; with fp32_on_tier they are
    /// first handed over (as hand_over_gradients would in backward). `copy_out` receives the
    /// updated compute copy (param_count elements, or empty for none). Returns applied or
    /// skipped_overflow; stats in last_stats(). Throws as described in the header comment.
    step_result update(std::span<const Grad> grads, std::span<ParamCopy> copy_out,
                       update_args args = {}) {
        check_grads_size(grads);
        expect_argument(!args.gradients_final || opts_.gradients != gradient_path::fp32_on_tier,
                        "update_pipeline: a streamed update (update_args::gradients_final) needs "
                        "lazy widening: "
                        "gradient_path::fp32_on_tier hands every gradient over first");
        const adamw_config adam = step_config(args.hparams);
        if (opts_.gradients == gradient_path::fp32_on_tier) {
            hand_over_gradients(grads, args);
            return run(std::span<const Grad>{}, copy_out, adam);
        }
        check_copy_size(copy_out);  // bad arguments are refused before any I/O
        detail::check_grad_scale(args.grad_scale);
        if (args.gradients_final) {
            expect_argument(
                cfg_.max_grad_norm == 0,
                "update_pipeline: a streamed update (update_args::gradients_final) cannot clip: "
                "max_grad_norm is " +
                    std::to_string(cfg_.max_grad_norm) +
                    " and the norm needs every gradient first");
            return run_streamed(grads, copy_out, args, adam);
        }
        auto t0 = clock::now();
        auto children_before = child_snapshot(tier_);
        // The first reads go out before the gradient check: they do not depend on it, and
        // the paths would otherwise idle while the check reads every gradient. A skipped step
        // keeps them for the next.
        bufs_.own_prefetches += prefetch_reads(std::numeric_limits<std::size_t>::max());
        double check_seconds = 0;
        if (!handover_.covers(steps_ + 1, grads, args.grad_scale)) {
            const double total = detail::subgroup_sum_squares(grads, args.grad_scale, cfg_,
                                                              opts_.pool, [this] { bufs_.poll(); });
            handover_ = check_record::made(steps_ + 1, args.grad_scale, total);
            check_seconds = seconds_since(t0);
        }
        detail::consume_on_exit<Grad> consumed{handover_};  // whatever the outcome
        auto r = run(grads, copy_out, adam, t0, std::move(children_before));
        stats_.compute_seconds += check_seconds;
        return r;
    }

    /// gradient_path::fp32_on_tier: the update after hand_over_gradients() for this step,
    /// with the lr and weight decay the hand-over's update_args named (update_args::hparams).
    step_result update(std::span<ParamCopy> copy_out) {
        expect_argument(opts_.gradients == gradient_path::fp32_on_tier,
                        "update_pipeline::update(copy_out) needs gradient_path::fp32_on_tier; "
                        "pass the gradients with lazy widening");
        return run(std::span<const Grad>{}, copy_out, step_config(handover_hparams_));
    }

    /// Starts reading, into free host buffers, the first subgroups the next update() visits
    /// that are not resident, so that a trainer can overlap those reads with its backward
    /// pass; the next update() picks them up instead of reading them again (counted in
    /// update_stats::served_from_prefetch). Reads at most `max_subgroups` subgroups and
    /// never more than the free buffers (with gradient_path::fp32_on_tier one buffer stays
    /// free for the gradient hand-over, and only the state is prefetched). Calling it again
    /// extends the prefetch; results are bit-identical with or without it. A skipped
    /// (overflow) update keeps the prefetched buffers for the next one; save(),
    /// read_state() and the hand-over may take them back when they need a buffer. A read
    /// error surfaces in the update() that uses the subgroup, naming it. Returns the number
    /// of reads started.
    std::size_t begin_prefetch(
        std::size_t max_subgroups = std::numeric_limits<std::size_t>::max()) {
        const std::size_t started = prefetch_reads(max_subgroups);
        bufs_.io().issue_all();  // nobody polls until the next update(): no window
        return started;
    }

    /// Subgroups whose prefetched read waits for the next update() (see begin_prefetch).
    [[nodiscard]] std::size_t prefetched_count() const noexcept { return bufs_.prefetched_count(); }

    /// Writes every dirty resident subgroup to the tier (they stay resident, now clean).
    void flush() {
        for (std::size_t b = 0; b < bufs_.size(); ++b)
            if (bufs_[b].use == detail::buffer_use::resident && bufs_[b].dirty) bufs_.write_now(b);
    }

    // ---- Save and restore -----------------------------------------------------------

    /// Saves the whole state to `dir` (see the header comment). Throws std::logic_error if
    /// the last update() failed part-way (subgroups at different steps: run update() again
    /// first), std::system_error naming the path for file errors, std::invalid_argument if
    /// `dir` exists and is not a save (no manifest.txt) and not empty.
    void save(const std::filesystem::path& dir) {
        detail::save_state(dir, cfg_, bufs_, std::span<const float>(opts_.master_params), steps_,
                           iteration_);
    }

    // ---- Resuming from a trainer's own checkpoint ---------------------------------------

    /// Sets the number of completed Adam steps: the next update() applies step
    /// `completed` + 1 (its bias corrections 1 - beta^(completed + 1)). With write_state(), a
    /// trainer resumes from a checkpoint of its own (for example llm.c's, which stores m, v
    /// and the step): built from the checkpoint's params, given each subgroup's m and v and
    /// the step count, the pipeline continues bit-identically to the run that wrote it.
    /// (restore() sets the step from its save by itself.) The visiting order's parity stays
    /// as it is; it never changes a result.
    /// @throws std::invalid_argument when `completed` < 0; std::logic_error when the last
    ///         update() failed part-way (subgroups at different steps: run update() again)
    void set_steps(std::int64_t completed) {
        expect_argument(completed >= 0,
                        "update_pipeline::set_steps: completed steps must be >= 0, got " +
                            std::to_string(completed));
        bufs_.expect_all_at(steps_, "update_pipeline::set_steps");
        bufs_.relabel_step(completed);
        steps_ = completed;
        handover_ = check_record{};  // a hand-over names the step it was for
    }

    /// Replaces subgroup s's state with `params`, `m` and `v` (each subgroup_elements(s)
    /// long), as of the pipeline's current step (steps()). With master_params the params are
    /// the caller's: `params` may be empty to leave them, or is copied there. A resident
    /// subgroup takes the new state in its buffer (written by the next update or flush());
    /// any other is written to the tier before the call returns. A prefetch is taken back.
    /// @throws std::invalid_argument for s out of range or a span of another size;
    ///         std::system_error naming the subgroup when the tier fails (the tier then keeps
    ///         the subgroup's previous state)
    void write_state(std::size_t s, std::span<const float> params, std::span<const float> m,
                     std::span<const float> v) {
        expect_argument(s < n_, "update_pipeline::write_state: subgroup " + std::to_string(s) +
                                    " out of range (" + std::to_string(n_) + " subgroups)");
        const std::size_t c = subgroup_elements(s);
        auto check = [&](std::span<const float> in, const char* what, bool may_be_empty) {
            expect_argument(in.size() == c || (may_be_empty && in.empty()),
                            std::string("update_pipeline::write_state: ") + what + " has " +
                                std::to_string(in.size()) + " elements, subgroup " +
                                std::to_string(s) + " has " + std::to_string(c));
        };
        check(params, "params", master_in_caller());
        check(m, "m", false);
        check(v, "v", false);
        bufs_.cancel_prefetch();
        const bool resident = bufs_.resident_of(s) >= 0;
        const std::size_t b = resident ? bufs_.take_resident(s) : bufs_.scratch();
        auto& buf = bufs_[b];
        float* f = buf.mem.template as<float>().data();
        if (master_in_caller()) {
            if (!params.empty())
                std::memcpy(opts_.master_params.data() + s * cfg_.subgroup_size, params.data(),
                            c * sizeof(float));
        } else {
            std::memcpy(f, params.data(), c * sizeof(float));
            f += c;
        }
        std::memcpy(f, m.data(), c * sizeof(float));
        std::memcpy(f + c, v.data(), c * sizeof(float));
        buf.sg = static_cast<std::ptrdiff_t>(s);
        buf.version = steps_;
        buf.dirty = true;
        if (resident) {
            bufs_.keep_resident(b);
            return;
        }
        try {
            bufs_.write_now(b);
        } catch (...) {
            bufs_.release(b);
            throw;
        }
        bufs_.release(b);
    }

    // ---- Inspection -----------------------------------------------------------------

    /// Completed Adam steps (the next update applies step steps() + 1).
    [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
    /// Number of subgroups (ceil(param_count / subgroup_size)).
    [[nodiscard]] std::size_t subgroup_count() const noexcept { return n_; }
    /// Parameters in subgroup s.
    [[nodiscard]] std::size_t subgroup_elements(std::size_t s) const noexcept {
        return cfg_.subgroup_elements(s);
    }
    /// Bytes of subgroup s's state blob on the tier: 12 per parameter (params, m, v), 8 (m, v)
    /// with pipeline_options::master_params.
    [[nodiscard]] std::size_t blob_bytes(std::size_t s) const noexcept {
        return bufs_.blob_bytes(s);
    }
    /// Whether the master params live in the caller's memory (pipeline_options::master_params).
    [[nodiscard]] bool master_in_caller() const noexcept { return !opts_.master_params.empty(); }
    /// The most subgroups kept resident between calls.
    [[nodiscard]] std::size_t resident_capacity() const noexcept {
        return opts_.resident == resident_policy::keep_last_updated
                   ? std::min(cfg_.host_buffers - cfg_.streaming_buffers, n_)
                   : 0;
    }
    /// Subgroups now held in host buffers between calls.
    [[nodiscard]] std::vector<std::size_t> resident_subgroups() const {
        std::vector<std::size_t> out;
        for (std::size_t s = 0; s < n_; ++s)
            if (bufs_.resident_of(s) >= 0) out.push_back(s);
        return out;
    }
    /// Host bytes of the buffers.
    [[nodiscard]] std::size_t host_buffer_bytes() const noexcept {
        std::size_t t = 0;
        for (std::size_t b = 0; b < bufs_.size(); ++b) t += bufs_[b].mem.capacity();
        return t;
    }
    /// The order the next update() visits the subgroups in.
    [[nodiscard]] alternating_order next_order() const noexcept {
        return opts_.order == subgroup_order::alternating
                   ? alternating_order(n_, iteration_, opts_.first_direction)
                   : ascending_order(n_);
    }
    /// What the last update() (or hand_over_gradients()) call did.
    [[nodiscard]] const update_stats& last_stats() const noexcept { return stats_; }
    /// The configuration the pipeline was built with.
    [[nodiscard]] const pipeline_config& config() const noexcept { return cfg_; }
    /// The options the pipeline was built with.
    [[nodiscard]] const pipeline_options& options() const noexcept { return opts_; }
    /// The tier key of subgroup s's state (of its first piece; piece j > 0 is "<key>.<j>").
    [[nodiscard]] const std::string& key(std::size_t s) const { return bufs_.key(s); }
    /// Pieces (tier keys) of subgroup s's state.
    [[nodiscard]] std::size_t piece_count(std::size_t s) const { return bufs_.piece_count(s); }

    /// Copies subgroup s's current fp32 params, m and v (from its buffer or the tier) into
    /// the spans (each subgroup_elements(s) long; empty spans are skipped). Uses a free buffer.
    void read_state(std::size_t s, std::span<float> params, std::span<float> m,
                    std::span<float> v) {
        expect_argument(s < n_, "update_pipeline::read_state: subgroup " + std::to_string(s) +
                                    " out of range (" + std::to_string(n_) + " subgroups)");
        const std::size_t c = subgroup_elements(s);
        const float* src = nullptr;
        if (master_in_caller() && m.empty() && v.empty()) {
            // Only the params, which are the caller's: no read.
        } else if (const auto r = bufs_.resident_of(s); r >= 0) {
            src = bufs_[static_cast<std::size_t>(r)].mem.template as<float>().data();
        } else {
            std::size_t b = bufs_.scratch();
            bufs_.read_now(s, bufs_[b].mem.bytes().first(blob_bytes(s)));
            src = bufs_[b].mem.template as<float>().data();
        }
        auto put = [&](std::span<float> out, const float* from, const char* what) {
            if (out.empty()) return;
            expect_argument(out.size() == c, std::string("update_pipeline::read_state: ") + what +
                                                 " has " + std::to_string(out.size()) +
                                                 " elements, subgroup " + std::to_string(s) +
                                                 " has " + std::to_string(c));
            std::memcpy(out.data(), from, c * sizeof(float));
        };
        if (master_in_caller()) {
            put(params, opts_.master_params.data() + s * cfg_.subgroup_size, "params");
            put(m, src, "m");
            put(v, src + c, "v");
        } else {
            put(params, src, "params");
            put(m, src + c, "m");
            put(v, src + 2 * c, "v");
        }
    }
    /// All fp32 master params (param_count elements).
    void read_params(std::span<float> out) {
        expect_argument(out.size() == cfg_.param_count,
                        "update_pipeline::read_params: output has " + std::to_string(out.size()) +
                            " elements, expected " + std::to_string(cfg_.param_count));
        for (std::size_t s = 0; s < n_; ++s)
            read_state(s, out.subspan(s * cfg_.subgroup_size, subgroup_elements(s)), {}, {});
    }

private:
    struct restore_tag {};
    using check_record = detail::gradient_check<Grad>;
    update_pipeline(restore_tag, const std::filesystem::path& dir, Tier& tier,
                    pipeline_config config, pipeline_options options)
        : tier_(tier),
          cfg_(checked(config, options)),
          opts_(std::move(options)),
          bufs_(tier, cfg_, opts_.key_prefix, state_floats(), buffer_bytes(), &stats_),
          fp32_grads_(tier, opts_.gradients, bufs_, cfg_, state_floats(), &stats_) {
        start_trace();
        try {
            load(dir);
        } catch (...) {
            quiesce_io();
            erase_all();
            throw;
        }
    }

    // ---- Set-up ---------------------------------------------------------------------

    // The checks that need the element types, after validate(); returns `config`.
    static const pipeline_config& checked(const pipeline_config& config,
                                          const pipeline_options& options) {
        validate(config, options);
        if (!options.master_params.empty()) {
            expect_argument(std::is_same_v<ParamCopy, float>,
                            "update_pipeline: master_params needs an fp32 compute copy (ParamCopy "
                            "= float); with a "
                            "16-bit copy the master params must live on the tier");
            expect_argument(options.master_params.size() == config.param_count,
                            "update_pipeline: master_params has " +
                                std::to_string(options.master_params.size()) +
                                " elements but param_count is " +
                                std::to_string(config.param_count));
        }
        // (Sizes below are in bytes of the largest subgroup, at most param_count elements: a
        // subgroup_size above param_count means one subgroup, and cannot overflow them.)
        expect_argument(config.param_count <= std::numeric_limits<std::size_t>::max() / 64,
                        "update_pipeline: param_count " + std::to_string(config.param_count) +
                            " is too large (its byte sizes would overflow)");
        return config;
    }

    // Bytes of one host buffer: the largest subgroup's state, and its fp32 gradients on the
    // baseline's path.
    [[nodiscard]] std::size_t buffer_bytes() const noexcept {
        std::size_t nbytes = state_floats() * sizeof(float) * cfg_.subgroup_elements(0);
        if (opts_.gradients == gradient_path::fp32_on_tier)
            nbytes += sizeof(float) * cfg_.subgroup_elements(0);
        return nbytes;
    }

    void start_trace() {
        if (!opts_.recorder) return;
        const auto reads = opts_.recorder->track("reads");
        tr_compute_ = opts_.recorder->track("compute");
        bufs_.trace_to(opts_.recorder, reads, opts_.recorder->track("writes"));
    }

    void load(const std::filesystem::path& dir) {
        const auto manifest = detail::load_state(dir, cfg_, bufs_, opts_.master_params);
        steps_ = manifest.step;
        iteration_ = manifest.iteration;
    }

    // ---- The phase ------------------------------------------------------------------

    // `started` and `children_before`: the call's start and per-child counters, when update()
    // did I/O before calling run().
    // A streamed update (update_args::gradients_final): nothing is checked up front; run()
    // checks each subgroup's gradients once its gate opens.
    step_result run_streamed(std::span<const Grad> grads, std::span<ParamCopy> copy_out,
                             const update_args& args, const adamw_config& adam) {
        auto t0 = clock::now();
        auto children_before = child_snapshot(tier_);
        handover_ = check_record::made(steps_ + 1, args.grad_scale);
        detail::consume_on_exit<Grad> consumed{handover_};
        return run(grads, copy_out, adam, t0, std::move(children_before), &args.gradients_final);
    }

    // The Adam settings of one call: the config's, with this step's lr and weight decay.
    // Throws std::invalid_argument naming the field before any I/O.
    [[nodiscard]] adamw_config step_config(const std::optional<step_hparams>& hparams) const {
        if (!hparams) return cfg_.adam;
        const adamw_config adam = with_step(cfg_.adam, *hparams);
        validate(adam);
        return adam;
    }

    // `adam`: this call's Adam settings (step_config).
    step_result run(std::span<const Grad> grads, std::span<ParamCopy> copy_out,
                    const adamw_config& adam,
                    std::optional<clock::time_point> started = std::nullopt,
                    std::optional<std::vector<child_io>> children_before = std::nullopt,
                    const gradient_gate* gate = nullptr) {
        auto t0 = started.value_or(clock::now());
        check_copy_size(copy_out);
        expect_argument(handover_.valid && handover_.for_step == steps_ + 1,
                        "update_pipeline::update: the gradients of step " +
                            std::to_string(steps_ + 1) +
                            " were not handed over (call hand_over_gradients first)");
        const std::int64_t target = steps_ + 1;
        stats_ = update_stats{};
        stats_.handover_seconds =
            handover_.seconds;  // 0 when update() checked the gradients itself
        stats_.handover_bytes_written = handover_.bytes;
        stats_.grad_norm = std::sqrt(handover_.sum_squares);
        if (!detail::finite_bits(handover_.sum_squares)) {
            stats_.result = step_result::skipped_overflow;
            stats_.seconds = seconds_since(t0);
            return step_result::skipped_overflow;  // step 1: nothing touched
        }
        float clip = 1.0f;
        if (cfg_.max_grad_norm > 0)
            clip = clip_coefficient(handover_.sum_squares, cfg_.max_grad_norm);
        stats_.clip_coef = clip;
        adamw_step_args args;
        args.step = target;
        args.grad_scale = handover_.grad_scale;
        args.clip_coef = clip;
        args.check = grad_check::caller_verified;

        auto before = children_before ? std::move(*children_before) : child_snapshot(tier_);
        bufs_.make_room(next_order(), resident_capacity());  // step 1, second half
        const auto order = next_order();
        const std::size_t keep = resident_capacity();
        std::vector<std::ptrdiff_t> read_buf(n_, -1);
        for (std::size_t p = 0; p < n_; ++p) {  // reads begin_prefetch() started
            read_buf[p] = bufs_.take_prefetch(order[p]);
            stats_.served_from_prefetch += read_buf[p] >= 0;
        }
        // served_from_prefetch counts the trainer's begin_prefetch() calls, not update()'s own.
        stats_.served_from_prefetch -= std::exchange(bufs_.own_prefetches, 0);
        std::size_t next = 0;
        // Step 2: reads ahead of position p.
        auto read_ahead = [&](std::size_t p) {
            next = std::max(next, p);
            while (next < n_) {
                std::size_t s2 = order[next];
                const std::ptrdiff_t held =
                    bufs_.resident_of(s2) >= 0 ? bufs_.resident_of(s2) : read_buf[next];
                if (held >= 0) {  // resident, or prefetched
                    fp32_grads_.issue_read(static_cast<std::size_t>(held), s2);
                    ++next;
                    continue;
                }
                auto b = bufs_.find_free();
                if (!b) break;
                issue_read(*b, s2);
                read_buf[next] = static_cast<std::ptrdiff_t>(*b);
                ++next;
            }
        };
        std::optional<detail::streamed_gradients<Grad, Tier>> streamed;
        if (gate)
            streamed.emplace(*gate, grads, handover_.grad_scale, target, cfg_, opts_.pool, bufs_,
                             stats_);
        try {
            for (std::size_t p = 0; p < n_; ++p) {
                const std::size_t s = order[p];
                bufs_.poll();
                bufs_.rethrow_pending();
                read_ahead(p);
                // Step 3: the buffer of subgroup s.
                std::size_t b;
                if (bufs_.resident_of(s) >= 0) {
                    b = bufs_.take_resident(s);
                    ++stats_.served_from_resident;
                } else {
                    if (read_buf[p] < 0) {
                        std::size_t fb = bufs_.take_free(&stats_.write_wait_seconds);
                        issue_read(fb, s);
                        read_buf[p] = static_cast<std::ptrdiff_t>(fb);
                        if (next <= p) next = p + 1;
                    }
                    b = static_cast<std::size_t>(read_buf[p]);
                    bufs_.wait_read(b);
                }
                fp32_grads_.wait_read(b, s);
                // Step 4: compute (a streamed update first waits for and checks the gradients).
                if (streamed) streamed->await(s, p, [&] { read_ahead(p + 1); });
                compute(b, s, target, adam, args, grads, copy_out);
                if (opts_.on_subgroup_updated) opts_.on_subgroup_updated(s);
                // Step 5: hand the buffer on.
                if (p + keep >= n_)
                    bufs_.keep_resident(b);
                else if (bufs_[b].dirty)
                    bufs_.start_write(b);
                else
                    bufs_.release(b);
            }
            // Step 7.
            bufs_.wait_all_writes(&stats_.write_wait_seconds);
            bufs_.rethrow_pending();
        } catch (...) {
            recover();
            fill_children(before);
            stats_.seconds = seconds_since(t0);
            throw;
        }
        steps_ = target;
        ++iteration_;
        stats_.step = target;
        stats_.result = step_result::applied;
        if (streamed) stats_.grad_norm = std::sqrt(streamed->sum_squares());
        fill_children(before);
        stats_.seconds = seconds_since(t0);
        return step_result::applied;
    }

    void compute(std::size_t b, std::size_t s, std::int64_t target, const adamw_config& adam,
                 const adamw_step_args& args, std::span<const Grad> grads,
                 std::span<ParamCopy> copy_out) {
        auto& buf = bufs_[b];
        const std::size_t c = subgroup_elements(s);
        const std::size_t off = s * cfg_.subgroup_size;
        auto f = buf.mem.template as<float>();
        const std::size_t m_at = master_in_caller() ? 0 : c;  // where m starts in the blob
        std::span<float> p =
            master_in_caller() ? opts_.master_params.subspan(off, c) : f.subspan(0, c);
        std::span<float> m = f.subspan(m_at, c), v = f.subspan(m_at + c, c);
        std::span<ParamCopy> out =
            copy_out.empty() ? std::span<ParamCopy>{} : copy_out.subspan(off, c);
        if (static_cast<const void*>(out.data()) == static_cast<const void*>(p.data()))
            out = {};  // in place
        std::optional<trace::scoped_event> ev;
        if (opts_.recorder && opts_.recorder->enabled())
            ev.emplace(opts_.recorder, tr_compute_, "adam " + std::to_string(s), "compute");
        auto t0 = clock::now();
        // In chunks of about one piece, polling the I/O in between so that the windows stay
        // full while Adam runs.
        const std::size_t chunk =
            std::max<std::size_t>(4096, cfg_.piece_bytes / (3 * sizeof(float)));
        auto step = [&](auto g) {
            return detail::step_subgroup(buf.version, target, s, adam, args, p, m, v, g, out, chunk,
                                         opts_.pool, [this] { bufs_.poll(); });
        };
        const bool stepped = fp32_grads_.active()
                                 ? step(std::span<const float>(fp32_grads_.section(b, s)))
                                 : step(grads.subspan(off, c));
        if (stepped) buf.dirty = true;
        stats_.compute_seconds += seconds_since(t0);
    }

    // ---- Buffers and I/O (detail/subgroup_buffers.hpp) ---------------------------------

    // free -> reading for subgroup s, with its fp32 gradients on the baseline's path.
    void issue_read(std::size_t b, std::size_t s) {
        bufs_.start_read(b, s);
        fp32_grads_.issue_read(b, s);
    }

    // Reads of the first subgroups the next update() visits that are neither resident nor
    // prefetched (one buffer kept free for the fp32 hand-over); returns how many started.
    std::size_t prefetch_reads(std::size_t max_subgroups) {
        const std::size_t keep_free = opts_.gradients == gradient_path::fp32_on_tier ? 1 : 0;
        return bufs_.prefetch(next_order(), max_subgroups, keep_free);
    }

    // Step 7's error path: settle every buffer so that no newest state is dropped.
    void recover() noexcept {
        fp32_grads_.drain();
        bufs_.recover();
    }

    void check_copy_size(std::span<const ParamCopy> copy_out) const {
        expect_argument(copy_out.empty() || copy_out.size() == cfg_.param_count,
                        "update_pipeline::update: copy_out has " + std::to_string(copy_out.size()) +
                            " elements, expected param_count " + std::to_string(cfg_.param_count) +
                            " (or none)");
        expect_argument(
            !master_in_caller() || copy_out.empty() ||
                static_cast<const void*>(copy_out.data()) ==
                    static_cast<const void*>(opts_.master_params.data()),
            "update_pipeline::update: copy_out is not master_params; with master_params the update "
            "writes the params in place (pass master_params or nothing)");
    }

    // Floats per parameter in a state blob: params, m, v; or m, v with master_params.
    [[nodiscard]] std::size_t state_floats() const noexcept { return master_in_caller() ? 2 : 3; }

    void check_grads_size(std::span<const Grad> grads) const {
        expect_argument(grads.size() == cfg_.param_count,
                        "update_pipeline: grads has " + std::to_string(grads.size()) +
                            " elements, expected param_count " + std::to_string(cfg_.param_count));
    }

    // Waits for every transfer in flight: the tier's contract forbids erasing a key with an
    // operation in flight (a write finishing later would bring the key back).
    void quiesce_io() noexcept {
        bufs_.quiesce();
        fp32_grads_.drain();
    }

    void erase_all() noexcept {
        bufs_.erase_all();
        fp32_grads_.erase_all();
    }

    void fill_children(const std::vector<child_io>& before) {
        auto after = child_snapshot(tier_);
        for (std::size_t i = 0; i < after.size() && i < before.size(); ++i)
            after[i] = after[i].since(before[i]);
        stats_.children = std::move(after);
    }

    static double seconds_since(clock::time_point t0) {
        return std::chrono::duration<double>(clock::now() - t0).count();
    }

    Tier& tier_;
    pipeline_config cfg_;
    pipeline_options opts_;
    std::size_t n_ = cfg_.subgroup_count();
    update_stats stats_;
    detail::subgroup_buffers<Tier> bufs_;         // the buffers, their state and their I/O
    detail::baseline_handover<Tier> fp32_grads_;  // gradient_path::fp32_on_tier; inactive otherwise
    std::int64_t steps_ = 0;
    std::uint64_t iteration_ = 0;  // successful update calls (the order's parity)
    check_record handover_;        // this step's gradient check (detail/gradient_check.hpp)
    std::optional<step_hparams> handover_hparams_;  // fp32_on_tier: the hand-over's hparams
    trace::track_id tr_compute_ = 0;
};

}  // namespace spillway
