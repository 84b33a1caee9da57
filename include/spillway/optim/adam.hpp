// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/optim/adam.hpp: the mixed-precision AdamW step over one span of parameters.
///
/// fp32 master params, fp32 moments m and v, gradients as float, float16 or bfloat16 (widened
/// in registers inside the step: "lazy widening", no fp32 copy of the gradients), an optional
/// float16/bfloat16 copy of the updated params (the compute copy), fused loss-scale
/// unscaling and global-norm clipping. The formula is torch.optim.AdamW's; see
/// adam_formula.hpp for it and for the exact float operations.
///
/// Guarantees:
/// - validate(config) and adamw_step check every argument before touching anything and throw
///   std::invalid_argument naming the field and its value (or the span and its size).
/// - adamw_step, with args.check == grad_check::scan (the default), first scans all gradients
///   for inf/NaN; if it finds one it returns step_result::skipped_overflow and params, m, v
///   and copy_out are left untouched. Then the update runs (noexcept kernel) over all threads
///   of the pool with the widest SIMD level the CPU supports (detail/simd.hpp).
/// - Results are bit-identical whatever the pool size, the SIMD level, and however a caller
///   splits the arrays into sub-spans: each element's result depends only on its own p, m, v,
///   g and the step's constants (an update over [0, n) equals updates over [0, k) and [k, n)).
/// - grad_sum_squares returns sum((g / grad_scale)^2) in double, computed as
///   sum(g^2) / grad_scale^2 (g^2 is exact in double), deterministic (fixed blocks summed in a
///   fixed order, independent of pool size and SIMD level); +inf or NaN when a gradient is
///   non-finite. Global-norm clipping over many spans: the caller adds the sums,
///   norm = sqrt(total), clip_coef = min(1, max_norm / (norm + 1e-6)) (torch's clip_grad_norm_).
/// - Memory traffic of one step per parameter: read p, g, m, v and write p, m, v = 28 bytes with
///   float grads, 26 with fp16/bf16 grads, +2 with a compute copy; the grad_check::scan pass
///   reads the gradients once more (+4 or +2). A caller that already proved the gradients
///   finite (grad_sum_squares returned a finite value over the same gradients) passes
///   grad_check::caller_verified to skip that pass.
/// - The caller keeps every span alive for the duration of the call; the spans must not overlap.
///   Calling them from a task running on the same pool is allowed: the calling thread takes
///   every chunk no free worker takes (thread_pool::parallel_for).
/// - The moments are fp32, as torch's: a finite gradient (after unscaling and clipping) above
///   sqrt(FLT_MAX / (1 - beta2)) in magnitude (about 5.8e20 with beta2 = 0.999) makes that
///   element's v infinite, and from then on its update is 0 (m_hat / inf) with no error. Torch's
///   fp32 AdamW overflows earlier (g * g above FLT_MAX: |g| > 1.8e19). Global-norm clipping
///   keeps gradients far below either bound.
/// - The bit-identity guarantees assume the default floating-point environment (round to
///   nearest, no flush-to-zero / denormals-are-zero) on the calling thread, which runs one
///   chunk itself; the pool's threads always have it.
#pragma once

#include "spillway/optim/adam_formula.hpp"
#include "spillway/optim/detail/adam_kernels.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace spillway {

/// AdamW hyper-parameters (torch.optim.AdamW's names and defaults, except weight_decay = 0).
struct adamw_config {
    float lr = 1e-3f;           ///< learning rate, >= 0
    float beta1 = 0.9f;         ///< decay of the first moment m, in [0, 1)
    float beta2 = 0.999f;       ///< decay of the second moment v, in [0, 1)
    float eps = 1e-8f;          ///< added to sqrt(v_hat) in the denominator, > 0
    float weight_decay = 0.0f;  ///< decoupled decay: p -= lr * weight_decay * p, >= 0
};

/// How adamw_step treats non-finite gradients.
enum class grad_check {
    scan,             ///< scan every gradient first; on inf/NaN skip the step (the default)
    caller_verified,  ///< the caller proved them finite (for example grad_sum_squares was finite): no scan
};

/// Per-step arguments of adamw_step.
struct adamw_step_args {
    std::int64_t step = 1;      ///< 1-based step number t (bias corrections 1 - beta^t)
    float grad_scale = 1.0f;    ///< gradients are divided by this (the loss scale); fused
    float clip_coef = 1.0f;     ///< then multiplied by this (global-norm clipping coefficient)
    grad_check check = grad_check::scan;  ///< whether to scan the gradients for inf/NaN first
};

/// What adamw_step did.
enum class step_result {
    applied,           ///< params, m, v (and copy_out) were updated
    skipped_overflow,  ///< a gradient was inf or NaN: nothing was written (grad_check::scan)
};

namespace detail {
/// The shortest text that reads back as the same value ("-1e-08", "nan", "0.9").
template <class T>
std::string format_value(T x) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
}
template <class T>
[[noreturn]] void bad_value(const char* where, const char* field, T value, const char* rule) {
    throw std::invalid_argument(std::string("spillway::") + where + ": " + field + " = " + format_value(value) +
                                " is invalid (" + rule + ")");
}
/// Whether `x` is finite, read from its bits: the overflow checks hold in a caller's
/// translation unit compiled with -ffast-math or -ffinite-math-only, where std::isfinite
/// may be folded to true.
inline bool finite_bits(double x) noexcept {
    return (std::bit_cast<std::uint64_t>(x) & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}
/// A loss scale the step can divide by: finite, > 0, and 1/grad_scale finite in float (the
/// step multiplies by clip_coef / grad_scale; below about 2.9e-39 that is inf, and every
/// parameter would become NaN while the step reports success).
inline bool usable_grad_scale(float grad_scale) noexcept {
    return finite_bits(grad_scale) && grad_scale > 0 && finite_bits(1.0f / grad_scale);
}
inline constexpr const char* grad_scale_rule = "must be finite, > 0 and at least 1/FLT_MAX (about 2.9e-39)";
}  // namespace detail

/// Throws std::invalid_argument naming the field and its value unless: lr >= 0, 0 <= beta1 < 1,
/// 0 <= beta2 < 1, eps > 0, weight_decay >= 0, all finite.
inline void validate(const adamw_config& c) {
    const char* w = "adamw_config";
    if (!(std::isfinite(c.lr) && c.lr >= 0)) detail::bad_value(w, "lr", c.lr, "must be finite and >= 0");
    if (!(c.beta1 >= 0 && c.beta1 < 1)) detail::bad_value(w, "beta1", c.beta1, "must be in [0, 1)");
    if (!(c.beta2 >= 0 && c.beta2 < 1)) detail::bad_value(w, "beta2", c.beta2, "must be in [0, 1)");
    if (!(std::isfinite(c.eps) && c.eps > 0)) detail::bad_value(w, "eps", c.eps, "must be finite and > 0");
    if (!(std::isfinite(c.weight_decay) && c.weight_decay >= 0))
        detail::bad_value(w, "weight_decay", c.weight_decay, "must be finite and >= 0");
}

/// Throws std::invalid_argument naming the field unless step >= 1, grad_scale finite and > 0,
/// clip_coef finite and >= 0.
inline void validate(const adamw_step_args& a) {
    const char* w = "adamw_step_args";
    if (a.step < 1) detail::bad_value(w, "step", a.step, "must be >= 1 (1-based)");
    if (!detail::usable_grad_scale(a.grad_scale)) detail::bad_value(w, "grad_scale", a.grad_scale, detail::grad_scale_rule);
    if (!(std::isfinite(a.clip_coef) && a.clip_coef >= 0))
        detail::bad_value(w, "clip_coef", a.clip_coef, "must be finite and >= 0");
    if (a.check != grad_check::scan && a.check != grad_check::caller_verified)
        detail::bad_value(w, "check", static_cast<int>(a.check), "must be a grad_check enumerator");
}

/// The per-step constants for (config, args) (adam_formula.hpp); validates neither, so call
/// validate() on both first when they come from a user.
inline adamw_coefficients make_adamw_coefficients(const adamw_config& c, const adamw_step_args& a) noexcept {
    return make_adamw_coefficients(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, a.step, a.grad_scale, a.clip_coef);
}

namespace detail {
/// Elements per work item of the threaded step (64 KiB of params: one tile per thread at a time).
inline constexpr std::size_t adam_tile = 16384;
/// Elements per partial sum of grad_sum_squares (fixed: the result must not depend on threads).
inline constexpr std::size_t sum_squares_block_size = 65536;

template <class T>
bool overlaps(std::span<const T> a, const void* b, std::size_t b_bytes) {
    if (a.empty() || b_bytes == 0) return false;
    auto* a0 = reinterpret_cast<const char*>(a.data());
    auto* b0 = static_cast<const char*>(b);
    std::less<const char*> lt;
    return lt(a0, b0 + b_bytes) && lt(b0, a0 + a.size_bytes());
}

template <class Grad>
bool any_nonfinite_parallel(simd_level level, const Grad* g, std::size_t n, thread_pool& pool) {
    std::atomic<bool> bad{false};
    std::size_t tiles = (n + adam_tile - 1) / adam_tile;
    pool.parallel_for(
        tiles,
        [&](std::size_t b, std::size_t e) {
            for (std::size_t t = b; t < e && !bad.load(std::memory_order_relaxed); t += 16) {
                std::size_t lo = t * adam_tile, hi = std::min(n, std::min(e, t + 16) * adam_tile);
                if (any_nonfinite(level, g + lo, hi - lo)) bad.store(true, std::memory_order_relaxed);
            }
        },
        4);
    return bad.load();
}

/// The validated step with an explicit SIMD level (tests and benchmarks force levels here).
template <class Grad, class Copy>
step_result adamw_step_at(simd_level level, const adamw_coefficients& c, grad_check check, float* p, float* m,
                          float* v, const Grad* g, Copy* out, std::size_t n, thread_pool& pool) {
    if (n == 0) return step_result::applied;
    if (check == grad_check::scan && any_nonfinite_parallel(level, g, n, pool)) return step_result::skipped_overflow;
    std::size_t tiles = (n + adam_tile - 1) / adam_tile;
    pool.parallel_for(
        tiles,
        [&](std::size_t b, std::size_t e) {
            std::size_t lo = b * adam_tile, hi = std::min(n, e * adam_tile);
            Copy* o = nullptr;
            if constexpr (!std::is_same_v<Copy, no_copy>) o = out + lo;
            adamw_kernel(level, c, p + lo, m + lo, v + lo, g + lo, o, hi - lo);
        },
        4);
    return step_result::applied;
}
}  // namespace detail

/// One AdamW step over one span of parameters, in place; the guarantees (validation, overflow
/// skip, bit-identity, memory traffic, threading) are in the file comment.
/// @tparam Grad      float, float16 or bfloat16
/// @tparam ParamCopy float16 or bfloat16
/// @param config   hyper-parameters (validated)
/// @param args     step number, loss scale, clipping coefficient, gradient check (validated)
/// @param params   fp32 master parameters, updated in place
/// @param m        fp32 first moments, same size, updated in place
/// @param v        fp32 second moments, same size, updated in place
/// @param grads    gradients, same size, read only (widened in registers)
/// @param copy_out receives the updated params rounded to ParamCopy; empty: no copy
/// @param pool     the thread pool to run on; nullptr: the shared pool (never the pool the
///                 caller is running on, see the file comment)
/// @return step_result::skipped_overflow when the scan found inf/NaN (nothing written), else
///         step_result::applied
/// @throws std::invalid_argument naming the field and value for bad hyper-parameters or
///         arguments, naming the span and both sizes for a size mismatch, naming both spans
///         when two overlap; nothing is written then
template <class Grad, class ParamCopy = float16>
step_result adamw_step(const adamw_config& config, const adamw_step_args& args, std::span<float> params,
                       std::span<float> m, std::span<float> v, std::span<const Grad> grads,
                       std::span<ParamCopy> copy_out = {}, thread_pool* pool = nullptr) {
    static_assert(std::is_same_v<Grad, float> || is_half_v<Grad>, "adamw_step: Grad must be float, float16 or bfloat16");
    static_assert(is_half_v<ParamCopy>, "adamw_step: ParamCopy must be float16 or bfloat16");
    validate(config);
    validate(args);
    const std::size_t n = params.size();
    auto size_check = [n](const char* name, std::size_t size) {
        if (size != n)
            throw std::invalid_argument(std::string("spillway::adamw_step: ") + name + " has " + std::to_string(size) +
                                        " elements but params has " + std::to_string(n));
    };
    size_check("m", m.size());
    size_check("v", v.size());
    size_check("grads", grads.size());
    if (!copy_out.empty()) size_check("copy_out", copy_out.size());
    struct named {
        const char* name;
        const void* data;
        std::size_t nbytes;
    };
    const named spans[] = {{"params", params.data(), params.size_bytes()},
                           {"m", m.data(), m.size_bytes()},
                           {"v", v.data(), v.size_bytes()},
                           {"grads", grads.data(), grads.size_bytes()},
                           {"copy_out", copy_out.data(), copy_out.size_bytes()}};
    for (std::size_t i = 0; i < std::size(spans); ++i)
        for (std::size_t j = i + 1; j < std::size(spans); ++j)
            if (detail::overlaps(std::span<const char>(static_cast<const char*>(spans[i].data), spans[i].nbytes),
                                 spans[j].data, spans[j].nbytes))
                throw std::invalid_argument(std::string("spillway::adamw_step: spans ") + spans[i].name + " and " +
                                            spans[j].name + " overlap");
    thread_pool& tp = pool ? *pool : thread_pool::shared_pool();
    const adamw_coefficients c = make_adamw_coefficients(config, args);
    const detail::simd_level level = detail::best_simd_level();
    if (copy_out.empty())
        return detail::adamw_step_at(level, c, args.check, params.data(), m.data(), v.data(), grads.data(),
                                     static_cast<detail::no_copy*>(nullptr), n, tp);
    return detail::adamw_step_at(level, c, args.check, params.data(), m.data(), v.data(), grads.data(),
                                 copy_out.data(), n, tp);
}

namespace detail {
template <class Grad>
double grad_sum_squares_at(simd_level level, const Grad* g, std::size_t n, float grad_scale, thread_pool& pool) {
    if (n == 0) return 0.0;
    std::size_t blocks = (n + sum_squares_block_size - 1) / sum_squares_block_size;
    std::vector<double> partial(blocks);
    pool.parallel_for(blocks, [&](std::size_t b, std::size_t e) {
        for (std::size_t k = b; k < e; ++k) {
            std::size_t lo = k * sum_squares_block_size, hi = std::min(n, lo + sum_squares_block_size);
            partial[k] = sum_squares_block(level, g + lo, hi - lo);
        }
    });
    double total = 0.0;
    for (double s : partial) total += s;
    double scale = static_cast<double>(grad_scale);
    return total / (scale * scale);
}
}  // namespace detail

/// Sum over the span of (g / grad_scale)^2 in double, deterministic; see the file comment.
/// @param grads      float, float16 or bfloat16 gradients
/// @param grad_scale the loss scale the gradients carry, finite and > 0
/// @param pool       the thread pool to run on; nullptr: the shared pool
/// @return the sum (0 for an empty span); +inf or NaN when a gradient is non-finite
/// @throws std::invalid_argument naming grad_scale and its value unless it is finite and > 0
template <class Grad>
double grad_sum_squares(std::span<const Grad> grads, float grad_scale = 1.0f, thread_pool* pool = nullptr) {
    static_assert(std::is_same_v<Grad, float> || is_half_v<Grad>, "grad_sum_squares: Grad must be float, float16 or bfloat16");
    if (!detail::usable_grad_scale(grad_scale))
        detail::bad_value("grad_sum_squares", "grad_scale", grad_scale, detail::grad_scale_rule);
    thread_pool& tp = pool ? *pool : thread_pool::shared_pool();
    return detail::grad_sum_squares_at(detail::best_simd_level(), grads.data(), grads.size(), grad_scale, tp);
}

/// clip_coef for global-norm clipping from the summed grad_sum_squares of all spans:
/// min(1, max_norm / (sqrt(total) + 1e-6)), as torch.nn.utils.clip_grad_norm_.
/// Throws std::invalid_argument unless max_norm is finite and > 0; a non-finite total gives NaN
/// (the caller skips the step).
inline float clip_coefficient(double total_sum_squares, double max_norm) {
    if (!(std::isfinite(max_norm) && max_norm > 0))
        detail::bad_value("clip_coefficient", "max_norm", max_norm, "must be finite and > 0");
    if (!detail::finite_bits(total_sum_squares)) return std::numeric_limits<float>::quiet_NaN();
    double norm = std::sqrt(total_sum_squares);
    return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

}  // namespace spillway
