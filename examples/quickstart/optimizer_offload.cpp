// SPDX-License-Identifier: Apache-2.0
// examples/quickstart/optimizer_offload.cpp: step 2 of docs/integration.md. The AdamW state
// (fp32 params, m, v: 12 bytes per parameter) moves to a file tier and an update pipeline
// updates it subgroup by subgroup, widening the trainer's bf16 gradients inside the step.
// The program trains a toy model twice, with AdamW in memory and offloaded, and exits
// non-zero unless both end with the same parameter bits and the resident set saved the
// reads it should.
//
// Usage: optimizer_offload [SCRATCH_DIR]
#include <cstdio>
#include <span>
#include <vector>

#include <spillway/spillway.hpp>

#include "quickstart.hpp"

using quickstart::expect;

namespace {

constexpr int steps = 6;

}  // namespace

int main(int argc, char** argv) {
    return quickstart::run_main("optimizer_offload", [&] {
        quickstart::scratch_dir scratch(argc, argv, "optimizer_offload");
        const std::filesystem::path directory = scratch.path();
        const quickstart::linear_model model(std::size_t{1} << 16, 8, 7);

        // [step-2-begin]
        // AdamW's hyperparameters (torch.optim.AdamW's names; betas and eps keep their defaults).
        const spillway::adamw_config adam{.lr = 1e-2f, .weight_decay = 0.01f};
        std::vector<float> params = model.initial_params(1);       // the trainer's fp32 parameters
        std::vector<float> grad(params.size());                    // what backward computes
        std::vector<spillway::bfloat16> grad_bf16(params.size());  // the same, kept as bf16

        spillway::file_tier<> tier(directory);  // or a virtual_tier over several paths (step 4)

        spillway::pipeline_config config;
        config.param_count = params.size();
        config.subgroup_size = 8192;  // parameters per subgroup: one 96 KiB blob on the tier
        config.host_buffers = 5;      // 3 stream (read, update, write); the other 2 stay resident
        config.adam = adam;           // lr, betas, eps, weight decay: torch.optim.AdamW's formula
        // <the tier's type, the gradients' element type, the element type of the compute copy>
        spillway::update_pipeline<spillway::file_tier<>, spillway::bfloat16, float> pipeline(
            tier, config, params);
        // [step-2-end]
        const double initial_loss = model.loss(params);
        for (int step = 1; step <= steps; ++step) {
            // [step-2-loop-begin]
            pipeline.begin_prefetch();          // the update's first reads overlap backward
            model.gradient(params, grad);       // your backward pass
            spillway::narrow(grad, grad_bf16);  // gradients stay bf16 in host memory
            spillway::step_result result =
                pipeline.update(grad_bf16, params);  // params <- updated fp32 copy
            // [step-2-loop-end]
            expect(result == spillway::step_result::applied, "every step is applied (no overflow)");

            // [step-2-stats-begin]
            const spillway::update_stats& s = pipeline.last_stats();
            std::printf(
                "step %2lld: %zu subgroups read (%zu during backward), %zu served from the "
                "resident set, "
                "read wait %.2f ms, compute %.2f ms\n",
                static_cast<long long>(s.step), s.subgroups_read, s.served_from_prefetch,
                s.served_from_resident, s.read_wait_seconds * 1e3, s.compute_seconds * 1e3);
            // [step-2-stats-end]
            const std::size_t resident = config.host_buffers - 3;
            expect(s.served_from_resident == (step == 1 ? 0 : resident),
                   "every call after the first serves host_buffers - 3 subgroups without a read");
            expect(s.subgroups_read + s.served_from_resident == pipeline.subgroup_count(),
                   "every other subgroup is read from the tier");
            expect(s.served_from_prefetch == config.host_buffers - (step == 1 ? 0 : resident),
                   "begin_prefetch() started a read in every free buffer");
        }

        const std::vector<float> expected = quickstart::train_in_memory(
            model.initial_params(1), adam, steps, [&](auto w, auto g) { model.gradient(w, g); });
        std::printf("loss %.6f -> %.6f (offloaded) and %.6f (in memory)\n", initial_loss,
                    model.loss(params), model.loss(expected));
        expect(quickstart::same_bits(params, expected),
               "the offloaded optimizer gives the same parameter bits as AdamW in memory");
        expect(model.loss(params) < 0.5 * initial_loss, "the loss at least halves");
    });
}
