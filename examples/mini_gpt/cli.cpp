// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/cli.cpp: the mini_gpt command line (parse_options, usage_text,
// help_or_version), parsed with CLI11 (Debian: libcli11-dev; the example's dependency only,
// never the library's).
//
// Every flag is declared once, in declare_flags(): its name, its group and value name in
// --help, its description, its default and its range or choices. --help, the parsing and the
// refusal all come from that declaration. A flag takes its value as `--flag value` or
// `--flag=value`; given twice, the last value counts (--path keeps every one).
// A bad value is refused by its declaration's check with an input_error
// "<flag>: <the problem, naming the value>" (main prints it on one line, exit status 2).
// Refusals that involve more than one flag are in validate(), after parsing.
#include "cli.hpp"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "llmc_format.hpp"
#include "memory_plan.hpp"
#include "spillway/config.hpp"
#include "trainer.hpp"

namespace mini_gpt {

namespace {

[[noreturn]] void bad_flag(const std::string& flag, const std::string& problem) {
    throw input_error(flag + ": " + problem);
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

/// "a", "a or b", "a, b or c".
std::string either(const std::vector<std::string>& names) {
    std::string s;
    for (std::size_t i = 0; i < names.size(); ++i)
        s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    return s;
}

// ==== --help's layout ==========================================================================

/// Descriptions start at this column; lines end by this width.
constexpr std::size_t help_column = 30, help_width = 100;

/// `text` wrapped at spaces into lines of at most `width` characters.
std::string wrap(const std::string& text, std::size_t width) {
    std::istringstream words(text);
    std::string out, line, word;
    while (words >> word) {
        if (!line.empty() && line.size() + 1 + word.size() > width) {
            out += line + "\n";
            line.clear();
        }
        line += (line.empty() ? "" : " ") + word;
    }
    return out + line;
}

/// A number as --help shows a default: 16, 0.0001, 1e-08.
template <class T>
std::string shown(T x) {
    std::ostringstream s;
    s << x;
    return s.str();
}

/// Each of `values` with its spelling, `name(value)`: a choice's table from the one function
/// that spells the values everywhere else (offload_name, dtype_name).
template <class T, class Name>
std::vector<std::pair<std::string, T>> spelled(Name name, std::initializer_list<T> values) {
    std::vector<std::pair<std::string, T>> table;
    for (T v : values) table.emplace_back(name(v), v);
    return table;
}

/// CLI11's layout, with one blank line before each group (CLI11 2.1 puts two between them).
class help_formatter : public CLI::Formatter {
public:
    std::string make_usage(const CLI::App* app, std::string name) const override {
        return CLI::Formatter::make_usage(app, std::move(name)) + "\n";
    }
    std::string make_group(std::string group, bool is_positional,
                           std::vector<const CLI::Option*> opts) const override {
        // Without its leading newline: make_groups puts one between groups.
        return CLI::Formatter::make_group(std::move(group), is_positional, std::move(opts))
            .substr(1);
    }
};

/// The flags' declarations: each call registers one flag with CLI11 under the current
/// group(), with its check, `value_name` after the flag in --help (none for a flag without a
/// value) and `help` followed by what the declaration knows (its default, its range or
/// choices) as the wrapped description.
class flag_table {
public:
    explicit flag_table(CLI::App& app) : app_(app) {}

    void group(std::string name) { group_ = std::move(name); }

    /// An integer in [lo, hi]. --help shows `target`'s value as the default, or
    /// `default_text` for a default with a meaning of its own ("default: every core").
    template <class T>
    void integer(const std::string& flag, T& target, long long lo, long long hi,
                 const std::string& value_name, const std::string& help,
                 const std::string& default_text = "") {
        auto* opt = app_.add_option(flag, target);
        // The value CLI11 converts is the one checked, written back in decimal (CLI11 alone
        // would read 010 as octal and 0x10 as hexadecimal).
        opt->transform(CLI::Validator(
            [flag, lo, hi](std::string& v) {
                v = std::to_string(parse_int(flag, v, lo, hi));
                return std::string();
            },
            "", "integer"));
        std::string facts = default_text.empty() ? "default " + shown(target) : default_text;
        constexpr long long unbounded = std::int64_t{1} << 40;
        const std::string range = hi >= unbounded
                                      ? (lo > 0 ? "at least " + std::to_string(lo) : "")
                                      : std::to_string(lo) + " to " + std::to_string(hi);
        if (!range.empty()) facts += (facts.empty() ? "" : "; ") + range;
        finish(opt, value_name, help, facts);
    }

    /// A finite number of at least 0 (float).
    void number(const std::string& flag, float& target, const std::string& help) {
        auto* opt = app_.add_option(flag, target);
        opt->transform(CLI::Validator(
            [flag](std::string& v) {
                char buf[32];
                std::snprintf(buf, sizeof buf, "%.9g",
                              static_cast<double>(parse_float(flag, v)));  // exact for a float
                v = buf;
                return std::string();
            },
            "", "number"));
        finish(opt, "X", help, "default " + shown(target));
    }

    /// One of `choices` (its spelling, its value); --help shows them as the value name.
    template <class T>
    void choice(const std::string& flag, T& target,
                const std::vector<std::pair<std::string, T>>& choices, const std::string& help) {
        std::vector<std::string> names;
        std::string value_name, facts;
        for (const auto& [name, value] : choices) {
            names.push_back(name);
            value_name += (value_name.empty() ? "" : "|") + name;
            if (value == target) facts = "default " + name;
        }
        auto* opt =
            app_.add_option_function<std::string>(flag, [&target, choices](const std::string& v) {
                for (const auto& [name, value] : choices)
                    if (name == v) target = value;
            });
        opt->check(CLI::Validator(
            [flag, names](std::string& v) {
                for (const auto& n : names)
                    if (n == v) return std::string();
                bad_flag(flag, "expected " + either(names) + ", got '" + v + "'");
            },
            "", "choice"));
        finish(opt, value_name, help, facts);
    }

    /// A file or a directory; an empty value is refused (it would silently mean "none").
    template <class T>  // std::filesystem::path, or a vector of them (every occurrence kept)
    void path(const std::string& flag, T& target, const std::string& value_name,
              const std::string& help) {
        auto* opt = app_.add_option(flag, target);
        opt->check(CLI::Validator(
            [flag](std::string& v) {
                if (v.empty()) bad_flag(flag, "empty path");
                return std::string();
            },
            "", "path"));
        finish(opt, value_name, help, "");
    }

    /// A value whose check and conversion are the `to_canonical` function's: it returns the
    /// value as CLI11 converts it into `target` or throws input_error naming the flag.
    template <class T, class F>
    void custom(const std::string& flag, T& target, const std::string& value_name,
                const std::string& help, const std::string& facts, F to_canonical) {
        auto* opt = app_.add_option(flag, target);
        opt->transform(CLI::Validator(
            [to_canonical](std::string& v) {
                v = to_canonical(v);
                return std::string();
            },
            "", "custom"));
        finish(opt, value_name, help, facts);
    }

    /// A flag without a value (`--flag`; CLI11 also takes --flag=true|false).
    void boolean(const std::string& flag, bool& target, const std::string& help) {
        finish(app_.add_flag(flag, target), "", help, "");
    }

    /// -h, --help and --version, answered by help_or_version before any parsing.
    void help_and_version(const std::string& help, const std::string& version) {
        finish(app_.set_help_flag("-h,--help"), "", help, "");
        finish(app_.set_version_flag("--version", version_text()), "", version, "");
    }

private:
    void finish(CLI::Option* opt, const std::string& value_name, std::string help,
                const std::string& facts) {
        if (!facts.empty()) help += " (" + facts + ")";
        opt->group(group_);
        opt->option_text(value_name);
        opt->description(wrap(help, help_width - help_column));
    }

    CLI::App& app_;
    std::string group_;
};

// ==== The flags ================================================================================

/// --init's standard GPT-2 sizes (GPT-2 paper, table 2; llm.c's gpt2_build_from_random):
/// 124M, 350M, 774M and 1558M parameters, heads of 64 channels, vocabulary 50257, 1024
/// positions.
struct standard_size {
    const char* name;
    int layers, channels;
};
constexpr standard_size standard_sizes[] = {
    {"gpt2", 12, 768}, {"gpt2-medium", 24, 1024}, {"gpt2-large", 36, 1280}, {"gpt2-xl", 48, 1600}};

/// Declares every flag of mini_gpt into `app`, each storing into its field of `o` (whose
/// values are the defaults --help shows).
void declare_flags(CLI::App& app, options& o) {
    // A flag given twice keeps its last value, as a user who appends a flag expects.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.allow_extras();  // refused by parse_options, as "unknown flag", naming it
    auto layout = std::make_shared<help_formatter>();
    layout->column_width(help_column);
    app.formatter(layout);
    app.footer(
        wrap("Each flag takes its value as --flag VALUE or --flag=VALUE; given twice, the last one "
             "counts (--path keeps each). Exit status: 0 after the run; 1 when the run fails (a "
             "write failed: a full disk, an I/O error; out of memory; another MPI rank failed); 2 "
             "for bad input (a flag, a file read, a save refused, a --save another run holds): one "
             "line naming the flag or the file and the problem.",
             help_width));
    flag_table t(app);

    t.group("Model and data");
    t.path("--model", o.model, "FILE",
           "start from an llm.c checkpoint, whose header gives the shape (default: the model "
           "below, GPT-2 init from --seed)");
    std::vector<std::pair<std::string, std::string>> sizes;
    for (const auto& size : standard_sizes) sizes.emplace_back(size.name, size.name);
    t.choice<std::string>("--init", o.init, sizes,
                          "a standard GPT-2 size (124M, 350M, 774M, 1558M parameters; vocabulary "
                          "50257, 1024 positions), GPT-2 init from --seed");
    t.path("--data", o.data, "FILE",
           "llm.c token file (default: the built-in corpus, byte tokens)");
    t.integer("--corpus-bytes", o.corpus_bytes, 1024, INT64_MAX, "N",
              "the built-in corpus's size in bytes");

    t.group("The default model's shape (refused beside --model or --init)");
    t.integer("--layers", o.layers, 1, 1024, "L", "transformer layers");
    t.integer("--channels", o.channels, 1, 1 << 16, "C", "channels, divisible by --heads");
    t.integer("--heads", o.heads, 1, 1 << 16, "H", "attention heads");
    t.integer("--vocab", o.vocab, 1, 65536, "V", "vocabulary size");
    t.integer("--max-seq", o.max_seq, 1, 1 << 20, "T", "positions, the longest sequence");

    t.group("Training");
    t.integer("--batch", o.batch, 1, 1 << 20, "B", "global batch size, split over MPI ranks");
    t.integer("--seq", o.seq, 1, 1 << 20, "T", "sequence length");
    t.integer("--steps", o.steps, 0, 1 << 30, "N", "training steps");
    t.number("--lr", o.lr, "AdamW's learning rate (the peak of --lr-schedule)");
    t.choice<spillway::lr_decay>(
        "--lr-schedule", o.lr_schedule,
        {{"constant", spillway::lr_decay::constant}, {"cosine", spillway::lr_decay::cosine}},
        "the learning rate per step (0-based s, warmup W, N = --steps): lr * (s+1) / W while "
        "s < W (linear warmup), then --lr (constant) or cosine decay from --lr at s = W to "
        "--lr-min at s = N (llm.c's and nanoGPT's schedule); saved with --save, and a resume "
        "must ask for the same");
    t.integer("--warmup-steps", o.warmup_steps, 0, 1 << 30, "W",
              "steps of linear warmup to --lr (with cosine: fewer than --steps)");
    t.number("--lr-min", o.lr_min, "cosine's final learning rate, at most --lr");
    t.number("--beta1", o.beta1, "AdamW's beta1, below 1");
    t.number("--beta2", o.beta2, "AdamW's beta2, below 1");
    t.number("--eps", o.eps, "AdamW's epsilon, above 0");
    t.number("--wd", o.weight_decay, "AdamW's weight decay");
    t.integer("--seed", o.seed, 0, INT64_MAX, "N", "initialisation seed");
    t.integer("--threads", o.threads, 1, 1024, "N", "compute threads", "default: every core");
    t.choice<grad_dtype>(
        "--grad-dtype", o.grads,
        spelled(dtype_name, {grad_dtype::fp32, grad_dtype::bf16, grad_dtype::fp16}),
        "the gradients' type (fp16 uses dynamic loss scaling)");

    t.group("Offloading");
    t.choice<offload_mode>(
        "--offload", o.offload,
        spelled(offload_name, {offload_mode::none, offload_mode::optimizer,
                               offload_mode::activations, offload_mode::all, offload_mode::params}),
        "what leaves memory: optimizer (AdamW's m and v), activations, all (both), or params "
        "(those and the parameters and gradients too: every layer's parameters and m, v "
        "streamed from the --paths (layer l on path l mod P) and updated layer by layer: in "
        "backward for fp32 and bf16 gradients, under the next forward for fp16)");
    t.custom("--memory-budget", o.memory_budget, "SIZE",
             "with --offload params: keep the process's peak RSS (VmHWM) under SIZE (e.g. 3.5G, "
             "800M; K, M, G, T = powers of 1024); too small a budget is refused naming the "
             "smallest that works (default: two layers' windows)",
             "",
             [](const std::string& v) { return std::to_string(parse_size("--memory-budget", v)); });
    t.path("--path", o.paths, "DIR",
           "a storage path for offloaded state (repeat it for several; default: a temporary "
           "directory); created if missing, its parent must exist; never inside --save");
    // One value per --path: `--path a b` is a path and an unknown flag, not two paths.
    app.get_option("--path")->expected(1)->allow_extra_args(false)->multi_option_policy(
        CLI::MultiOptionPolicy::TakeAll);
    t.path("--lock-dir", o.lock_dir, "DIR",
           "where the paths' node_lock files go (default: /dev/shm, or the temporary "
           "directory); every process that shares a --path must use the same one");
    t.custom("--act-split", o.act_split, "S",
             "which layers' activations stay in memory: adaptive (TBA's rule from a profiling "
             "step), offload (none stay) or K (layers K.. stay)",
             "default adaptive", [](const std::string& v) {
                 if (v == "adaptive") return std::string("-1");
                 if (v == "offload") return std::to_string(1 << 30);
                 if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
                     bad_flag("--act-split",
                              "expected adaptive, offload or a layer number K, got '" + v + "'");
                 return std::to_string(parse_int("--act-split", v, 0, 1 << 30));
             });
    t.integer("--act-budget", o.act_budget_mib, 0, std::int64_t{1} << 40, "MiB",
              "most bytes the activation stash holds",
              "default and least: what the last layer's backward loads at once, about one layer");
    t.choice<bool>("--act-recompute", o.act_recompute, {{"on", true}, {"off", false}},
                   "recompute the LayerNorm, attention and GELU outputs in backward instead of "
                   "offloading them (7 of a layer's 16 (B,T,C) floats per position and the "
                   "attention probabilities; the same bits either way)");
    t.integer("--subgroup", o.subgroup, 1024, std::int64_t{1} << 40, "N",
              "parameters per optimizer subgroup (one file each on the paths)");
    t.integer("--buffers", o.buffers, 3, 4096, "N", "host buffers of the update pipeline");
    t.choice<bool>("--update-under-forward", o.update_under_forward, {{"on", true}, {"off", false}},
                   "run the offloaded optimizer's ascending updates under the next forward, each "
                   "layer waiting for its parameters (one process)");
    t.choice<bool>("--update-under-backward", o.update_under_backward,
                   {{"on", true}, {"off", false}},
                   "run the offloaded optimizer's descending updates under backward, each "
                   "subgroup waiting for its gradients (one process, fp32 gradients). Such an "
                   "update cannot skip an overflow: an inf or NaN gradient stops the run (exit "
                   "1); with off, the step is skipped");
    t.choice<bool>("--order", o.ascending_order, {{"alternating", false}, {"ascending", true}},
                   "the offloaded optimizer's subgroup order: alternating (every other update "
                   "is ascending) or ascending (every update)");

    t.group("Saving and output");
    t.path("--save", o.save_dir, "DIR",
           "save a resumable checkpoint into DIR every --save-every steps (DIR/step-0000000K "
           "after step K); the older saves it wrote go, nothing else in DIR; one run at a time "
           "holds DIR (DIR/save.lock)");
    t.integer("--save-every", o.save_every, 1, 1 << 30, "K", "steps between saves");
    t.path("--resume", o.resume_dir, "DIR", "continue from the latest save in DIR");
    t.path("--save-model", o.save_model, "FILE", "write an llm.c checkpoint after the last step");
    t.boolean("--json", o.json,
              "one JSON object per step instead of the progress line, for scripts; its \"step\" "
              "counts from 1, as the progress line's \"step K/N\" and the saves' step-0000000K do");
    t.boolean("--quiet", o.quiet, "no per-step lines (the summary only)");
    t.path("--trace", o.trace, "FILE",
           "write a Chrome trace (Perfetto) of compute and I/O; under mpirun rank 0 writes FILE "
           "and rank k writes FILE with \".rank<k>\" before its extension");
    t.help_and_version("print this text", "print the version of mini_gpt and Spillway");
}

/// The application every parse and the help start from.
void describe_app(CLI::App& app) {
    app.name("mini_gpt");
    app.description("mini_gpt: train GPT-2 on the CPU with Spillway's offloading primitives.");
}

// ==== Checks across flags ======================================================================
// Every refusal that involves more than one flag, in the order they are checked; each
// flag's own range and choices are its declaration's, above. `shape_flag` is the last of
// --layers, --channels, --heads, --vocab and --max-seq given (empty: none).

void validate(const options& o, const std::string& shape_flag) {
    // The model's shape comes from --init's size or --model's header: a shape flag beside
    // either would be ignored, so it is refused.
    if (!o.init.empty()) {
        if (!o.model.empty()) bad_flag("--init", "give --init or --model, not both");
        if (!shape_flag.empty())
            bad_flag(shape_flag,
                     "the model's shape comes from --init " + o.init + "; drop " + shape_flag);
    }
    // ---- --offload params (its budget; every --grad-dtype and --model are taken) ----
    if (o.offload != offload_mode::params && o.memory_budget > 0) {
        bad_flag("--memory-budget", std::string("needs --offload params (the mode that plans ") +
                                        "every resident byte), got --offload " +
                                        offload_name(o.offload));
    }
    // ---- end of --offload params ----
    if (!o.model.empty() && !shape_flag.empty())
        bad_flag(shape_flag, "the model's shape comes from --model " + o.model.string() +
                                 " (its header); drop " + shape_flag);
    if (o.model.empty() && o.init.empty() && o.channels % o.heads != 0)
        throw input_error("--channels " + std::to_string(o.channels) +
                          " is not divisible by --heads " + std::to_string(o.heads));
    // AdamW's settings, checked now rather than at the first update (which --steps 0 never
    // reaches): beta1 and beta2 below 1, eps above 0.
    if (!(o.beta1 < 1.0f)) bad_flag("--beta1", "must be below 1, got " + std::to_string(o.beta1));
    if (!(o.beta2 < 1.0f)) bad_flag("--beta2", "must be below 1, got " + std::to_string(o.beta2));
    if (!(o.eps > 0.0f)) bad_flag("--eps", "must be above 0, got " + std::to_string(o.eps));
    // The learning-rate schedule.
    if (o.lr_schedule == spillway::lr_decay::constant && o.lr_min != 0.0f)
        bad_flag("--lr-min", "needs --lr-schedule cosine (a constant schedule stays at --lr)");
    if (o.lr_schedule == spillway::lr_decay::cosine) {
        if (!(o.lr_min <= o.lr))
            bad_flag("--lr-min", "must be at most --lr " + std::to_string(o.lr) + ", got " +
                                     std::to_string(o.lr_min));
        if (o.warmup_steps >= o.steps)
            bad_flag("--warmup-steps",
                     "cosine decays after the warmup until --steps " + std::to_string(o.steps) +
                         ": give fewer warmup steps, got " + std::to_string(o.warmup_steps));
    }
    try {
        spillway::validate(lr_schedule_of(o));
    } catch (const std::invalid_argument& e) {
        throw input_error(std::string("--lr-schedule: ") + e.what());
    }
}

/// The shape of --init's size (one of standard_sizes, checked by its declaration).
void apply_init(options& o) {
    for (const auto& size : standard_sizes)
        if (o.init == size.name) {
            o.layers = size.layers;
            o.channels = size.channels;
            o.heads = size.channels / 64;
            o.vocab = 50257;
            o.max_seq = 1024;
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

spillway::lr_schedule lr_schedule_of(const options& opt) {
    spillway::lr_schedule s;
    s.decay = opt.lr_schedule;
    s.lr = opt.lr;
    s.warmup_steps = opt.warmup_steps;
    if (opt.lr_schedule == spillway::lr_decay::cosine) {
        s.lr_min = opt.lr_min;
        s.total_steps = opt.steps;
    }
    return s;
}

std::string version_text() {
    return "mini_gpt (Spillway " SPILLWAY_VERSION_STRING ")\n";
}

std::string usage_text() {
    CLI::App app;
    describe_app(app);
    options defaults;
    declare_flags(app, defaults);
    return app.help();
}

std::optional<std::string> help_or_version(const std::vector<std::string>& args) {
    for (const auto& a : args) {
        if (a == "--help" || a == "-h") return usage_text();
        if (a == "--version") return version_text();
    }
    return std::nullopt;
}

options parse_options(const std::vector<std::string>& args) {
    options o;
    CLI::App app;
    describe_app(app);
    declare_flags(app, o);
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // as CLI11 takes them
    try {
        app.parse(reversed);
    } catch (const CLI::ArgumentMismatch& e) {
        // The last flag, or one before `--flag=`, without its value: CLI11 names it first.
        const std::string what = e.what();
        for (const CLI::Option* opt : app.get_options())
            if (what.rfind(opt->get_name() + ":", 0) == 0)
                bad_flag(opt->get_name(), "needs a value");
        throw input_error(what);
    } catch (const CLI::CallForHelp&) {
        throw input_error("--help: give it alone (help_or_version answers it)");
    } catch (const CLI::CallForVersion&) {
        throw input_error("--version: give it alone (help_or_version answers it)");
    } catch (const CLI::ParseError& e) {
        throw input_error(e.what());  // CLI11's message, which names the flag
    }
    const auto extra = app.remaining();
    if (!extra.empty()) {
        const std::string& a = extra.front();
        bad_flag(a.rfind("--", 0) == 0 ? a.substr(0, a.find('=')) : a, "unknown flag (see --help)");
    }
    std::string shape_flag;
    for (const CLI::Option* opt : app.parse_order()) {
        const std::string name = opt->get_name();
        if (name == "--layers" || name == "--channels" || name == "--heads" || name == "--vocab" ||
            name == "--max-seq")
            shape_flag = name;
    }
    validate(o, shape_flag);
    apply_init(o);
    return o;
}

}  // namespace mini_gpt
