// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/detail/narrowed_step.hpp: AdamW over float gradients narrowed to a half
/// type piece by piece through a small buffer, with the bits of adamw_step<Half> over the
/// gradients narrowed whole (the update is element by element, so the pieces do not change
/// it), and the matching sum of squares.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "spillway/optim/adam.hpp"
#include "spillway/optim/half.hpp"

namespace spillway::detail {

/// The sum of squares of `grads` narrowed to Half and divided by `scale`, piece by piece
/// through `buf` (non-empty): +inf or NaN when a narrowed gradient is inf or NaN.
template <class Half>
double narrowed_sum_squares(std::span<const float> grads, float scale, std::span<Half> buf,
                            thread_pool* pool) {
    double sum = 0;
    for (std::size_t at = 0; at < grads.size(); at += buf.size()) {
        const std::size_t n = std::min(buf.size(), grads.size() - at);
        spillway::narrow(grads.subspan(at, n), buf.first(n));
        sum += spillway::grad_sum_squares(std::span<const Half>(buf.first(n)), scale, pool);
    }
    return sum;
}

/// One AdamW step over `params` with `grads` narrowed to Half (or used as they are, Half =
/// float) and divided by args.grad_scale, piece by piece through `buf` (non-empty for a half
/// type). With grad_check::scan, a piece holding an inf or NaN returns skipped_overflow at
/// once: the pieces before it are already applied (the caller stops the run).
template <class Half>
step_result narrowed_step(const adamw_config& config, const adamw_step_args& args,
                          std::span<float> params, std::span<float> m, std::span<float> v,
                          std::span<const float> grads, std::span<Half> buf, thread_pool* pool) {
    if constexpr (std::is_same_v<Half, float>) {
        return spillway::adamw_step<float>(config, args, params, m, v, grads, {}, pool);
    } else {
        for (std::size_t at = 0; at < grads.size(); at += buf.size()) {
            const std::size_t n = std::min(buf.size(), grads.size() - at);
            spillway::narrow(grads.subspan(at, n), buf.first(n));
            if (spillway::adamw_step<Half>(config, args, params.subspan(at, n), m.subspan(at, n),
                                           v.subspan(at, n), std::span<const Half>(buf.first(n)),
                                           {}, pool) == step_result::skipped_overflow)
                return step_result::skipped_overflow;
        }
        return step_result::applied;
    }
}

}  // namespace spillway::detail
