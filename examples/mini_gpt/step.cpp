// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/step.cpp: one training step, and where its AdamW update runs (step.hpp).
#include "step.hpp"

#include "cli.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include <time.h>

#include "dist.hpp"
#include "memory_plan.hpp"

namespace mini_gpt {

namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

/// How far backward has got, for an update that runs under it (the optimizer's
/// step_under_backward on the deferred_update thread): backward announces that the gradients
/// from a param index upward are final (gpt2::grads_final_fn); the update's gate waits for
/// its subgroup's range. If backward fails, abandon() makes the gate throw, so the update
/// stops instead of waiting for ever.
class backward_progress {
public:
    void advance(std::size_t from) {
        std::lock_guard lock(mutex_);
        final_from_ = std::min(final_from_, from);
        cv_.notify_all();
    }
    void abandon() {
        std::lock_guard lock(mutex_);
        abandoned_ = true;
        cv_.notify_all();
    }
    spillway::gradient_gate gate() {
        return [this](std::size_t begin, std::size_t, std::chrono::microseconds wait) {
            std::unique_lock lock(mutex_);
            const bool ready =
                cv_.wait_for(lock, wait, [&] { return final_from_ <= begin || abandoned_; });
            if (abandoned_)
                throw std::runtime_error("backward failed before the update under it could finish");
            return ready;
        };
    }

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::size_t final_from_ = std::numeric_limits<std::size_t>::max();
    bool abandoned_ = false;
};

}  // namespace

double process_cpu_ms() {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

/// An optimizer step that runs on a thread of its own while the next forward (or this
/// step's backward) computes. Protocol:
///  1. start(fn): fn (the optimizer's step) runs on a new thread; the optimizer reports,
///     through progress(done), that params [0, done) hold their new values.
///  2. The next forward asks wait_for(end) before each layer: it returns once params
///     [0, end) are final, or once the step ended (an error is rethrown by finish()).
///  3. finish() joins the thread and rethrows what the step threw; it is called after that
///     forward (the final LayerNorm already waited for the last subgroup), before backward
///     overwrites the gradients the step reads, and before anything else touches the
///     optimizer. The destructor joins a step still running (an exception unwinding).
class step_runner::deferred_update {
public:
    deferred_update() = default;
    deferred_update(const deferred_update&) = delete;
    deferred_update& operator=(const deferred_update&) = delete;
    ~deferred_update() {
        if (thread_.joinable()) thread_.join();
    }

    [[nodiscard]] bool running() const noexcept { return thread_.joinable(); }

    void start(std::function<void()> step) {
        done_ = 0;
        ended_ = false;
        error_ = nullptr;
        began_ = clock_type::now();
        thread_ = std::thread([this, step = std::move(step)] {
            std::exception_ptr error;
            try {
                step();
            } catch (...) {
                error = std::current_exception();
            }
            std::lock_guard lock(mutex_);
            ended_at_ = clock_type::now();
            error_ = error;
            ended_ = true;
            cv_.notify_all();
        });
    }

    /// The optimizer's progress callback (runs on the step's thread).
    void progress(std::size_t done) {
        std::lock_guard lock(mutex_);
        done_ = std::max(done_, done);
        cv_.notify_all();
    }

    void wait_for(std::size_t end) {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return done_ >= end || ended_; });
    }

    /// Joins; rethrows the step's error. Returns the step's start and end.
    std::pair<clock_type::time_point, clock_type::time_point> finish() {
        thread_.join();
        if (error_) std::rethrow_exception(error_);
        return {began_, ended_at_};
    }

    /// Joins, dropping the step's error (the trainer is already failing for another reason).
    void join_quietly() noexcept {
        if (thread_.joinable()) thread_.join();
    }

private:
    std::thread thread_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::size_t done_ = 0;
    bool ended_ = false;
    std::exception_ptr error_;
    clock_type::time_point began_, ended_at_;
};

step_runner::step_runner(parts p)
    : p_(std::move(p)),
      schedule_(lr_schedule_of(p_.opt)),
      shard_{p_.shards[static_cast<std::size_t>(dist::rank())],
             p_.shards[static_cast<std::size_t>(dist::rank()) + 1]},
      deferred_(std::make_unique<deferred_update>()) {
    const std::size_t n = p_.model.params().size();
    if (p_.opt.grads == grad_dtype::bf16) grads_bf16_.resize(n);
    if (p_.opt.grads == grad_dtype::fp16) grads_fp16_.resize(n);
    if (p_.recorder) track_ = p_.recorder->track("trainer");
    p_.optim.on_progress([d = deferred_.get()](std::size_t done) { d->progress(done); });
}

step_runner::~step_runner() = default;

spillway::step_hparams step_runner::hparams_at(std::int64_t step) const noexcept {
    return {spillway::learning_rate(schedule_, step), p_.opt.weight_decay};
}

namespace {

/// Dynamic loss scaling (fp16): halve on an overflow (never below 1), double after 500 good
/// steps in a row.
void update_loss_scale(train_state& state, bool finite) {
    if (!finite) {
        state.loss_scale = std::max(1.0f, state.loss_scale / 2);
        state.good_steps = 0;
    } else if (++state.good_steps >= 500) {
        state.loss_scale *= 2;
        state.good_steps = 0;
    }
}

}  // namespace

step_result step_runner::train_step_streamed(std::int64_t step, train_state& state) {
    // The same stages as train_step, with the update where the verdict allows it
    // (streamed_params.hpp):
    //  1. the batch; 2. forward, each layer's params from the stream (fp16: with the last
    //  step's pending update applied first); 3. backward, each layer's gradients summed over
    //  the ranks as soon as they are final, then (fp32, bf16) the layer updated, or (fp16)
    //  narrowed into the spill and checked; 4. end_step: the ends updated in memory, and
    //  (fp16) the verdict: on overflow the step is skipped, else the layers' update is
    //  pending; the loss summed over the ranks; 5. dynamic loss scaling as train_step's.
    const options& opt = p_.opt;
    streamed_params& sp = *p_.streamed;
    gpt2& model = p_.model;
    const int B = opt.batch, T = opt.seq;
    const int rows = static_cast<int>(p_.rows.size());
    step_result r;
    r.step = step;
    r.streamed = true;
    auto t0 = clock_type::now();
    const double cpu0 = process_cpu_ms();
    const stream_traffic before = sp.traffic();
    const activation_store::io_bytes act_before = p_.store.traffic();
    fill_batch(p_.tokens, step, B, T, static_cast<int>(p_.rows.begin), rows, inputs_, targets_);
    p_.store.reset_peak();
    auto tf = clock_type::now();
    const float local_loss = model.forward(inputs_.data(), targets_.data(), rows, T, p_.store);
    sp.begin_step(state.adam_steps + 1, state.loss_scale, hparams_at(step));
    auto tb = clock_type::now();
    model.backward(state.loss_scale * static_cast<float>(rows) / static_cast<float>(B), p_.store);
    auto tu = clock_type::now();
    r.finite = sp.end_step();
    if (r.finite) ++state.adam_steps;
    r.loss = static_cast<float>(dist::allreduce_sum(static_cast<double>(local_loss) * rows) / B);
    if (opt.grads == grad_dtype::fp16) update_loss_scale(state, r.finite);  // train_step's 6.
    const bool deferred = opt.grads == grad_dtype::fp16;
    if (p_.recorder) {
        p_.recorder->complete(track_, "forward " + std::to_string(step + 1), tf, tb);
        p_.recorder->complete(
            track_,
            (deferred ? "backward " : "backward and layer updates ") + std::to_string(step + 1), tb,
            tu);
        p_.recorder->complete(
            track_,
            (deferred ? "verdict and update of the ends " : "update of the ends ") +
                std::to_string(step + 1),
            tu, clock_type::now());
    }
    // fp16: the layers' update runs in the next forward (or before a save); else in backward.
    r.deferred = deferred && r.finite;
    r.under_backward = !deferred;
    if (r.deferred) ++steps_deferred_;
    r.update_ms = ms_since(tu);
    r.io_wait_ms = model.times().act_wait_ms;
    r.step_ms = ms_since(t0);
    state.next_step = step + 1;
    r.loss_scale = state.loss_scale;
    r.times = model.times();
    r.act_peak = p_.store.peak_bytes() + model.fixed_activation_bytes();
    r.cpu_ms = process_cpu_ms() - cpu0;
    r.traffic = sp.traffic() - before;
    const activation_store::io_bytes act_after = p_.store.traffic();
    r.act_traffic = {act_after.read - act_before.read, act_after.written - act_before.written};
    r.peak_rss = peak_rss_bytes();
    return r;
}

step_result step_runner::train_step(std::int64_t step, train_state& state) {
    if (p_.streamed) return train_step_streamed(step, state);
    const options& opt = p_.opt;
    gpt2& model = p_.model;
    optimizer& optim = p_.optim;
    deferred_update& deferred = *deferred_;
    spillway::trace::recorder* recorder = p_.recorder;
    const int nranks = dist::size(), B = opt.batch, T = opt.seq;
    const int rows = static_cast<int>(p_.rows.size());
    const std::size_t lo = shard_.begin, hi = shard_.end;
    step_result r;
    r.step = step;

    // 1. The batch; the optimizer state the update reads first.
    auto t0 = clock_type::now();
    const double cpu0 = process_cpu_ms();
    fill_batch(p_.tokens, step, B, T, static_cast<int>(p_.rows.begin), rows, inputs_, targets_);
    p_.store.reset_peak();
    // (With an update still running, the pipeline is that update's: prefetch after it.)
    if (!deferred.running()) optim.prefetch();

    // 2. Forward, under the previous step's update when one still runs.
    auto tf = clock_type::now();
    gpt2::param_gate gate;
    if (deferred.running())
        gate = [&](int layer) { deferred.wait_for(model.layout().layer_range(layer).second); };
    const float local_loss =
        model.forward(inputs_.data(), targets_.data(), rows, T, p_.store, gate);
    if (deferred.running()) {
        auto [u0, u1] = deferred.finish();
        if (recorder)
            recorder->complete(
                track_, "optimizer step (under forward " + std::to_string(step + 1) + ")", u0, u1);
        optim.prefetch();  // the next update's first reads now run under backward
    }

    // 3. Backward, with the update under it when the optimizer walks downwards: the walk
    //    starts at the last layers, whose gradients backward finishes first.
    r.under_backward = opt.update_under_backward && nranks == 1 && opt.grads == grad_dtype::fp32 &&
                       state.loss_scale == 1.0f &&  // (its gradients are taken as unscaled)
                       optim.next_step_under_backward();
    backward_progress progress;
    if (r.under_backward) {
        deferred.start([o = &optim, t = state.adam_steps + 1, h = hparams_at(step),
                        grads = std::span<const float>(model.grads()), params = model.params(),
                        g = progress.gate()] { o->step_under_backward(t, h, grads, params, g); });
        ++steps_under_backward_;
    }
    auto tb = clock_type::now();
    // Each rank's loss is the mean over its rows: weighted by rows/B, the gradients summed
    // over the ranks are those of the global mean.
    try {
        gpt2::grads_final_fn announce;
        if (r.under_backward) announce = [&progress](std::size_t from) { progress.advance(from); };
        model.backward(state.loss_scale * static_cast<float>(rows) / static_cast<float>(B),
                       p_.store, announce);
    } catch (...) {
        progress.abandon();
        deferred.join_quietly();
        throw;
    }

    // 4. The gradient exchange, narrowing and the overflow check.
    auto ta = clock_type::now();
    dist::allreduce_sum(model.grads());
    r.loss = static_cast<float>(dist::allreduce_sum(static_cast<double>(local_loss) * rows) / B);
    r.comm_ms = ms_since(ta);
    if (recorder) {
        recorder->complete(track_, "forward " + std::to_string(step + 1), tf, tb);
        recorder->complete(track_, "backward " + std::to_string(step + 1), tb, ta);
        if (nranks > 1)
            recorder->complete(track_, "gradient exchange " + std::to_string(step + 1), ta,
                               clock_type::now());
    }
    // The gradients narrowed to the chosen dtype (kept in host memory; widened lazily inside
    // the AdamW step).
    auto tu = clock_type::now();
    grad_span grads;
    if (opt.grads == grad_dtype::fp32)
        grads = std::span<const float>(model.grads());
    else if (opt.grads == grad_dtype::bf16) {
        spillway::narrow(std::span<const float>(model.grads()),
                         std::span<spillway::bfloat16>(grads_bf16_));
        grads = std::span<const spillway::bfloat16>(grads_bf16_);
    } else {
        spillway::narrow(std::span<const float>(model.grads()),
                         std::span<spillway::float16>(grads_fp16_));
        grads = std::span<const spillway::float16>(grads_fp16_);
    }
    // After the exchange every rank holds the same gradients: each checks its own shard
    // (the optimizer's check, which its step then reuses) and the ranks combine the verdicts.
    // (A step under backward checks each subgroup's gradients itself, as it takes them.)
    grad_span mine = std::visit([&](auto g) -> grad_span { return g.subspan(lo, hi - lo); }, grads);
    const double sum_squares = r.under_backward ? 0.0 : optim.check(state.loss_scale, mine);
    auto tv = clock_type::now();
    r.finite = !dist::any(!std::isfinite(sum_squares));
    auto tc = clock_type::now();
    if (recorder && !r.under_backward) {
        recorder->complete(track_, "gradient check", tu, tv);
        if (nranks > 1) recorder->complete(track_, "overflow verdict", tv, tc);
    }

    // 5. The update. I/O wait: activations in backward, and forward's waits for parameters
    //    still being updated (a deferred step: its own waits ran under the forward).
    r.io_wait_ms = model.times().act_wait_ms + model.times().param_wait_ms;
    if (r.finite) {
        ++state.adam_steps;
        const bool save_due = !opt.save_dir.empty() && (step + 1) % opt.save_every == 0;
        r.deferred = !r.under_backward && opt.update_under_forward && nranks == 1 &&
                     step + 1 < opt.steps && !save_due && optim.next_step_ascending();
        if (r.under_backward) {
            try {
                auto [u0, u1] = deferred.finish();
                if (recorder)
                    recorder->complete(
                        track_, "optimizer step (under backward " + std::to_string(step + 1) + ")",
                        u0, u1);
            } catch (const spillway::gradient_overflow_error& e) {
                throw std::runtime_error(
                    "step " + std::to_string(step + 1) + ": " + e.what() +
                    " (the update ran under backward; with --update-under-backward off an "
                    "overflow skips the step)");
            }
        } else if (r.deferred) {
            deferred.start([o = &optim, t = state.adam_steps, h = hparams_at(step),
                            scale = state.loss_scale, mine,
                            params = model.params().subspan(lo, hi - lo)] {
                o->step(t, h, scale, mine, params);
            });
            ++steps_deferred_;
        } else {
            optim.step(state.adam_steps, hparams_at(step), state.loss_scale, mine,
                       model.params().subspan(lo, hi - lo));
            r.io_wait_ms += optim.last_io_wait_ms();
        }
        auto tg = clock_type::now();
        if (recorder && !r.deferred) recorder->complete(track_, "optimizer step", tc, tg);
        dist::allgather(model.params(), p_.shards);
        r.comm_ms += ms_since(tg);
        if (recorder && nranks > 1)
            recorder->complete(track_, "parameter gather", tg, clock_type::now());
    }

    // 6. Dynamic loss scaling (fp16 only): halve on overflow, double after 500 good steps.
    if (opt.grads == grad_dtype::fp16) update_loss_scale(state, r.finite);
    r.update_ms = ms_since(tu);
    if (recorder)
        recorder->complete(track_, "update " + std::to_string(step + 1), tu, clock_type::now());
    r.step_ms = ms_since(t0);
    state.next_step = step + 1;
    r.loss_scale = state.loss_scale;
    r.times = model.times();
    r.act_peak = p_.store.peak_bytes() + model.fixed_activation_bytes();
    r.cpu_ms = process_cpu_ms() - cpu0;
    return r;
}

}  // namespace mini_gpt
