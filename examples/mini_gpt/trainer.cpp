// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/trainer.cpp: train(): the set-up, a short loop over train_step(), the
// saves and the reports. The step itself is step.cpp, saving and resuming checkpoint_dir.cpp,
// printing report.cpp, the command line cli.cpp.
#include "trainer.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "blas_kernels.hpp"
#include "checkpoint_dir.hpp"
#include "cli.hpp"
#include "corpus.hpp"
#include "dist.hpp"
#include "gpt2.hpp"
#include "llmc_format.hpp"
#include "memory_plan.hpp"
#include "optimizer.hpp"
#include "report.hpp"
#include "spillway/error.hpp"
#include "spillway/lock/lock_name.hpp"
#include "spillway/lock/owned_directory.hpp"
#include "spillway/schedule/shard_range.hpp"
#include "step.hpp"
#include "streamed_params.hpp"

namespace mini_gpt {

namespace {

/// Makes sure `dir` exists and is writable; throws input_error naming it otherwise. Only its
/// last component is created (mode 0700): a missing parent is more likely a typing slip than
/// a wish for a new tree, so it is refused, named.
void ensure_writable_dir(const std::filesystem::path& dir, const char* flag) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        const int err = errno;
        auto parent = dir.has_filename() ? dir.parent_path() : dir.parent_path().parent_path();
        if (err == ENOENT && !parent.empty())
            throw input_error(std::string(flag) + " " + spillway::quoted(dir.string()) +
                              ": its parent " + spillway::quoted(parent.string()) +
                              " does not exist (only the last component is created)");
        throw input_error(std::string(flag) + " " + spillway::quoted(dir.string()) +
                          ": cannot create the directory: " + std::strerror(err));
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
        throw input_error(dir.string() + ": " + flag + " is not a directory");
    auto probe = dir / (".mini_gpt-probe-" + std::to_string(::getpid()));
    try {
        std::vector<std::byte> one(1);
        write_file_atomic(probe, one);
    } catch (const input_error& e) {
        throw input_error(dir.string() + ": " + flag + " directory is not writable (" + e.what() +
                          ")");
    }
    std::filesystem::remove(probe, ec);
}

/// Checks that the file named by `path` can be created (its directory exists and takes files).
void ensure_writable_file(const std::filesystem::path& path, const char* flag) {
    auto dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw input_error(path.string() + ": " + flag + " names a directory; give a file name");
    if (!std::filesystem::is_directory(dir, ec))
        throw input_error(path.string() + ": " + flag + " cannot be written: " + dir.string() +
                          " is not a directory");
    auto probe = path;
    probe += ".probe-" + std::to_string(::getpid());
    try {
        std::vector<std::byte> one(1);
        write_file_atomic(probe, one);
    } catch (const input_error& e) {
        throw input_error(path.string() + ": " + flag + " cannot be written (" + e.what() + ")");
    }
    std::filesystem::remove(probe, ec);
}

/// Refuses a --path inside --save, or a --save inside a --path (the same directory included):
/// a save removes its older step folders, and the offloaded state must never be one of them.
/// They are compared by their canonical paths (std::filesystem::weakly_canonical: checked before
/// either is created, so a refused run leaves nothing behind).
void refuse_nested(const std::filesystem::path& save,
                   const std::vector<std::filesystem::path>& paths) {
    const auto s = std::filesystem::weakly_canonical(save);
    // Whether `inner` is `outer` or below it.
    auto within = [](const std::filesystem::path& inner, const std::filesystem::path& outer) {
        return std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end()).first ==
               outer.end();
    };
    for (const auto& p : paths) {
        const auto c = std::filesystem::weakly_canonical(p);
        if (!within(c, s) && !within(s, c)) continue;
        const std::string path = "--path " + spillway::quoted(p.string());
        const std::string save_flag = "--save " + spillway::quoted(save.string());
        throw input_error(
            (within(c, s) ? path + " is inside " + save_flag : save_flag + " is inside " + path) +
            (c == s ? " (the same directory)" : "") +
            ": a save prunes its directory, so the offloaded state and the saves need "
            "directories apart");
    }
}

/// The default --path: a scratch directory removed when the run ends. It is an
/// owned_directory, so the one a killed run left (SIGKILL, the OOM killer) is told from a
/// running one's: every abandoned "mini_gpt-*" directory of the user is removed first.
spillway::owned_directory make_temp_paths() {
    const auto root = std::filesystem::temp_directory_path();
    try {
        spillway::owned_directory::reclaim_abandoned(root, "mini_gpt-");
        return spillway::owned_directory::create(root, "mini_gpt-");
    } catch (const std::system_error& e) {
        throw input_error(root.string() +
                          ": cannot create a temporary directory for the offloaded state (" +
                          e.what() + "); give one with --path");
    }
}

/// The model: read from --model, or the default config initialised from --seed. With
/// --offload params only --model's header is read here (the streams read the parameters
/// layer by layer: streamed_params::load_model).
gpt2_config model_config(const options& opt, std::vector<float>& init_params) {
    gpt2_config config;
    if (!opt.model.empty() && opt.offload == offload_mode::params)
        return read_checkpoint_config(opt.model);
    if (!opt.model.empty()) {
        checkpoint ck = read_checkpoint(opt.model);
        init_params = std::move(ck.params);
        return ck.config;
    }
    config.num_layers = opt.layers;
    config.channels = opt.channels;
    config.num_heads = opt.heads;
    config.vocab_size = opt.vocab;
    config.padded_vocab_size = (opt.vocab + 63) / 64 * 64;
    config.max_seq_len = opt.max_seq;
    try {
        config.validate();
    } catch (const std::invalid_argument& e) {
        throw input_error(std::string("default model: ") + e.what());
    }
    return config;
}

/// The tokens: read from --data, or the built-in corpus; each checked against the vocabulary.
std::vector<std::uint16_t> load_tokens(const options& opt, const gpt2_config& config,
                                       std::string& data_name) {
    std::vector<std::uint16_t> tokens;
    if (!opt.data.empty()) {
        tokens = read_tokens(opt.data);
        data_name = opt.data.string();
    } else {
        tokens = builtin_tokens(opt.corpus_bytes);
        data_name = "built-in corpus";
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] >= config.vocab_size)
            throw input_error(data_name + ": token " + std::to_string(tokens[i]) + " at position " +
                              std::to_string(i) +
                              " is out of range for the model's vocabulary of " +
                              std::to_string(config.vocab_size));
    }
    return tokens;
}

/// Where each rank's optimizer shard starts, and the end: a contiguous run of whole subgroups
/// per rank (spillway::shard_range).
std::vector<std::size_t> optimizer_shards(const options& opt, std::size_t nparams, int nranks) {
    const std::size_t nsub = (nparams + opt.subgroup - 1) / opt.subgroup;
    if (nsub < static_cast<std::size_t>(nranks))
        throw input_error("--subgroup " + std::to_string(opt.subgroup) + " gives " +
                          std::to_string(nsub) + " subgroups, fewer than the " +
                          std::to_string(nranks) + " ranks that share them");
    std::vector<std::size_t> shards;
    for (int r = 0; r < nranks; ++r)
        shards.push_back(spillway::shard_range(nparams, static_cast<std::size_t>(r),
                                               static_cast<std::size_t>(nranks), opt.subgroup)
                             .begin);
    shards.push_back(nparams);
    return shards;
}

/// Every rank must run the same steps on the same model, data and settings: a rank given
/// other flags (an MPMD command line, a stale save on one node) would leave the others
/// waiting in a collective for ever. The ranks compare a fingerprint once.
void check_same_run(const options& opt, const train_state& state,
                    const std::vector<std::uint16_t>& tokens, std::uint64_t data_hash,
                    std::size_t nparams) {
    std::ostringstream settings;
    settings << opt.steps << ' ' << state.next_step << ' ' << opt.batch << ' ' << opt.seq << ' '
             << tokens.size() << ' ' << data_hash << ' ' << nparams << ' '
             << static_cast<int>(opt.grads) << ' ' << static_cast<int>(opt.offload) << ' ' << opt.lr
             << ' ' << static_cast<int>(opt.lr_schedule) << ' ' << opt.lr_min << ' '
             << opt.warmup_steps << ' ' << opt.beta1 << ' ' << opt.beta2 << ' ' << opt.eps << ' '
             << opt.weight_decay << ' ' << opt.subgroup << ' ' << opt.buffers << ' '
             << opt.ascending_order << ' ' << opt.save_dir.empty() << ' ' << opt.save_every << ' '
             << opt.save_model.empty();
    if (!dist::same_everywhere(spillway::fnv1a_64(settings.str())))
        throw input_error(
            "mpirun: the ranks were not given the same run (steps, start step, batch, sequence, "
            "data, "
            "model, gradient type, offload mode, AdamW settings or schedule, subgroups, buffers, "
            "order or "
            "saves differ); give every rank the same flags and files");
}

/// Writes the streams' first state (the GPT-2 init, or --model's parameters, and zero
/// moments), printing the bytes written and the rate about every two seconds on a large
/// model.
void write_first_state(streamed_params& sp, const options& opt, std::ostream& out) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    auto last = t0;
    const bool show = !opt.quiet && !opt.json;
    std::size_t shown_total = 0;
    const streamed_params::progress_fn progress = [&](std::size_t done, std::size_t total) {
        const auto now = clock::now();
        if (!show || (now - last < std::chrono::seconds(2) && done < total)) return;
        if (done == total && shown_total == 0) return;  // fast: no progress lines at all
        last = now;
        shown_total = total;
        const double s = std::chrono::duration<double>(now - t0).count();
        out << "writing the first state: " << human_bytes(static_cast<double>(done)) << " of "
            << human_bytes(static_cast<double>(total)) << " ("
            << human_bytes(static_cast<double>(done) / std::max(s, 1e-9)) << "/s)\n"
            << std::flush;
    };
    if (opt.model.empty())
        sp.init_gpt2(opt.seed, progress);
    else
        sp.load_model(opt.model, progress);
}

/// --save-model with --offload params: the llm.c checkpoint written layer by layer from the
/// streams (no model-sized buffer, so the budget holds to the end), through `file`.tmp
/// (created anew, mode 0600, fsynced) renamed over `file`, as write_checkpoint does.
void write_streamed_model(streamed_params& sp, const std::filesystem::path& file) {
    auto tmp = file;
    tmp += ".tmp";
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
        throw input_error(file.string() + ": cannot remove the stale " + tmp.string() + ": " +
                          std::strerror(errno));
    try {
        sp.write_llmc(tmp);
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
    if (::rename(tmp.c_str(), file.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw input_error(file.string() + ": rename from " + tmp.string() +
                          " failed: " + std::strerror(err));
    }
}

}  // namespace

std::filesystem::path trace_path(const std::filesystem::path& file, int rank) {
    if (rank == 0) return file;
    auto named = file;
    named.replace_filename(file.stem().string() + ".rank" + std::to_string(rank) +
                           file.extension().string());
    return named;
}

void fill_batch(const std::vector<std::uint16_t>& tokens, std::int64_t k, int B, int T, int row0,
                int rows, std::vector<int>& inputs, std::vector<int>& targets) {
    std::size_t BT = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    std::size_t nbatches = (tokens.size() - 1) / BT;
    std::size_t start = static_cast<std::size_t>(k % static_cast<std::int64_t>(nbatches)) * BT +
                        static_cast<std::size_t>(row0) * static_cast<std::size_t>(T);
    std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(T);
    inputs.resize(n);
    targets.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        inputs[i] = tokens[start + i];
        targets[i] = tokens[start + i + 1];
    }
}

std::vector<float> train(const options& opt, std::ostream& rank0_out, run_report* report) {
    // 1. Ranks (dist.hpp) and threads: ours for every kernel, OpenBLAS single-threaded inside
    //    each slice; by default the node's cores are shared among its ranks.
    const int rank = dist::rank(), nranks = dist::size();
    std::ostringstream discard;
    std::ostream& out = rank == 0 ? rank0_out : discard;
    blas::single_threaded();
    const int threads =
        opt.threads > 0
            ? opt.threads
            : std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) /
                              dist::local_size());
    // The compute threads poll 200 us for the next kernel before they sleep: a step calls
    // parallel_for hundreds of times, and waking a sleeping thread costs tens of
    // microseconds on a virtual machine.
    spillway::thread_pool pool(static_cast<std::size_t>(threads - 1), "spw-compute",
                               std::chrono::microseconds(200));

    // 2. The model and the tokens; this rank's rows of every global batch.
    std::vector<float> init_params;
    const gpt2_config config = model_config(opt, init_params);
    if (opt.seq > config.max_seq_len)
        throw input_error("--seq " + std::to_string(opt.seq) + " exceeds the model's max_seq_len " +
                          std::to_string(config.max_seq_len));
    const bool offload_params = opt.offload == offload_mode::params;
    gpt2 model(config, pool, offload_params ? param_memory::external : param_memory::owned);
    // --offload params initialises the parameters straight into the streams, below.
    if (!offload_params) {
        if (init_params.empty())
            model.init_gpt2(opt.seed);
        else
            model.load_llmc_params(init_params);
    }
    std::string data_name;
    const std::vector<std::uint16_t> tokens = load_tokens(opt, config, data_name);
    const int B = opt.batch, T = opt.seq;
    const std::size_t BT = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    if (B < nranks)
        throw input_error("--batch " + std::to_string(B) +
                          " is smaller than the number of ranks (" + std::to_string(nranks) +
                          "): every rank needs at least one row");
    const spillway::index_range rows =
        spillway::shard_range(static_cast<std::size_t>(B), static_cast<std::size_t>(rank),
                              static_cast<std::size_t>(nranks));
    if (tokens.size() < BT + 1)
        throw input_error(data_name + ": " + std::to_string(tokens.size()) +
                          " tokens, fewer than one batch needs (" + std::to_string(BT + 1) +
                          " for --batch " + std::to_string(B) + " --seq " + std::to_string(T) +
                          ")");

    // 3. Output paths are checked before any work is done.
    if (!opt.save_dir.empty()) refuse_nested(opt.save_dir, opt.paths);
    if (!opt.save_model.empty()) ensure_writable_file(opt.save_model, "--save-model");
    if (!opt.save_dir.empty()) ensure_writable_dir(opt.save_dir, "--save");
    for (const auto& p : opt.paths) ensure_writable_dir(p, "--path");
    std::optional<save_directory> save_dir;  // held (locked) until the run ends
    if (!opt.save_dir.empty()) save_dir.emplace(opt.save_dir, std::cerr);
    if (!opt.lock_dir.empty()) ensure_writable_dir(opt.lock_dir, "--lock-dir");
    if (!opt.trace.empty()) ensure_writable_file(opt.trace, "--trace");
    std::optional<spillway::owned_directory> temp_paths;
    std::vector<std::filesystem::path> paths = opt.paths;
    const bool offload_opt =
        opt.offload == offload_mode::optimizer || opt.offload == offload_mode::all;
    const bool offload_act = opt.offload == offload_mode::activations ||
                             opt.offload == offload_mode::all || offload_params;
    if (paths.empty() && (offload_opt || offload_act)) {
        temp_paths.emplace(make_temp_paths());
        paths.push_back(temp_paths->path());
    }

    // 4. The optimizer and the activation store for the --offload mode.
    std::unique_ptr<spillway::trace::recorder> recorder;
    // Every rank records its own timeline; rank k > 0 writes it beside rank 0's (trace_path).
    const std::filesystem::path trace_file =
        opt.trace.empty() ? opt.trace : trace_path(opt.trace, rank);
    if (!opt.trace.empty())
        recorder = std::make_unique<spillway::trace::recorder>(
            spillway::trace::recording::enabled,
            nranks > 1 ? "mini_gpt rank " + std::to_string(rank) : "mini_gpt");
    const std::string process_tag = std::to_string(::getpid());
    optimizer_settings os;
    os.adam = {opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay};
    os.subgroup = opt.subgroup;
    os.buffers = opt.buffers;
    os.paths = paths;
    // A temporary path is this process's alone: its locks live (and go) with it, instead of
    // leaving a lock file per run in /dev/shm.
    if (!opt.lock_dir.empty())
        os.lock_directory = opt.lock_dir;
    else if (temp_paths)
        os.lock_directory = temp_paths->path();
    os.grads = opt.grads;
    os.order = opt.ascending_order ? spillway::subgroup_order::ascending
                                   : spillway::subgroup_order::alternating;
    os.pool = &pool;
    os.recorder = recorder.get();
    os.key_prefix = "optim-" + process_tag;
    const std::size_t nparams = model.layout().total;
    // (--offload params: no optimizer shards; the streams update every layer on every rank)
    const std::vector<std::size_t> shards =
        offload_params ? std::vector<std::size_t>(static_cast<std::size_t>(nranks) + 1, 0)
                       : optimizer_shards(opt, nparams, nranks);
    const std::span<float> shard = model.params().subspan(
        shards[static_cast<std::size_t>(rank)],
        shards[static_cast<std::size_t>(rank) + 1] - shards[static_cast<std::size_t>(rank)]);
    std::unique_ptr<optimizer> optim = offload_opt ? make_offloaded_optimizer(os, shard.size())
                                                   : make_memory_optimizer(os, shard.size());
    const int local_rows = static_cast<int>(rows.size());
    std::unique_ptr<activation_store> store;
    // --offload params: the memory plan, the free space, the streams and their first state.
    std::unique_ptr<streamed_params> streamed;
    std::size_t param_window = 0, state_window = 0, grad_window = 0;
    // The activation store's settings. With a memory budget every layer's activations leave
    // (the adaptive split would keep layers chosen at run time); --act-split K and
    // --act-budget stay inside the plan (the stash's budget is one of its fixed parts).
    const int split =
        offload_params && opt.memory_budget > 0 && opt.act_split < 0 ? 1 << 30 : opt.act_split;
    const store_settings ss{paths.empty() ? std::filesystem::path() : paths.front(),
                            "act-" + process_tag,
                            recorder.get(),
                            split,
                            opt.act_budget_mib << 20,
                            opt.act_recompute};
    if (offload_params) {
        const bool fp16 = opt.grads == grad_dtype::fp16;  // (the gradient spill's window)
        const stream_windows windows = plan_stream_windows(
            opt.memory_budget, {.config = config,
                                .rows = local_rows,
                                .seq = T,
                                .threads = threads,
                                .grads = opt.grads,
                                .tokens_bytes = tokens.size() * sizeof(tokens[0]),
                                .baseline = opt.baseline_rss,
                                .stash = &ss});
        param_window = windows.params;
        state_window = windows.state;
        grad_window = windows.grads;
        // Each path must hold its layers' params and m,v (and fp16 gradients: layer l on
        // path l mod P, striped_tier), in whole blocks, with the file tiers' spare files and
        // the rewrites in flight (streamed_params::disk_bytes_on); the first one the
        // activations too. Paths on one file system share its free space.
        std::vector<std::size_t> need(paths.size()), stored(paths.size());
        std::vector<dev_t> device(paths.size(), 0);
        for (std::size_t i = 0; i < paths.size(); ++i) {
            stored[i] = streamed_params::stored_bytes_on(config, opt.grads, i, paths.size());
            need[i] = streamed_params::disk_bytes_on(config, opt.grads, i, paths.size(),
                                                     param_window, state_window, grad_window) +
                      (i == 0 ? stash_stored_bytes(config, local_rows, T, opt.act_recompute) : 0);
            struct stat st {};
            if (::stat(paths[i].c_str(), &st) == 0) device[i] = st.st_dev;
        }
        for (std::size_t i = 0; i < paths.size(); ++i) {
            std::size_t together = 0;  // this path's and those on its file system
            std::string others;
            for (std::size_t j = 0; j < paths.size(); ++j) {
                if (j != i && (device[j] != device[i] || device[i] == 0)) continue;
                together += need[j];
                if (j != i) others += (others.empty() ? "" : ", ") + paths[j].string();
            }
            const std::size_t free = free_bytes(paths[i]);
            if (free < together)
                throw input_error(
                    paths[i].string() + ": " + human_bytes(static_cast<double>(need[i])) +
                    " needed for the model's state (params 4 B + m,v 8 B" +
                    (fp16 ? " + fp16 gradients 2 B" : "") + " per streamed parameter" +
                    (paths.size() > 1 ? " of its layers, " + std::to_string(i) + " mod " +
                                            std::to_string(paths.size())
                                      : std::string()) +
                    ": " + human_bytes(static_cast<double>(stored[i])) + "; " +
                    (i == 0 ? "activations, spare files and rewrites: "
                            : "spare files and rewrites: ") +
                    human_bytes(static_cast<double>(need[i] - stored[i])) + ")" +
                    (others.empty() ? std::string()
                                    : ", " + human_bytes(static_cast<double>(together)) +
                                          " with --path " + others + " on the same file system") +
                    ", only " + human_bytes(static_cast<double>(free)) + " free");
        }
        streamed_params_settings sps;
        sps.paths = paths;
        sps.param_window = param_window;
        sps.state_window = state_window;
        sps.grad_window = grad_window;
        sps.grads = opt.grads;
        sps.adam = os.adam;
        sps.pool = &pool;
        sps.reduce_gradients = nranks > 1;
        streamed = std::make_unique<streamed_params>(config, sps);
        model.use_param_store(streamed.get());
        if (opt.resume_dir.empty()) write_first_state(*streamed, opt, out);  // (else the save's)
    }
    if (offload_act) {
        store = make_offloading_store(config, local_rows, T, ss);
    } else {
        store = std::make_unique<in_memory_store>(config, local_rows, T);
    }

    // 5. The state: fresh, or the latest save of --resume.
    const std::uint64_t data_hash =
        opt.resume_dir.empty() && opt.save_dir.empty() && nranks == 1 ? 0 : tokens_hash(tokens);
    train_state state;
    state.loss_scale = opt.grads == grad_dtype::fp16 ? 32768.0f : 1.0f;
    if (!opt.resume_dir.empty() || !opt.save_dir.empty()) {  // what a save records of the run
        state.has_run_shape = true;
        state.shape = {static_cast<std::int32_t>(opt.grads), B, T, tokens.size(), data_hash};
        state.has_schedule = true;
        state.schedule = lr_schedule_of(opt);
    }
    if (!opt.resume_dir.empty())
        state = resume_checkpoint(opt.resume_dir, opt, data_name, model, *optim, shard, state,
                                  streamed.get());
    else if (!offload_params)
        optim->init(shard);  // (--offload params: write_first_state zeroed the moments)
    if (nranks > 1) check_same_run(opt, state, tokens, data_hash, nparams);

    // 6. Train.
    const std::size_t layer_act_bytes = layer_acts::floats(config, local_rows, T) * sizeof(float) *
                                        static_cast<std::size_t>(config.num_layers);
    run_printer printer(opt, out, report, model, layer_act_bytes);
    if (streamed) {
        std::vector<std::string> names;
        for (const auto& p : paths) names.push_back(p.string());
        printer.stream_paths(std::move(names));
    }
    printer.header(threads, data_name, tokens.size());
    step_runner steps(
        {opt, tokens, model, *optim, *store, rows, shards, recorder.get(), streamed.get()});
    std::vector<float> losses;
    for (std::int64_t step = state.next_step; step < opt.steps; ++step) {
        const step_result r = steps.train_step(step, state);
        losses.push_back(r.loss);
        printer.step(r);
        if (save_dir && (step + 1) % opt.save_every == 0)
            save_checkpoint(*save_dir, step + 1, model, *optim, state, streamed.get());
    }

    // 7. The end: --save-model, the trace and the summary.
    // Their paths were checked at the start: a write that fails now is the run's failure
    // (a full disk, an I/O error: exit status 1), not bad input.
    if (!opt.save_model.empty() && rank == 0) {
        try {
            if (streamed)
                write_streamed_model(*streamed, opt.save_model);
            else
                write_checkpoint(opt.save_model, config, model.llmc_params());
        } catch (const input_error& e) {
            throw save_error("--save-model " + spillway::quoted(opt.save_model.string()) +
                             ": cannot write it: " + e.what());
        }
    }
    if (recorder) {
        try {
            recorder->save(trace_file);
        } catch (const std::system_error& e) {
            throw save_error(trace_file.string() + ": cannot write the trace: " + e.what());
        }
    }
    printer.summary(steps, *store, *optim, streamed.get(), param_window, state_window);
    return losses;
}

}  // namespace mini_gpt
