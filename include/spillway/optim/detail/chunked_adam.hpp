// spillway/optim/detail/chunked_adam.hpp: one subgroup's AdamW step in chunks, with the
// caller's work in between (not public).
//
// Guarantees:
// - The result is bit-identical to one adamw_step over the whole spans: AdamW is
//   elementwise, so splitting it changes no bit.
// - `between()` runs after each chunk (the pipeline tops its I/O windows up there, so that
//   the tier keeps working while Adam runs).
// - With ParamCopy = float no compute copy is written (the caller copies the params).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
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

}  // namespace spillway::detail
