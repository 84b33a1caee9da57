// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/gradient_check.hpp: the gradient check of one update_pipeline step
// (not public): where it was made, whether an update may use it, and the streamed update's
// gate, which checks each subgroup once its gradients are final.
//
// A step's gradients are checked once (the sum of squares of each gradient divided by
// grad_scale; inf or NaN is an overflow), in one of three places:
//  1. hand_over_gradients() at the end of backward: the record keeps the span (data and
//     size) and the grad_scale it checked.
//  2. update() itself, when no record covers its gradients (covers() is false).
//  3. A streamed update (update_args::gradients_final): nothing up front; streamed_gradients
//     waits for each subgroup's gate and checks that subgroup before its Adam step.
//
// Guarantees:
// - covers() holds only for the same step, span and grad_scale: a check is never applied
//   to other gradients. One update consumes the record, whatever its outcome
//   (consume_on_exit).
// - Sums are per subgroup, added in subgroup order: the same total whatever the tier, the
//   order or the place of the check, and overflow is read from the sum's bits
//   (finite_bits), so it holds under -ffast-math.
// - A streamed update's overflow is a gradient_overflow_error naming the subgroup, its
//   parameters and how many subgroups already hold the step.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/detail/subgroup_buffers.hpp"
#include "spillway/optim/pipeline_config.hpp"
#include "spillway/optim/update_stats.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway::detail {

/// The record of one step's gradient check (see the file comment).
template <class Grad>
struct gradient_check {
    bool valid = false;
    std::int64_t for_step = 0;
    double sum_squares = 0;
    float grad_scale = 1;
    double seconds = 0;           ///< hand_over_gradients()'s time (0: update() checked)
    std::uint64_t bytes = 0;      ///< fp32 gradient bytes the hand-over wrote (fp32_on_tier)
    const Grad* grads = nullptr;  ///< the span checked (update() compares; null: none kept)
    std::size_t grad_count = 0;

    /// A valid record for `step`, of gradients divided by `scale`, with no span kept.
    [[nodiscard]] static gradient_check made(std::int64_t step, float scale,
                                             double squares = 0) noexcept {
        gradient_check c;
        c.valid = true;
        c.for_step = step;
        c.sum_squares = squares;
        c.grad_scale = scale;
        return c;
    }
    /// Whether an update of `step` over `g` divided by `scale` may use this check.
    [[nodiscard]] bool covers(std::int64_t step, std::span<const Grad> g,
                              float scale) const noexcept {
        return valid && for_step == step && grads == g.data() && grad_count == g.size() &&
               grad_scale == scale;
    }
};

/// Marks `check` used when it goes out of scope: one update consumes it, whatever its
/// outcome, so a trainer that refills the same gradient buffer without handing it over gets
/// a fresh check.
template <class Grad>
struct consume_on_exit {
    gradient_check<Grad>& check;
    ~consume_on_exit() { check.valid = false; }
};

/// Refuses a grad_scale the check cannot divide by (std::invalid_argument with the rule).
inline void check_grad_scale(float grad_scale) {
    expect_argument(usable_grad_scale(grad_scale), "update_pipeline: grad_scale " +
                                                       std::string(grad_scale_rule) + ", got " +
                                                       format_value(grad_scale));
}

/// The sum of squares of `grads` (param_count elements) divided by `grad_scale`, per
/// subgroup of `config` and added in subgroup order; `between()` runs after each subgroup
/// (the pipeline tops its I/O windows up there).
template <class Grad, class Between>
[[nodiscard]] double subgroup_sum_squares(std::span<const Grad> grads, float grad_scale,
                                          const pipeline_config& config, thread_pool* pool,
                                          Between&& between) {
    check_grad_scale(grad_scale);
    double total = 0;
    for (std::size_t s = 0; s < config.subgroup_count(); ++s) {
        total += grad_sum_squares<Grad>(
            grads.subspan(s * config.subgroup_size, config.subgroup_elements(s)), grad_scale, pool);
        between();
    }
    return total;
}

/// A streamed update's gate over one walk: before subgroup s's Adam step, await() asks the
/// gate until its gradients are final, keeping the I/O going in between, then checks them.
/// The caller keeps every argument alive for the walk.
template <class Grad, storage_tier Tier>
class streamed_gradients {
public:
    using clock = std::chrono::steady_clock;

    /// `step` is the step being applied, `grads` the trainer's param_count gradients.
    streamed_gradients(const gradient_gate& gate, std::span<const Grad> grads, float grad_scale,
                       std::int64_t step, const pipeline_config& config, thread_pool* pool,
                       subgroup_buffers<Tier>& bufs, update_stats& stats)
        : gate_(gate),
          grads_(grads),
          grad_scale_(grad_scale),
          step_(step),
          cfg_(config),
          pool_(pool),
          bufs_(bufs),
          stats_(stats),
          squares_(config.subgroup_count()) {}

    /// Waits for subgroup s's gradients (at position p of the walk), calling `keep_busy()`
    /// (reads ahead) between asks, and checks them.
    /// @throws gradient_overflow_error when one is inf or NaN; the tier's or the gate's error
    template <class KeepBusy>
    void await(std::size_t s, std::size_t p, KeepBusy&& keep_busy) {
        const std::size_t begin = s * cfg_.subgroup_size, count = cfg_.subgroup_elements(s);
        auto t0 = clock::now();
        // Short asks while transfers are in flight (their completions free buffers for the
        // reads ahead and keep the windows full); long ones once the paths have nothing to do.
        constexpr std::chrono::microseconds busy_wait{500}, idle_wait{20000};
        while (!gate_(begin, begin + count, bufs_.io().idle() ? idle_wait : busy_wait)) {
            bufs_.poll();
            bufs_.rethrow_pending();
            keep_busy();
        }
        stats_.gradient_wait_seconds += seconds_since(t0);
        auto t1 = clock::now();
        const double squares =
            grad_sum_squares<Grad>(grads_.subspan(begin, count), grad_scale_, pool_);
        stats_.compute_seconds += seconds_since(t1);
        if (!finite_bits(squares))
            throw gradient_overflow_error(
                "update_pipeline: a gradient of subgroup " + std::to_string(s) + " (params [" +
                    std::to_string(begin) + ", " + std::to_string(begin + count) +
                    ")) is inf or NaN in a streamed update of step " + std::to_string(step_) +
                    ": " + std::to_string(p) + " of " + std::to_string(squares_.size()) +
                    " subgroups already hold that step (a streamed update cannot skip; call "
                    "update() again with finite gradients of this step to finish it)",
                s, p);
        squares_[s] = squares;
    }

    /// The sum of squares of every subgroup awaited, in subgroup order (as the up-front
    /// check sums).
    [[nodiscard]] double sum_squares() const noexcept {
        double total = 0;
        for (double x : squares_) total += x;
        return total;
    }

private:
    static double seconds_since(clock::time_point t0) {
        return std::chrono::duration<double>(clock::now() - t0).count();
    }

    const gradient_gate& gate_;
    std::span<const Grad> grads_;
    float grad_scale_;
    std::int64_t step_;
    const pipeline_config& cfg_;
    thread_pool* pool_;
    subgroup_buffers<Tier>& bufs_;
    update_stats& stats_;
    std::vector<double> squares_;  // per subgroup
};

}  // namespace spillway::detail
