// SPDX-License-Identifier: Apache-2.0
// examples/quickstart/your_trainer.cpp: a small trainer shaped like llm.c's (one arena per
// tensor kind, every layer in it; kernels that add into their gradients), and the lines that
// take it out of core: its params and AdamW moments stream through a spillway::layer_optimizer,
// its saved activations through a spillway::layer_stash, both on files spread over every
// --path, all under one --memory-budget. The lines Spillway adds are the regions marked
// [spillway-...]; docs/integration.md shows them ("Your own trainer").
//
// The model: L residual layers y = x + s * tanh(x W^T + b) of width C (kinds W (C, C), b (C),
// s (C)) over a batch of B rows, trained to a fixed random teacher with half the mean square
// error, AdamW with warmup and cosine decay.
//
// Usage: your_trainer [--offload none|all] [--memory-budget SIZE] [--path DIR]... [--steps N]
//                     [--layers L] [--width C] [--batch B]
// Prints each step's loss (also as a hex float), the median step time, and a CRC-32C of the
// final params: an offloaded run and an in-memory run of the same model print the same losses
// and CRC (quickstart.your_trainer checks it).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <spillway/io/durable_file.hpp>
#include <spillway/optim/adam.hpp>
#include <spillway/schedule/lr_schedule.hpp>
#include <spillway/stream/tensor_layout.hpp>
// [spillway-includes-begin]
#include <spillway/plan/process_baseline.hpp>
#include <spillway/stash/layer_stash.hpp>
#include <spillway/stash/stash_budget.hpp>
#include <spillway/stream/layer_optimizer.hpp>
#include <spillway/stream/layer_optimizer_plan.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/path_folders.hpp>
#include <spillway/tier/virtual_tier.hpp>
// [spillway-includes-end]

namespace {

struct settings {
    bool offload = false;
    std::size_t memory_budget = 0;
    std::vector<std::filesystem::path> paths;
    int steps = 8;
    std::size_t layers = 12, width = 256, batch = 64;
};

[[noreturn]] void usage_error(const std::string& what) {
    throw std::invalid_argument(what +
                                " (usage: your_trainer [--offload none|all] "
                                "[--memory-budget BYTES[K|M|G]] [--path DIR]... [--steps N] "
                                "[--layers L] [--width C] [--batch B])");
}

std::size_t parse_count(const std::string& flag, const std::string& v) {
    std::size_t used = 0;
    unsigned long long n = 0;
    try {
        n = std::stoull(v, &used);
    } catch (const std::exception&) {
        usage_error(flag + " " + v + ": not a number");
    }
    std::size_t unit = 1;
    if (used + 1 == v.size()) {
        const char u = v[used];
        unit = u == 'K' ? 1u << 10 : u == 'M' ? 1u << 20 : u == 'G' ? 1u << 30 : 0;
        if (unit == 0) usage_error(flag + " " + v + ": the unit must be K, M or G");
    } else if (used != v.size()) {
        usage_error(flag + " " + v + ": not a whole number");
    }
    if (n == 0) usage_error(flag + " " + v + ": must be at least 1");
    return static_cast<std::size_t>(n) * unit;
}

settings parse(int argc, char** argv) {
    settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) usage_error(flag + " needs a value");
        const std::string v = argv[++i];
        if (flag == "--offload") {
            if (v != "none" && v != "all") usage_error("--offload " + v + ": none or all");
            s.offload = v == "all";
        } else if (flag == "--memory-budget") {
            s.memory_budget = parse_count(flag, v);
        } else if (flag == "--path") {
            s.paths.emplace_back(v);
        } else if (flag == "--steps") {
            s.steps = static_cast<int>(parse_count(flag, v));
        } else if (flag == "--layers") {
            s.layers = parse_count(flag, v);
        } else if (flag == "--width") {
            s.width = parse_count(flag, v);
        } else if (flag == "--batch") {
            s.batch = parse_count(flag, v);
        } else {
            usage_error("unknown flag " + flag);
        }
    }
    if (s.offload && s.paths.empty()) usage_error("--offload all needs at least one --path");
    if (s.offload && s.memory_budget == 0) usage_error("--offload all needs --memory-budget");
    return s;
}

/// A value in [-1, 1) that depends only on (seed, i).
float uniform(std::uint64_t seed, std::uint64_t i) {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

/// One layer's tensors, wherever they live (the arenas, or a layer's blob).
struct layer_params {
    const float* w;  // (C, C)
    const float* b;  // (C)
    const float* s;  // (C)
};
struct layer_grads {
    float* w;
    float* b;
    float* s;
};

/// The model's arithmetic, as a trainer's kernels: shapes in comments, gradients added into
/// their buffers (+=), as llm.c's backward does.
class residual_mlp {
public:
    residual_mlp(std::size_t width, std::size_t batch) : C_(width), B_(batch) {}
    [[nodiscard]] std::size_t acts() const noexcept { return B_ * C_; }

    /// Layer l's first params: W uniform in +-1/sqrt(C), b = 0, s = 0.5.
    void init(std::size_t layer, float* w, float* b, float* s) const {
        const float scale = 1.0f / std::sqrt(static_cast<float>(C_));
        for (std::size_t k = 0; k < C_ * C_; ++k) w[k] = scale * uniform(100 + layer, k);
        std::fill(b, b + C_, 0.0f);
        std::fill(s, s + C_, 0.5f);
    }

    /// x (B, C) -> h = tanh(x W^T + b) (B, C), y = x + s * h (B, C).
    void forward(const layer_params& p, const float* x, float* h, float* y) const {
        for (std::size_t r = 0; r < B_; ++r) {
            const float* xr = x + r * C_;
            for (std::size_t i = 0; i < C_; ++i) {
                const float* wi = p.w + i * C_;
                float z = p.b[i];
                for (std::size_t j = 0; j < C_; ++j) z += wi[j] * xr[j];
                h[r * C_ + i] = std::tanh(z);
                y[r * C_ + i] = xr[i] + p.s[i] * h[r * C_ + i];
            }
        }
    }

    /// From dy (B, C) and the layer's x and h: adds the layer's gradients into g and writes
    /// dx (B, C). dz scratch (B, C).
    void backward(const layer_params& p, const float* x, const float* h, const float* dy,
                  const layer_grads& g, float* dx, float* dz) const {
        for (std::size_t r = 0; r < B_; ++r)
            for (std::size_t i = 0; i < C_; ++i) {
                const std::size_t k = r * C_ + i;
                g.s[i] += dy[k] * h[k];
                dz[k] = dy[k] * p.s[i] * (1.0f - h[k] * h[k]);
                g.b[i] += dz[k];
                dx[k] = dy[k];
            }
        for (std::size_t r = 0; r < B_; ++r)
            for (std::size_t i = 0; i < C_; ++i) {
                const float d = dz[r * C_ + i];
                const float* xr = x + r * C_;
                float* gw = g.w + i * C_;
                const float* wi = p.w + i * C_;
                float* dxr = dx + r * C_;
                for (std::size_t j = 0; j < C_; ++j) {
                    gw[j] += d * xr[j];
                    dxr[j] += d * wi[j];
                }
            }
    }

    /// The batch of `step`: inputs x (B, C) and the teacher's targets.
    void batch(int step, float* x, float* target) const {
        for (std::size_t k = 0; k < B_ * C_; ++k) {
            x[k] = uniform(1000 + static_cast<std::uint64_t>(step), k);
            target[k] = 0.5f * std::tanh(2.0f * x[k] * uniform(7, k % C_));
        }
    }

    /// Half the mean square error of out (B, C); writes dout = d(loss)/d(out).
    double loss(const float* out, const float* target, float* dout) const {
        double sum = 0;
        const float n = static_cast<float>(B_ * C_);
        for (std::size_t k = 0; k < B_ * C_; ++k) {
            const float d = out[k] - target[k];
            sum += static_cast<double>(d) * d;
            dout[k] = d / n;
        }
        return sum / (2.0 * static_cast<double>(B_ * C_));
    }

private:
    std::size_t C_, B_;
};

/// The trainer's arenas, llm.c style: one per tensor kind (and per moment), all layers.
struct arenas {
    std::vector<float> w, b, s;
    arenas(std::size_t L, std::size_t C) : w(L * C * C), b(L * C), s(L * C) {}
};

spillway::tensor_layout layout_of(arenas& p, arenas& g, std::size_t L, std::size_t C) {
    return spillway::tensor_layout(L, {{"w", p.w.data(), g.w.data(), C * C, C * C},
                                       {"b", p.b.data(), g.b.data(), C, C},
                                       {"s", p.s.data(), g.s.data(), C, C}});
}

/// The process's own memory (binary, libraries, threads) as the plan counts it: measured once
/// for this program with a margin (plan/process_baseline.hpp).
constexpr std::size_t process_allowance = std::size_t{16} << 20;

const spillway::adamw_config adam{.lr = 1e-3f, .weight_decay = 0.01f};

spillway::lr_schedule schedule_of(int steps) {
    return {.decay = spillway::lr_decay::cosine,
            .lr = adam.lr,
            .lr_min = adam.lr / 10,
            .warmup_steps = 2,
            .total_steps = steps};
}

struct run_result {
    std::vector<double> losses;
    std::vector<double> step_seconds;
    std::uint32_t params_crc = 0;
};

/// The trainer before Spillway: everything in the arenas.
run_result train_in_memory(const settings& cfg) {
    const std::size_t L = cfg.layers, C = cfg.width;
    const residual_mlp net(C, cfg.batch);
    arenas params(L, C), grads(L, C), m(L, C), v(L, C);
    const spillway::tensor_layout layout = layout_of(params, grads, L, C);
    for (std::size_t l = 0; l < L; ++l)
        net.init(l, &params.w[l * C * C], &params.b[l * C], &params.s[l * C]);
    std::vector<float> x((L + 1) * net.acts()), h(L * net.acts()), target(net.acts());
    std::vector<float> dy(net.acts()), dx(net.acts()), dz(net.acts());
    run_result out;
    for (int step = 1; step <= cfg.steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        net.batch(step, x.data(), target.data());
        for (std::size_t l = 0; l < L; ++l)
            net.forward({&params.w[l * C * C], &params.b[l * C], &params.s[l * C]},
                        &x[l * net.acts()], &h[l * net.acts()], &x[(l + 1) * net.acts()]);
        out.losses.push_back(net.loss(&x[L * net.acts()], target.data(), dy.data()));
        for (std::size_t l = L; l-- > 0;) {
            layout.zero_grads(l);
            net.backward({&params.w[l * C * C], &params.b[l * C], &params.s[l * C]},
                         &x[l * net.acts()], &h[l * net.acts()], dy.data(),
                         {&grads.w[l * C * C], &grads.b[l * C], &grads.s[l * C]}, dx.data(),
                         dz.data());
            dy.swap(dx);
        }
        const spillway::adamw_config now = spillway::with_step(
            adam, {spillway::learning_rate(schedule_of(cfg.steps), step - 1), adam.weight_decay});
        for (auto [p, g, mk, vk] :
             {std::tie(params.w, grads.w, m.w, v.w), std::tie(params.b, grads.b, m.b, v.b),
              std::tie(params.s, grads.s, m.s, v.s)})
            spillway::adamw_step(now, {.step = step}, std::span(p), std::span(mk), std::span(vk),
                                 std::span<const float>(g));
        out.step_seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::vector<float> blob(layout.layer_floats());
    for (std::size_t l = 0; l < L; ++l) {
        layout.gather_params(l, blob);
        out.params_crc = spillway::crc32c(std::as_bytes(std::span(blob)), out.params_crc);
    }
    return out;
}

/// The same trainer out of core: no arena of the model's size; each layer's params live in
/// a blob (w | b | s) that the layer_optimizer hands out, the activations in the stash.
run_result train_offloaded(const settings& cfg) {
    const std::size_t L = cfg.layers, C = cfg.width;
    const residual_mlp net(C, cfg.batch);
    const std::size_t layer_floats = C * C + 2 * C;
    auto params_at = [&](std::span<const float> blob) {
        return layer_params{blob.data(), blob.data() + C * C, blob.data() + C * C + C};
    };
    auto grads_at = [&](std::span<float> blob) {
        return layer_grads{blob.data(), blob.data() + C * C, blob.data() + C * C + C};
    };
    const std::size_t act_bytes = net.acts() * sizeof(float);

    // [spillway-setup-begin]
    // This process's folder on each --path, with a file tier in it for the params, one for
    // AdamW's m|v and one for the activations; the layers striped over the paths.
    using tier = spillway::virtual_tier<spillway::null_lock, std::vector<spillway::file_tier<>>>;
    auto folders = spillway::path_folders::create(cfg.paths, "your_trainer", "your_trainer-");
    spillway::virtual_tier_options striped;
    striped.placement = spillway::placement_mode::striped;
    tier params_tier(striped, folders.file_tier_args({}, "params"));
    tier state_tier(striped, folders.file_tier_args({}, "moments"));
    tier act_tier(striped, folders.file_tier_args({}, "activations"));

    // One memory budget for all of it, or a refusal naming the smallest that works.
    const std::vector<std::size_t> floats(L, layer_floats);
    const std::vector<spillway::layer_tensor> saved = {{"h", net.acts()}, {"y", net.acts()}};
    spillway::stash_options so;
    so.split = spillway::split_mode::offload_all;
    so.memory_budget =
        spillway::smallest_stash_budget(saved, L, {.recomputed = {}, .carried = {"y"}}, so);
    spillway::memory_request request{
        .budget = cfg.memory_budget,
        .fixed = {{"the process",
                   spillway::reproducible_baseline(spillway::peak_rss_bytes(), process_allowance)},
                  {"the trainer's own buffers", 5 * act_bytes},
                  {"the activations", spillway::stash_footprint(saved, so)},
                  spillway::layer_optimizer_fixed(floats, spillway::grad_dtype::fp32)},
        .streams = spillway::layer_optimizer_streams(floats, spillway::grad_dtype::fp32)};
    const spillway::memory_plan plan = spillway::plan_memory(request);

    spillway::layer_optimizer_options o;
    o.adam = adam;
    spillway::use_windows(o, plan);
    spillway::layer_optimizer opt(params_tier, state_tier, floats, o);
    spillway::activation_stash stash(act_tier, so);
    spillway::layer_stash acts(stash, saved, L);
    // [spillway-setup-end]

    for (std::size_t l = 0; l < L; ++l) {
        // [spillway-init-begin]
        opt.fill(l, [&](std::span<float> p) {
            net.init(l, p.data(), p.data() + C * C, p.data() + C * C + C);
        });
        // [spillway-init-end]
    }
    std::vector<float> x0(net.acts()), target(net.acts());
    std::vector<float> dy(net.acts()), dx(net.acts()), dz(net.acts());
    run_result out;
    for (int step = 1; step <= cfg.steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        net.batch(step, x0.data(), target.data());
        // [spillway-step-begin]
        opt.begin_step(
            step, 1.0f,
            {spillway::learning_rate(schedule_of(cfg.steps), step - 1), adam.weight_decay});
        acts.begin_step();
        // [spillway-step-end]
        for (std::size_t l = 0; l < L; ++l) {
            // [spillway-forward-begin]
            acts.acquire(l);
            const float* x = l == 0 ? x0.data() : acts.output<float>(l - 1, "y").data();
            net.forward(params_at(opt.forward_layer(l)), x, acts.output<float>(l, "h").data(),
                        acts.output<float>(l, "y").data());
            opt.forward_done(l);
            acts.save(l, "h");
            if (l > 0) acts.save(l - 1, "y", l);  // read by layer l: saved in its scope
            // [spillway-forward-end]
        }
        out.losses.push_back(
            net.loss(acts.output<float>(L - 1, "y").data(), target.data(), dy.data()));
        acts.recycle(L - 1, "y");  // backward does not read the model's output
        for (std::size_t l = L; l-- > 0;) {
            // [spillway-backward-begin]
            auto [p, g] = opt.backward_layer(l);  // g is zeroed
            const float* x = l == 0 ? x0.data() : acts.load<float>(l - 1, "y").data();
            net.backward(params_at(p), x, acts.load<float>(l, "h").data(), dy.data(), grads_at(g),
                         dx.data(), dz.data());
            opt.grads_done(l);  // AdamW on layer l, while the next layer's reads go on
            acts.release(l, "h");
            if (l > 0) acts.release(l - 1, "y");
            // [spillway-backward-end]
            dy.swap(dx);
        }
        opt.end_step();
        out.step_seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    for (std::size_t l = 0; l < L; ++l)
        opt.read_layer(l, [&](std::span<const float> p, auto&&...) {
            out.params_crc = spillway::crc32c(std::as_bytes(p), out.params_crc);
        });
    std::printf("smallest budget %zu bytes; peak RSS %zu bytes of the budget %zu\n",
                plan.smallest_budget, spillway::peak_rss_bytes(), cfg.memory_budget);
    return out;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const settings cfg = parse(argc, argv);
        const run_result r = cfg.offload ? train_offloaded(cfg) : train_in_memory(cfg);
        for (std::size_t i = 0; i < r.losses.size(); ++i)
            std::printf("step %zu loss %.6f (%a)\n", i + 1, r.losses[i], r.losses[i]);
        std::vector<double> later(r.step_seconds.begin() + (r.step_seconds.size() > 1),
                                  r.step_seconds.end());
        std::printf("median step %.4f s\nparams crc32c %08x\n", median(later), r.params_crc);
        return 0;
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "your_trainer: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "your_trainer: %s\n", e.what());
        return 1;
    }
}
