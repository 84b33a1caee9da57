// SPDX-License-Identifier: Apache-2.0
// The gpu_offload example's MLP kernels (examples/gpu_offload/mlp_step.hpp) on Thrust's CPU
// backend: the loss and every gradient against an independent double-precision forward and
// backward on random data, for one hidden layer and for several, so the kernels the GPU
// runs are checked on machines without one.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <thrust/execution_policy.h>

#include "gpu_offload/mlp_step.hpp"

using spillway::float16;
using spillway::from_float;
using spillway::to_float;

namespace {
void check_against_double(const gpu_offload::mlp_shape& s) {
    CAPTURE(s.layers);
    const float loss_scale = 256.0f;
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(s.batch * s.in), t(s.batch * s.out);
    for (auto& v : x) v = u(rng);
    for (auto& v : t) v = u(rng);
    std::vector<float16> params(s.params()), grads(s.params());
    for (auto& p : params) p = from_float<float16>(u(rng) * 0.5f);
    std::vector<float> hidden(s.layers * s.batch * s.hidden), y(s.batch * s.out), loss(s.batch),
        d0(s.backward_elements()), d1(s.backward_elements());
    gpu_offload::mlp_tensors m{.s = s, .x = x.data(), .t = t.data(), .params = params.data(), .hidden = hidden.data(),
                               .y = y.data(), .sample_loss = loss.data(), .d0 = d0.data(), .d1 = d1.data(),
                               .grads = grads.data(),
                               .dy_coef = 2.0f * loss_scale / static_cast<float>(s.batch * s.out)};
    gpu_offload::forward(thrust::device, m);
    gpu_offload::backward(thrust::device, m);

    // The reference: the same network in double, gradients by the chain rule.
    auto P = [&](std::size_t i) { return static_cast<double>(to_float(params[i])); };
    const double n_out = static_cast<double>(s.batch * s.out);
    const std::size_t n = s.linear_layers();
    // a[l]: the input of layer l after its activation (x, or relu(h_{l-1})); pre[l]: its output.
    std::vector<std::vector<double>> a(n + 1), pre(n);
    a[0].assign(x.begin(), x.end());
    for (std::size_t l = 0; l < n; ++l) {
        const std::size_t fi = s.fan_in(l), fo = s.fan_out(l), w = s.offset(l), bias = w + fi * fo;
        pre[l].assign(s.batch * fo, 0.0);
        for (std::size_t b = 0; b < s.batch; ++b)
            for (std::size_t j = 0; j < fo; ++j) {
                double acc = P(bias + j);
                for (std::size_t i = 0; i < fi; ++i) acc += a[l][b * fi + i] * P(w + i * fo + j);
                pre[l][b * fo + j] = acc;
            }
        a[l + 1].resize(pre[l].size());
        for (std::size_t i = 0; i < pre[l].size(); ++i) a[l + 1][i] = std::max(pre[l][i], 0.0);
    }
    double ref_loss = 0;
    std::vector<double> d(s.batch * s.out), g(s.params(), 0.0);
    for (std::size_t i = 0; i < d.size(); ++i) {
        const double diff = pre[n - 1][i] - t[i];
        ref_loss += diff * diff / n_out;
        d[i] = 2 * diff / n_out;
    }
    for (std::size_t l = n; l-- > 0;) {
        const std::size_t fi = s.fan_in(l), fo = s.fan_out(l), w = s.offset(l), bias = w + fi * fo;
        std::vector<double> din(s.batch * fi, 0.0);
        for (std::size_t b = 0; b < s.batch; ++b)
            for (std::size_t j = 0; j < fo; ++j) {
                const double dj = d[b * fo + j];
                g[bias + j] += dj;
                for (std::size_t i = 0; i < fi; ++i) {
                    g[w + i * fo + j] += a[l][b * fi + i] * dj;
                    din[b * fi + i] += dj * P(w + i * fo + j);
                }
            }
        if (l > 0)
            for (std::size_t i = 0; i < din.size(); ++i)
                if (pre[l - 1][i] <= 0) din[i] = 0;
        d = std::move(din);
    }

    double got_loss = 0;
    for (float l : loss) got_loss += l;
    got_loss /= n_out;
    CHECK(std::fabs(got_loss - ref_loss) <= 1e-5 * ref_loss);
    double max_ref = 0;
    for (double v : g) max_ref = std::max(max_ref, std::fabs(v));
    REQUIRE(max_ref > 0);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < s.params(); ++i) {
        double got = to_float(grads[i]) / static_cast<double>(loss_scale);
        // fp16 rounding (2^-11 relative) plus float sums over at most `hidden` terms
        if (std::fabs(got - g[i]) > 1e-3 * std::fabs(g[i]) + 1e-5 * max_ref) ++bad;
    }
    CHECK(bad == 0);
}
}  // namespace

TEST_CASE("gpu_offload MLP step on the CPU backend: loss and gradients match a double reference") {
    check_against_double({.batch = 5, .in = 12, .hidden = 20, .out = 3, .layers = 1});
}

TEST_CASE("gpu_offload deep MLP step on the CPU backend: loss and gradients match a double reference") {
    check_against_double({.batch = 4, .in = 9, .hidden = 16, .out = 5, .layers = 4});
    check_against_double({.batch = 3, .in = 24, .hidden = 6, .out = 10, .layers = 3});  // in, out wider than hidden
}
