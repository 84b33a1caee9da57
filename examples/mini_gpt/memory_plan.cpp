// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/memory_plan.cpp: the memory budget's plan (memory_plan.hpp).
#include "memory_plan.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "llmc_format.hpp"
#include "spillway/io/aligned_buffer.hpp"

namespace mini_gpt {

namespace {

std::size_t sz(int x) {
    return static_cast<std::size_t>(x);
}

std::size_t status_field(const char* name) {
    std::ifstream f("/proc/self/status");
    std::string line;
    const std::string key = std::string(name) + ":";
    while (std::getline(f, line)) {
        if (line.rfind(key, 0) == 0) {
            std::istringstream in(line.substr(key.size()));
            std::size_t kib = 0;
            in >> kib;
            return kib * 1024;
        }
    }
    return 0;
}

}  // namespace

memory_plan plan_memory(const memory_plan_inputs& in) {
    memory_plan p;
    const std::size_t smallest = in.smallest_param + in.smallest_state + in.smallest_grads;
    p.smallest_budget = in.baseline + in.fixed + smallest;
    if (in.budget < p.smallest_budget)
        throw input_error("--memory-budget " + std::to_string(in.budget) + " bytes (" +
                          human_size(static_cast<double>(in.budget)) +
                          ") is too small: the smallest budget that works is " +
                          std::to_string(p.smallest_budget) + " bytes (" +
                          human_size(static_cast<double>(p.smallest_budget)) + ": the process " +
                          human_size(static_cast<double>(in.baseline)) + ", resident parts " +
                          human_size(static_cast<double>(in.fixed)) +
                          ", one layer's params and m,v" +
                          (in.smallest_grads > 0 ? " and fp16 gradients " : " ") +
                          human_size(static_cast<double>(smallest)) + ")");
    // Each window its smallest, then the surplus in proportion to the bytes per parameter
    // (params 4, m|v 8, fp16 gradients 2), each up to its total; then what is left over to
    // whichever can still grow, params first.
    struct window {
        std::size_t* size;
        std::size_t total, weight;
    };
    p.param_window = in.smallest_param;
    p.state_window = in.smallest_state;
    p.grad_window = in.smallest_grads;
    window w[3] = {{&p.param_window, std::max(in.param_total, in.smallest_param), 4},
                   {&p.state_window, std::max(in.state_total, in.smallest_state), 8},
                   {&p.grad_window, std::max(in.grads_total, in.smallest_grads),
                    in.smallest_grads > 0 ? 2u : 0u}};
    const std::size_t surplus = in.budget - p.smallest_budget;
    const std::size_t weights = w[0].weight + w[1].weight + w[2].weight;
    std::size_t given = 0;
    for (auto& x : w) {
        const std::size_t share = surplus / weights * x.weight;
        const std::size_t add = std::min(share, x.total - *x.size);
        *x.size += add;
        given += add;
    }
    for (auto& x : w) {
        if (x.weight == 0) continue;
        const std::size_t add = std::min(surplus - given, x.total - *x.size);
        *x.size += add;
        given += add;
    }
    return p;
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

std::size_t stash_resident_bytes(const gpt2_config& c, int B, int T, bool recompute) {
    // The stash's least budget (offload.cpp): a layer's stored tensors, one (B,T,C) more and
    // every layer's LayerNorm statistics; then the layer forward computes into and a layer
    // of free buffers (pool_limit); backward's recompute scratch.
    const auto sizes = layer_acts::tensor_floats(c, B, T);
    std::size_t layer = 0, stored = 0, small = 0;
    for (int i = 0; i < layer_acts::num_tensors; ++i) {
        const std::size_t n = spillway::align_up(sizes[sz(i)] * sizeof(float));
        layer += n;
        if (!(recompute && layer_acts::recomputable(i))) stored += n;
        if (n < (64u << 10)) small += n;
    }
    const std::size_t btc = spillway::align_up(sizes[layer_acts::residual3_i] * sizeof(float));
    const std::size_t least = stored + btc + small * sz(c.num_layers);
    const std::size_t scratch =
        recompute ? 2 * btc + spillway::align_up(sizes[layer_acts::att_i] * sizeof(float)) +
                        spillway::align_up(sizes[layer_acts::fch_gelu_i] * sizeof(float))
                  : 0;
    // Huge-page slabs round each up to 2 MiB pages.
    return least + 2 * layer + scratch + 8 * spillway::huge_page_bytes;
}

std::size_t memory_margin(int threads) {
    // malloc arenas and thread stacks (compute, tier and stash I/O threads), OpenBLAS's
    // per-thread buffers: measured at 20-40 MiB on x86-64 Linux; 48 MiB plus 4 MiB a thread.
    return (48u << 20) + sz(threads) * (4u << 20);
}

std::size_t peak_rss_bytes() {
    return status_field("VmHWM");
}
std::size_t current_rss_bytes() {
    return status_field("VmRSS");
}

std::size_t free_bytes(const std::filesystem::path& path) {
    struct statvfs st {};
    if (::statvfs(path.c_str(), &st) != 0) return 0;
    return static_cast<std::size_t>(st.f_bavail) * static_cast<std::size_t>(st.f_frsize);
}

std::string human_size(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        ++u;
    }
    std::ostringstream s;
    s << std::fixed << std::setprecision(u == 0 ? 0 : 1) << b << " " << units[u];
    return s.str();
}

}  // namespace mini_gpt
