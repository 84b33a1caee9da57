// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/schedule/lr_schedule.hpp: the learning rate of each step, as a pure function of the
/// step number: constant, or linear warmup followed by cosine decay to lr_min (the schedule of
/// llm.c's GPU trainer and of nanoGPT).
///
/// The formula, for the 0-based step s, peak lr, warmup W and horizon N (total_steps):
///
///   s <  W:                lr * (s + 1) / W                 (linear warmup; step 0 is not 0)
///   constant, s >= W:      lr
///   cosine,   W <= s < N:  lr_min + 0.5 * (1 + cos(pi * (s - W) / (N - W))) * (lr - lr_min)
///   cosine,   s >= N:      lr_min
///
/// Guarantees:
/// - learning_rate() evaluates the formula in double and rounds the result once to float, so
///   it depends only on the schedule's fields and s: a resumed run gets the same bits at
///   every step as an uninterrupted one. (llm.c evaluates the same formula in float, nanoGPT
///   in Python's double: their learning rates can differ from this one, and from each
///   other, in the last bit.)
/// - Every result is finite, >= 0 and at most max(lr, lr_min); at s = W - 1 it is lr, and
///   cosine reaches lr_min at s = N exactly.
/// - Light: only standard headers. A trainer hands the rate to the optimizer as
///   step_hparams{learning_rate(s, step), weight_decay} (optim/step_hparams.hpp).
/// - validate() refuses, with std::invalid_argument naming the field and its value, every
///   schedule the formula cannot run with; learning_rate() and hparams_at() do not validate.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string>

namespace spillway {

/// The shape of the decay after the warmup.
enum class lr_decay {
    constant,  ///< the peak lr from the end of the warmup on
    cosine,    ///< cosine decay from lr to lr_min over [warmup_steps, total_steps)
};

/// A learning-rate schedule (plain values: saved with a run and compared on resume).
struct lr_schedule {
    lr_decay decay = lr_decay::constant;  ///< constant or cosine
    float lr = 1e-3f;                     ///< the peak learning rate (finite, >= 0)
    float lr_min = 0.0f;                  ///< cosine's final rate (finite, 0 <= lr_min <= lr)
    std::int64_t warmup_steps = 0;        ///< steps of linear warmup (>= 0; 0: none)
    /// Cosine's horizon: the step at which lr_min is reached, usually the run's step count
    /// (> warmup_steps for cosine; not used by constant).
    std::int64_t total_steps = 0;
    /// Schedules are equal when every field is (a resumed run checks its schedule this way).
    friend bool operator==(const lr_schedule&, const lr_schedule&) = default;
};

/// Throws std::invalid_argument naming the field and its value unless: lr and lr_min are
/// finite, 0 <= lr_min <= lr (cosine), warmup_steps >= 0, and cosine's total_steps >
/// warmup_steps; `decay` must be an enumerator.
inline void validate(const lr_schedule& s) {
    auto bad = [](const char* field, const std::string& value, const char* rule) {
        throw std::invalid_argument(std::string("spillway::lr_schedule: ") + field + " = " + value +
                                    " is invalid (" + rule + ")");
    };
    if (s.decay != lr_decay::constant && s.decay != lr_decay::cosine)
        bad("decay", std::to_string(static_cast<int>(s.decay)), "must be constant or cosine");
    if (!(std::isfinite(s.lr) && s.lr >= 0))
        bad("lr", std::to_string(s.lr), "must be finite and >= 0");
    if (s.warmup_steps < 0) bad("warmup_steps", std::to_string(s.warmup_steps), "must be >= 0");
    if (s.decay != lr_decay::cosine) return;
    if (!(std::isfinite(s.lr_min) && s.lr_min >= 0 && s.lr_min <= s.lr))
        bad("lr_min", std::to_string(s.lr_min),
            ("must be finite and in [0, lr] with lr = " + std::to_string(s.lr)).c_str());
    if (s.total_steps <= s.warmup_steps)
        bad("total_steps", std::to_string(s.total_steps),
            ("cosine decays over [warmup_steps, total_steps): it must be > warmup_steps = " +
             std::to_string(s.warmup_steps))
                .c_str());
}

/// The learning rate of 0-based step `step` (>= 0) under `s` (validated): the formula of the
/// file comment in double, rounded once to float.
[[nodiscard]] inline float learning_rate(const lr_schedule& s, std::int64_t step) noexcept {
    const double lr = s.lr;
    if (step < s.warmup_steps)
        return static_cast<float>(lr * static_cast<double>(step + 1) /
                                  static_cast<double>(s.warmup_steps));
    if (s.decay == lr_decay::constant) return s.lr;
    if (step >= s.total_steps) return s.lr_min;
    const double ratio = static_cast<double>(step - s.warmup_steps) /
                         static_cast<double>(s.total_steps - s.warmup_steps);
    const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
    const double lr_min = s.lr_min;
    return static_cast<float>(lr_min + coeff * (lr - lr_min));
}

}  // namespace spillway
