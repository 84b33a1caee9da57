// SPDX-License-Identifier: Apache-2.0
// examples/gpu_offload/layer_ring.hpp: the schedule of the budgeted GPU run, as plain host
// code (no CUDA call), so the CPU tests check every decision the GPU run makes.
//
// The run keeps the fp16 weights of every layer in pinned host memory and only a ring of
// weight slots in device memory; one layer's gradients at a time go through a ring of
// gradient slots; the activations saved for backward go through a pool of activation
// buffers (the device stash moves them off the device). This header decides:
// - plan_ring: from a device budget, how many weight slots (K), gradient slots (G) and
//   activation buffers (A) there are, or the refusal when the budget is below the minimum
//   (2 weight slots, 1 gradient slot, 2 activation buffers and the fixed buffers);
// - schedule_weights: which layer each weight use reads from which slot, and when each slot
//   is refilled: a step uses the N linear layers 0..N-1 in forward, then N-1..0 in
//   backward. Forward loads every layer (the optimizer changed them all), layer l into
//   slot l mod K; backward reloads the layers the ring no longer holds, each into the slot
//   the backward pass finished with most recently. A load is issued right after the last
//   use of its slot's previous occupant is enqueued, and copies once that use finished (an
//   event), so it runs while the uses in between compute; with K slots a load runs up to
//   K - 1 layers ahead, and loads are issued in the order they are needed.
// - grad_slot / grad_slot_wait, forward_activation_buffer / backward_activation_buffer:
//   which gradient slot and activation buffer each layer uses, and which earlier use a
//   gradient slot must wait for.
// Guarantees (tests/cuda/gpu_offload_ring_cpu_test.cpp checks them): every use finds its
// layer in its slot; no slot is refilled before the last use of what it holds; every load
// is issued before the use that needs it; device_bytes() <= the budget.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "spillway/human_bytes.hpp"

namespace gpu_offload {

/// Every device buffer starts at a multiple of this (cudaMalloc's own alignment).
inline constexpr std::size_t device_alignment = 256;

/// n rounded up to a multiple of device_alignment.
[[nodiscard]] constexpr std::size_t align_device(std::size_t n) {
    return (n + device_alignment - 1) / device_alignment * device_alignment;
}

/// "1.50 GiB (1610612736 bytes)": how messages and reports show a byte count.
[[nodiscard]] inline std::string format_bytes(std::size_t nbytes) {
    return spillway::human_bytes_exact(nbytes);
}

/// Parses a byte count such as 2G, 512M, 1.5GiB or 1073741824 (K, M, G, T: powers of 1024;
/// an optional trailing B or iB). Throws std::invalid_argument naming `flag` and the text
/// for anything else, for 0 and for more than 2^60 bytes.
[[nodiscard]] inline std::size_t parse_bytes(std::string_view flag, std::string_view text) {
    const std::string s(text);
    auto bad = [&](const std::string& why) {
        return std::invalid_argument(std::string(flag) + " " + s + ": " + why +
                                     " (expected a size such as 2G, 512M or 1073741824)");
    };
    std::size_t used = 0;
    double value = 0;
    if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) throw bad("not a number");
    try {
        value = std::stod(s, &used);
    } catch (const std::exception&) {
        throw bad("not a number");
    }
    std::string unit = s.substr(used);
    if (unit.size() == 3 && unit.substr(1) == "iB") unit.resize(1);
    if (unit.size() == 2 && unit[1] == 'B') unit.resize(1);
    double scale = 1;
    if (unit.empty() || unit == "B") scale = 1;
    else if (unit == "K" || unit == "k") scale = 1024.0;
    else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
    else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
    else if (unit == "T" || unit == "t") scale = 1024.0 * 1024 * 1024 * 1024;
    else throw bad("unknown unit '" + unit + "'");
    const double bytes = value * scale;
    if (!(bytes >= 1)) throw bad("must be at least 1 byte");
    if (bytes > 1152921504606846976.0) throw bad("more than 2^60 bytes");
    return static_cast<std::size_t>(bytes);
}

/// The bytes of one of each device buffer (each already a multiple of device_alignment).
struct ring_sizes {
    std::size_t weight_slot = 0;  ///< the largest layer's fp16 weights and bias
    std::size_t grad_slot = 0;    ///< the largest layer's fp16 gradients
    std::size_t activation = 0;   ///< one saved activation (batch x hidden, fp32)
    std::size_t fixed = 0;        ///< the batch, outputs, losses and backward buffers together
};

/// How many of each buffer the device holds.
struct ring_plan {
    std::size_t layers = 0;              ///< linear layers N
    std::size_t weight_slots = 0;        ///< K, 2 <= K <= N
    std::size_t grad_slots = 0;          ///< G, 1 <= G <= 2
    std::size_t activation_buffers = 0;  ///< A, 2 <= A <= 4
    ring_sizes sizes;

    /// The device bytes of this plan: what the run allocates.
    [[nodiscard]] std::size_t device_bytes() const {
        return weight_slots * sizes.weight_slot + grad_slots * sizes.grad_slot +
               activation_buffers * sizes.activation + sizes.fixed;
    }
    /// True when the ring holds fewer slots than layers: weights stream every pass.
    [[nodiscard]] bool streams_weights() const { return weight_slots < layers; }
};

/// No device budget: every layer keeps its own weight slot.
inline constexpr std::size_t no_budget = std::numeric_limits<std::size_t>::max();

/// The smallest plan: 2 weight slots, 1 gradient slot, 2 activation buffers.
[[nodiscard]] inline ring_plan minimum_plan(const ring_sizes& sizes, std::size_t layers) {
    return ring_plan{.layers = layers, .weight_slots = 2, .grad_slots = 1, .activation_buffers = 2, .sizes = sizes};
}

/// The plan for `layers` (>= 2) linear layers within `budget` device bytes. Beyond the
/// minimum, the budget buys in this order: a second gradient slot (a layer's gradients copy
/// out while the next layer computes), activation buffers up to min(4, layers - 1) (saves
/// wait less for the stash's copies out), then weight slots up to one per layer (fewer
/// layers reloaded in backward; with K = N nothing is reloaded). Throws
/// std::invalid_argument naming the budget and the minimum when the budget is below it.
[[nodiscard]] inline ring_plan plan_ring(const ring_sizes& sizes, std::size_t layers, std::size_t budget = no_budget) {
    if (layers < 2) throw std::invalid_argument("plan_ring: the model needs at least 2 linear layers");
    ring_plan p = minimum_plan(sizes, layers);
    if (p.device_bytes() > budget)
        throw std::invalid_argument(
            "device budget " + format_bytes(budget) + " is below the minimum this model needs on the device, " +
            format_bytes(p.device_bytes()) + ": 2 weight slots and 1 gradient slot of " +
            format_bytes(sizes.weight_slot) + " each, 2 activation buffers of " + format_bytes(sizes.activation) +
            " and " + format_bytes(sizes.fixed) + " of batch, output and backward buffers");
    auto fits = [&](const ring_plan& q) { return q.device_bytes() <= budget; };
    ring_plan q = p;
    q.grad_slots = 2;
    if (fits(q)) p = q;
    const std::size_t max_activation = std::max<std::size_t>(2, std::min<std::size_t>(4, layers - 1));
    while (p.activation_buffers < max_activation) {
        q = p;
        ++q.activation_buffers;
        if (!fits(q)) break;
        p = q;
    }
    const std::size_t room = budget == no_budget ? no_budget : budget - p.device_bytes();
    const std::size_t extra = sizes.weight_slot == 0 ? layers : room / sizes.weight_slot;
    p.weight_slots += std::min(extra, layers - p.weight_slots);
    return p;
}

/// Whether a use of a layer's weights is in the forward or the backward pass.
enum class pass { forward, backward };

/// One use of a layer's weights in a step (uses 0..N-1 are forward, N..2N-1 backward).
struct weight_use {
    std::size_t layer = 0;
    std::size_t slot = 0;
    pass direction = pass::forward;
    /// The load this use waits for (index into step_schedule::loads): set on the first use
    /// after the layer arrived; later uses of the same load follow it on the compute stream.
    std::optional<std::size_t> wait_load;
    /// The load issued once this use is enqueued: it refills this use's slot, after this use
    /// finished (the last use of what the slot holds).
    std::optional<std::size_t> then_load;
};

/// One copy of a layer's weights from pinned host memory into a slot.
struct weight_load {
    std::size_t layer = 0;
    std::size_t slot = 0;
    /// The use whose end frees the slot; none for the first K loads of a step (the slot is
    /// free: the previous step finished before this one starts).
    std::optional<std::size_t> after_use;
    std::size_t first_use = 0;  ///< the first use that reads this load
};

/// Every weight use and load of one step, for N layers and K slots.
struct step_schedule {
    std::vector<weight_use> uses;       ///< 2N, in order
    std::vector<weight_load> loads;     ///< N + max(0, N - K), in the order they are issued
    std::vector<std::size_t> initial;   ///< loads issued at the start of the step (after_use none)
};

/// The weight schedule of one step (see the header comment) for `layers` linear layers and
/// `slots` weight slots (2 <= slots; more than `layers` are not used). Throws
/// std::invalid_argument for fewer than 2 layers or slots.
[[nodiscard]] inline step_schedule schedule_weights(std::size_t layers, std::size_t slots) {
    if (layers < 2 || slots < 2)
        throw std::invalid_argument("schedule_weights: needs at least 2 layers and 2 slots, got " +
                                    std::to_string(layers) + " and " + std::to_string(slots));
    const std::size_t n = layers, k = std::min(slots, layers);
    step_schedule s;
    s.uses.resize(2 * n);
    // Forward load l brings layer l into slot l mod k for use l, once forward use l - k is
    // done with the slot. After forward the ring holds layers n-k..n-1, which backward uses
    // n..n+k-1 read again; backward reload j (load n + j) brings layer n-k-1-j for use
    // n+k+j into the slot of backward use n+j, the last use of what that slot holds. So
    // loads are issued in index order, each as soon as its slot is done with.
    for (std::size_t l = 0; l < n; ++l) {
        s.loads.push_back({.layer = l,
                           .slot = l % k,
                           .after_use = l >= k ? std::optional<std::size_t>(l - k) : std::nullopt,
                           .first_use = l});
        if (l < k) s.initial.push_back(l);
    }
    for (std::size_t j = 0; j + k < n; ++j)
        s.loads.push_back({.layer = n - k - 1 - j, .slot = (n - 1 - j) % k, .after_use = n + j, .first_use = n + k + j});
    for (std::size_t i = 0; i < s.loads.size(); ++i)
        if (s.loads[i].after_use) s.uses[*s.loads[i].after_use].then_load = i;
    for (std::size_t u = 0; u < 2 * n; ++u) {
        weight_use& w = s.uses[u];
        w.direction = u < n ? pass::forward : pass::backward;
        w.layer = u < n ? u : 2 * n - 1 - u;
        // The load of this layer that is current at use u: the forward load, or in backward
        // (beyond the ring's last k layers) the backward reload.
        const std::size_t b = u - n;  // backward position, when u >= n
        const std::size_t load = u < n || b < k ? w.layer : n + (b - k);
        w.slot = s.loads[load].slot;
        if (s.loads[load].first_use == u) w.wait_load = load;
    }
    return s;
}

/// The gradient slot of backward position q (0 for the last layer).
[[nodiscard]] constexpr std::size_t grad_slot(std::size_t q, std::size_t grad_slots) { return q % grad_slots; }
/// The backward position whose gradient copy must end before position q writes its slot
/// (none for the first G positions: the previous step's copies ended).
[[nodiscard]] constexpr std::optional<std::size_t> grad_slot_wait(std::size_t q, std::size_t grad_slots) {
    if (q < grad_slots) return std::nullopt;
    return q - grad_slots;
}
/// The activation buffer forward writes the pre-activation of hidden layer l into.
[[nodiscard]] constexpr std::size_t forward_activation_buffer(std::size_t l, std::size_t buffers) {
    return l % buffers;
}
/// The activation buffer backward loads the pre-activation of hidden layer l into: the
/// layer being computed reads one of buffers 0 and 1 while the next one arrives in the other.
[[nodiscard]] constexpr std::size_t backward_activation_buffer(std::size_t l) { return l % 2; }

}  // namespace gpu_offload
