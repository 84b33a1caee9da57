// SPDX-License-Identifier: Apache-2.0
// Gradients of a tiny GPT-2 against central finite differences of an independent float64
// reference forward pass; the loss of a GPT-2-initialised model at step 0 against ln(V).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "blas_kernels.hpp"
#include "gpt2.hpp"

using namespace mini_gpt;

// OpenBLAS on the caller's thread, as the trainer sets it (blas::single_threaded()).
static const bool blas_single_threaded = (blas::single_threaded(), true);

namespace {

/// A plain float64 GPT-2 forward (no BLAS, no threads), written from the model's definition.
double reference_loss(const gpt2_config& c, const std::vector<double>& w, const std::vector<int>& in,
                      const std::vector<int>& tg, int B, int T) {
    param_layout lay(c);
    auto P = [&](int tensor) { return w.data() + lay.llmc_offsets[static_cast<std::size_t>(tensor)]; };
    const int C = c.channels, L = c.num_layers, NH = c.num_heads, hs = C / NH, V = c.vocab_size;
    const int Vp = c.padded_vocab_size;
    auto idx = [](int a, int b) { return static_cast<std::size_t>(a) * static_cast<std::size_t>(b); };
    std::vector<double> x(idx(B * T, C));
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < C; ++i)
                x[idx(b * T + t, C) + i] = P(0)[idx(in[idx(b, T) + t], C) + i] + P(1)[idx(t, C) + i];
    auto layernorm = [&](const std::vector<double>& inp, const double* g, const double* bb) {
        std::vector<double> out(inp.size());
        for (int r = 0; r < B * T; ++r) {
            double m = 0, v = 0;
            for (int i = 0; i < C; ++i) m += inp[idx(r, C) + i];
            m /= C;
            for (int i = 0; i < C; ++i) v += (inp[idx(r, C) + i] - m) * (inp[idx(r, C) + i] - m);
            v /= C;
            double s = 1.0 / std::sqrt(v + 1e-5);
            for (int i = 0; i < C; ++i) out[idx(r, C) + i] = (inp[idx(r, C) + i] - m) * s * g[i] + bb[i];
        }
        return out;
    };
    auto linear = [&](const std::vector<double>& inp, int IC, const double* W, const double* bias, int OC) {
        std::vector<double> out(idx(B * T, OC));
        for (int r = 0; r < B * T; ++r)
            for (int o = 0; o < OC; ++o) {
                double s = bias ? bias[o] : 0.0;
                for (int i = 0; i < IC; ++i) s += inp[idx(r, IC) + i] * W[idx(o, IC) + i];
                out[idx(r, OC) + o] = s;
            }
        return out;
    };
    for (int l = 0; l < L; ++l) {
        auto ln1 = layernorm(x, P(2) + l * C, P(3) + l * C);
        auto qkv = linear(ln1, C, P(4) + idx(l, 3 * C * C), P(5) + l * 3 * C, 3 * C);
        std::vector<double> y(idx(B * T, C), 0.0);
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < NH; ++h)
                for (int t = 0; t < T; ++t) {
                    std::vector<double> a(static_cast<std::size_t>(t + 1));
                    double mx = -1e300, sum = 0;
                    for (int u = 0; u <= t; ++u) {
                        double d = 0;
                        for (int i = 0; i < hs; ++i)
                            d += qkv[idx(b * T + t, 3 * C) + h * hs + i] * qkv[idx(b * T + u, 3 * C) + C + h * hs + i];
                        a[static_cast<std::size_t>(u)] = d / std::sqrt(static_cast<double>(hs));
                        mx = std::max(mx, a[static_cast<std::size_t>(u)]);
                    }
                    for (auto& e : a) sum += (e = std::exp(e - mx));
                    for (int u = 0; u <= t; ++u)
                        for (int i = 0; i < hs; ++i)
                            y[idx(b * T + t, C) + h * hs + i] +=
                                a[static_cast<std::size_t>(u)] / sum * qkv[idx(b * T + u, 3 * C) + 2 * C + h * hs + i];
                }
        auto proj = linear(y, C, P(6) + idx(l, C * C), P(7) + l * C, C);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
        auto ln2 = layernorm(x, P(8) + l * C, P(9) + l * C);
        auto h = linear(ln2, C, P(10) + idx(l, 4 * C * C), P(11) + l * 4 * C, 4 * C);
        for (auto& e : h) e = 0.5 * e * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (e + 0.044715 * e * e * e)));
        auto mlp = linear(h, 4 * C, P(12) + idx(l, 4 * C * C), P(13) + l * C, C);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
    }
    auto lnf = layernorm(x, P(14), P(15));
    auto logits = linear(lnf, C, P(0), nullptr, Vp);
    double loss = 0;
    for (int r = 0; r < B * T; ++r) {
        double mx = -1e300, sum = 0;
        for (int i = 0; i < V; ++i) mx = std::max(mx, logits[idx(r, Vp) + i]);
        for (int i = 0; i < V; ++i) sum += std::exp(logits[idx(r, Vp) + i] - mx);
        loss += -(logits[idx(r, Vp) + tg[static_cast<std::size_t>(r)]] - mx - std::log(sum));
    }
    return loss / (B * T);
}

gpt2_config tiny_config() {
    gpt2_config c;
    c.max_seq_len = 8;
    c.vocab_size = 60;
    c.padded_vocab_size = 64;  // padded: the last 4 rows of wte are never used
    c.num_layers = 2;
    c.num_heads = 4;
    c.channels = 16;
    return c;
}

}  // namespace

TEST_CASE("gradients of a tiny GPT-2 match float64 finite differences") {
    // Two threads: the row-parallel kernels (embedding, LayerNorm, attention, softmax) are
    // split between them. At these sizes every matrix product, elementwise kernel (GELU,
    // residual) and sum over rows is one piece, so their splits are not exercised here:
    // kernels_test checks them against float64 at sizes that split.
    spillway::thread_pool pool(1);
    gpt2_config c = tiny_config();
    gpt2 model(c, pool);
    const int B = 2, T = 7;
    std::mt19937_64 rng(42);
    std::normal_distribution<float> nd(0.0f, 0.15f);
    param_layout lay(c);
    // The reference reads llm.c's order; the model keeps its own (layer-major): the checks
    // below go through the conversion, so they test it too.
    std::vector<float> llmc(lay.total);
    for (auto& x : llmc) x = nd(rng);
    for (int tensor : {2, 8, 14})  // LayerNorm weights around 1
        for (std::size_t i = 0; i < lay.sizes[static_cast<std::size_t>(tensor)]; ++i)
            llmc[lay.llmc_offsets[static_cast<std::size_t>(tensor)] + i] += 1.0f;
    model.load_llmc_params(llmc);
    std::vector<int> in(B * T), tg(B * T);
    std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
    for (auto& x : in) x = tok(rng);
    for (auto& x : tg) x = tok(rng);

    in_memory_store store(c, B, T);
    float loss = model.forward(in.data(), tg.data(), B, T, store);
    // backward overwrites every gradient: poison the block so that one it missed shows.
    std::fill(model.grads().begin(), model.grads().end(), std::numeric_limits<float>::quiet_NaN());
    const float loss_scale = 4.0f;  // a power of two: the scaled gradients are exact multiples
    model.backward(loss_scale, store);

    const std::vector<float> llmc_params = model.llmc_params();
    CHECK(llmc_params == llmc);
    std::vector<float> grads(lay.total);
    lay.to_llmc_order(model.grads(), grads);
    std::vector<double> w(llmc_params.begin(), llmc_params.end());
    double ref = reference_loss(c, w, in, tg, B, T);
    CHECK(std::abs(loss - ref) <= 1e-5 * std::abs(ref));

    // Every tensor: a sample of entries (all of the small ones) by central differences.
    const double h = 1e-5;
    int checked = 0;
    double worst = 0;
    for (int tensor = 0; tensor < num_param_tensors; ++tensor) {
        std::size_t off = lay.llmc_offsets[static_cast<std::size_t>(tensor)], n = lay.sizes[static_cast<std::size_t>(tensor)];
        std::size_t stride = std::max<std::size_t>(1, n / 24);
        for (std::size_t i = (static_cast<std::size_t>(tensor) * 7) % stride; i < n; i += stride) {
            std::size_t k = off + i;
            double saved = w[k];
            w[k] = saved + h;
            double lp = reference_loss(c, w, in, tg, B, T);
            w[k] = saved - h;
            double lm = reference_loss(c, w, in, tg, B, T);
            w[k] = saved;
            double fd = (lp - lm) / (2 * h);
            double an = grads[k] / loss_scale;
            double err = std::abs(an - fd);
            worst = std::max(worst, err / (1e-4 + std::abs(fd)));
            INFO("tensor " << param_names[static_cast<std::size_t>(tensor)] << " index " << i << ": analytic " << an
                           << ", finite differences " << fd);
            CHECK(err <= 2e-5 + 2e-3 * std::abs(fd));
            ++checked;
        }
    }
    CHECK(std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); }));
    MESSAGE("checked " << checked << " gradient entries, worst relative error " << worst);
    // The padded rows of wte never get a gradient.
    for (std::size_t i = static_cast<std::size_t>(c.vocab_size * c.channels); i < lay.sizes[0]; ++i)
        REQUIRE(grads[i] == 0.0f);
}

TEST_CASE("forward and backward give the same bits run to run, and with one thread as with two") {
    gpt2_config c = tiny_config();
    const int B = 3, T = 8;
    std::vector<int> in(B * T), tg(B * T);
    for (int i = 0; i < B * T; ++i) {
        in[static_cast<std::size_t>(i)] = (i * 7) % c.vocab_size;
        tg[static_cast<std::size_t>(i)] = (i * 13 + 5) % c.vocab_size;
    }
    auto run = [&](std::size_t workers) {
        spillway::thread_pool pool(workers);
        gpt2 model(c, pool);
        model.init_gpt2(7);
        in_memory_store store(c, B, T);
        float loss = model.forward(in.data(), tg.data(), B, T, store);
        model.backward(1.0f, store);
        return std::make_pair(loss, std::vector<float>(model.grads().begin(), model.grads().end()));
    };
    auto a = run(1), b = run(1);
    CHECK(a.first == b.first);
    CHECK(a.second == b.second);
    // One thread: at these sizes every matrix product, elementwise kernel and sum over rows is
    // one piece for 0 and 1 workers, and the row-parallel kernels compute each row alone in a
    // fixed order however the rows are shared out, so the loss and every gradient keep their
    // bits. (Where a product is split at other boundaries, OpenBLAS may round its slices
    // differently in the last bit: kernels_test bounds that.)
    auto one = run(0);
    CHECK(one.first == a.first);
    CHECK(one.second == a.second);
}

TEST_CASE("forward asks its param_gate for each layer in order, before it reads that layer") {
    // The gate is how a trainer lets forward start while the optimizer still updates the
    // parameters: here every parameter is zero until the gate for its layer put it back, so
    // a kernel that read a layer before asking would change the loss.
    spillway::thread_pool pool(1);
    gpt2_config c = tiny_config();
    const int B = 2, T = 8;
    std::vector<int> in(B * T), tg(B * T);
    for (int i = 0; i < B * T; ++i) {
        in[static_cast<std::size_t>(i)] = (i * 5 + 1) % c.vocab_size;
        tg[static_cast<std::size_t>(i)] = (i * 11 + 3) % c.vocab_size;
    }
    gpt2 model(c, pool);
    model.init_gpt2(3);
    in_memory_store store(c, B, T);
    const float expected = model.forward(in.data(), tg.data(), B, T, store);
    CHECK(model.times().param_wait_ms == 0.0);  // no gate, no wait
    const std::vector<float> saved(model.params().begin(), model.params().end());
    std::fill(model.params().begin(), model.params().end(), 0.0f);
    std::vector<int> asked;
    const param_layout& lay = model.layout();
    std::size_t covered = 0;  // the layers' ranges tile the block in order
    float loss = model.forward(in.data(), tg.data(), B, T, store, [&](int layer) {
        asked.push_back(layer);
        auto [begin, end] = lay.layer_range(layer);
        CHECK(begin == covered);
        covered = end;
        std::copy(saved.begin() + static_cast<std::ptrdiff_t>(begin), saved.begin() + static_cast<std::ptrdiff_t>(end),
                  model.params().begin() + static_cast<std::ptrdiff_t>(begin));
        if (layer == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // an update still running
    });
    std::vector<int> order;
    for (int l = -1; l <= c.num_layers; ++l) order.push_back(l);
    CHECK(asked == order);
    CHECK(covered == lay.total);
    CHECK(loss == expected);
    CHECK(model.times().param_wait_ms >= 5.0);  // the time spent in the gate is counted as waiting
}

TEST_CASE("step-0 loss of a GPT-2-initialised model is near ln(V)") {
    spillway::thread_pool pool(1);
    gpt2_config c;  // the default config: V = 256
    c.num_layers = 2;
    gpt2 model(c, pool);
    model.init_gpt2(1337);
    const int B = 4, T = 32;
    std::vector<int> in(B * T), tg(B * T);
    std::mt19937 rng(3);
    for (auto& x : in) x = static_cast<int>(rng() % 256);
    for (auto& x : tg) x = static_cast<int>(rng() % 256);
    in_memory_store store(c, B, T);
    float loss = model.forward(in.data(), tg.data(), B, T, store);
    CHECK(std::abs(loss - std::log(256.0f)) < 0.05f);
    // Different seeds give different models.
    gpt2 other(c, pool);
    other.init_gpt2(1338);
    CHECK(!std::equal(model.params().begin(), model.params().end(), other.params().begin()));
}

TEST_CASE("bad configs are refused naming the field") {
    gpt2_config c;
    c.channels = 130;
    c.num_heads = 4;
    CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("not divisible by num_heads"), std::invalid_argument);
    c = gpt2_config{};
    c.padded_vocab_size = 100;
    CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("padded_vocab_size"), std::invalid_argument);
}
