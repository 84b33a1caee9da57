// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/chunked_adam.hpp: one subgroup's AdamW step in chunks, with the
// caller's work in between, and the rule that makes a retried update apply it once (not
// public).
//
// Guarantees:
// - The result is bit-identical to one adamw_step over the whole spans: AdamW is
//   elementwise, so splitting it changes no bit.
// - `between()` runs after each chunk (the pipeline tops its I/O windows up there, so that
//   the tier keeps working while Adam runs).
// - adamw_in_chunks() with ParamCopy = float writes no compute copy (the caller copies the
//   params); step_subgroup() does, for every ParamCopy.
// - step_subgroup() applies step `target` only to a state at step target - 1; a state
//   already at `target` (updated before a fault) only gives its compute copy again, and any
//   other is a std::logic_error naming the subgroup.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "spillway/optim/adam.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/thread_pool.hpp"

namespace spillway::detail {

/// adamw_step over p, m, v and g (same length) in chunks of `chunk` elements (> 0), writing
/// the compute copy to `out` (empty: none) and calling `between()` after each chunk. The
/// gradients must have been checked (args.check == grad_check::caller_verified).
template <class G, class ParamCopy, class Between>
void adamw_in_chunks(const adamw_config& config, const adamw_step_args& args, std::span<float> p,
                     std::span<float> m, std::span<float> v, std::span<const G> g,
                     std::span<ParamCopy> out, std::size_t chunk, thread_pool* pool,
                     Between&& between) {
    const std::size_t c = p.size();
    for (std::size_t lo = 0; lo < c; lo += chunk) {
        const std::size_t k = std::min(chunk, c - lo);
        auto pc = p.subspan(lo, k), mc = m.subspan(lo, k), vc = v.subspan(lo, k);
        auto gc = g.subspan(lo, k);
        if constexpr (std::is_same_v<ParamCopy, float>) {
            (void)adamw_step<G>(config, args, pc, mc, vc, gc, std::span<float16>{}, pool);
        } else {
            auto oc = out.empty() ? out : out.subspan(lo, k);
            (void)adamw_step<G, ParamCopy>(config, args, pc, mc, vc, gc, oc, pool);
        }
        between();
    }
}

/// Step `target` of subgroup `s`, whose state p, m, v (same length as g) is at step
/// `version`: Adam in chunks (as adamw_in_chunks) when version == target - 1, then version =
/// target; nothing when version == target (a retried update: the subgroup was updated
/// before the fault). Either way the compute copy goes to `out` (empty: none).
/// @return whether the state changed (Adam ran)
/// @throws std::logic_error when version is neither target - 1 nor target
template <class G, class ParamCopy, class Between>
bool step_subgroup(std::int64_t& version, std::int64_t target, std::size_t s,
                   const adamw_config& config, const adamw_step_args& args, std::span<float> p,
                   std::span<float> m, std::span<float> v, std::span<const G> g,
                   std::span<ParamCopy> out, std::size_t chunk, thread_pool* pool,
                   Between&& between) {
    constexpr bool fp32_copy = std::is_same_v<ParamCopy, float>;
    const bool apply = version == target - 1;
    if (!apply && version != target)
        throw std::logic_error("update_pipeline: subgroup " + std::to_string(s) + " holds step " +
                               std::to_string(version) + " while step " + std::to_string(target) +
                               " is being applied");
    if (apply) {
        adamw_in_chunks(config, args, p, m, v, g, fp32_copy ? std::span<ParamCopy>{} : out, chunk,
                        pool, between);
        version = target;
    }
    if (!out.empty()) {
        if constexpr (fp32_copy)
            std::memcpy(out.data(), p.data(), p.size() * sizeof(float));
        else if (!apply)
            narrow(std::span<const float>(p), out);  // (Adam wrote it otherwise)
    }
    return apply;
}

}  // namespace spillway::detail
