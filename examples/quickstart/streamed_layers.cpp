// SPDX-License-Identifier: Apache-2.0
// examples/quickstart/streamed_layers.cpp: the layer optimizer of docs/integration.md
// ("Layer by layer: spillway::layer_optimizer"). A model's layers (params and AdamW's m, v:
// 12 bytes per parameter) live on two striped paths and pass through memory windows of two
// layers; each layer is updated in backward as soon as its bf16 gradients are final. The
// program trains a toy model of six layers of mixed sizes twice, in memory with adamw_step per
// layer and streamed, saves and reloads the streamed one half-way, and exits non-zero unless
// both end with the same bits.
//
// Usage: streamed_layers [SCRATCH_DIR]
#include <cstdio>
#include <span>
#include <vector>

#include <spillway/stream/layer_optimizer.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/path_folders.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include "quickstart.hpp"

using quickstart::expect;

namespace {

constexpr int steps = 6;
const std::vector<std::size_t> layer_floats = {40000, 65536, 30000, 65536, 50000, 20000};
const spillway::adamw_config adam{.lr = 1e-2f, .weight_decay = 0.01f};

/// The toy model: layer l's loss is 0.5 * |p - target|^2, so its gradient is p - target.
float target(std::size_t l, std::size_t i) {
    return quickstart::uniform(l + 10, i);
}
float initial(std::size_t l, std::size_t i) {
    return quickstart::uniform(l + 100, i);
}
float lr_at(int step) {
    return adam.lr / static_cast<float>(step);
}  // a schedule

}  // namespace

int main(int argc, char** argv) {
    return quickstart::run_main("streamed_layers", [&] {
        quickstart::scratch_dir scratch(argc, argv, "streamed_layers");
        const std::filesystem::path paths[] = {scratch.path() / "nvme0", scratch.path() / "nvme1"};

        // The reference: each layer in memory, adamw_step on its bf16 gradients.
        const std::size_t L = layer_floats.size();
        std::vector<std::vector<float>> p(L), m(L), v(L);
        for (std::size_t l = 0; l < L; ++l) {
            p[l].resize(layer_floats[l]);
            m[l].assign(layer_floats[l], 0.0f);
            v[l].assign(layer_floats[l], 0.0f);
            for (std::size_t i = 0; i < p[l].size(); ++i) p[l][i] = initial(l, i);
        }
        for (int step = 1; step <= steps; ++step)
            for (std::size_t l = 0; l < L; ++l) {
                std::vector<float> g(p[l].size());
                for (std::size_t i = 0; i < g.size(); ++i) g[i] = p[l][i] - target(l, i);
                std::vector<spillway::bfloat16> h(g.size());
                spillway::narrow(g, h);
                spillway::adamw_step_args a;
                a.step = step;
                spillway::adamw_step<spillway::bfloat16>(
                    spillway::with_step(adam, {lr_at(step), adam.weight_decay}), a, p[l], m[l],
                    v[l], std::span<const spillway::bfloat16>(h));
            }

        // [layers-tier-begin]
        // One file tier per path in this process's folder there; layer l's blobs on path l mod 2.
        const auto folders = spillway::path_folders::create(paths, "layers", "trainer-");
        using tier_type =
            spillway::virtual_tier<spillway::null_lock, std::vector<spillway::file_tier<>>>;
        spillway::virtual_tier_options tier_options;
        tier_options.placement = spillway::placement_mode::striped;
        tier_options.bandwidths = {1.0, 1.0};  // striping needs no probe
        tier_type tier(tier_options, folders.file_tier_args());
        // [layers-tier-end]

        // [layers-optimizer-begin]
        spillway::layer_optimizer_options options;
        options.grads = spillway::grad_dtype::bf16;  // narrowed as your in-memory AdamW would
        options.adam = adam;
        options.param_window = 2 * spillway::smallest_param_window(layer_floats);  // two layers
        options.state_window = 2 * spillway::smallest_state_window(layer_floats);
        // options.reduce_grads = [&](std::size_t layer, std::span<float> g) { /* allreduce */ };
        auto opt =
            std::make_unique<spillway::layer_optimizer<tier_type>>(tier, layer_floats, options);
        for (std::size_t l = 0; l < L; ++l)  // the first contents, layer by layer
            opt->fill(l, [&](std::span<float> params) {
                for (std::size_t i = 0; i < params.size(); ++i) params[i] = initial(l, i);
            });
        // [layers-optimizer-end]

        for (int step = 1; step <= steps; ++step) {
            // [layers-step-begin]
            opt->begin_step(step, 1.0f, {lr_at(step), adam.weight_decay});
            for (std::size_t l = 0; l < L; ++l) {  // forward
                std::span<const float> params = opt->forward_layer(l);
                (void)params;  // your layer's forward reads them
                opt->forward_done(l);
            }
            for (std::size_t l = L; l-- > 0;) {                 // backward
                auto [params, grads] = opt->backward_layer(l);  // grads zeroed
                for (std::size_t i = 0; i < grads.size(); ++i) grads[i] += params[i] - target(l, i);
                opt->grads_done(l);  // reduced, then the layer updated
            }
            spillway::step_result verdict = opt->end_step();  // fp16: skipped on overflow
            // [layers-step-end]
            expect(verdict == spillway::step_result::applied, "every step is applied");
            if (step == steps / 2) {
                // [layers-save-begin]
                const auto file = scratch.path() / "layers.ckpt";
                opt->save(file);  // params, m, v and the step, under CRC-32C
                opt.reset();      // (its blobs are erased: the tier is free for the new one)
                opt = std::make_unique<spillway::layer_optimizer<tier_type>>(tier, layer_floats,
                                                                             options);
                opt->load(file);  // a resumed run: opt->last_step() == step
                // [layers-save-end]
                expect(opt->last_step() == step, "the save holds its step");
            }
        }
        for (std::size_t l = 0; l < L; ++l)
            opt->read_layer(l, [&](std::span<const float> params, std::span<const float> mm,
                                   std::span<const float> vv) {
                expect(quickstart::same_bits(params, p[l]) && quickstart::same_bits(mm, m[l]) &&
                           quickstart::same_bits(vv, v[l]),
                       "layer " + std::to_string(l) + " has the in-memory run's bits");
            });
        const auto s = opt->stats();
        std::printf("after the reload: params read %llu B, written %llu B; m|v read %llu B\n",
                    static_cast<unsigned long long>(s.params.bytes_read),
                    static_cast<unsigned long long>(s.params.bytes_written),
                    static_cast<unsigned long long>(s.state.bytes_read));
    });
}
