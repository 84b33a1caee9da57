// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/memory_plan.cpp: the figures of the memory budget's plan (memory_plan.hpp).
#include "memory_plan.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "llmc_format.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "streamed_params.hpp"

namespace mini_gpt {

namespace {

std::size_t sz(int x) {
    return static_cast<std::size_t>(x);
}

}  // namespace

spillway::memory_request budget_request(std::size_t budget, const budget_inputs& in) {
    const gpt2_config& c = in.config;
    const std::size_t L = sz(c.num_layers);
    spillway::memory_request r;
    r.budget = budget;
    r.fixed = {
        {"the process", in.baseline > 0
                            ? in.baseline
                            : spillway::reproducible_baseline(peak_rss_bytes(),
                                                              process_allowance(in.tokens_bytes))},
        {"the resident ends and gradient buffers", streamed_params::resident_bytes(c, in.grads)},
        {"activations outside the layers", model_scratch_bytes(c, in.rows, in.seq)},
        {"the activation stash", offloading_store_footprint(c, in.rows, in.seq, *in.stash)},
        {"a margin for threads and the allocator", memory_margin(in.threads)}};
    r.streams = {{"params", streamed_params::smallest_param_window(c),
                  spillway::charge_of(streamed_params::layer_param_bytes(c)) * L, 4},
                 {"m|v", streamed_params::smallest_state_window(c),
                  spillway::charge_of(streamed_params::layer_state_bytes(c)) * L, 8}};
    if (in.grads == grad_dtype::fp16) {
        const std::size_t g = streamed_params::smallest_grad_window(c);
        r.streams.push_back({"fp16 gradients", g, g * L, 2});
    }
    return r;
}

stream_windows plan_stream_windows(std::size_t budget, const budget_inputs& in) {
    const spillway::memory_request r = budget_request(budget, in);
    std::size_t w[3] = {0, 0, 0};
    if (budget == 0) {  // two layers each: one computed, one read or written
        for (std::size_t i = 0; i < r.streams.size(); ++i)
            w[i] = std::min(r.streams[i].whole, 2 * r.streams[i].smallest);
    } else {
        try {
            const spillway::memory_plan p = spillway::plan_memory(r);
            for (std::size_t i = 0; i < p.windows.size(); ++i) w[i] = p.windows[i];
        } catch (const spillway::budget_too_small& e) {
            throw input_error(std::string("--memory-budget: ") + e.what());
        }
    }
    return {w[0], w[1], w[2]};
}

std::size_t process_allowance(std::size_t tokens_bytes) {
    return (std::size_t{24} << 20) + tokens_bytes;
}

std::size_t model_scratch_bytes(const gpt2_config& c, int B, int T) {
    const std::size_t BT = sz(B) * sz(T), C = sz(c.channels);
    const std::size_t floats = BT * C * 2 + BT * 3 + BT * sz(c.padded_vocab_size) + BT * C * 3 +
                               BT * 3 * C + BT * 4 * C + sz(B) * sz(c.num_heads) * sz(T) * sz(T);
    return floats * sizeof(float) + 2 * BT * sizeof(int);
}

std::size_t stash_stored_bytes(const gpt2_config& c, int B, int T, bool recompute) {
    const auto sizes = layer_acts::tensor_floats(c, B, T);
    std::size_t stored = 0;
    for (int i = 0; i < layer_acts::num_tensors; ++i)
        if (!(recompute && layer_acts::recomputable(i)))
            stored += spillway::align_up(sizes[sz(i)] * sizeof(float));
    return stored * sz(c.num_layers);
}

std::size_t memory_margin(int threads) {
    // malloc arenas and thread stacks (compute, tier and stash I/O threads), OpenBLAS's
    // per-thread buffers: measured at 20-40 MiB on x86-64 Linux; 48 MiB plus 4 MiB a thread.
    return (48u << 20) + sz(threads) * (4u << 20);
}

std::size_t free_bytes(const std::filesystem::path& path) {
    struct statvfs st {};
    if (::statvfs(path.c_str(), &st) != 0) return 0;
    return static_cast<std::size_t>(st.f_bavail) * static_cast<std::size_t>(st.f_frsize);
}

std::size_t parse_size(const std::string& flag, const std::string& v) {
    std::size_t used = 0;
    double x = 0;
    try {
        x = std::stod(v, &used);
    } catch (const std::exception&) {
        throw input_error(flag + ": expected a size such as 3.5G or 800M, got '" + v + "'");
    }
    std::string unit = v.substr(used);
    if (unit.size() >= 2 && (unit.substr(1) == "iB" || unit.substr(1) == "B"))
        unit = unit.substr(0, 1);
    double mult = 1;
    if (unit == "K" || unit == "k")
        mult = 1024.0;
    else if (unit == "M" || unit == "m")
        mult = 1024.0 * 1024;
    else if (unit == "G" || unit == "g")
        mult = 1024.0 * 1024 * 1024;
    else if (unit == "T" || unit == "t")
        mult = 1024.0 * 1024 * 1024 * 1024;
    else if (!unit.empty() && unit != "B")
        throw input_error(flag + ": unknown unit '" + unit + "' in '" + v +
                          "' (use K, M, G or T: powers of 1024)");
    if (!std::isfinite(x) || x <= 0 || x * mult > 1e18)
        throw input_error(flag + ": expected a positive size, got '" + v + "'");
    return static_cast<std::size_t>(x * mult);
}

}  // namespace mini_gpt
