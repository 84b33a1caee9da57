// SPDX-License-Identifier: Apache-2.0
// spillway/optim/adam_formula.hpp: the AdamW update of one element, shared by every kernel.
//
// The formula (torch.optim.AdamW, decoupled weight decay; t is the 1-based step number):
//
//   g  = grad * (clip_coef / grad_scale)            unscale the loss scale, apply clipping
//   p  = p * (1 - lr * weight_decay)                decoupled decay, before the moments
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Guarantees:
// - adamw_update evaluates exactly this sequence of float operations, with every addition
//   an explicit fused multiply-add (fmaf) and IEEE division and square root:
//     g = grad * grad_mul;  p = p * decay;
//     m = fma(beta1, m, one_minus_beta1 * g);
//     v = fma(beta2, v, (one_minus_beta2 * g) * g);
//     p = fma(neg_step_size, m / fma(sqrt(v), inv_sqrt_bias2, eps), p);
//   There is no plain a*b+c left for a compiler to contract, so the result is the same bits
//   whatever -ffp-contract says. The SIMD kernels (detail/adam_kernels.hpp) do the same
//   operations lane by lane, so every path, and CUDA code compiled without fast-math, gives
//   bit-identical results.
// - make_adamw_coefficients computes the per-step constants in double and rounds each
//   once to float (as PyTorch computes them in Python floats): the bias corrections
//   bias1 = 1 - beta1^t and bias2 = 1 - beta2^t (pow in double), then
//     neg_step_size  = float(-lr / bias1)
//     inv_sqrt_bias2 = float(1 / sqrt(bias2))
//     decay          = float(1 - lr * weight_decay)
//     grad_mul       = float(clip_coef / grad_scale)
//   lr and weight_decay are the step's own (step_hparams: a schedule may change them every
//   step); t is the 1-based step number (update_pipeline::set_steps sets it on a resume).
// - A trainer's own AdamW gives other last bits. llm.c's, for example, computes
//   m_hat = m / (1 - powf(beta1, t)) and v_hat = v / (1 - powf(beta2, t)) in float for each
//   element, then p -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * p): the bias
//   corrections rounded in float, divided per element instead of folded into two
//   constants, the decay applied after the moments, and no fused multiply-adds. The math is
//   the same AdamW; the rounding is not, so the parameters drift apart in the last bits
//   after one step. To compare a run with its offloaded version, switch the in-memory run
//   to adamw_step first (docs/integration.md, "Migrating from your own AdamW").
// - Everything is SPILLWAY_HOST_DEVICE: usable from CUDA kernels and Thrust functors.
#pragma once

#include "spillway/config.hpp"

#include <cstdint>
#include <math.h>  // fmaf, sqrtf, pow, sqrt in the global namespace (host and device)

namespace spillway {

/// Per-step constants of the AdamW update, all float.
struct adamw_coefficients {
    float grad_mul;         ///< clip_coef / grad_scale
    float decay;            ///< 1 - lr * weight_decay
    float beta1;            ///< the first moment's decay
    float one_minus_beta1;  ///< 1 - beta1
    float beta2;            ///< the second moment's decay
    float one_minus_beta2;  ///< 1 - beta2
    float inv_sqrt_bias2;   ///< 1 / sqrt(1 - beta2^t)
    float eps;              ///< added to the denominator
    float neg_step_size;    ///< -lr / (1 - beta1^t)
};

/// The constants for step t (>= 1); arguments are not validated here (adam.hpp does that).
SPILLWAY_HOST_DEVICE adamw_coefficients make_adamw_coefficients(float lr, float beta1, float beta2,
                                                                float eps, float weight_decay,
                                                                std::int64_t step, float grad_scale,
                                                                float clip_coef) noexcept {
    double t = static_cast<double>(step);
    double bias1 = 1.0 - pow(static_cast<double>(beta1), t);
    double bias2 = 1.0 - pow(static_cast<double>(beta2), t);
    adamw_coefficients c{};
    c.grad_mul =
        static_cast<float>(static_cast<double>(clip_coef) / static_cast<double>(grad_scale));
    c.decay = static_cast<float>(1.0 - static_cast<double>(lr) * static_cast<double>(weight_decay));
    c.beta1 = beta1;
    c.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(beta1));
    c.beta2 = beta2;
    c.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(beta2));
    c.inv_sqrt_bias2 = static_cast<float>(1.0 / sqrt(bias2));
    c.eps = eps;
    c.neg_step_size = static_cast<float>(-static_cast<double>(lr) / bias1);
    return c;
}

/// One element: updates p, m, v in place from the widened gradient `grad`.
SPILLWAY_HOST_DEVICE void adamw_update(float& p, float& m, float& v, float grad,
                                       const adamw_coefficients& c) noexcept {
    float g = grad * c.grad_mul;
    float pd = p * c.decay;
    m = fmaf(c.beta1, m, c.one_minus_beta1 * g);
    v = fmaf(c.beta2, v, (c.one_minus_beta2 * g) * g);
    float denom = fmaf(sqrtf(v), c.inv_sqrt_bias2, c.eps);
    p = fmaf(c.neg_step_size, m / denom, pd);
}

}  // namespace spillway
