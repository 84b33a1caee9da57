// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/cli.cpp: the mini_gpt command line (parse_options, usage_text).
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc_format.hpp"
#include "memory_plan.hpp"
#include "trainer.hpp"

namespace mini_gpt {

namespace {

[[noreturn]] void bad_flag(const std::string& flag, const std::string& problem) {
    throw input_error(flag + ": " + problem);
}

bool on_off(const std::string& flag, const std::string& v) {
    if (v != "on" && v != "off") bad_flag(flag, "must be on or off, got '" + v + "'");
    return v == "on";
}

long long parse_int(const std::string& flag, const std::string& v, long long lo, long long hi) {
    try {
        std::size_t used = 0;
        long long x = std::stoll(v, &used);
        if (used != v.size()) throw std::invalid_argument("trailing");
        if (x < lo || x > hi)
            bad_flag(flag, "value " + v + " is outside [" + std::to_string(lo) + ", " +
                               std::to_string(hi) + "]");
        return x;
    } catch (const input_error&) {
        throw;
    } catch (const std::exception&) {
        bad_flag(flag, "expected an integer, got '" + v + "'");
    }
}

float parse_float(const std::string& flag, const std::string& v) {
    try {
        std::size_t used = 0;
        float x = std::stof(v, &used);
        if (used != v.size() || !std::isfinite(x) || x < 0) throw std::invalid_argument("bad");
        return x;
    } catch (const std::exception&) {
        bad_flag(flag, "expected a non-negative number, got '" + v + "'");
    }
}

}  // namespace

const char* offload_name(offload_mode m) {
    switch (m) {
        case offload_mode::none:
            return "none";
        case offload_mode::optimizer:
            return "optimizer";
        case offload_mode::activations:
            return "activations";
        case offload_mode::all:
            return "all";
        case offload_mode::params:
            return "params";
    }
    return "?";
}

std::string usage_text() {
    return R"(mini_gpt: train GPT-2 on the CPU with Spillway's offloading primitives.

Usage: mini_gpt [flags]
  --model FILE        start from an llm.c checkpoint (default: a small model, GPT-2 init)
  --data FILE         llm.c token file (default: the built-in corpus, byte tokens)
  --corpus-bytes N    the built-in corpus's size in bytes (default 1 MiB, at least 1024)
  --batch B           global batch size (default 16)
  --seq T             sequence length (default 64)
  --steps N           training steps (default 400)
  --lr X --beta1 X --beta2 X --eps X --wd X    AdamW (defaults 1e-4 0.9 0.999 1e-8 0)
  --seed N            initialisation seed (default 1337)
  --threads N         compute threads (default: every core)
  --grad-dtype D      fp32 | bf16 | fp16 (fp16 uses dynamic loss scaling)
  --offload M         none | optimizer | activations | all | params
                      all: m, v and the activations leave memory; params: those and the
                      parameters and gradients too (every layer's params and m,v streamed from
                      --path, updated layer by layer in backward; fp32 gradients only)
  --memory-budget SIZE
                      with --offload params: keep the process's peak RSS (VmHWM) under SIZE
                      (e.g. 3.5G, 800M; K, M, G = powers of 1024); too small a budget is
                      refused naming the smallest that works (default: two layers' windows)
  --init NAME         gpt2 | gpt2-medium | gpt2-large | gpt2-xl: a standard GPT-2 size
                      (124M, 350M, 774M, 1558M; V 50257, maxT 1024), GPT-2 init from --seed
  --path DIR          a storage path for offloaded state (repeatable; default: a temp dir)
  --lock-dir DIR      where the paths' node_lock files go (default: /dev/shm, or the temp
                      dir); every process that shares a --path must use the same one
  --act-split S       which layers' activations stay in memory: adaptive (TBA's rule from a
                      profiling step; default), offload (none stay), or K (layers K.. stay)
  --act-budget MiB    most bytes the activation stash holds (default and least: what the
                      last layer's backward loads at once, about one layer)
  --act-recompute on|off
                      recompute the LayerNorm, attention and GELU outputs in backward
                      instead of offloading them (default on: 7 of a layer's 16 (B,T,C)
                      floats per position and the attention probabilities; the same bits
                      either way)
  --subgroup N        parameters per optimizer subgroup (default 65536, at least 1024)
  --buffers N         host buffers of the update pipeline (default 6, at least 3)
  --update-under-forward on|off
                      run the offloaded optimizer's ascending updates under the next forward,
                      each layer waiting for its parameters (default on; one process)
  --update-under-backward on|off
                      run the offloaded optimizer's descending updates under backward, each
                      subgroup waiting for its gradients (default on; one process, fp32
                      gradients). Such an update cannot skip an overflow: an inf or NaN
                      gradient stops the run (exit 1); with off, the step is skipped
  --order O           the offloaded optimizer's subgroup order: alternating (default; every
                      other update is ascending) or ascending (every update)
  --save DIR          save a resumable checkpoint into DIR every --save-every K steps (default 50)
  --resume DIR        continue from the latest save in DIR
  --save-model FILE   write an llm.c checkpoint after the last step
  --json              one JSON object per step instead of the progress line
  --quiet             no per-step lines
  --trace FILE        write a Chrome trace (Perfetto) of compute and I/O; under mpirun rank 0
                      writes FILE and rank k writes FILE with ".rank<k>" before its extension
  --help, --version   this text; the version of mini_gpt and Spillway
  Default model: --layers 4 --channels 128 --heads 4 --vocab 256 --max-seq 64
)";
}

options parse_options(const std::vector<std::string>& args) {
    options o;
    std::string shape_flag;  // the last of --layers, --channels, --heads, --vocab, --max-seq given
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> const std::string& {
            if (i + 1 >= args.size()) bad_flag(a, "needs a value");
            return args[++i];
        };
        // The model's shape comes from --model's header when one is given: a shape flag beside
        // it would be ignored, so it is refused (after the loop).
        if (a == "--layers" || a == "--channels" || a == "--heads" || a == "--vocab" ||
            a == "--max-seq")
            shape_flag = a;
        // A flag that names a file or a directory: an empty value is refused (it would
        // silently mean "none").
        auto path_value = [&]() -> const std::string& {
            const std::string& v = value();
            if (v.empty()) bad_flag(a, "empty path");
            return v;
        };
        if (a == "--model")
            o.model = path_value();
        else if (a == "--data")
            o.data = path_value();
        else if (a == "--batch")
            o.batch = static_cast<int>(parse_int(a, value(), 1, 1 << 20));
        else if (a == "--seq")
            o.seq = static_cast<int>(parse_int(a, value(), 1, 1 << 20));
        else if (a == "--steps")
            o.steps = static_cast<int>(parse_int(a, value(), 0, 1 << 30));
        else if (a == "--lr")
            o.lr = parse_float(a, value());
        else if (a == "--beta1")
            o.beta1 = parse_float(a, value());
        else if (a == "--beta2")
            o.beta2 = parse_float(a, value());
        else if (a == "--eps")
            o.eps = parse_float(a, value());
        else if (a == "--wd")
            o.weight_decay = parse_float(a, value());
        else if (a == "--seed")
            o.seed = static_cast<std::uint64_t>(parse_int(a, value(), 0, INT64_MAX));
        else if (a == "--threads")
            o.threads = static_cast<int>(parse_int(a, value(), 1, 1024));
        else if (a == "--save-model")
            o.save_model = path_value();
        else if (a == "--grad-dtype") {
            const std::string& v = value();
            if (v == "fp32")
                o.grads = grad_dtype::fp32;
            else if (v == "bf16")
                o.grads = grad_dtype::bf16;
            else if (v == "fp16")
                o.grads = grad_dtype::fp16;
            else
                bad_flag(a, "expected fp32, bf16 or fp16, got '" + v + "'");
        } else if (a == "--offload") {
            const std::string& v = value();
            if (v == "none")
                o.offload = offload_mode::none;
            else if (v == "optimizer")
                o.offload = offload_mode::optimizer;
            else if (v == "activations")
                o.offload = offload_mode::activations;
            else if (v == "all")
                o.offload = offload_mode::all;
            else if (v == "params")
                o.offload = offload_mode::params;
            else
                bad_flag(a,
                         "expected none, optimizer, activations, all or params, got '" + v + "'");
        } else if (a == "--memory-budget")
            o.memory_budget = parse_size(a, value());
        else if (a == "--init") {
            const std::string& v = value();
            if (v != "gpt2" && v != "gpt2-medium" && v != "gpt2-large" && v != "gpt2-xl")
                bad_flag(a, "expected gpt2, gpt2-medium, gpt2-large or gpt2-xl, got '" + v + "'");
            o.init = v;
        } else if (a == "--path")
            o.paths.emplace_back(path_value());
        else if (a == "--lock-dir")
            o.lock_dir = path_value();
        else if (a == "--act-budget")
            o.act_budget_mib =
                static_cast<std::size_t>(parse_int(a, value(), 0, std::int64_t{1} << 40));
        else if (a == "--act-split") {
            const std::string& v = value();
            if (v == "adaptive")
                o.act_split = -1;
            else if (v == "offload")
                o.act_split = 1 << 30;
            else
                o.act_split = static_cast<int>(parse_int(a, v, 0, 1 << 30));
        } else if (a == "--subgroup")  // (at least 1024: one file per subgroup on the paths)
            o.subgroup =
                static_cast<std::size_t>(parse_int(a, value(), 1024, std::int64_t{1} << 40));
        else if (a == "--buffers")
            o.buffers = static_cast<int>(parse_int(a, value(), 3, 4096));
        else if (a == "--order") {
            std::string v = value();
            if (v != "alternating" && v != "ascending")
                bad_flag(a, "must be alternating or ascending, got '" + v + "'");
            o.ascending_order = v == "ascending";
        } else if (a == "--update-under-forward")
            o.update_under_forward = on_off(a, value());
        else if (a == "--update-under-backward")
            o.update_under_backward = on_off(a, value());
        else if (a == "--act-recompute")
            o.act_recompute = on_off(a, value());
        else if (a == "--save")
            o.save_dir = path_value();
        else if (a == "--save-every")
            o.save_every = static_cast<int>(parse_int(a, value(), 1, 1 << 30));
        else if (a == "--resume")
            o.resume_dir = path_value();
        else if (a == "--json")
            o.json = true;
        else if (a == "--quiet")
            o.quiet = true;
        else if (a == "--trace")
            o.trace = path_value();
        else if (a == "--layers")
            o.layers = static_cast<int>(parse_int(a, value(), 1, 1024));
        else if (a == "--channels")
            o.channels = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
        else if (a == "--heads")
            o.heads = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
        else if (a == "--vocab")
            o.vocab = static_cast<int>(parse_int(a, value(), 1, 65536));
        else if (a == "--max-seq")
            o.max_seq = static_cast<int>(parse_int(a, value(), 1, 1 << 20));
        else if (a == "--corpus-bytes")
            o.corpus_bytes = static_cast<std::size_t>(parse_int(a, value(), 1024, INT64_MAX));
        else
            bad_flag(a, "unknown flag (see --help)");
    }
    if (!o.init.empty()) {
        if (!o.model.empty()) bad_flag("--init", "give --init or --model, not both");
        if (!shape_flag.empty())
            bad_flag(shape_flag,
                     "the model's shape comes from --init " + o.init + "; drop " + shape_flag);
        // The standard sizes (GPT-2 paper, table 2; llm.c's gpt2_build_from_random).
        const int L = o.init == "gpt2"          ? 12
                      : o.init == "gpt2-medium" ? 24
                      : o.init == "gpt2-large"  ? 36
                                                : 48;
        const int C = o.init == "gpt2"          ? 768
                      : o.init == "gpt2-medium" ? 1024
                      : o.init == "gpt2-large"  ? 1280
                                                : 1600;
        o.layers = L;
        o.channels = C;
        o.heads = C / 64;
        o.vocab = 50257;
        o.max_seq = 1024;
    }
    if (o.offload == offload_mode::params) {
        if (o.grads != grad_dtype::fp32)
            bad_flag("--grad-dtype", std::string("--offload params takes fp32 gradients only: ") +
                                         "with fp16/bf16 an overflow must be found before the "
                                         "first update, which a streamed update cannot do (see "
                                         "docs/param_stream.md)");
        if (!o.model.empty())
            bad_flag("--model",
                     "--offload params starts from --init or the default model "
                     "(reading a checkpoint whole would exceed the memory budget)");
    } else if (o.memory_budget > 0) {
        bad_flag("--memory-budget", std::string("needs --offload params (the mode that plans ") +
                                        "every resident byte), got --offload " +
                                        offload_name(o.offload));
    }
    if (!o.model.empty() && !shape_flag.empty())
        bad_flag(shape_flag, "the model's shape comes from --model " + o.model.string() +
                                 " (its header); drop " + shape_flag);
    if (o.model.empty() && o.channels % o.heads != 0)
        throw input_error("--channels " + std::to_string(o.channels) +
                          " is not divisible by --heads " + std::to_string(o.heads));
    // AdamW's settings, checked now rather than at the first update (which --steps 0 never
    // reaches): beta1 and beta2 below 1, eps above 0.
    if (!(o.beta1 < 1.0f)) bad_flag("--beta1", "must be below 1, got " + std::to_string(o.beta1));
    if (!(o.beta2 < 1.0f)) bad_flag("--beta2", "must be below 1, got " + std::to_string(o.beta2));
    if (!(o.eps > 0.0f)) bad_flag("--eps", "must be above 0, got " + std::to_string(o.eps));
    return o;
}

}  // namespace mini_gpt
