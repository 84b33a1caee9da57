// SPDX-License-Identifier: Apache-2.0
// layer_optimizer: layers of mixed sizes trained out of core over several windows, bit for bit
// against in-memory adamw_step over the same layers (fp32, bf16, fp16 with an overflow step),
// with per-step hyper-parameters; the gradients handed out zeroed; the data-parallel callback
// once per layer and step; save -> load -> continue equal to an uninterrupted run; refusals;
// and stored_bytes() against the bytes the files of a run really occupy.
#include <doctest/doctest.h>

#include <spillway/stream/layer_optimizer.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/stat.h>

#include "stream/constant_steps.hpp"
#include "support/temp_dir.hpp"

using spillway::grad_dtype;
using spillway::host_tier;
using spillway::layer_optimizer;
using spillway::layer_optimizer_options;
using spillway::step_hparams;
using spillway::step_result;

namespace {

const std::vector<std::size_t> sizes = {3000, 5120, 1500, 4096, 7001};

bool same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

float init_param(std::size_t l, std::size_t i) {
    return std::sin(static_cast<float>(l * 7919 + i)) * 0.05f;
}

/// Iteration k's gradient of layer l, element i (before any loss scale); iteration `bad`'s
/// layer 2 holds an inf.
float grad_of(int k, std::size_t l, std::size_t i, int bad) {
    if (k == bad && l == 2 && i == 17) return std::numeric_limits<float>::infinity();
    return std::cos(static_cast<float>(k * 31 + static_cast<int>(l * 101 + i))) * 0.01f;
}

step_hparams hparams_at(std::int64_t t) {
    return {1e-3f / static_cast<float>(t), t % 2 == 0 ? 0.1f : 0.0f};
}

constexpr float loss_scale = 1024.0f;

/// The same layers in memory, updated by adamw_step over each whole layer as an in-memory
/// trainer does (bf16, fp16: the gradients narrowed whole; fp16: the verdict over every
/// layer first).
struct reference {
    std::vector<std::vector<float>> p, m, v;
    spillway::adamw_config cfg;
    grad_dtype g;
    float reduce_factor = 1.0f;

    reference(grad_dtype dt, spillway::adamw_config c) : cfg(c), g(dt) {
        for (std::size_t l = 0; l < sizes.size(); ++l) {
            p.emplace_back(sizes[l]);
            m.emplace_back(sizes[l], 0.0f);
            v.emplace_back(sizes[l], 0.0f);
            for (std::size_t i = 0; i < sizes[l]; ++i) p[l][i] = init_param(l, i);
        }
    }
    bool step(std::int64_t t, int k, int bad) {
        const float scale = g == grad_dtype::fp16 ? loss_scale : 1.0f;
        std::vector<std::vector<float>> grads;
        for (std::size_t l = 0; l < sizes.size(); ++l) {
            grads.emplace_back(sizes[l]);
            for (std::size_t i = 0; i < sizes[l]; ++i)
                grads[l][i] = grad_of(k, l, i, bad) * scale * reduce_factor;
        }
        spillway::adamw_step_args a;
        a.step = t;
        a.grad_scale = scale;
        const auto c = spillway::with_step(cfg, hparams_at(t));
        if (g == grad_dtype::fp16) {
            std::vector<std::vector<spillway::float16>> h;
            double sum = 0;
            for (auto& gl : grads) {
                h.emplace_back(gl.size());
                spillway::narrow(std::span<const float>(gl),
                                 std::span<spillway::float16>(h.back()));
                sum +=
                    spillway::grad_sum_squares(std::span<const spillway::float16>(h.back()), scale);
            }
            if (!std::isfinite(sum)) return false;
            for (std::size_t l = 0; l < sizes.size(); ++l)
                REQUIRE(spillway::adamw_step<spillway::float16>(
                            c, a, p[l], m[l], v[l], std::span<const spillway::float16>(h[l])) ==
                        step_result::applied);
            return true;
        }
        for (std::size_t l = 0; l < sizes.size(); ++l) {
            if (g == grad_dtype::bf16) {
                std::vector<spillway::bfloat16> h(grads[l].size());
                spillway::narrow(std::span<const float>(grads[l]),
                                 std::span<spillway::bfloat16>(h));
                REQUIRE(spillway::adamw_step<spillway::bfloat16>(
                            c, a, p[l], m[l], v[l], std::span<const spillway::bfloat16>(h)) ==
                        step_result::applied);
            } else {
                REQUIRE(spillway::adamw_step<float>(c, a, p[l], m[l], v[l],
                                                    std::span<const float>(grads[l])) ==
                        step_result::applied);
            }
        }
        return true;
    }
};

layer_optimizer_options options_for(grad_dtype g, std::size_t param_layers,
                                    std::size_t state_layers, std::size_t spill_layers) {
    layer_optimizer_options o;
    o.grads = g;
    o.adam.lr = 1e-3f;
    o.adam.weight_decay = 0.0f;
    auto window = [](std::size_t layers, std::size_t bytes) {
        std::vector<std::size_t> c;
        for (auto n : sizes) c.push_back(spillway::charge_of(n * bytes));
        std::sort(c.begin(), c.end(), std::greater<>());
        std::size_t w = 0;
        for (std::size_t i = 0; i < layers && i < c.size(); ++i) w += c[i];
        return w;
    };
    o.param_window = window(param_layers, 4);
    o.state_window = window(state_layers, 8);
    o.spill_window = spillway::smallest_spill_window(sizes) * spill_layers;
    return o;
}

/// One step of a trainer over `opt`, checking what it is handed against `ref` (before ref's
/// step); returns end_step's verdict.
template <class Tier>
step_result train_step(layer_optimizer<Tier>& opt, const reference& ref, std::int64_t t, int k,
                       int bad) {
    const bool fp16 = opt.options().grads == grad_dtype::fp16;
    const float scale = fp16 ? loss_scale : 1.0f;
    opt.begin_step(t, scale, hparams_at(t));
    for (std::size_t l = 0; l < sizes.size(); ++l) {
        const auto p = opt.forward_layer(l);
        CHECK(same_bits(p, ref.p[l]));
        opt.forward_done(l);
    }
    for (std::size_t l = sizes.size(); l-- > 0;) {
        auto [p, g] = opt.backward_layer(l);
        CHECK(same_bits(p, ref.p[l]));
        REQUIRE(g.size() == sizes[l]);
        bool zero = true;
        for (float x : g) zero = zero && std::bit_cast<std::uint32_t>(x) == 0;
        CHECK(zero);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] += grad_of(k, l, i, bad) * scale;
        opt.grads_done(l);
    }
    return opt.end_step();
}

template <class Tier>
void check_equal(layer_optimizer<Tier>& opt, const reference& ref) {
    for (std::size_t l = 0; l < sizes.size(); ++l)
        opt.read_layer(
            l, [&](std::span<const float> p, std::span<const float> m, std::span<const float> v) {
                CHECK(same_bits(p, ref.p[l]));
                CHECK(same_bits(m, ref.m[l]));
                CHECK(same_bits(v, ref.v[l]));
            });
}

template <class Tier>
void fill_first(layer_optimizer<Tier>& opt) {
    for (std::size_t l = 0; l < sizes.size(); ++l)
        opt.fill(l, [&](std::span<float> p) {
            for (std::size_t i = 0; i < p.size(); ++i) p[i] = init_param(l, i);
        });
}

}  // namespace

TEST_CASE("layer_optimizer: bit-identical to in-memory adamw_step, every dtype and window") {
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::bf16, grad_dtype::fp16}) {
        // (params, m|v, spill) windows in layers: the smallest, two, and every layer.
        for (auto [wp, ws, wg] :
             std::vector<std::array<std::size_t, 3>>{{1, 1, 1}, {2, 3, 2}, {5, 5, 5}}) {
            CAPTURE(static_cast<int>(g));
            CAPTURE(wp);
            CAPTURE(ws);
            host_tier tier;
            auto o = options_for(g, wp, ws, wg);
            layer_optimizer<host_tier> opt(tier, sizes, o);
            fill_first(opt);
            reference ref(g, o.adam);
            // Iteration 2's gradients overflow (fp16 skips it; the step number stays).
            const int bad = g == grad_dtype::fp16 ? 2 : -1;
            std::int64_t t = 1;
            for (int k = 0; k < 6; ++k) {
                const step_result r = train_step(opt, ref, t, k, bad);
                const bool applied = ref.step(t, k, bad);
                CHECK((r == step_result::applied) == applied);
                CHECK(applied == (k != bad));
                if (!applied) CHECK_FALSE(opt.pending());
                if (applied) CHECK(opt.last_step() == t++);
            }
            check_equal(opt, ref);
            if (g == grad_dtype::fp16 && wg < sizes.size()) {
                // The spill wrote the layers its buffers could not keep, and read them back.
                CHECK(opt.stats().spill_written > 0);
                CHECK(opt.stats().spill_read > 0);
            }
        }
    }
}

TEST_CASE("layer_optimizer: the data-parallel callback sums each layer's gradients once a step") {
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::fp16}) {
        host_tier tier;
        auto o = options_for(g, 2, 2, 2);
        std::map<std::size_t, int> calls;
        o.reduce_grads = [&](std::size_t layer, std::span<float> grads) {
            CHECK(grads.size() == sizes.at(layer));
            ++calls[layer];
            for (float& x : grads) x *= 2.0f;  // two ranks of the same gradients
        };
        int agreed = 0;
        o.agree_overflow = [&](bool overflow) {
            ++agreed;
            return overflow;
        };
        layer_optimizer<host_tier> opt(tier, sizes, o);
        fill_first(opt);
        reference ref(g, o.adam);
        ref.reduce_factor = 2.0f;
        for (int k = 0; k < 3; ++k) {
            CHECK(train_step(opt, ref, k + 1, k, -1) == step_result::applied);
            ref.step(k + 1, k, -1);
            for (std::size_t l = 0; l < sizes.size(); ++l) CHECK(calls[l] == k + 1);
        }
        CHECK(agreed == (g == grad_dtype::fp16 ? 3 : 0));
        check_equal(opt, ref);
    }
}

TEST_CASE("layer_optimizer: save, load and continue equals the uninterrupted run") {
    const spillway::test::temp_dir dir;
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::bf16, grad_dtype::fp16}) {
        CAPTURE(static_cast<int>(g));
        const auto o = options_for(g, 2, 2, 1);
        reference ref(g, o.adam);
        const auto file = dir.path() / ("opt-" + std::to_string(static_cast<int>(g)));
        {
            spillway::file_tier<> tier(dir.path());
            layer_optimizer<spillway::file_tier<>> opt(tier, sizes, o);
            fill_first(opt);
            for (int k = 0; k < 3; ++k) {
                train_step(opt, ref, k + 1, k, -1);
                ref.step(k + 1, k, -1);
            }
            opt.save(file);  // (fp16: the pending update of step 3 applied first)
            CHECK_FALSE(opt.pending());
            CHECK_THROWS_WITH_AS(opt.save(file), doctest::Contains(file.string().c_str()),
                                 std::system_error);  // O_EXCL
        }
        struct stat st {};
        REQUIRE(::stat(file.c_str(), &st) == 0);
        CHECK((st.st_mode & 0777) == 0600);
        spillway::file_tier<> tier(dir.path());
        layer_optimizer<spillway::file_tier<>> opt(tier, sizes, o);
        opt.load(file);
        CHECK(opt.last_step() == 3);
        check_equal(opt, ref);
        for (int k = 3; k < 6; ++k) {
            train_step(opt, ref, opt.last_step() + 1, k, -1);
            ref.step(k + 1, k, -1);
        }
        CHECK(opt.last_step() == 6);
        check_equal(opt, ref);
    }
}

TEST_CASE("layer_optimizer: load refuses another model's file and a flipped byte, naming it") {
    const spillway::test::temp_dir dir;
    host_tier tier;
    const auto o = options_for(grad_dtype::fp32, 1, 1, 1);
    const auto file = dir.path() / "opt";
    {
        layer_optimizer<host_tier> opt(tier, sizes, o);
        fill_first(opt);
        opt.save(file);
    }
    {
        auto other = sizes;
        other[1] += 1;
        host_tier t2;
        layer_optimizer<host_tier> opt(t2, other, o);
        CHECK_THROWS_WITH_AS(opt.load(file), doctest::Contains(file.string().c_str()),
                             std::system_error);
    }
    {
        auto other = sizes;
        std::swap(other[0], other[1]);  // the same total size, another header
        host_tier t2;
        layer_optimizer<host_tier> opt(t2, other, o);
        CHECK_THROWS_WITH_AS(opt.load(file), doctest::Contains("not a layer_optimizer save"),
                             std::runtime_error);
    }
    // A flipped byte in layer 3's params.
    std::vector<std::byte> bytes(std::filesystem::file_size(file));
    REQUIRE(spillway::read_file(file, bytes, "test") == bytes.size());
    std::size_t at = 8 + 16 + 8 * sizes.size() + 4;
    for (std::size_t l = 0; l < 3; ++l) at += 12 * sizes[l] + 4;
    bytes[at + 5] ^= std::byte{0x10};
    const auto flipped = dir.path() / "flipped";
    spillway::write_file(flipped, bytes, "test");
    host_tier t2;
    layer_optimizer<host_tier> opt(t2, sizes, o);
    CHECK_THROWS_WITH_AS(opt.load(flipped), doctest::Contains("layer 3's CRC-32C"),
                         std::runtime_error);
}

TEST_CASE("layer_optimizer: refusals and misuse name the figure or the layer") {
    host_tier tier;
    auto o = options_for(grad_dtype::fp16, 1, 1, 1);
    o.spill_window -= 1;
    CHECK_THROWS_WITH_AS(
        layer_optimizer<host_tier>(tier, sizes, o),
        doctest::Contains(std::to_string(spillway::smallest_spill_window(sizes)).c_str()),
        std::invalid_argument);
    o = options_for(grad_dtype::fp32, 1, 1, 1);
    o.param_window = spillway::smallest_param_window(sizes) - 1;
    CHECK_THROWS_WITH_AS(
        layer_optimizer<host_tier>(tier, sizes, o),
        doctest::Contains(std::to_string(spillway::smallest_param_window(sizes)).c_str()),
        std::invalid_argument);
    o.param_window = spillway::smallest_param_window(sizes);
    o.state_window = spillway::smallest_state_window(sizes);
    layer_optimizer<host_tier> opt(tier, sizes, o);
    fill_first(opt);
    CHECK_THROWS_AS(opt.grads_done(1), std::logic_error);
    (void)opt.forward_layer(0);
    CHECK_THROWS_AS((void)opt.forward_layer(1), std::logic_error);
    CHECK_THROWS_AS(opt.end_step(), std::logic_error);
    opt.forward_done(0);
    CHECK_THROWS_AS((void)opt.forward_layer(sizes.size()), std::invalid_argument);
    // fp32: an inf cannot skip a step that is partly applied; the run is told which layer.
    opt.begin_step(1);
    auto [p, g] = opt.backward_layer(4);
    g[3] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(opt.grads_done(4), doctest::Contains("layer 4"), std::runtime_error);
}

TEST_CASE("layer_optimizer: stored_bytes() covers every byte its file tiers occupy") {
    // Two file tiers per path (params and the spill; m|v), two paths, layers l mod 2; a thread
    // samples the blocks every file in the directories occupies while fp16 steps run with the
    // windows' writes, the spill and a save's flush; the peak per path stays within the figure.
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::fp16}) {
        const spillway::test::temp_dir dir;
        const auto o = options_for(g, 2, 2, 1);
        std::vector<std::filesystem::path> roots{dir.path() / "a", dir.path() / "b"};
        std::vector<std::unique_ptr<spillway::file_tier<>>> ptiers, stiers;
        for (const auto& r : roots) {
            std::filesystem::create_directories(r / "p");
            std::filesystem::create_directories(r / "s");
        }
        // Layer l on path l mod 2: one optimizer per path over its own layers keeps this test
        // inside the library (a striped tier does the same with one optimizer).
        std::atomic<bool> stop{false};
        std::vector<std::atomic<std::size_t>> peak(2);
        std::thread sampler([&] {
            while (!stop) {
                for (std::size_t i = 0; i < 2; ++i) {
                    std::size_t used = 0;
                    std::error_code ec;
                    for (auto it = std::filesystem::recursive_directory_iterator(roots[i], ec);
                         !ec && it != std::filesystem::recursive_directory_iterator();
                         it.increment(ec)) {
                        struct stat st {};
                        if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
                            used += static_cast<std::size_t>(st.st_blocks) * 512;
                    }
                    if (used > peak[i]) peak[i] = used;
                }
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        });
        for (std::size_t i = 0; i < 2; ++i) {
            std::vector<std::size_t> mine;
            for (std::size_t l = i; l < sizes.size(); l += 2) mine.push_back(sizes[l]);
            spillway::file_tier<> pt(roots[i] / "p"), st(roots[i] / "s");
            layer_optimizer<spillway::file_tier<>> opt(pt, st, mine, o);
            spillway::test::run_constant_steps(opt, 3);
        }
        stop = true;
        sampler.join();
        spillway::disk_layout d;
        d.paths = 2;
        for (std::size_t i = 0; i < 2; ++i) {
            const std::size_t figure = spillway::stored_bytes_on(sizes, o, d, i);
            CAPTURE(i);
            CHECK(peak[i] > 0);
            CHECK(peak[i] <= figure);
        }
    }
}

TEST_CASE(
    "layer_optimizer: fp16, a layer left out of a step gets its pending update with its own step's "
    "figures") {
    // Step 1 visits every layer; step 2 leaves layer 1 out (no forward, no backward): its
    // update of step 1 is applied at step 2's end_step with step 1's number and lr, and it
    // gets no update of step 2.
    host_tier tier;
    const auto o = options_for(grad_dtype::fp16, 2, 2, 2);
    layer_optimizer<host_tier> opt(tier, sizes, o);
    fill_first(opt);
    reference ref(grad_dtype::fp16, o.adam);
    REQUIRE(train_step(opt, ref, 1, 0, -1) == step_result::applied);
    ref.step(1, 0, -1);
    const std::vector<float> p1 = ref.p[1], m1 = ref.m[1], v1 = ref.v[1];
    opt.begin_step(2, loss_scale, hparams_at(2));
    for (std::size_t l = sizes.size(); l-- > 0;) {
        if (l == 1) continue;
        auto [p, g] = opt.backward_layer(l);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] += grad_of(1, l, i, -1) * loss_scale;
        opt.grads_done(l);
    }
    REQUIRE(opt.end_step() == step_result::applied);
    ref.step(2, 1, -1);
    ref.p[1] = p1;
    ref.m[1] = m1;
    ref.v[1] = v1;
    check_equal(opt, ref);
}
