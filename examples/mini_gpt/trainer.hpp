// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/trainer.hpp: the mini-GPT training loop and its command line.
//
// What a run does, step by step:
//  1. Parse the flags (parse_options); any bad flag is an input_error.
//  2. Load the model (--model, llm.c checkpoint) or build the default config initialised from
//     --seed; load the tokens (--data, llm.c token file) or generate the built-in corpus; check
//     every token against the vocabulary. With --resume DIR, load the latest save in DIR.
//  3. Per step k: take batch k (B*T+1 tokens from k*B*T, wrapping after the last whole batch);
//     forward (activations in the store chosen by --offload); backward with the loss scale;
//     narrow the gradients to --grad-dtype; AdamW through the optimizer chosen by --offload;
//     print a progress line (or a JSON object); every --save-every steps, save to --save DIR.
//  4. After the last step: --save-model FILE writes an llm.c checkpoint; a summary table.
// Every --offload mode computes the same bits: the model's kernels do not depend on where the
// activations live, and every optimizer path runs Spillway's AdamW element formula (with
// --offload params, over each layer's span as backward finishes it: step.cpp,
// streamed_params.hpp; the memory budget's plan is memory_plan.hpp).
// Where each part lives: the command line in cli.cpp, train() in trainer.cpp, one step and
// where its update runs in step.cpp, saving and resuming in checkpoint_dir.cpp, the printed
// lines in report.cpp, the model in gpt2.cpp, the offloading back ends in offload.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "optimizer.hpp"
#include "spillway/schedule/lr_schedule.hpp"

namespace mini_gpt {

/// What leaves memory: none; the optimizer's state (m, v); the activations (the stash); all
/// (both); params (all, and the parameters and gradients too: streamed_params.hpp).
enum class offload_mode { none, optimizer, activations, all, params };

/// The --offload spelling of `m` ("none", "optimizer", "activations", "all", "params").
const char* offload_name(offload_mode m);

struct options {
    std::filesystem::path model;  // --model FILE (llm.c checkpoint); empty: default config
    std::filesystem::path data;   // --data FILE (llm.c tokens); empty: built-in corpus
    int batch = 16;               // --batch B (global batch, split over MPI ranks)
    int seq = 64;                 // --seq T
    int steps = 400;              // --steps N
    float lr = 1e-4f;             // --lr (the peak of a schedule)
    spillway::lr_decay lr_schedule = spillway::lr_decay::constant;  // --lr-schedule
    std::int64_t warmup_steps = 0;  // --warmup-steps N: linear warmup to --lr
    float lr_min = 0.0f;            // --lr-min X: cosine's final rate
    float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f,
          weight_decay = 0.0f;                  // --beta1 --beta2 --eps --wd
    std::uint64_t seed = 1337;                  // --seed
    int threads = 0;                            // --threads (0: every core)
    std::filesystem::path save_model;           // --save-model FILE
    grad_dtype grads = grad_dtype::fp32;        // --grad-dtype fp32|bf16|fp16
    offload_mode offload = offload_mode::none;  // --offload none|optimizer|activations|all|params
    std::size_t memory_budget = 0;  // --memory-budget SIZE (bytes; --offload params; 0: none)
    std::size_t baseline_rss = 0;   // the process's RSS the plan starts from (0: VmHWM; tests)
    std::string init;               // --init gpt2|gpt2-medium|gpt2-large|gpt2-xl (empty: default)
    std::vector<std::filesystem::path> paths;  // --path DIR (repeatable); default: a temp dir
    std::filesystem::path lock_dir;  // --lock-dir DIR for node_lock's files (default: /dev/shm)
    int act_split = -1;              // --act-split adaptive (-1) | offload (every layer) | K
    std::size_t act_budget_mib =
        0;  // --act-budget MiB for the stash (0: the least it needs, about one layer)
    bool act_recompute =
        true;  // --act-recompute on|off: ln1, ln2, att, atty, fch_gelu recomputed, not offloaded
    std::size_t subgroup = 1 << 16;     // --subgroup N: parameters per optimizer subgroup
    int buffers = 6;                    // --buffers N: host buffers of the update pipeline
    bool update_under_forward = true;   // --update-under-forward on|off
    bool update_under_backward = true;  // --update-under-backward on|off
    bool ascending_order = false;       // --order alternating|ascending (the offloaded optimizer's)
    std::filesystem::path save_dir;     // --save DIR
    int save_every = 50;                // --save-every K
    std::filesystem::path resume_dir;   // --resume DIR
    bool json = false;                  // --json
    bool quiet = false;                 // --quiet: no progress lines (summary only)
    std::filesystem::path trace;        // --trace FILE
    // The default model (no --model): --layers, --channels, --heads, --vocab, --max-seq.
    int layers = 4, channels = 128, heads = 4, vocab = 256, max_seq = 64;
    std::size_t corpus_bytes = 1 << 20;  // --corpus-bytes
};

/// Parses argv (without argv[0]). Throws input_error for unknown flags or bad values.
options parse_options(const std::vector<std::string>& args);

/// The --help text.
std::string usage_text();

/// Where rank `rank` writes its --trace timeline: `file` itself for rank 0, else `file` with
/// ".rank<k>" before its extension (trace.json -> trace.rank1.json), so that the ranks of one
/// mpirun never write the same file.
std::filesystem::path trace_path(const std::filesystem::path& file, int rank);

/// Batch k of a token stream for global batch B and sequence T: of the B*T+1 tokens starting
/// at token (k mod K)*B*T (K = (tokens-1)/(B*T) whole batches), inputs are the first B*T and
/// targets the same shifted by one, both (B,T) row-major; rows [row0, row0+rows) are filled.
void fill_batch(const std::vector<std::uint16_t>& tokens, std::int64_t k, int B, int T, int row0,
                int rows, std::vector<int>& inputs, std::vector<int>& targets);

/// Per-step measurements of a run (for benchmarks and scripts).
struct run_report {
    std::vector<double> step_ms, forward_ms, backward_ms, update_ms, io_wait_ms;
    std::vector<double> cpu_ms;         // CPU time of the whole process (all threads) per step
    std::vector<double> param_wait_ms;  // forward waiting for a deferred update's parameters
    std::vector<bool> update_deferred;  // the step's update ran under the next forward
    std::vector<bool> update_under_backward;  // the step's update ran under its own backward
    std::vector<std::size_t> act_peak_bytes;
    std::size_t all_kept_bytes = 0;   // activations if every layer were kept in memory
    std::size_t layer_act_bytes = 0;  // the layer blocks alone (what --act-split offload moves)
    double flops_per_step = 0;        // model FLOPs of one step (global batch)
    std::size_t params = 0;
    // --offload params: the plan and what the streams did (0 otherwise).
    std::size_t memory_budget = 0, peak_rss = 0;  // --memory-budget, VmHWM at the end
    std::size_t param_window = 0, state_window = 0;
    std::size_t grad_window = 0;                 // fp16: the gradient spill's buffers
    std::size_t param_peak = 0, state_peak = 0;  // the streams' peak resident bytes
    // Bytes per step to and from the path: params read, written; m|v read, written; the
    // fp16 gradient spill's read, written.
    std::vector<std::uint64_t> param_read, param_written, state_read, state_written;
    std::vector<std::uint64_t> grad_read, grad_written;
    // Per step, per --path (in --path order): everything read from and written to it (the
    // streams' layers l mod P on path l; the activations on the first).
    std::vector<std::vector<std::uint64_t>> path_read, path_written;
};

/// Runs training; progress to `out`. Throws input_error (bad input) or other exceptions.
/// Returns the per-step losses (of this process's steps, resumed or not); fills `report`
/// when given.
std::vector<float> train(const options& opt, std::ostream& out, run_report* report = nullptr);

}  // namespace mini_gpt
