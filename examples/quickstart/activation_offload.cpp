// SPDX-License-Identifier: Apache-2.0
// examples/quickstart/activation_offload.cpp: step 3 of docs/integration.md. A toy MLP hands
// the activations its backward pass needs to an activation stash over a file tier, which
// writes them out while forward goes on and reads them back, in reverse, for backward. The
// program computes the weight gradients of three batches with every activation kept in
// memory and through the stash, and exits non-zero unless they have the same bits and the
// stash stayed within its memory budget while offloading.
//
// Usage: activation_offload [SCRATCH_DIR]
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <spillway/spillway.hpp>

#include "quickstart.hpp"

using quickstart::expect;

namespace {

constexpr std::size_t layers = 8, width = 128, batch = 16;
constexpr std::size_t act_floats = batch * width;
constexpr std::size_t act_bytes = act_floats * sizeof(float);

/// out = relu(in W^T). in, out (batch, width); w (width, width).
void layer_forward(std::span<const float> w, std::span<const float> in, std::span<float> out) {
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t i = 0; i < width; ++i) {
            float z = 0;
            for (std::size_t j = 0; j < width; ++j) z += w[i * width + j] * in[b * width + j];
            out[b * width + i] = z > 0 ? z : 0;
        }
}

/// Backward of layer_forward: from dout (batch, width) and the layer's saved input and
/// output, adds dz^T in to dw (width, width) and writes din = dz W (batch, width).
void layer_backward(std::span<const float> w, std::span<const float> in, std::span<const float> out,
                    std::span<const float> dout, std::span<float> dw, std::span<float> din) {
    std::fill(din.begin(), din.end(), 0.0f);
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t i = 0; i < width; ++i) {
            const float dz = out[b * width + i] > 0 ? dout[b * width + i] : 0.0f;
            for (std::size_t j = 0; j < width; ++j) {
                dw[i * width + j] += dz * in[b * width + j];
                din[b * width + j] += dz * w[i * width + j];
            }
        }
}

/// d(loss)/d(out) of loss = |out - target|^2 / (2 batch).
void loss_gradient(std::span<const float> out, std::span<const float> target, std::span<float> dout) {
    for (std::size_t k = 0; k < out.size(); ++k) dout[k] = (out[k] - target[k]) / static_cast<float>(batch);
}

struct toy_mlp {
    std::vector<std::vector<float>> w;  // layers x (width, width)
    std::vector<float> x, target;       // one batch (batch, width) each
};

toy_mlp make_mlp(std::uint64_t seed) {
    toy_mlp net;
    for (std::size_t l = 0; l < layers; ++l) {
        net.w.emplace_back(width * width);
        for (std::size_t k = 0; k < width * width; ++k)
            net.w[l][k] = 2.0f * quickstart::uniform(seed + l, k) / std::sqrt(static_cast<float>(width));
    }
    return net;
}

void new_batch(toy_mlp& net, std::uint64_t step) {
    net.x.resize(act_floats);
    net.target.resize(act_floats);
    for (std::size_t k = 0; k < act_floats; ++k) {
        net.x[k] = quickstart::uniform(1000 + step, k);
        net.target[k] = quickstart::uniform(2000 + step, k);
    }
}

/// The weight gradients with every activation kept in memory: the reference.
std::vector<std::vector<float>> gradients_in_memory(const toy_mlp& net) {
    std::vector<std::vector<float>> h(layers + 1, std::vector<float>(act_floats)), dw(layers);
    h[0] = net.x;
    for (std::size_t l = 0; l < layers; ++l) layer_forward(net.w[l], h[l], h[l + 1]);
    std::vector<float> dout(act_floats), din(act_floats);
    loss_gradient(h[layers], net.target, dout);
    for (std::size_t l = layers; l-- > 0;) {
        dw[l].assign(width * width, 0.0f);
        layer_backward(net.w[l], h[l], h[l + 1], dout, dw[l], din);
        dout.swap(din);
    }
    return dw;
}

std::span<const float> floats(std::span<const std::byte> bytes) {
    return {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)};
}

// [step-3-desc-begin]
/// Activation h_l of one step: its identity is (storage, version, dtype, shape, strides),
/// never its address. The trainer bumps the version whenever it rewrites the storage.
spillway::tensor_desc activation(std::size_t l, std::uint64_t step) {
    spillway::tensor_desc d;
    d.name = "h" + std::to_string(l);             // for error messages
    d.storage_id = l;                             // your framework's storage id
    d.version = step;                             // rewritten every step
    d.type = spillway::dtype::f32;
    d.shape = {batch, width};                     // contiguous (strides left empty)
    d.layer = static_cast<std::uint32_t>(l);      // layer scope, in forward order
    return d;
}
// [step-3-desc-end]

}  // namespace

int main(int argc, char** argv) {
    return quickstart::run_main("activation_offload", [&] {
        quickstart::scratch_dir scratch(argc, argv, "activation_offload");
        const std::filesystem::path directory = scratch.path();
        toy_mlp net = make_mlp(11);

        // [step-3-begin]
        spillway::file_tier<> tier(directory);

        spillway::stash_options options;
        options.keep_below_bytes = 4096;         // smaller tensors stay in memory
        options.memory_budget = 4 * act_bytes;   // resident activations never exceed this
        options.prefetch_layers = 1;             // layers read ahead of backward
        spillway::activation_stash<spillway::file_tier<>> stash(tier, options);
        // [step-3-end]

        for (std::uint64_t step = 1; step <= 3; ++step) {
            new_batch(net, step);
            std::vector<float> dout(act_floats), din(act_floats);
            std::vector<std::vector<float>> dw(layers, std::vector<float>(width * width));

            // [step-3-forward-begin]
            std::vector<spillway::stash_handle> saved(layers + 1);  // saved[l]: h_l, the input of layer l
            spillway::aligned_buffer in;                            // h_l; layer 0 reads the batch
            for (std::size_t l = 0; l < layers; ++l) {
                spillway::aligned_buffer out = stash.allocate(act_bytes);  // from the stash's pool
                layer_forward(net.w[l], l == 0 ? std::span<const float>(net.x) : in.as<float>(), out.as<float>());
                if (l > 0) saved[l] = stash.save(activation(l, step), std::move(in));  // read: hand over, no copy
                in = std::move(out);
            }
            loss_gradient(in.as<float>(), net.target, dout);
            saved[layers] = stash.save(activation(layers, step), std::move(in));
            // [step-3-forward-end]

            // [step-3-backward-begin]
            for (std::size_t l = layers; l-- > 0;) {
                std::span<const float> out = floats(stash.load(saved[l + 1]));  // waits only if the read is late
                std::span<const float> input = l > 0 ? floats(stash.load(saved[l])) : std::span<const float>(net.x);
                layer_backward(net.w[l], input, out, dout, dw[l], din);
                stash.release(saved[l + 1]);  // done with h_{l+1}: its memory and its blob are freed
                dout.swap(din);
            }
            // [step-3-backward-end]

            const auto expected = gradients_in_memory(net);
            for (std::size_t l = 0; l < layers; ++l)
                expect(quickstart::same_bits(dw[l], expected[l]),
                       "step " + std::to_string(step) + ", layer " + std::to_string(l) +
                           ": the gradients through the stash equal those with everything in memory");
        }

        // [step-3-stats-begin]
        spillway::stash_stats s = stash.stats();
        std::printf("saved %llu KiB, offloaded %llu KiB, read back %llu KiB, forwarded %llu KiB, "
                    "peak resident %zu KiB (budget %zu KiB), backward waited %.2f ms\n",
                    static_cast<unsigned long long>(s.bytes_saved >> 10),
                    static_cast<unsigned long long>(s.bytes_offloaded >> 10),
                    static_cast<unsigned long long>(s.bytes_loaded >> 10),
                    static_cast<unsigned long long>(s.bytes_forwarded >> 10), s.peak_resident_bytes >> 10,
                    options.memory_budget >> 10, s.load_wait_seconds * 1e3);
        // [step-3-stats-end]
        expect(s.peak_resident_bytes <= options.memory_budget, "the stash never held more than its budget");
        expect(options.memory_budget < layers * act_bytes, "the budget is below what keeping every activation needs");
        expect(s.bytes_offloaded > 0 && s.bytes_loaded > 0, "activations went to the tier and came back");
    });
}
