// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/plan/memory_plan.hpp: one memory budget split across the parts of a run that
/// stay resident whatever happens (the fixed parts) and the windows of its streams (each
/// stream's resident layers: params, AdamW's m|v, an fp16 gradient spill, ...).
///
/// The plan, in order (every figure in bytes):
///  1. fixed: the sum of the request's fixed parts (the process's baseline, buffers of the
///     model's size, the activation stash's footprint, a margin), each named;
///  2. the smallest budget: fixed plus each stream's smallest window. A budget below it is
///     refused with budget_too_small, whose message and smallest_budget() name that figure;
///  3. each window first gets its smallest, then the surplus (budget less the smallest
///     budget) is shared in proportion to the streams' weights (their bytes per parameter),
///     each window at most its whole (every layer resident);
///  4. what a window could not take goes to the others that can still grow, in request
///     order; what none can take stays unplanned.
///
/// Guarantees:
/// - The plan is a pure function of its request: the same request gives the same windows
///   and the same smallest budget in every run, and a budget of exactly smallest_budget()
///   is accepted while one byte less is refused. Reproducible figures need reproducible
///   inputs: plan from figures that do not depend on the run (plan/process_baseline.hpp).
/// - fixed + the windows never exceed the budget; no window is below its smallest or above
///   its whole (a whole below the smallest counts as the smallest).
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "spillway/human_bytes.hpp"
#include "spillway/stream/param_stream_options.hpp"

namespace spillway {

/// A part of the budget that the windows cannot use.
struct fixed_part {
    std::string name;        ///< What it is, as the refusal names it ("the process").
    std::size_t nbytes = 0;  ///< Its bytes.
};

/// A stream whose window the plan sizes.
struct stream_demand {
    std::string name;          ///< As the refusal names it ("params", "m|v").
    std::size_t smallest = 0;  ///< The smallest window it accepts (e.g. param_stream's
                               ///< smallest_budget()).
    std::size_t whole = 0;     ///< The window that holds every layer; more is never given.
    std::size_t weight = 1;    ///< Its share of the surplus: its bytes per parameter.
};

/// The demand of a param_stream over layers of `layer_nbytes` with `options`: its smallest
/// window smallest_budget(layer_nbytes, options), its whole every layer's charge_of(). The
/// window plan_memory() gives it is the stream's param_stream_options::memory_budget.
[[nodiscard]] inline stream_demand layer_stream(std::string name,
                                                std::span<const std::size_t> layer_nbytes,
                                                std::size_t weight,
                                                const param_stream_options& options = {}) {
    stream_demand d{std::move(name), smallest_budget(layer_nbytes, options), 0, weight};
    for (auto n : layer_nbytes) d.whole += charge_of(n, options.pages);
    return d;
}

/// What plan_memory() splits.
struct memory_request {
    std::size_t budget = 0;              ///< The budget to split, in bytes.
    std::vector<fixed_part> fixed;       ///< What stays resident whatever the windows.
    std::vector<stream_demand> streams;  ///< The streams, in the order leftovers go to.

    /// The sum of the fixed parts.
    [[nodiscard]] std::size_t fixed_bytes() const noexcept {
        std::size_t n = 0;
        for (const auto& f : fixed) n += f.nbytes;
        return n;
    }
    /// The sum of the streams' smallest windows.
    [[nodiscard]] std::size_t smallest_windows() const noexcept {
        std::size_t n = 0;
        for (const auto& s : streams) n += s.smallest;
        return n;
    }
    /// fixed_bytes() + smallest_windows(): the smallest budget that works.
    [[nodiscard]] std::size_t smallest_budget() const noexcept {
        return fixed_bytes() + smallest_windows();
    }
};

/// plan_memory()'s answer.
struct memory_plan {
    std::vector<std::size_t> windows;  ///< One per stream, in request order.
    std::size_t fixed_bytes = 0;       ///< The fixed parts' sum.
    std::size_t smallest_budget = 0;   ///< The smallest budget the request accepts.
    /// fixed_bytes plus the windows: at most the budget.
    [[nodiscard]] std::size_t planned_bytes() const noexcept {
        std::size_t n = fixed_bytes;
        for (auto w : windows) n += w;
        return n;
    }
};

/// A budget below the smallest that works. what() names the budget, the smallest budget in
/// bytes ("the smallest budget that works is N bytes (...)") and each part it is made of.
class budget_too_small : public std::invalid_argument {
public:
    /// `what` is the message; `smallest` the smallest budget that works, in bytes.
    budget_too_small(const std::string& what, std::size_t smallest)
        : std::invalid_argument(what), smallest_(smallest) {}
    /// The smallest budget that works, in bytes.
    [[nodiscard]] std::size_t smallest_budget() const noexcept { return smallest_; }

private:
    std::size_t smallest_;
};

/// The windows for `r` (see the file comment). @throws budget_too_small when r.budget is
/// below r.smallest_budget().
[[nodiscard]] inline memory_plan plan_memory(const memory_request& r) {
    memory_plan p;
    p.fixed_bytes = r.fixed_bytes();
    p.smallest_budget = r.smallest_budget();
    if (r.budget < p.smallest_budget) {
        std::string parts;
        for (const auto& f : r.fixed)
            parts += (parts.empty() ? "" : ", ") + f.name + " " +
                     human_bytes(static_cast<double>(f.nbytes));
        for (const auto& s : r.streams)
            parts += (parts.empty() ? "" : ", ") + std::string("one window of ") + s.name + " " +
                     human_bytes(static_cast<double>(s.smallest));
        throw budget_too_small("a budget of " + human_bytes_exact(r.budget) +
                                   " is too small: the smallest budget that works is " +
                                   std::to_string(p.smallest_budget) + " bytes (" +
                                   human_bytes(static_cast<double>(p.smallest_budget)) + ": " +
                                   parts + ")",
                               p.smallest_budget);
    }
    const std::size_t n = r.streams.size();
    p.windows.resize(n);
    std::size_t weights = 0;
    for (std::size_t i = 0; i < n; ++i) {
        p.windows[i] = r.streams[i].smallest;
        weights += r.streams[i].weight;
    }
    auto room = [&](std::size_t i) {
        return std::max(r.streams[i].whole, r.streams[i].smallest) - p.windows[i];
    };
    const std::size_t surplus = r.budget - p.smallest_budget;
    std::size_t given = 0;
    if (weights > 0)
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t add = std::min(surplus / weights * r.streams[i].weight, room(i));
            p.windows[i] += add;
            given += add;
        }
    for (std::size_t i = 0; i < n; ++i) {
        if (r.streams[i].weight == 0) continue;
        const std::size_t add = std::min(surplus - given, room(i));
        p.windows[i] += add;
        given += add;
    }
    return p;
}

}  // namespace spillway
