// SPDX-License-Identifier: Apache-2.0
// The gpu_offload example's MLP kernels (examples/gpu_offload/mlp_step.hpp) on Thrust's CPU
// backend: the loss and every gradient against an independent double-precision forward and
// backward on random data, so the kernels the GPU runs are checked on machines without one.
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

TEST_CASE("gpu_offload MLP step on the CPU backend: loss and gradients match a double reference") {
    gpu_offload::mlp_shape s{.batch = 5, .in = 12, .hidden = 20, .out = 3};
    const float loss_scale = 256.0f;
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(s.batch * s.in), t(s.batch * s.out);
    for (auto& v : x) v = u(rng);
    for (auto& v : t) v = u(rng);
    std::vector<float16> params(s.params()), grads(s.params());
    for (auto& p : params) p = from_float<float16>(u(rng) * 0.5f);
    std::vector<float> h_pre(s.batch * s.hidden), y(s.batch * s.out), loss(s.batch), dy(s.batch * s.out),
        dh(s.batch * s.hidden);
    gpu_offload::mlp_tensors m{.s = s, .x = x.data(), .t = t.data(), .params = params.data(), .h_pre = h_pre.data(),
                               .y = y.data(), .sample_loss = loss.data(), .dy = dy.data(), .dh = dh.data(),
                               .grads = grads.data(),
                               .dy_coef = 2.0f * loss_scale / static_cast<float>(s.batch * s.out)};
    gpu_offload::forward_hidden(thrust::device, m);
    gpu_offload::forward_output(thrust::device, m);
    gpu_offload::backward(thrust::device, m);

    // The reference: the same network in double, gradients by the chain rule.
    auto P = [&](std::size_t i) { return static_cast<double>(to_float(params[i])); };
    const double n_out = static_cast<double>(s.batch * s.out);
    std::vector<double> hp(s.batch * s.hidden), dyr(s.batch * s.out), g(s.params(), 0.0);
    double ref_loss = 0;
    for (std::size_t b = 0; b < s.batch; ++b) {
        for (std::size_t j = 0; j < s.hidden; ++j) {
            double a = P(s.b1() + j);
            for (std::size_t i = 0; i < s.in; ++i) a += x[b * s.in + i] * P(s.w1() + i * s.hidden + j);
            hp[b * s.hidden + j] = a;
        }
        for (std::size_t k = 0; k < s.out; ++k) {
            double a = P(s.b2() + k);
            for (std::size_t j = 0; j < s.hidden; ++j) a += std::max(hp[b * s.hidden + j], 0.0) * P(s.w2() + j * s.out + k);
            double d = a - t[b * s.out + k];
            ref_loss += d * d / n_out;
            dyr[b * s.out + k] = 2 * d / n_out;
        }
    }
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t j = 0; j < s.hidden; ++j) {
            double h = std::max(hp[b * s.hidden + j], 0.0), dhj = 0;
            for (std::size_t k = 0; k < s.out; ++k) {
                g[s.w2() + j * s.out + k] += h * dyr[b * s.out + k];
                dhj += dyr[b * s.out + k] * P(s.w2() + j * s.out + k);
            }
            if (hp[b * s.hidden + j] <= 0) dhj = 0;
            for (std::size_t i = 0; i < s.in; ++i) g[s.w1() + i * s.hidden + j] += x[b * s.in + i] * dhj;
            g[s.b1() + j] += dhj;
        }
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t k = 0; k < s.out; ++k) g[s.b2() + k] += dyr[b * s.out + k];

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
