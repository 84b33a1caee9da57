// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/memory_plan.hpp: how `--offload params --memory-budget SIZE` splits the
// budget: the figures mini_gpt hands to Spillway's planner (spillway/plan/memory_plan.hpp).
//
// The request, every figure in bytes and none measured from the run (so that the smallest
// budget named is the same in every identical run):
//  1. fixed parts: the process (a fixed allowance for the binary and its libraries plus the
//     tokens: spillway::reproducible_baseline), the streamed model's resident ends and
//     gradient buffers, the model's activations outside the layer blocks, the activation
//     stash's footprint (its budget: --act-budget or its smallest, and the buffers the
//     trainer holds; spillway/stash/stash_budget.hpp), and a margin for the allocator, the
//     I/O threads and OpenBLAS;
//  2. streams: params (4 B per parameter), m|v (8 B) and, with fp16 gradients, the gradient
//     spill (2 B); each at least one layer, at most every layer.
// Every flag combination is inside the plan: --act-split only chooses which layers the
// stash writes (its budget forces the writes of kept layers), --act-budget is a fixed part.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include "gpt2.hpp"
#include "optimizer.hpp"
#include "spillway/human_bytes.hpp"
#include "spillway/plan/memory_plan.hpp"
#include "spillway/plan/process_baseline.hpp"

namespace mini_gpt {

using spillway::human_bytes;
using spillway::peak_rss_bytes;

/// The windows of --offload params's streams.
struct stream_windows {
    std::size_t params = 0, state = 0, grads = 0;
};

/// What the budget is planned from (see the file comment).
struct budget_inputs {
    gpt2_config config;
    int rows = 0, seq = 0;  // this rank's batch rows, the sequence length
    int threads = 1;        // compute threads
    grad_dtype grads = grad_dtype::fp32;
    std::size_t tokens_bytes = 0;           // the tokens held in memory
    std::size_t baseline = 0;               // the process's figure; 0: process_allowance()'s
    const store_settings* stash = nullptr;  // the activation store's settings
};

/// The request for `budget` (spillway::plan_memory sizes it).
spillway::memory_request budget_request(std::size_t budget, const budget_inputs& in);

/// The windows under --memory-budget `budget`; without a budget (0), two layers each.
/// @throws input_error naming --memory-budget and the smallest budget that works.
stream_windows plan_stream_windows(std::size_t budget, const budget_inputs& in);

/// The process's baseline, fixed in advance: the binary and its libraries (measured at about
/// 11 MiB on x86-64 Linux; 24 MiB allowed) plus the tokens, unless the process's peak
/// already exceeds it (spillway::reproducible_baseline).
std::size_t process_allowance(std::size_t tokens_bytes);

/// The model's activations and gradient scratch outside the layer blocks (gpt2::reserve's
/// buffers) for batch B, time T.
std::size_t model_scratch_bytes(const gpt2_config& c, int B, int T);
/// The most the offloading activation store takes with settings `s` (offload.cpp): its
/// stash's budget, the buffers it holds and the arena's slack.
std::size_t offloading_store_footprint(const gpt2_config& c, int B, int T, const store_settings& s);
/// Bytes the stash writes to the path per step (every layer offloaded).
std::size_t stash_stored_bytes(const gpt2_config& c, int B, int T, bool recompute);
/// The margin for the allocator, the tier's and the stash's threads and OpenBLAS's buffers.
std::size_t memory_margin(int threads);

/// Free bytes for an unprivileged user on the file system of `path` (statvfs).
std::size_t free_bytes(const std::filesystem::path& path);

/// "3.5G", "800M", "64K", "123" (bytes): K, M, G, T are powers of 1024; an optional "iB" or
/// "B" after the unit. @throws input_error naming `flag` for anything else.
std::size_t parse_size(const std::string& flag, const std::string& v);

}  // namespace mini_gpt
