// SPDX-License-Identifier: Apache-2.0
// tensor_layout: a tensor-major trainer (llm.c's layout: one arena per tensor kind, every
// layer in it) gathers a layer into a blob and scatters it back, for params and gradients;
// a small model trained through the offload path (param_stream for the params and the
// moments, adamw_step per gathered layer) is bit-identical to its in-memory run.
#include <doctest/doctest.h>

#include <spillway/optim/adam.hpp>
#include <spillway/stream/param_stream.hpp>
#include <spillway/stream/tensor_layout.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/temp_dir.hpp"

using namespace spillway;

namespace {

constexpr std::size_t L = 4, C = 8, V = 5;  // layers, channels, vocabulary

/// A tiny tensor-major model: its params and gradients each in one arena, as llm.c's
/// ParameterTensors: wte (V,C) | ln_w (L,C) | w (L,C,C) | b (L,C) | lnf (C).
struct tiny_model {
    static constexpr std::size_t wte = 0, ln_w = wte + V * C, w = ln_w + L * C, b = w + L * C * C,
                                 lnf = b + L * C, total = lnf + C;
    std::vector<float> params, grads;
    std::vector<float> acts;  // (L+1, C): h_0 .. h_L, and tanh(a_l) beside them
    std::vector<float> tanh_a;

    explicit tiny_model(std::uint64_t seed)
        : params(total), grads(total), acts((L + 1) * C), tanh_a(L * C) {
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<float> d(-0.5f, 0.5f);
        for (auto& p : params) p = d(rng);
    }
    // Forward of layer l: h_{l+1} = ln_w_l * tanh(w_l h_l + b_l).
    void forward_layer(std::size_t l) {
        const float* W = &params[w + l * C * C];
        for (std::size_t i = 0; i < C; ++i) {
            float a = params[b + l * C + i];
            for (std::size_t j = 0; j < C; ++j) a += W[i * C + j] * acts[l * C + j];
            tanh_a[l * C + i] = std::tanh(a);
            acts[(l + 1) * C + i] = params[ln_w + l * C + i] * tanh_a[l * C + i];
        }
    }
    // Loss = 0.5 * sum((lnf * h_L)^2); returns it and puts dL/dh_L into dh, the lnf
    // gradient into the arena (+=).
    float loss_and_top(std::vector<float>& dh) {
        float loss = 0;
        for (std::size_t i = 0; i < C; ++i) {
            const float hL = acts[L * C + i], y = params[lnf + i] * hL;
            loss += 0.5f * y * y;
            grads[lnf + i] += y * hL;
            dh[i] = y * params[lnf + i];
        }
        return loss;
    }
    // Backward of layer l: adds its params' gradients into the arena (+=, as llm.c's kernels)
    // and turns dh (dL/dh_{l+1}) into dL/dh_l.
    void backward_layer(std::size_t l, std::vector<float>& dh) {
        std::vector<float> da(C), dprev(C, 0.0f);
        const float* W = &params[w + l * C * C];
        for (std::size_t i = 0; i < C; ++i) {
            const float t = tanh_a[l * C + i];
            grads[ln_w + l * C + i] += dh[i] * t;
            da[i] = dh[i] * params[ln_w + l * C + i] * (1.0f - t * t);
            grads[b + l * C + i] += da[i];
            for (std::size_t j = 0; j < C; ++j) {
                grads[w + l * C * C + i * C + j] += da[i] * acts[l * C + j];
                dprev[j] += W[i * C + j] * da[i];
            }
        }
        dh = dprev;
    }
    // The embedding row of `token` as h_0; its gradient (+=) after backward.
    void embed(std::size_t token) {
        std::memcpy(acts.data(), &params[wte + token * C], C * sizeof(float));
    }
    void embed_backward(std::size_t token, const std::vector<float>& dh) {
        for (std::size_t i = 0; i < C; ++i) grads[wte + token * C + i] += dh[i];
    }
};

adamw_config adam() {
    return {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
}

constexpr int steps = 6;
std::size_t token_of(int step) {
    return static_cast<std::size_t>(step * 3 + 1) % V;
}

/// The in-memory run: every step zeroes the gradient arena and updates the whole params
/// arena with one adamw_step. Returns the losses; leaves the model trained.
std::vector<float> train_in_memory(tiny_model& m) {
    std::vector<float> mom(tiny_model::total, 0.0f), var(tiny_model::total, 0.0f), losses;
    for (int s = 0; s < steps; ++s) {
        std::fill(m.grads.begin(), m.grads.end(), 0.0f);
        m.embed(token_of(s));
        for (std::size_t l = 0; l < L; ++l) m.forward_layer(l);
        std::vector<float> dh(C);
        losses.push_back(m.loss_and_top(dh));
        for (std::size_t l = L; l-- > 0;) m.backward_layer(l, dh);
        m.embed_backward(token_of(s), dh);
        const adamw_step_args args{.step = s + 1};
        REQUIRE(adamw_step<float>(adam(), args, m.params, mom, var,
                                  std::span<const float>(m.grads)) == step_result::applied);
    }
    return losses;
}

/// The layer tensors of `m` as a tensor_layout (wte and lnf are not per layer: they stay in
/// memory with their own AdamW step).
tensor_layout layout_of(tiny_model& m) {
    // [tensor-major-layout-begin]
    // One kind per per-layer tensor: {name, layer 0's params, layer 0's gradients,
    // floats per layer, floats from one layer to the next}.
    float* P = m.params.data();
    float* G = m.grads.data();
    std::vector<tensor_kind> kinds;
    kinds.push_back({"ln_w", P + tiny_model::ln_w, G + tiny_model::ln_w, C, C});
    kinds.push_back({"w", P + tiny_model::w, G + tiny_model::w, C * C, C * C});
    kinds.push_back({"b", P + tiny_model::b, G + tiny_model::b, C, C});
    tensor_layout layout(L, std::move(kinds));
    // [tensor-major-layout-end]
    return layout;
}

/// The offloaded run: each layer's params on a param_stream (a blob gathered from the
/// arenas), its m and v on a backward_only stream, updated in backward layer by layer.
template <class Tier>
std::vector<float> train_offloaded(tiny_model& m, Tier& tier, std::vector<float>& final_layers) {
    const tensor_layout layout = layout_of(m);
    const std::size_t n = layout.layer_floats();
    param_stream_options po;
    po.memory_budget = 2 * charge_of(layout.layer_nbytes(), po.pages);  // two of four layers
    po.key_prefix = "tm-params";
    param_stream<Tier> params(tier, uniform_layers(L, layout.layer_nbytes()), po);
    param_stream_options so = po;
    so.memory_budget = 2 * charge_of(2 * layout.layer_nbytes(), so.pages);
    so.key_prefix = "tm-moments";
    so.pattern = visit_pattern::backward_only;
    param_stream<Tier> moments(tier, uniform_layers(L, 2 * layout.layer_nbytes()), so);
    std::vector<float> blob(n), zeros(2 * n, 0.0f);
    for (std::size_t l = 0; l < L; ++l) {  // the first contents: the arenas' layers, m = v = 0
        layout.gather_params(l, blob);
        params.store(l, std::as_bytes(std::span(blob)));
        moments.store(l, std::as_bytes(std::span(zeros)));
    }
    // The ends (wte, lnf) stay in memory.
    std::vector<float> end_m(V * C + C, 0.0f), end_v(V * C + C, 0.0f), end_p(V * C + C),
        end_g(V * C + C);
    std::vector<float> grad_blob(n), losses;
    for (int s = 0; s < steps; ++s) {
        const adamw_step_args args{.step = s + 1};
        std::fill_n(m.grads.begin() + tiny_model::wte, V * C, 0.0f);
        std::fill_n(m.grads.begin() + tiny_model::lnf, C, 0.0f);
        m.embed(token_of(s));
        for (std::size_t l = 0; l < L; ++l) {
            const auto v = params.acquire(l);
            layout.scatter_params(l, v.template as<float>());
            m.forward_layer(l);
            params.release(l);
        }
        std::vector<float> dh(C);
        losses.push_back(m.loss_and_top(dh));
        for (std::size_t l = L; l-- > 0;) {
            // [tensor-major-backward-begin]
            auto p = params.acquire_for_update(l).template as<float>();
            layout.scatter_params(l, p);  // the layer's tensors back in the arenas
            layout.zero_grads(l);         // the kernels add into their gradients
            m.backward_layer(l, dh);
            layout.gather_grads(l, grad_blob);
            auto mv = moments.acquire_for_update(l).template as<float>();
            adamw_step<float>(adam(), args, p, mv.first(n), mv.subspan(n),
                              std::span<const float>(grad_blob));
            moments.release(l, layer_change::updated);
            params.release(l, layer_change::updated);
            // [tensor-major-backward-end]
        }
        m.embed_backward(token_of(s), dh);
        // The ends: the same elementwise AdamW over their own spans.
        std::memcpy(end_p.data(), &m.params[tiny_model::wte], V * C * sizeof(float));
        std::memcpy(end_p.data() + V * C, &m.params[tiny_model::lnf], C * sizeof(float));
        std::memcpy(end_g.data(), &m.grads[tiny_model::wte], V * C * sizeof(float));
        std::memcpy(end_g.data() + V * C, &m.grads[tiny_model::lnf], C * sizeof(float));
        REQUIRE(adamw_step<float>(adam(), args, end_p, end_m, end_v,
                                  std::span<const float>(end_g)) == step_result::applied);
        std::memcpy(&m.params[tiny_model::wte], end_p.data(), V * C * sizeof(float));
        std::memcpy(&m.params[tiny_model::lnf], end_p.data() + V * C, C * sizeof(float));
    }
    final_layers.assign(L * n, 0.0f);
    for (std::size_t l = 0; l < L; ++l) {
        const auto v = params.acquire(l).template as<float>();
        std::memcpy(final_layers.data() + l * n, v.data(), n * sizeof(float));
        params.release(l);
    }
    return losses;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

}  // namespace

TEST_CASE("gather and scatter move a layer's tensors, params and gradients, bit for bit") {
    tiny_model m(7);
    for (std::size_t i = 0; i < m.grads.size(); ++i) m.grads[i] = static_cast<float>(i) * 0.25f;
    const tensor_layout layout = layout_of(m);
    CHECK(layout.layers() == L);
    CHECK(layout.layer_floats() == C + C * C + C);
    CHECK(layout.layer_nbytes() == (C + C * C + C) * sizeof(float));
    CHECK(layout.blob_offset(0) == 0);
    CHECK(layout.blob_offset(1) == C);
    CHECK(layout.blob_offset(2) == C + C * C);
    std::vector<float> blob(layout.layer_floats());
    layout.gather_params(2, blob);
    // ln_w of layer 2, then w of layer 2, then b of layer 2.
    CHECK(same_bits(std::span(blob).first(C),
                    std::span(m.params).subspan(tiny_model::ln_w + 2 * C, C)));
    CHECK(same_bits(std::span(blob).subspan(C, C * C),
                    std::span(m.params).subspan(tiny_model::w + 2 * C * C, C * C)));
    CHECK(
        same_bits(std::span(blob).last(C), std::span(m.params).subspan(tiny_model::b + 2 * C, C)));
    const auto before = m.params;
    for (auto& x : blob) x = -x;
    layout.scatter_params(2, blob);
    std::size_t changed = 0;
    for (std::size_t i = 0; i < before.size(); ++i) changed += before[i] != m.params[i];
    CHECK(changed == layout.layer_floats());  // layer 2's tensors and nothing else
    layout.gather_grads(3, blob);
    CHECK(blob[0] == static_cast<float>(tiny_model::ln_w + 3 * C) * 0.25f);
    CHECK(blob[C] == static_cast<float>(tiny_model::w + 3 * C * C) * 0.25f);
    layout.zero_grads(3);
    layout.gather_grads(3, blob);
    for (float g : blob) CHECK(g == 0.0f);
    layout.gather_grads(1, blob);
    CHECK(blob[0] != 0.0f);  // other layers keep theirs
}

TEST_CASE("bad layouts and calls are refused, naming the kind, the layer or the size") {
    tiny_model m(1);
    float* P = m.params.data();
    auto refused = [](std::size_t layers, std::vector<tensor_kind> kinds) {
        try {
            tensor_layout layout(layers, std::move(kinds));
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    CHECK(refused(L, {{.name = "w", .params = P, .count = 4, .stride = 3}})
              .find("'w': stride 3 is below its count 4") != std::string::npos);
    CHECK(refused(L, {{.name = "x", .params = nullptr, .count = 4, .stride = 4}})
              .find("'x' has no params") != std::string::npos);
    CHECK(
        refused(L, {{.name = "z", .params = P, .count = 0, .stride = 4}}).find("'z' has count 0") !=
        std::string::npos);
    CHECK(refused(0, {{.name = "a", .params = P, .count = 1, .stride = 1}})
              .find("layers must be > 0") != std::string::npos);
    // b's layer 1 starts inside a's layer 3.
    const std::string overlap =
        refused(L, {{.name = "a", .params = P, .count = 4, .stride = 4},
                    {.name = "b", .params = P + 10, .count = 2, .stride = 2}});
    CHECK(overlap.find("params of kind 'a' layer 2 overlap those of kind 'b' layer 0") !=
          std::string::npos);
    const tensor_layout layout = layout_of(m);
    std::vector<float> small(3), blob(layout.layer_floats());
    CHECK_THROWS_WITH_AS(layout.gather_params(0, small),
                         doctest::Contains("the blob has 3 floats, a layer has 80"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(layout.scatter_grads(L, blob),
                         doctest::Contains("layer 4 out of range (4 layers)"),
                         std::invalid_argument);
    const tensor_layout no_grads(
        L, {{.name = "ln_w", .params = P + tiny_model::ln_w, .count = C, .stride = C}});
    std::vector<float> one(C);
    CHECK_THROWS_WITH_AS(no_grads.gather_grads(0, one),
                         doctest::Contains("kind 'ln_w' has no gradients"), std::logic_error);
}

TEST_CASE(
    "a tensor-major model trained through the offload path is bit-identical to its in-memory run") {
    tiny_model reference(42);
    const auto want = train_in_memory(reference);
    REQUIRE(want.size() == steps);
    CHECK(want.back() != want.front());  // it trains
    auto check_run = [&](auto& tier, const char* what) {
        CAPTURE(what);
        tiny_model m(42);
        std::vector<float> layers;
        const auto got = train_offloaded(m, tier, layers);
        CHECK(same_bits(got, want));
        // Every layer's params as the stream holds them, and the ends in the arenas.
        const tensor_layout ref_layout = layout_of(reference);
        std::vector<float> blob(ref_layout.layer_floats());
        for (std::size_t l = 0; l < L; ++l) {
            ref_layout.gather_params(l, blob);
            CHECK_MESSAGE(same_bits(std::span(layers).subspan(l * blob.size(), blob.size()), blob),
                          "layer " << l << " differs");
        }
        CHECK(
            same_bits(std::span(m.params).first(V * C), std::span(reference.params).first(V * C)));
        CHECK(same_bits(std::span(m.params).last(C), std::span(reference.params).last(C)));
    };
    host_tier host;
    check_run(host, "host tier");
    test::temp_dir dir("tensor-layout");
    file_tier<> file(dir.path());
    check_run(file, "file tier");
}
