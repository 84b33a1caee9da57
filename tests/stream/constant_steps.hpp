// SPDX-License-Identifier: Apache-2.0
// tests/stream/constant_steps.hpp: a layer_optimizer's file traffic without a model: every
// layer filled with 0.5, then `steps` steps with gradients of 0.25, then settle() and flush(),
// so the windows' write-backs, the fp16 spill and a final flush all reach the tiers.
#pragma once

#include <doctest/doctest.h>

#include <spillway/stream/layer_optimizer.hpp>

#include <algorithm>
#include <cstdint>
#include <span>

namespace spillway::test {

template <class Tier>
void run_constant_steps(layer_optimizer<Tier>& opt, std::int64_t steps) {
    const std::size_t L = opt.layer_count();
    for (std::size_t l = 0; l < L; ++l)
        opt.fill(l, [](std::span<float> p) { std::fill(p.begin(), p.end(), 0.5f); });
    for (std::int64_t t = 1; t <= steps; ++t) {
        opt.begin_step(t, 1.0f);
        for (std::size_t l = 0; l < L; ++l) {
            (void)opt.forward_layer(l);
            opt.forward_done(l);
        }
        for (std::size_t l = L; l-- > 0;) {
            auto [p, g] = opt.backward_layer(l);
            std::fill(g.begin(), g.end(), 0.25f);
            opt.grads_done(l);
        }
        REQUIRE(opt.end_step() == step_result::applied);
    }
    opt.settle();
    opt.flush();
}

}  // namespace spillway::test
