// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/step.hpp: one training step, and where its AdamW update runs.
//
// A step, in order:
//  1. take this rank's rows of batch k; start reading the optimizer state the update needs
//     first (it does not depend on this step's gradients);
//  2. forward, each layer waiting for its parameters when the previous step's update still
//     runs under it ("under the next forward");
//  3. backward with the loss scale; the update may run under it, each subgroup waiting until
//     backward announces its gradients final ("under backward");
//  4. sum the gradients over the ranks; narrow them to --grad-dtype; check them for inf/NaN
//     (all ranks agree on the verdict);
//  5. the AdamW update of this rank's shard: finished (under backward), started to run under
//     the next forward, or run now; then gather every rank's shard;
//  6. dynamic loss scaling (fp16): halve on overflow, double after 500 good steps.
// An update under the next forward runs when the offloaded optimizer walks upwards, in one
// process (with ranks, the gather needs every shard's update first), when a next step
// follows and no save comes between. An update under backward runs when it walks downwards,
// in one process, with fp32 gradients and no loss scale. Where the update runs never changes
// the results: the same AdamW on the same gradients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "checkpoint_dir.hpp"
#include "gpt2.hpp"
#include "optimizer.hpp"
#include "streamed_params.hpp"
#include "spillway/optim/step_hparams.hpp"
#include "spillway/schedule/lr_schedule.hpp"
#include "spillway/schedule/shard_range.hpp"
#include "spillway/trace/recorder.hpp"
#include "trainer.hpp"

namespace mini_gpt {

/// What one step measured and decided.
struct step_result {
    std::int64_t step = 0;
    float loss = 0;               // the global batch's mean loss
    float loss_scale = 1;         // the loss scale after this step
    bool finite = true;           // false: an inf or NaN gradient, the update was skipped
    bool deferred = false;        // the update runs under the next forward
    bool under_backward = false;  // the update ran under this step's backward
    double step_ms = 0, update_ms = 0, io_wait_ms = 0, comm_ms = 0, cpu_ms = 0;
    pass_times times;          // forward and backward (model.times())
    std::size_t act_peak = 0;  // activations resident at the step's peak
    // --offload params: bytes the streams moved in this step, the process's VmHWM after it.
    bool streamed = false;
    stream_traffic traffic;
    activation_store::io_bytes act_traffic;  // the activation stash's reads and writes
    std::size_t peak_rss = 0;
};

/// Runs the steps of one training run (see the file comment). Keeps references to
/// everything it is given; not copyable.
class step_runner {
public:
    struct parts {
        const options& opt;
        const std::vector<std::uint16_t>& tokens;
        gpt2& model;
        optimizer& optim;
        activation_store& store;
        spillway::index_range rows;       // this rank's rows of every global batch
        std::vector<std::size_t> shards;  // where each rank's parameter shard starts (and the end)
        spillway::trace::recorder* recorder = nullptr;
        // --offload params: the model's params, gradients and their update (then `optim`
        // and `shards` are not used).
        streamed_params* streamed = nullptr;
    };
    explicit step_runner(parts p);
    ~step_runner();
    step_runner(const step_runner&) = delete;
    step_runner& operator=(const step_runner&) = delete;

    /// Runs step `step` (0-based) and updates `state` (AdamW steps, loss scale, next step).
    step_result train_step(std::int64_t step, train_state& state);

    /// Updates that ran under the next forward, and under their own backward, so far.
    [[nodiscard]] int steps_deferred() const noexcept { return steps_deferred_; }
    [[nodiscard]] int steps_under_backward() const noexcept { return steps_under_backward_; }

private:
    class deferred_update;
    /// train_step for --offload params (streamed_params): each layer updated in backward
    /// (fp32, bf16), or, with fp16 and its loss scale, checked in backward and updated in the
    /// next forward once every rank's verdict is in (an overflow skips the step as here).
    step_result train_step_streamed(std::int64_t step, train_state& state);
    /// Step `step`'s (0-based) lr and weight decay: the schedule's lr, --wd.
    [[nodiscard]] spillway::step_hparams hparams_at(std::int64_t step) const noexcept;
    parts p_;
    spillway::lr_schedule schedule_;  // --lr-schedule's (cli.hpp: lr_schedule_of)
    spillway::index_range shard_;     // this rank's parameters
    std::unique_ptr<deferred_update> deferred_;
    std::vector<spillway::bfloat16> grads_bf16_;
    std::vector<spillway::float16> grads_fp16_;
    std::vector<int> inputs_, targets_;
    spillway::trace::track_id track_ = 0;
    int steps_deferred_ = 0, steps_under_backward_ = 0;
};

/// This process's CPU time (all threads), in milliseconds.
double process_cpu_ms();

}  // namespace mini_gpt
