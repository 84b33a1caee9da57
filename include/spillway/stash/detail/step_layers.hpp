// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/detail/step_layers.hpp: the layers of one step of an activation stash, in
/// forward order, and the prefetch window over them.
///
/// A layer's forward position is the order in which its id first appears in the step. For
/// each layer the stash records when it began, the bytes it would offload (the profile the
/// adaptive split is planned from) and whether any of its tensors was queued for a write.
///
/// Guarantees: positions are dense (0, 1, ...) and stable within a step; clear() starts the
/// next step. window_low() is a pure function of the recorded layers: layers kept in memory
/// need no reads, so they never use up the prefetch window. Not synchronised: the stash
/// calls it under its own lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "spillway/stash/split_rule.hpp"

namespace spillway::detail {

class step_layers {
public:
    /// The position of layer `id`, added at the end when new; `start_seconds()` (seconds
    /// since the step began) is called only then.
    template <class Seconds>
    std::size_t position_of(std::uint32_t id, Seconds&& start_seconds) {
        auto it = positions_.find(id);
        if (it != positions_.end()) return it->second;
        const std::size_t pos = layers_.size();
        record r;
        r.profile.start_seconds = start_seconds();
        layers_.push_back(r);
        positions_.emplace(id, pos);
        return pos;
    }
    /// Layers seen in this step.
    [[nodiscard]] std::size_t size() const noexcept { return layers_.size(); }
    /// Adds `nbytes` to the offloadable bytes of the layer at `position` (if there is one).
    void add_offload_bytes(std::size_t position, std::size_t nbytes) noexcept {
        if (position < layers_.size()) layers_[position].profile.offload_bytes += nbytes;
    }
    /// Notes that the layer at `position` (if there is one) has a tensor queued for a write.
    void mark_offloads(std::size_t position) noexcept {
        if (position < layers_.size()) layers_[position].offloads = true;
    }
    /// The offloadable bytes of every layer of this step together.
    [[nodiscard]] std::size_t offload_bytes() const noexcept {
        std::size_t n = 0;
        for (const auto& l : layers_) n += l.profile.offload_bytes;
        return n;
    }
    /// The profiles of this step's layers, in forward order.
    [[nodiscard]] std::vector<layer_profile> profiles() const {
        std::vector<layer_profile> p;
        for (const auto& l : layers_) p.push_back(l.profile);
        return p;
    }
    /// The lowest layer position of the prefetch window when backward is at
    /// `backward_position`: that layer and the `prefetch_layers` layers below it that
    /// offload anything.
    [[nodiscard]] std::size_t window_low(std::size_t backward_position,
                                         std::size_t prefetch_layers) const noexcept {
        std::size_t pos = std::min(backward_position, layers_.size()), io = 0;
        while (pos > 0 && io < prefetch_layers) {
            --pos;
            if (layers_[pos].offloads) ++io;
        }
        return pos;
    }
    /// Forgets every layer: the next step begins.
    void clear() noexcept {
        layers_.clear();
        positions_.clear();
    }

private:
    struct record {
        layer_profile profile;
        bool offloads = false;  // some tensor of this layer was queued for a write
    };
    std::vector<record> layers_;
    std::unordered_map<std::uint32_t, std::size_t> positions_;  // layer id -> position
};

}  // namespace spillway::detail
