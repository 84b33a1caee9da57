// SPDX-License-Identifier: Apache-2.0
// examples/quickstart/larger_than_memory.cpp: step 6 of docs/integration.md. A deep MLP
// trains with its parameters in a param_stream over a file tier, under a memory budget of two
// of its eight layers, and its AdamW state (m | v) in a second stream; backward updates each
// layer as soon as its gradients are final, so neither the model, nor its gradients, nor its
// optimizer state is ever in memory whole. The program trains the same model with every
// array in memory and exits non-zero unless both runs give the same losses and final weights
// bit for bit, neither stream held more than its budget, and the parameter stream moved the
// bytes per step that docs/param_stream.md gives for room for 2 of 8 layers.
//
// Usage: larger_than_memory [SCRATCH_DIR]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <spillway/spillway.hpp>

#include "quickstart.hpp"

using quickstart::expect;

namespace {

constexpr std::size_t layers = 8, width = 64, batch = 16;
constexpr std::size_t n = width * width + width;  // floats per layer: W (width, width) | b (width)
constexpr std::size_t act_floats = batch * width;
constexpr int steps = 20;
const spillway::adamw_config adam{.lr = 3e-3f, .weight_decay = 0.01f};

/// The initial parameters of layer l: W uniform in +-sqrt(3 / width) (unit variance through
/// tanh's linear part), b = 0.
void init_layer(std::size_t l, std::span<float> p) {
    const float scale = std::sqrt(3.0f / static_cast<float>(width));
    for (std::size_t k = 0; k < width * width; ++k) p[k] = scale * quickstart::uniform(100 + l, k);
    std::fill(p.begin() + width * width, p.end(), 0.0f);
}

/// out = tanh(in W^T + b). p = W (width, width) | b (width); in, out (batch, width).
void layer_forward(std::span<const float> p, std::span<const float> in, std::span<float> out) {
    for (std::size_t r = 0; r < batch; ++r)
        for (std::size_t i = 0; i < width; ++i) {
            float z = p[width * width + i];
            for (std::size_t j = 0; j < width; ++j) z += p[i * width + j] * in[r * width + j];
            out[r * width + i] = std::tanh(z);
        }
}

/// Backward of layer_forward: from dout (batch, width) and the layer's input and output,
/// writes the layer's gradient grad = dW (width, width) | db (width) and din = dz W
/// (batch, width), where dz = dout (1 - out^2).
void layer_backward(std::span<const float> p, std::span<const float> in, std::span<const float> out,
                    std::span<const float> dout, std::span<float> grad, std::span<float> din) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    std::fill(din.begin(), din.end(), 0.0f);
    for (std::size_t r = 0; r < batch; ++r)
        for (std::size_t i = 0; i < width; ++i) {
            const float y = out[r * width + i];
            const float dz = dout[r * width + i] * (1.0f - y * y);
            grad[width * width + i] += dz;
            for (std::size_t j = 0; j < width; ++j) {
                grad[i * width + j] += dz * in[r * width + j];
                din[r * width + j] += dz * p[i * width + j];
            }
        }
}

/// loss = |out - target|^2 / (2 batch width), half the mean square error; writes
/// dout = d(loss)/d(out).
double loss_gradient(std::span<const float> out, std::span<const float> target,
                     std::span<float> dout) {
    double loss = 0;
    for (std::size_t k = 0; k < out.size(); ++k) {
        const float d = out[k] - target[k];
        loss += static_cast<double>(d) * d;
        dout[k] = d / static_cast<float>(act_floats);
    }
    return loss / (2.0 * act_floats);
}

/// The batch of `step`: random inputs x (batch, width) and the targets a fixed random teacher
/// gives them, tanh(x T^T) with T (width, width).
void make_batch(int step, std::span<float> x, std::span<float> target) {
    for (std::size_t k = 0; k < act_floats; ++k)
        x[k] = quickstart::uniform(1000 + static_cast<std::uint64_t>(step), k);
    const float scale = 0.5f * std::sqrt(3.0f / static_cast<float>(width));
    for (std::size_t r = 0; r < batch; ++r)
        for (std::size_t i = 0; i < width; ++i) {
            float z = 0;
            for (std::size_t j = 0; j < width; ++j)
                z += scale * quickstart::uniform(7, i * width + j) * x[r * width + j];
            target[r * width + i] = std::tanh(z);
        }
}

/// The activations of one step, kept in memory (docs/integration.md step 3 offloads them):
/// act[l] (batch, width) is the input of layer l, act[layers] the model's output.
struct step_buffers {
    std::vector<std::vector<float>> act =
        std::vector<std::vector<float>>(layers + 1, std::vector<float>(act_floats));
    std::vector<float> target = std::vector<float>(act_floats);
    std::vector<float> grad_out = std::vector<float>(act_floats);  // d(loss)/d(output of layer l)
    std::vector<float> grad_in = std::vector<float>(act_floats);   // d(loss)/d(input of layer l)
    std::vector<float> grad = std::vector<float>(n);               // layer l's gradient, reused
};

/// The trainer before Spillway: every layer's parameters, m and v in memory, one adamw_step
/// per layer in backward. Returns the loss of each step; `params` ends with the weights.
std::vector<double> train_in_memory(std::vector<std::vector<float>>& params) {
    std::vector<std::vector<float>> m(layers, std::vector<float>(n)), v = m;
    params.assign(layers, std::vector<float>(n));
    for (std::size_t l = 0; l < layers; ++l) init_layer(l, params[l]);
    step_buffers b;
    std::vector<double> losses;
    for (int step = 1; step <= steps; ++step) {
        make_batch(step, b.act[0], b.target);
        // [larger-than-memory-before-begin]
        for (std::size_t l = 0; l < layers; ++l) layer_forward(params[l], b.act[l], b.act[l + 1]);
        losses.push_back(loss_gradient(b.act[layers], b.target, b.grad_out));
        for (std::size_t l = layers; l-- > 0;) {
            layer_backward(params[l], b.act[l], b.act[l + 1], b.grad_out, b.grad, b.grad_in);
            spillway::adamw_step(adam, {.step = step}, std::span(params[l]), std::span(m[l]),
                                 std::span(v[l]), std::span<const float>(b.grad));
            std::swap(b.grad_out, b.grad_in);
        }
        // [larger-than-memory-before-end]
    }
    return losses;
}

/// A counter's growth between two stats() snapshots (for %llu).
unsigned long long delta(std::uint64_t now, std::uint64_t before) {
    return now - before;
}

}  // namespace

int main(int argc, char** argv) {
    return quickstart::run_main("larger_than_memory", [&] {
        quickstart::scratch_dir scratch(argc, argv, "larger_than_memory");
        const std::filesystem::path directory = scratch.path();

        // [larger-than-memory-streams-begin]
        spillway::file_tier<> tier(directory);  // any storage_tier: a virtual_tier over paths too

        const std::size_t layer_nbytes = n * sizeof(float);  // one blob per layer: W | b
        spillway::param_stream_options po;
        po.memory_budget = 2 * spillway::charge_of(layer_nbytes);  // 2 of the 8 layers, never more
        po.key_prefix = "params";
        spillway::param_stream params(tier, spillway::uniform_layers(layers, layer_nbytes), po);

        spillway::param_stream_options so;  // AdamW's m | v: 8 bytes per parameter
        so.memory_budget = 2 * spillway::charge_of(2 * layer_nbytes);
        so.key_prefix = "adam";
        spillway::param_stream adam_state(tier, spillway::uniform_layers(layers, 2 * layer_nbytes),
                                          so);

        for (std::size_t l = 0; l < layers; ++l) {  // first contents, written as they are made
            params.fill(l, [&](spillway::layer_update_view p) { init_layer(l, p.as<float>()); });
            adam_state.fill(
                l, [](spillway::layer_update_view s) { std::ranges::fill(s.as<float>(), 0.0f); });
        }
        // [larger-than-memory-streams-end]
        std::printf(
            "model: %zu layers of %zu B (%zu B of parameters, %zu B of m | v); budgets: "
            "%zu B for parameters, %zu B for m | v\n",
            layers, layer_nbytes, layers * layer_nbytes, 2 * layers * layer_nbytes,
            po.memory_budget, so.memory_budget);
        expect(
            po.memory_budget < params.total_bytes() && so.memory_budget < adam_state.total_bytes(),
            "each budget is below the bytes of its stream's layers");

        step_buffers b;
        std::vector<double> losses;
        double moved_per_param = 0;  // of the last step, both streams, read and written
        for (int step = 1; step <= steps; ++step) {
            make_batch(step, b.act[0], b.target);
            const spillway::param_stream_stats p0 = params.stats(), s0 = adam_state.stats();

            // [larger-than-memory-forward-begin]
            for (std::size_t l = 0; l < layers; ++l) {
                spillway::layer_view p = params.acquire(l);  // read ahead while l - 1 computed
                layer_forward(p.as<float>(), b.act[l], b.act[l + 1]);
                params.release(l);
            }
            // [larger-than-memory-forward-end]
            losses.push_back(loss_gradient(b.act[layers], b.target, b.grad_out));

            // [larger-than-memory-backward-begin]
            for (std::size_t l = layers; l-- > 0;) {
                spillway::layer_update_view p = params.acquire_for_update(l);
                layer_backward(p.as<float>(), b.act[l], b.act[l + 1], b.grad_out, b.grad,
                               b.grad_in);
                // Layer l's gradients are final: update it now, then drop them.
                std::span<float> mv = adam_state.acquire_for_update(l).as<float>();
                spillway::adamw_step(adam, {.step = step}, p.as<float>(), mv.first(n), mv.last(n),
                                     std::span<const float>(b.grad));  // m | v: n floats each
                adam_state.release(l, spillway::layer_change::updated);
                params.release(l, spillway::layer_change::updated);  // written back when evicted
                std::swap(b.grad_out, b.grad_in);
            }
            // [larger-than-memory-backward-end]

            // [larger-than-memory-stats-begin]
            const spillway::param_stream_stats p1 = params.stats(), s1 = adam_state.stats();
            std::printf(
                "step %2d: loss %.6f | params read %6llu B, written %6llu B | m, v read "
                "%6llu B, written %6llu B\n",
                step, losses.back(), delta(p1.bytes_read, p0.bytes_read),
                delta(p1.bytes_written, p0.bytes_written), delta(s1.bytes_read, s0.bytes_read),
                delta(s1.bytes_written, s0.bytes_written));
            // [larger-than-memory-stats-end]
            moved_per_param =
                static_cast<double>(
                    delta(p1.bytes_read + p1.bytes_written + s1.bytes_read + s1.bytes_written,
                          p0.bytes_read + p0.bytes_written + s0.bytes_read + s0.bytes_written)) /
                static_cast<double>(layers * n);
            if (step > 1) {  // docs/param_stream.md: room for k = 2 of N = 8 layers
                expect(delta(p1.reads, p0.reads) == 2 * (layers - 2),
                       "the parameter stream reads 2(N - k) layers a step");
                expect(delta(p1.writes, p0.writes) == std::min(layers, 2 * (layers - 2)),
                       "the parameter stream writes min(N, 2(N - k)) layers a step");
                expect(delta(p1.served_resident, p0.served_resident) == 2 * 2,
                       "2k acquires a step are served from memory");
            }
        }
        const spillway::param_stream_stats ps = params.stats(), ss = adam_state.stats();
        std::printf(
            "peak resident: params %zu B of a %zu B budget, m | v %zu B of a %zu B budget\n",
            ps.peak_resident_bytes, ps.memory_budget, ss.peak_resident_bytes, ss.memory_budget);
        std::printf(
            "moved per parameter per step: %.1f B (params 6 B read + 4 B written with 2 of 8 "
            "layers kept across each turn, m | v 8 B + 8 B)\n",
            moved_per_param);
        expect(moved_per_param == 26.0, "a step moves 26 B per parameter (docs/param_stream.md)");
        expect(ps.peak_resident_bytes <= ps.memory_budget,
               "the parameter stream never held more than its budget");
        expect(ss.peak_resident_bytes <= ss.memory_budget,
               "the optimizer state stream never held more than its budget");

        std::vector<std::vector<float>> expected;
        const std::vector<double> expected_losses = train_in_memory(expected);
        std::printf("loss %.6f -> %.6f streamed, %.6f -> %.6f in memory\n", losses.front(),
                    losses.back(), expected_losses.front(), expected_losses.back());
        for (int step = 0; step < steps; ++step)
            expect(std::memcmp(&losses[step], &expected_losses[step], sizeof(double)) == 0,
                   "step " + std::to_string(step + 1) +
                       ": the streamed loss has the bits of the in-memory one");
        for (std::size_t l = 0; l < layers; ++l) {
            spillway::layer_view p = params.acquire(l);
            const bool same = quickstart::same_bits(p.as<float>(), expected[l]);
            params.release(l);
            expect(same, "layer " + std::to_string(l) +
                             ": the streamed weights have the bits of the in-memory ones");
        }
        expect(losses.back() < 0.75 * losses.front(), "the loss falls by at least a quarter");
    });
}
