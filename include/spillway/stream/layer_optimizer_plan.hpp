// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/layer_optimizer_plan.hpp: a layer_optimizer inside one memory budget: the
/// streams it adds to a memory_request (plan/memory_plan.hpp), the bytes it keeps outside its
/// windows, and the windows a plan gives it.
///
/// Guarantees:
/// - layer_optimizer_streams() lists the streams in a fixed order: "params" (4 B a parameter),
///   "m|v" (8 B) and, for fp16 gradients, "fp16 gradients" (2 B); each stream's smallest
///   window is the one layer_optimizer's constructor accepts (smallest_*_window()) and its
///   whole the window that keeps every layer resident, so any plan of a request built with
///   them constructs.
/// - use_windows() copies the plan's windows for those streams, starting at the request's
///   stream `first`, into the options: the optimizer then keeps at most
///   fixed part + windows, as the plan counted.
/// - Pure functions of their arguments: a plan built on them is the same in every run.
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <vector>

#include "spillway/plan/memory_plan.hpp"
#include "spillway/stream/layer_optimizer_options.hpp"

namespace spillway {

/// The streams a layer_optimizer over layers of `layer_floats` floats with gradients `g`
/// adds to a memory_request, in order (see the file comment).
[[nodiscard]] inline std::vector<stream_demand> layer_optimizer_streams(
    std::span<const std::size_t> layer_floats, grad_dtype g) {
    std::vector<stream_demand> out = {
        layer_stream("params", detail::scaled(layer_floats, sizeof(float)), 4,
                     detail::layer_stream_options(1, "params", false)),
        layer_stream("m|v", detail::scaled(layer_floats, 2 * sizeof(float)), 8,
                     detail::layer_stream_options(1, "adam", true))};
    if (g == grad_dtype::fp16) {
        const std::size_t one = smallest_spill_window(layer_floats);
        out.push_back({"fp16 gradients", one, one * layer_floats.size(), 2});
    }
    return out;
}

/// The memory_request's fixed part for a layer_optimizer: the gradient and narrowing
/// buffers it keeps outside its windows (layer_optimizer_resident_bytes()).
[[nodiscard]] inline fixed_part layer_optimizer_fixed(std::span<const std::size_t> layer_floats,
                                                      grad_dtype g) {
    return {"the optimizer's layer gradients", layer_optimizer_resident_bytes(layer_floats, g)};
}

/// Sets o's windows (params, m|v and, for fp16, the spill) from `plan`'s windows
/// first, first + 1 (and first + 2): the streams layer_optimizer_streams() put in the request
/// at index `first`. @throws std::invalid_argument when the plan has too few windows
inline void use_windows(layer_optimizer_options& o, const memory_plan& plan,
                        std::size_t first = 0) {
    const std::size_t n = o.grads == grad_dtype::fp16 ? 3 : 2;
    if (plan.windows.size() < first + n)
        throw std::invalid_argument("use_windows: the plan has " +
                                    std::to_string(plan.windows.size()) +
                                    " windows; a layer_optimizer needs " + std::to_string(n) +
                                    " from index " + std::to_string(first));
    o.param_window = plan.windows[first];
    o.state_window = plan.windows[first + 1];
    if (n == 3) o.spill_window = plan.windows[first + 2];
}

}  // namespace spillway
