// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/memory_plan.hpp: how `--offload params --memory-budget SIZE` splits the
// budget, and the numbers it is planned from.
//
// The plan, in order (every figure in bytes):
//  1. baseline: the process's peak RSS (VmHWM) when planning starts: the binary, its
//     libraries, the tokens, the compute threads;
//  2. fixed: what a step keeps resident whatever the windows: the ends (wte, wpe, final
//     LayerNorm: params, grads, m, v), the layer gradient buffer, the model's activations
//     outside the layer blocks (logits (B,T,Vp) the largest), the activation stash's budget
//     and its working buffers, and a margin for the allocator, the I/O threads and OpenBLAS;
//  3. the rest goes to the windows: each first gets its smallest (one layer), then the
//     surplus is shared in proportion to their bytes per parameter (params 4, m|v 8 and,
//     with fp16 gradients, the gradient spill 2), each at most its whole model; what one
//     cannot use goes to the others (params first). The windows never sum above the rest.
// A budget below baseline + fixed + the smallest windows is refused (input_error, exit 2)
// naming that sum: the smallest budget that works.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include "gpt2.hpp"
#include "size_flag.hpp"  // parse_size

namespace mini_gpt {

struct memory_plan_inputs {
    std::size_t budget = 0;          // --memory-budget
    std::size_t baseline = 0;        // VmHWM when planning
    std::size_t fixed = 0;           // resident whatever the windows (see the file comment)
    std::size_t smallest_param = 0;  // the streams' smallest windows
    std::size_t smallest_state = 0;
    std::size_t param_total = 0;  // the windows that hold every layer
    std::size_t state_total = 0;
    std::size_t smallest_grads = 0;  // fp16: the gradient spill's (0: no spill)
    std::size_t grads_total = 0;
};

struct memory_plan {
    std::size_t param_window = 0, state_window = 0, grad_window = 0;
    std::size_t smallest_budget = 0;  // baseline + fixed + the smallest windows
};

/// The windows for `in` (see the file comment). @throws input_error when in.budget is below
/// the smallest budget that works, naming it in bytes.
memory_plan plan_memory(const memory_plan_inputs& in);

/// The model's activations and gradient scratch outside the layer blocks (gpt2::reserve's
/// buffers) for batch B, time T.
std::size_t model_scratch_bytes(const gpt2_config& c, int B, int T);
/// What the activation stash holds at most with its default (least) budget, every layer
/// offloaded: its budget, the layer forward computes into, a layer of free buffers and
/// backward's recompute scratch.
std::size_t stash_resident_bytes(const gpt2_config& c, int B, int T, bool recompute);
/// Bytes the stash writes to the path per step (every layer offloaded).
std::size_t stash_stored_bytes(const gpt2_config& c, int B, int T, bool recompute);
/// The margin for the allocator, the tier's and the stash's threads and OpenBLAS's buffers.
std::size_t memory_margin(int threads);

/// This process's VmHWM and VmRSS (/proc/self/status) in bytes; 0 when unknown.
std::size_t peak_rss_bytes();
std::size_t current_rss_bytes();

/// Free bytes for an unprivileged user on the file system of `path` (statvfs).
std::size_t free_bytes(const std::filesystem::path& path);

/// "1.2 GiB"-style text.
std::string human_size(double bytes);

}  // namespace mini_gpt
