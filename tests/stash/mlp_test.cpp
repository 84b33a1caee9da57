// SPDX-License-Identifier: Apache-2.0
// A two-layer MLP trained for a few SGD steps with its saved activations in an
// activation_stash over a file tier gives bit-identical gradients and weights to the same
// network keeping everything in memory.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

#include <spillway/stash/activation_stash.hpp>
#include <spillway/tier/file_tier.hpp>

#include "stash/stash_support.hpp"
#include "support/temp_dir.hpp"

using namespace spillway;

namespace {

constexpr int B = 64, D = 96, H = 160, O = 16;  // batch, input, hidden, output

struct params {
    std::vector<float> w1, b1, w2, b2;  // w1 (D,H), b1 (H), w2 (H,O), b2 (O)
};
struct grads {
    std::vector<float> w1, b1, w2, b2;
    friend bool operator==(const grads&, const grads&) = default;
};

params init_params() {
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.0f, 0.1f);
    params p{std::vector<float>(D * H), std::vector<float>(H), std::vector<float>(H * O), std::vector<float>(O)};
    for (auto* v : {&p.w1, &p.b1, &p.w2, &p.b2})
        for (auto& x : *v) x = dist(rng);
    return p;
}

std::vector<float> batch(int step, int cols, unsigned salt) {
    std::mt19937 rng(1000u * static_cast<unsigned>(step) + salt);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(B) * static_cast<std::size_t>(cols));
    for (auto& x : v) x = dist(rng);
    return v;
}

// out (n,m) = a (n,k) x b (k,m); a and b given by element accessors so views work.
template <class A, class Bm>
std::vector<float> matmul(int n, int k, int m, A a, Bm b) {
    std::vector<float> out(static_cast<std::size_t>(n) * static_cast<std::size_t>(m), 0.0f);
    for (int i = 0; i < n; ++i)
        for (int p = 0; p < k; ++p) {
            float av = a(i, p);
            for (int j = 0; j < m; ++j) out[static_cast<std::size_t>(i * m + j)] += av * b(p, j);
        }
    return out;
}

std::span<const std::byte> as_bytes(const std::vector<float>& v) { return std::as_bytes(std::span(v)); }

std::vector<float> as_floats(std::span<const std::byte> b) {
    std::vector<float> v(b.size() / sizeof(float));
    std::memcpy(v.data(), b.data(), b.size());
    return v;
}

/// Where forward puts what backward needs: the trainer itself, or a stash.
class saver {
public:
    virtual ~saver() = default;
    virtual void begin_layer(std::uint32_t) {}
    virtual void end_layer() {}
    virtual std::size_t save(const tensor_desc& d, const std::vector<float>& v) = 0;
    virtual void start_backward() {}
    virtual std::vector<float> load(std::size_t slot) = 0;
    virtual void release(std::size_t) {}
};

class in_memory : public saver {
public:
    std::size_t save(const tensor_desc&, const std::vector<float>& v) override {
        kept_.push_back(v);
        return kept_.size() - 1;
    }
    std::vector<float> load(std::size_t slot) override { return kept_[slot]; }
    void reset() { kept_.clear(); }

private:
    std::vector<std::vector<float>> kept_;
};

template <class Tier>
class stashed : public saver {
public:
    stashed(activation_stash<Tier>& stash, bool flush_before_backward)
        : stash_(stash), flush_(flush_before_backward) {}
    void begin_layer(std::uint32_t l) override { stash_.begin_layer(l); }
    void end_layer() override { stash_.end_layer(); }
    std::size_t save(const tensor_desc& d, const std::vector<float>& v) override {
        handles_.push_back(stash_.save(d, as_bytes(v)));
        return handles_.size() - 1;
    }
    void start_backward() override {
        if (flush_) stash_.flush();
        stash_.start_backward();
    }
    std::vector<float> load(std::size_t slot) override { return as_floats(stash_.load(handles_[slot])); }
    void release(std::size_t slot) override { stash_.release(handles_[slot]); }
    void reset() { handles_.clear(); }

private:
    activation_stash<Tier>& stash_;
    bool flush_;
    std::vector<stash_handle> handles_;
};

tensor_desc desc(const char* name, std::uint64_t storage, std::uint64_t version, std::vector<std::int64_t> shape,
                 std::vector<std::int64_t> strides = {}) {
    tensor_desc d;
    d.name = name;
    d.storage_id = storage;
    d.version = version;
    d.shape = std::move(shape);
    d.strides = std::move(strides);
    return d;
}

// One training step: forward saves, backward loads; returns the gradients and applies SGD.
grads train_step(params& p, int step, saver& s) {
    auto x = batch(step, D, 1), target = batch(step, O, 2);
    const auto v = static_cast<std::uint64_t>(step);  // each step's buffers are new versions
    // ---- forward ----
    s.begin_layer(0);
    // a1 (B,H) = x (B,D) w1 (D,H) + b1
    auto a1 = matmul(B, D, H, [&](int i, int k) { return x[static_cast<std::size_t>(i * D + k)]; },
                     [&](int k, int j) { return p.w1[static_cast<std::size_t>(k * H + j)]; });
    for (int i = 0; i < B; ++i)
        for (int j = 0; j < H; ++j) a1[static_cast<std::size_t>(i * H + j)] += p.b1[static_cast<std::size_t>(j)];
    auto slot_x = s.save(desc("x", 1, v, {B, D}), x);
    auto slot_a1 = s.save(desc("a1", 2, v, {B, H}), a1);
    std::vector<float> h(a1.size());
    for (std::size_t i = 0; i < a1.size(); ++i) h[i] = a1[i] > 0 ? a1[i] : 0.0f;
    auto slot_h_relu = s.save(desc("h", 3, v, {B, H}), h);  // relu saves its output
    s.end_layer();
    s.begin_layer(1);
    auto slot_h = s.save(desc("h", 3, v, {B, H}), h);  // linear 2 saves its input: the same tensor
    // linear 2 also keeps h^T as a view of the same storage: other strides, another tensor
    auto slot_ht = s.save(desc("h^T", 3, v, {H, B}, {1, H}), h);
    auto y = matmul(B, H, O, [&](int i, int k) { return h[static_cast<std::size_t>(i * H + k)]; },
                    [&](int k, int j) { return p.w2[static_cast<std::size_t>(k * O + j)]; });
    for (int i = 0; i < B; ++i)
        for (int j = 0; j < O; ++j) y[static_cast<std::size_t>(i * O + j)] += p.b2[static_cast<std::size_t>(j)];
    s.end_layer();
    // The trainer's activation buffers die here (poisoned, so backward can only use saved copies).
    for (auto* buf : {&x, &a1, &h}) std::fill(buf->begin(), buf->end(), std::numeric_limits<float>::quiet_NaN());

    // ---- backward ----  loss = 0.5 * sum((y - t)^2) / B
    s.start_backward();
    std::vector<float> dy(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) dy[i] = (y[i] - target[i]) / static_cast<float>(B);
    grads g;
    {
        auto ht = s.load(slot_ht);  // (H,B) view laid out as h's storage
        auto hh = s.load(slot_h);
        // dw2 (H,O) = h^T (H,B) dy (B,O): read h^T through its strides
        g.w2 = matmul(H, B, O, [&](int i, int k) { return ht[static_cast<std::size_t>(i + k * H)]; },
                      [&](int k, int j) { return dy[static_cast<std::size_t>(k * O + j)]; });
        CHECK(std::memcmp(ht.data(), hh.data(), hh.size() * sizeof(float)) == 0);
        s.release(slot_ht);
        s.release(slot_h);
    }
    g.b2.assign(O, 0.0f);
    for (int i = 0; i < B; ++i)
        for (int j = 0; j < O; ++j) g.b2[static_cast<std::size_t>(j)] += dy[static_cast<std::size_t>(i * O + j)];
    // dh (B,H) = dy (B,O) w2^T (O,H)
    auto dh = matmul(B, O, H, [&](int i, int k) { return dy[static_cast<std::size_t>(i * O + k)]; },
                     [&](int k, int j) { return p.w2[static_cast<std::size_t>(j * O + k)]; });
    {
        auto hr = s.load(slot_h_relu);
        auto a1s = s.load(slot_a1);
        bool consistent = true;
        for (std::size_t i = 0; i < dh.size(); ++i) {
            consistent = consistent && (hr[i] > 0) == (a1s[i] > 0);
            if (!(a1s[i] > 0)) dh[i] = 0.0f;  // relu'
        }
        CHECK(consistent);
        s.release(slot_h_relu);
        s.release(slot_a1);
    }
    auto xs = s.load(slot_x);
    g.w1 = matmul(D, B, H, [&](int i, int k) { return xs[static_cast<std::size_t>(k * D + i)]; },
                  [&](int k, int j) { return dh[static_cast<std::size_t>(k * H + j)]; });
    s.release(slot_x);
    g.b1.assign(H, 0.0f);
    for (int i = 0; i < B; ++i)
        for (int j = 0; j < H; ++j) g.b1[static_cast<std::size_t>(j)] += dh[static_cast<std::size_t>(i * H + j)];

    const float lr = 0.05f;
    for (std::size_t i = 0; i < p.w1.size(); ++i) p.w1[i] -= lr * g.w1[i];
    for (std::size_t i = 0; i < p.b1.size(); ++i) p.b1[i] -= lr * g.b1[i];
    for (std::size_t i = 0; i < p.w2.size(); ++i) p.w2[i] -= lr * g.w2[i];
    for (std::size_t i = 0; i < p.b2.size(); ++i) p.b2[i] -= lr * g.b2[i];
    return g;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("a two-layer MLP over a file tier gives bit-identical gradients to keeping everything") {
    const int steps = 3;
    params ref = init_params();
    std::vector<grads> ref_grads;
    for (int step = 0; step < steps; ++step) {
        in_memory mem;
        ref_grads.push_back(train_step(ref, step, mem));
    }
    CHECK_FALSE(ref_grads[0] == ref_grads[1]);  // the weights really moved

    struct variant {
        const char* name;
        stash_options opts;
        bool flush_before_backward;
    };
    auto base = [] {
        stash_options o;
        o.keep_below_bytes = 0;
        o.pool_limit = 0;
        return o;
    };
    std::vector<variant> variants;
    {
        auto o = base();
        o.split = split_mode::offload_all;
        variants.push_back({"offload all, read back from files", o, true});
        variants.push_back({"offload all, forwarding allowed", o, false});
        o.memory_budget = 80 * 1024;
        variants.push_back({"offload all, tight budget", o, true});
        o = base();
        o.split = split_mode::adaptive;
        o.probe_bytes = 1 << 20;
        variants.push_back({"adaptive", o, true});
        o = base();
        o.split = split_mode::fixed;
        o.first_kept_layer = 1;
        variants.push_back({"fixed split", o, true});
    }
    test::temp_dir dir("stash-mlp");
    file_tier<> tier(dir.path());
    for (auto& var : variants) {
        std::string name = var.name;
        CAPTURE(name);
        params p = init_params();
        activation_stash stash(tier, var.opts);
        for (int step = 0; step < steps; ++step) {
            stashed<file_tier<>> s(stash, var.flush_before_backward);
            auto g = train_step(p, step, s);
            CHECK(bit_identical(g.w1, ref_grads[static_cast<std::size_t>(step)].w1));
            CHECK(bit_identical(g.b1, ref_grads[static_cast<std::size_t>(step)].b1));
            CHECK(bit_identical(g.w2, ref_grads[static_cast<std::size_t>(step)].w2));
            CHECK(bit_identical(g.b2, ref_grads[static_cast<std::size_t>(step)].b2));
        }
        CHECK(bit_identical(p.w1, ref.w1));
        CHECK(bit_identical(p.w2, ref.w2));
        auto st = stash.stats();
        const std::uint64_t h_bytes = std::uint64_t{B} * H * 4;
        CHECK(st.bytes_deduplicated == steps * h_bytes);  // h saved twice per step
        CHECK(st.tensors == steps * 4u);                  // x, a1, h, h^T
        if (var.opts.split == split_mode::offload_all && var.flush_before_backward)
            CHECK(st.bytes_loaded == st.bytes_offloaded);  // everything came back from files
        if (var.opts.split == split_mode::offload_all)  // written, or forwarded before its write ended
            CHECK(st.bytes_offloaded + st.bytes_forwarded >= steps * (h_bytes * 2 + std::uint64_t{B} * (D + H) * 4));
        if (var.opts.memory_budget < std::numeric_limits<std::size_t>::max())
            CHECK(st.peak_resident_bytes <= var.opts.memory_budget);
        MESSAGE(name << ": offloaded " << st.bytes_offloaded << ", loaded " << st.bytes_loaded << ", forwarded "
                         << st.bytes_forwarded << ", kept " << st.bytes_kept << ", peak resident "
                         << st.peak_resident_bytes);
    }
    CHECK(tier.used() == 0);
}
