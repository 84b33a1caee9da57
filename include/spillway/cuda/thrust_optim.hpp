// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/thrust_optim.hpp: the optimizer's elementwise work on device memory as
// Thrust kernels: the fp32 to fp16/bf16 cast of updated params, the gradient norm and
// overflow check, and the AdamW step for subgroups kept in GPU memory.
//
// Guarantees:
// - Written against Thrust only: the same code runs on the GPU (nvcc, CUDA backend) and on
//   the CPU (Thrust's OMP or CPP backend), where it is tested on machines without a GPU.
//   Spans must live in memory the policy reaches (device memory for the CUDA backend).
// - On a stream, pass stream_policy(stream) (stream_policy.hpp): the reductions' scratch
//   memory is then ordered on that stream, so a gradient scan never waits for other streams
//   (thrust::cuda::par.on(stream) frees it with cudaFree, which synchronises the device).
//   With it, narrow() and adamw_step()'s update return once their kernels are enqueued:
//   the caller orders readers of the outputs after the stream. grad_sum_squares(),
//   check_gradients() and adamw_step()'s scan (grad_check::scan) wait for the stream up to
//   their own kernels, because their result comes back to the host: the value they return
//   is final (adamw_step's update, after the scan, is still asynchronous).
// - narrow() is spillway::from_float element by element: bit-identical to the CPU's
//   spillway::narrow (round to nearest even, NaNs quiet, overflow to infinity).
// - adamw_step() applies adam_formula.hpp's adamw_update to each element, with the
//   per-step constants computed once on the host by make_adamw_coefficients: the same float
//   operations (explicit fmaf, IEEE division and square root) as the CPU step, so the
//   results are bit-identical to spillway::adamw_step on the same data (CUDA code must not
//   be compiled with fast-math). It validates like the CPU step (std::invalid_argument
//   naming the field or the span) and, with grad_check::scan, returns
//   step_result::skipped_overflow touching nothing when a gradient is inf or NaN; that scan
//   is one reduction (one host round trip per call, whatever the size). The
//   spans must not overlap (not checked: they may be device addresses).
// - grad_sum_squares() returns sum((g / grad_scale)^2) in double (each square is exact in
//   double; the order of the additions is the backend's, so it may differ from the CPU's in
//   the last bits); +inf or NaN when a gradient is not finite. check_gradients() adds the
//   norm and the overflow flag in the same single pass.
// - The host-side checks (the overflow flag, grad_scale's validation, the same rule as the
//   CPU's: finite, > 0, at least 1/FLT_MAX) read the bits, like the CPU code: they hold in
//   a caller's translation unit compiled with -ffast-math, where std::isfinite may be folded
//   to true (this header is compiled with the caller's flags).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include "spillway/config.hpp"
#include "spillway/cuda/stream_policy.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/adam_formula.hpp"
#include "spillway/optim/detail/adam_scalar.hpp"
#include "spillway/optim/detail/half_core.hpp"

namespace spillway::cuda {

// ---- fp32 -> fp16 / bf16 ------------------------------------------------------------------

/// The elementwise cast: round one float to Half (float16 or bfloat16).
template <class Half>
struct narrow_fn {
    static_assert(is_half_v<Half>, "narrow_fn<Half>: Half must be float16 or bfloat16");
    /// from_float<Half>(f).
    SPILLWAY_HOST_DEVICE Half operator()(float f) const noexcept { return from_float<Half>(f); }
};

namespace detail {
inline void check_same_count(const char* what, const char* a, std::size_t na, const char* b,
                             std::size_t nb) {
    if (na != nb)
        throw std::invalid_argument(std::string("spillway::cuda::") + what + ": " + a + " has " +
                                    std::to_string(na) + " elements but " + b + " has " +
                                    std::to_string(nb));
}
}  // namespace detail

/// out[i] = from_float<Half>(in[i]) for every i, with Thrust on `policy`. Throws
/// std::invalid_argument when the sizes differ, before touching anything.
template <class Policy, class Half>
void narrow(const Policy& policy, std::span<const float> in, std::span<Half> out) {
    detail::check_same_count("narrow", "input", in.size(), "output", out.size());
    if (in.empty()) return;
    thrust::transform(policy, in.data(), in.data() + in.size(), out.data(), narrow_fn<Half>{});
}

// ---- gradient norm and overflow -------------------------------------------------------------

/// The elementwise square of a widened gradient, in double (exact).
template <class Grad>
struct square_fn {
    /// to_float(g)^2 as double.
    SPILLWAY_HOST_DEVICE double operator()(Grad g) const noexcept {
        double x = static_cast<double>(spillway::detail::widen_one(g));
        return x * x;
    }
};

/// What check_gradients() found.
struct gradient_check {
    double sum_squares = 0;  ///< sum((g / grad_scale)^2); +inf or NaN when a gradient is not finite
    double norm = 0;         ///< sqrt(sum_squares): the L2 norm of the unscaled gradients
    bool overflow = false;   ///< a gradient is inf or NaN: skip the step
};

/// sum((g / grad_scale)^2) in double over `grads`, with Thrust on `policy`. Throws
/// std::invalid_argument unless grad_scale is usable like the CPU's grad_sum_squares
/// requires (finite, > 0, at least 1/FLT_MAX; checked by its bits).
template <class Policy, class Grad>
double grad_sum_squares(const Policy& policy, std::span<const Grad> grads,
                        float grad_scale = 1.0f) {
    static_assert(std::is_same_v<Grad, float> || is_half_v<Grad>,
                  "grad_sum_squares: Grad must be float, float16 or bfloat16");
    if (!spillway::detail::usable_grad_scale(grad_scale))
        spillway::detail::bad_value("cuda::grad_sum_squares", "grad_scale", grad_scale,
                                    spillway::detail::grad_scale_rule);
    if (grads.empty()) return 0.0;
    double total = thrust::transform_reduce(policy, grads.data(), grads.data() + grads.size(),
                                            square_fn<Grad>{}, 0.0, thrust::plus<double>{});
    double scale = static_cast<double>(grad_scale);
    return total / (scale * scale);
}

/// The gradient norm and the overflow check in one pass over `grads` (see gradient_check).
/// Throws like grad_sum_squares.
template <class Policy, class Grad>
gradient_check check_gradients(const Policy& policy, std::span<const Grad> grads,
                               float grad_scale = 1.0f) {
    gradient_check r;
    r.sum_squares = grad_sum_squares(policy, grads, grad_scale);
    r.overflow =
        !spillway::detail::finite_bits(r.sum_squares);  // by its bits: holds under -ffast-math
    r.norm = r.overflow ? r.sum_squares : std::sqrt(r.sum_squares);
    return r;
}

// ---- AdamW ----------------------------------------------------------------------------------

/// True for a gradient that is inf or NaN (by its bits, like the CPU scan).
template <class Grad>
struct nonfinite_fn {
    /// Whether g is inf or NaN.
    SPILLWAY_HOST_DEVICE bool operator()(Grad g) const noexcept {
        return spillway::detail::nonfinite_bits(g);
    }
};

/// The AdamW update of element i (and its compute copy, unless Copy is detail::no_copy).
template <class Grad, class Copy>
struct adamw_fn {
    adamw_coefficients c;  ///< the step's constants
    float* params;         ///< fp32 master params (n)
    float* m;              ///< first moments (n)
    float* v;              ///< second moments (n)
    const Grad* grads;     ///< gradients (n), widened in registers
    Copy* copy_out;        ///< compute copy (n), or unused for detail::no_copy
    /// Updates element i in place.
    SPILLWAY_HOST_DEVICE void operator()(std::size_t i) const noexcept {
        adamw_update(params[i], m[i], v[i], spillway::detail::widen_one(grads[i]), c);
        if constexpr (!std::is_same_v<Copy, spillway::detail::no_copy>)
            copy_out[i] = from_float<Copy>(params[i]);
    }
};

/// One AdamW step over spans in memory `policy` reaches (a subgroup kept in GPU memory);
/// the same arguments, checks and results as spillway::adamw_step (adam.hpp), bit for bit.
/// Grad: float, float16 or bfloat16; copy_out (float16 or bfloat16) empty = no copy.
/// Throws std::invalid_argument for bad hyper-parameters, arguments or sizes.
template <class Policy, class Grad, class ParamCopy = float16>
step_result adamw_step(const Policy& policy, const adamw_config& config,
                       const adamw_step_args& args, std::span<float> params, std::span<float> m,
                       std::span<float> v, std::span<const Grad> grads,
                       std::span<ParamCopy> copy_out = {}) {
    static_assert(std::is_same_v<Grad, float> || is_half_v<Grad>,
                  "adamw_step: Grad must be float, float16 or bfloat16");
    static_assert(is_half_v<ParamCopy>, "adamw_step: ParamCopy must be float16 or bfloat16");
    validate(config);
    validate(args);
    const std::size_t n = params.size();
    detail::check_same_count("adamw_step", "m", m.size(), "params", n);
    detail::check_same_count("adamw_step", "v", v.size(), "params", n);
    detail::check_same_count("adamw_step", "grads", grads.size(), "params", n);
    if (!copy_out.empty())
        detail::check_same_count("adamw_step", "copy_out", copy_out.size(), "params", n);
    if (n == 0) return step_result::applied;
    // One reduction, one host round trip: thrust::any_of is a find_if, which the CUDA
    // backend runs as a loop of bounded searches, each synchronising the stream.
    if (args.check == grad_check::scan &&
        thrust::transform_reduce(policy, grads.data(), grads.data() + n, nonfinite_fn<Grad>{},
                                 false, thrust::logical_or<bool>{}))
        return step_result::skipped_overflow;
    const adamw_coefficients c = make_adamw_coefficients(config, args);
    thrust::counting_iterator<std::size_t> first(0);
    if (copy_out.empty())
        thrust::for_each(policy, first, first + n,
                         adamw_fn<Grad, spillway::detail::no_copy>{
                             c, params.data(), m.data(), v.data(), grads.data(), nullptr});
    else
        thrust::for_each(policy, first, first + n,
                         adamw_fn<Grad, ParamCopy>{c, params.data(), m.data(), v.data(),
                                                   grads.data(), copy_out.data()});
    return step_result::applied;
}

}  // namespace spillway::cuda
