// SPDX-License-Identifier: Apache-2.0
// bench/bench_mini_gpt.cpp: training step time of examples/mini_gpt for every --offload mode,
// on the default config and on GPT-2 124M (B=4, T=64), with 1 and 2 ranks, against limits
// measured in this run.
//
// Rows:
//  - sgemm_limit: a large fp32 matrix product (M=N=K=2048) through the trainer's own matmul
//    path (our thread pool over OpenBLAS slices): the
//    FLOP/s ceiling of this machine for the model's arithmetic. Counter flops_per_s.
//  - path_bandwidth: 1 GiB written and read back through a file tier (O_DIRECT where the
//    file system allows) in the scratch directory, the path the offloaded state takes in the
//    step rows; path_bandwidth/shm: the same on /dev/shm (a file tier in memory), the path of
//    the gpt2_124M_shm row. Counters write_bytes_per_s, read_bytes_per_s.
//  - step/<config>/<offload>/ranks:<P>: one training run, the mini_gpt binary with --json in a
//    process of its own as a user runs it (a run inside this process is slower, by varying
//    amounts); the row's time is the median over two-step cycles after the first step (the
//    first allocates and, with the stash, profiles) of each cycle's mean step time: the
//    offloaded optimizer's ascending updates run under the next step's forward, so steps
//    alternate short and long, and a cycle holds one update of each direction.
//    Counters: model_flops_per_s, vs_limit (model FLOP/s over the sgemm limit measured again
//    around this run, the better of before and after: the machine may be shared), ms_per_step,
//    act_peak_bytes and act_peak_vs_all_kept (median peak after the first step over keeping
//    every layer; 1 rank), update_ms, io_wait_ms and param_wait_ms (forward waiting for a
//    deferred update; per cycle as above; 1 rank), cpu_ms_per_step (process CPU time per
//    step, all threads; 1 rank). A peer trainer is measured in the same run or not at all:
//    bench/peers/torch_gpt2.py runs PyTorch beside mini_gpt (`scripts/dev bench torch`).
//    Rows other than `none` run 3 times (SPILLWAY_MINI_GPT_PAIRS),
//    each run right after a `none` run of the same model and ranks; the row's time is the
//    median of its runs and vs_none the median of the pairs' ratios (vs_none_min and
//    vs_none_max their spread, vs_none_pairs their count): on a machine whose speed drifts
//    over minutes, a ratio of two adjacent runs is what stays meaningful. Other counters come
//    from the row's first run. The `optimizer` and `all` rows (1 rank) also carry the goal's
//    premise ("when the paths' bandwidth suffices"): path_bytes_per_step (the optimizer
//    state on the path, m and v, and with `all` every layer's stored activations (less the
//    LayerNorm, attention and GELU outputs backward recomputes), each written and read once),
//    path_floor_ms (those
//    bytes over the path's measured write and read bandwidth; opt_io_floor_ms: the optimizer
//    state's part), path_needed_bytes_per_s (the bytes over the paired `none` runs' step),
//    for `all` forward_write_floor_ms (the layers' activations over the path's write
//    bandwidth) and forward_ms_none (the paired `none` runs' forward), and
//    bandwidth_suffices (1 when path_floor_ms is below the `none` step and, for `all`,
//    forward_write_floor_ms below the `none` forward: TBA's premise that the writes keep up
//    with the forward that produces them).
//    The default config's one-rank `optimizer`, `activations` and `all` rows also measure the
//    machine's charge for their I/O (where fio is installed): in each pair, after the row's
//    run, a `none` run while fio moves the row's bytes each way at the pace of the row's run
//    (random 1 MiB O_DIRECT reads and writes on the same path). Counters: io_load_bytes_per_step,
//    io_load_read_bytes_per_s and io_load_write_bytes_per_s (what fio moved), none_under_io_ms,
//    io_tax (that `none` step over the pair's plain `none` step; median of the pairs) and
//    vs_none_under_io (the row over the `none` step under fio: 1 means the row costs what its
//    bytes alone cost the machine).
//  - step/gpt2_124M_2path/all/ranks:1: the optimizer state over two paths, the scratch
//    directory and /dev/shm (`--path` twice: the virtual tier places the subgroups by the
//    paths' measured bandwidth: a disk path and a second path); the
//    activations on the first. The premise counts the optimizer's bytes at the two paths'
//    summed bandwidth.
//  - step/gpt2_124M_sync/all/ranks:1: the `all` row with --update-under-forward off and
//    --update-under-backward off, every update in its own phase (what the trainer did before
//    its ascending updates ran under the next forward and its descending ones under
//    backward): the gain of those overlaps, measured in the same run.
//  - step/gpt2_124M_shm/all/ranks:1 and step/default_shm/all/ranks:1: the `all` runs with their
//    paths on /dev/shm, where the bandwidth suffices (a 124M step moves about 2.3 GB, more
//    than a slow disk moves in the step's compute time); vs_none against `none` runs
//    of the same model (they touch no path). The bytes really go through file tiers, on a memory file system (on 2
//    cores its copies take CPU time from the compute, as a disk's DMA would not).
//  - 2 ranks: `mpirun -np 2` (with --oversubscribe, and --allow-run-as-root as root) on the
//    same command with one thread per rank, so both rows use 2 threads.
// The `activations` and `all` rows use --act-split offload (every layer's activations go to
// the tier), so they measure what the stash saves and what its I/O costs.
//
// Side file mini_gpt_series.json (beside --benchmark_out, else in the current directory):
// {"machine", "date", "runs": [{"config", "offload", "ranks", "loss": [...], "step_ms": [...],
// "act_peak_bytes"}]}, one run per step row: the default config's runs are long enough to
// show the loss fall.
// SPILLWAY_BENCH_SMOKE=1 runs only the default config, briefly.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "support/bench_env.hpp"
#include "support/fio.hpp"

#if __has_include("trainer.hpp")
#include "blas_kernels.hpp"
#include "gpt2.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/tier/file_tier.hpp"
#include "trainer.hpp"

namespace {

using mini_gpt::offload_mode;
using mini_gpt::offload_name;
using spillway::bench::shell_quote;

int bench_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/// The values after the first (the warm-up step).
template <class T>
std::vector<double> after_first(const std::vector<T>& v) {
    return v.size() < 2 ? std::vector<double>() : std::vector<double>(v.begin() + 1, v.end());
}

/// The median over two-step cycles after the first (warm-up) step of each cycle's mean: the
/// alternating order makes consecutive steps differ (an ascending update runs under the next
/// step's forward, a descending one in its own step), so a cycle is the unit a step time
/// means; an odd step left at the end is dropped. A run too short for one cycle: the median
/// step after the first (as scripts/bench_report.py's step_median).
template <class T>
double cycle_median(const std::vector<T>& v) {
    std::vector<double> cycles;
    for (std::size_t k = 1; k + 1 < v.size(); k += 2)
        cycles.push_back((static_cast<double>(v[k]) + static_cast<double>(v[k + 1])) / 2);
    return cycles.empty() ? median(after_first(v)) : median(cycles);
}

/// Seconds of `reps` M=N=K=n products through the trainer's matmul path (median).
double time_sgemm(int n, int reps) {
    mini_gpt::blas::single_threaded();
    spillway::thread_pool pool(static_cast<std::size_t>(bench_threads() - 1));
    std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
    std::vector<double> secs;
    for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        mini_gpt::matmul_forward(pool, c.data(), a.data(), b.data(), nullptr, n, n, n);
        secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        benchmark::DoNotOptimize(c.data());
    }
    return median(secs);
}

int sgemm_n() { return spillway::bench::smoke() ? 256 : 2048; }
double sgemm_flops_per_s() {
    const int n = sgemm_n();
    return 2.0 * n * n * static_cast<double>(n) / time_sgemm(n, 3);
}

void sgemm_limit(benchmark::State& state) {
    double flops = 0;
    for (auto _ : state) {
        const int n = sgemm_n();
        double s = time_sgemm(n, 3);
        state.SetIterationTime(s);
        flops = 2.0 * n * n * static_cast<double>(n) / s;
    }
    state.counters["flops_per_s"] = flops;
}

// ---- The offload paths' bandwidth ------------------------------------------------------------

/// One offload path: where its files go and what the path_bandwidth row measured on it.
struct offload_path {
    std::filesystem::path dir;
    double write_bps = 0, read_bps = 0;
};
offload_path disk_path;  // the scratch directory (SPILLWAY_BENCH_DIR), on the disk by default
offload_path shm_path;   // a directory on /dev/shm (memory): the path whose bandwidth suffices

/// The second path's directory, or empty where /dev/shm is not there.
std::filesystem::path shm_dir() {
    std::error_code ec;
    if (!std::filesystem::is_directory("/dev/shm", ec)) return {};
    return std::filesystem::path("/dev/shm") / ("spillway-bench-mini_gpt-" + std::to_string(::getpid()));
}

void path_bandwidth(benchmark::State& state, offload_path* path) {
    // 1 GiB: a 256 MiB burst fits the caches below a virtual disk and overstates what a step
    // that moves gigabytes sees.
    const std::size_t blob = std::size_t{32} << 20, count = spillway::bench::smoke() ? 2 : 32;
    if (path->dir.empty()) {
        state.SkipWithError("/dev/shm is not a directory here");
        return;
    }
    auto dir = path->dir / "mini_gpt-bandwidth";
    std::filesystem::create_directories(dir);
    double path_write_bps = 0, path_read_bps = 0;
    for (auto _ : state) {
        spillway::file_tier<> tier(dir);
        std::vector<spillway::aligned_buffer> bufs;
        for (std::size_t i = 0; i < count; ++i) {
            bufs.emplace_back(blob);
            std::fill(bufs.back().as<float>().begin(), bufs.back().as<float>().end(), static_cast<float>(i));
        }
        auto timed = [&](auto&& issue) {
            auto t0 = std::chrono::steady_clock::now();
            std::vector<spillway::io_completion> done;
            for (std::size_t i = 0; i < count; ++i) done.push_back(issue("blob" + std::to_string(i), bufs[i]));
            for (auto& d : done) d.wait();
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        };
        double w = timed([&](const std::string& k, spillway::aligned_buffer& b) { return tier.write(k, b.bytes()); });
        double r = timed([&](const std::string& k, spillway::aligned_buffer& b) { return tier.read(k, b.bytes()); });
        for (std::size_t i = 0; i < count; ++i) tier.erase("blob" + std::to_string(i));
        state.SetIterationTime(w + r);
        path_write_bps = static_cast<double>(blob * count) / w;
        path_read_bps = static_cast<double>(blob * count) / r;
    }
    std::filesystem::remove_all(dir);
    path->write_bps = path_write_bps;
    path->read_bps = path_read_bps;
    state.counters["write_bytes_per_s"] = path_write_bps;
    state.counters["read_bytes_per_s"] = path_read_bps;
}

// ---- Training runs -------------------------------------------------------------------------

/// One run for the side file.
struct series_run {
    std::string config, offload;
    int ranks = 1;
    std::vector<double> loss, step_ms;
    std::size_t act_peak_bytes = 0;
};
std::vector<series_run> series;

mini_gpt::options run_options(bool gpt2_124m, offload_mode mode, const offload_path& path) {
    mini_gpt::options o;
    o.threads = bench_threads();
    o.quiet = true;
    o.offload = mode;
    o.paths = {path.dir / "mini_gpt"};
    o.lock_dir = path.dir / "mini_gpt-locks";  // beside the path, not one pair per run in /dev/shm
    o.act_split = 1 << 30;  // every layer's activations to the tier (see the file comment)
    if (gpt2_124m) {
        o.layers = 12;
        o.channels = 768;
        o.heads = 12;
        o.vocab = 50257;  // padded to 50304 as llm.c does
        o.max_seq = 1024;
        o.batch = 4;
        o.seq = 64;
        o.steps = 6;  // a warm-up step, two measured cycles (steps 1-4), and the last (dropped)
        o.subgroup = std::size_t{1} << 22;  // 4 Mi params (32 MiB of m and v) per subgroup
        o.buffers = 8;
    } else {
        o.steps = spillway::bench::smoke() ? 3 : 100;  // long enough to show the loss fall
    }
    return o;
}

/// The mini_gpt command line for `o` (the flags run_options sets).
std::vector<std::string> command_line(const mini_gpt::options& o) {
    auto s = [](auto v) { return std::to_string(v); };
    std::vector<std::string> args = {
        "--json", "--threads", s(o.threads), "--layers", s(o.layers), "--channels", s(o.channels), "--heads",
        s(o.heads), "--vocab", s(o.vocab), "--max-seq", s(o.max_seq), "--batch", s(o.batch), "--seq", s(o.seq),
        "--steps", s(o.steps), "--subgroup", s(o.subgroup), "--buffers", s(o.buffers), "--offload",
        offload_name(o.offload), "--act-split", "offload", "--lock-dir", o.lock_dir.string(),
        "--update-under-forward", o.update_under_forward ? "on" : "off", "--update-under-backward",
        o.update_under_backward ? "on" : "off"};
    for (const auto& p : o.paths) {
        args.push_back("--path");
        args.push_back(p.string());
    }
    return args;
}

/// The model `o` describes (the vocabulary padded to a multiple of 64, as the trainer does).
mini_gpt::gpt2_config model_config(const mini_gpt::options& o) {
    mini_gpt::gpt2_config c;
    c.num_layers = o.layers;
    c.channels = o.channels;
    c.num_heads = o.heads;
    c.max_seq_len = o.max_seq;
    c.vocab_size = o.vocab;
    c.padded_vocab_size = (o.vocab + 63) / 64 * 64;
    return c;
}

/// Runs `o` as its user would, a process of its own: the mini_gpt binary with --json, on
/// `ranks` MPI ranks under mpirun (one thread each) or alone (bench_threads() threads), and
/// reads rank 0's JSON lines into the run and *rep. A run inside this process is slower than
/// the same flags from the command line, and by varying amounts, so every row runs the
/// command a user types. Throws std::runtime_error
/// naming the command when it fails.
series_run run_once(mini_gpt::options o, int ranks, mini_gpt::run_report* rep) {
    std::string cmd;
    if (ranks != 1) {
        o.threads = std::max(1, bench_threads() / ranks);
        cmd = shell_quote(MINI_GPT_MPIEXEC) + " -np " + std::to_string(ranks) + " --oversubscribe";
        if (::geteuid() == 0) cmd += " --allow-run-as-root";
        cmd += ' ';
    }
    cmd += shell_quote(MINI_GPT_EXE);
    for (const auto& a : command_line(o)) {
        cmd += ' ';
        cmd += shell_quote(a);
    }
    cmd += " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot start: " + cmd);
    std::string out;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    int status = ::pclose(p);
    if (status != 0) throw std::runtime_error("exit status " + std::to_string(status) + ": " + cmd + "\n" + out);
    mini_gpt::run_report local;
    if (!rep) rep = &local;
    series_run r;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
        if (line.empty() || line.front() != '{') continue;
        auto j = nlohmann::json::parse(line);
        r.loss.push_back(j.at("loss").get<double>());
        rep->step_ms.push_back(j.at("ms").get<double>());
        rep->forward_ms.push_back(j.at("forward_ms").get<double>());
        rep->backward_ms.push_back(j.at("backward_ms").get<double>());
        rep->update_ms.push_back(j.at("update_ms").get<double>());
        rep->io_wait_ms.push_back(j.at("io_wait_ms").get<double>());
        rep->cpu_ms.push_back(j.at("cpu_ms").get<double>());
        rep->param_wait_ms.push_back(j.at("param_wait_ms").get<double>());
        rep->update_deferred.push_back(j.at("update_deferred").get<bool>());
        rep->act_peak_bytes.push_back(j.at("act_peak_bytes").get<std::size_t>());
        rep->all_kept_bytes = j.at("act_all_kept_bytes").get<std::size_t>();
    }
    if (static_cast<int>(r.loss.size()) != o.steps)
        throw std::runtime_error("expected " + std::to_string(o.steps) + " steps from: " + cmd + "\n" + out);
    r.step_ms = rep->step_ms;
    r.act_peak_bytes = static_cast<std::size_t>(median(after_first(rep->act_peak_bytes)));
    return r;
}

/// Pairs of (`none`, this row) runs per row other than `none`: 3, 1 for a smoke run;
/// SPILLWAY_MINI_GPT_PAIRS overrides.
int pair_count() {
    if (const char* e = std::getenv("SPILLWAY_MINI_GPT_PAIRS")) return std::max(1, std::atoi(e));
    return spillway::bench::smoke() ? 1 : 3;
}

/// A step row: the model, the offload mode, the ranks, and the path the offloaded bytes take.
struct row {
    bool big;
    offload_mode mode;
    int ranks;
    bool on_shm = false;     // the paths on /dev/shm instead of the scratch directory
    bool two_paths = false;  // the optimizer over the scratch directory and /dev/shm (--path twice)
    bool sync_update = false;  // --update-under-forward off --update-under-backward off: every update in its own phase
};

/// The config name's suffix of a row's paths: "_shm" (/dev/shm alone), "_2path" (the scratch
/// directory and /dev/shm), "" (the scratch directory); then "_sync" for a row whose updates
/// all run in their own phase.
std::string row_suffix(const row& r) {
    return std::string(r.on_shm ? "_shm" : r.two_paths ? "_2path" : "") + (r.sync_update ? "_sync" : "");
}

/// A one-rank step's bytes through its path, each way: m and v of every parameter with the
/// optimizer offloaded (the fp32 params are the model's own and stay in memory), and every
/// layer's stored activations with them offloaded (--act-split offload; the block less what
/// backward recomputes: --act-recompute is on in every row).
struct path_traffic {
    double state_bytes = 0, act_bytes = 0;
    [[nodiscard]] double each_way() const { return state_bytes + act_bytes; }
};
path_traffic traffic_of(const mini_gpt::options& o) {
    const mini_gpt::gpt2_config c = model_config(o);
    path_traffic t;
    if (o.offload == offload_mode::optimizer || o.offload == offload_mode::all)
        t.state_bytes = 8.0 * static_cast<double>(mini_gpt::param_layout(c).total);
    if (o.offload == offload_mode::activations || o.offload == offload_mode::all)
        t.act_bytes = static_cast<double>(mini_gpt::layer_acts::stored_floats(c, o.batch, o.seq) * sizeof(float) *
                                          static_cast<std::size_t>(o.layers));
    return t;
}

/// The machine's charge for I/O: a `none` run (which touches no path) while fio moves
/// `bytes_per_s` each way through `path` in the offloaded runs' pattern (random 1 MiB reads and
/// writes, O_DIRECT, a few in flight, buffers on huge pages as the stash's are). On a virtual
/// machine the host's side of the I/O can take time from the guest's cores, so the bytes an
/// offloading row moves slow its compute even though its own threads barely use the CPU.
struct taxed_run {
    double step_s = 0;
    spillway::bench::fio_result moved;
};
taxed_run run_under_io(const mini_gpt::options& none_o, const offload_path& path, double bytes_per_s) {
    const auto dir = path.dir / "mini_gpt-io-load";
    std::filesystem::create_directories(dir);
    const auto rate = std::to_string(static_cast<long long>(bytes_per_s));
    taxed_run t;
    {
        spillway::bench::background_fio fio("--name=io_load --directory=" + shell_quote(dir.string()) +
                                                " --size=256m --rw=randrw --bs=1m --direct=1 --ioengine=io_uring"
                                                " --iodepth=4 --time_based --runtime=3600 --rate=" + rate + "," + rate,
                                            path.dir, spillway::bench::fio_memory::huge_pages);
        // fio first lays out its 256 MiB file (a fraction of a second at this disk's speed).
        std::this_thread::sleep_for(std::chrono::seconds(1));
        const series_run none = run_once(none_o, 1, nullptr);
        t.moved = fio.stop();
        t.step_s = cycle_median(none.step_ms) / 1e3;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return t;
}

void train_step(benchmark::State& state, const row& r) {
    const bool gpt2_124m = r.big;
    const offload_mode mode = r.mode;
    const int ranks = r.ranks;
    const offload_path& path = r.on_shm ? shm_path : disk_path;  // the activations' path, and the first
    if (path.dir.empty() || (r.two_paths && shm_path.dir.empty())) {
        state.SkipWithError("/dev/shm is not a directory here");
        return;
    }
    mini_gpt::options o = run_options(gpt2_124m, mode, path);
    if (r.two_paths) o.paths.push_back(shm_path.dir / "mini_gpt");
    o.update_under_forward = !r.sync_update;
    o.update_under_backward = !r.sync_update;
    // The optimizer state's bandwidth: its paths' together (the virtual tier places it by
    // their measured ratio); the activations take the first path.
    const double opt_read_bps = path.read_bps + (r.two_paths ? shm_path.read_bps : 0.0);
    const double opt_write_bps = path.write_bps + (r.two_paths ? shm_path.write_bps : 0.0);
    // The shm rows pair with `none` runs of the same model (none touches no path).
    const std::string model = gpt2_124m ? "gpt2_124M" : "default";
    const std::string config = model + row_suffix(r);
    for (auto _ : state) {
        // The limit again, right before and after the run: the machines are shared, so a
        // ratio is only meaningful against a limit measured under the same load.
        double limit = sgemm_flops_per_s();
        // Paired runs: each run of this row comes right after a `none` run of the same model
        // and ranks, and vs_none is the median of the pairs' ratios, so a slow spell of the
        // machine (they last minutes here) weighs on both sides of a ratio.
        const int pairs = mode == offload_mode::none ? 1 : pair_count();
        const mini_gpt::options none_o = run_options(gpt2_124m, offload_mode::none, path);
        series_run run;
        mini_gpt::run_report rep;
        std::vector<double> row_s, none_s, none_forward_ms, ratios;
        // The I/O tax (default config, one rank, the disk path): per pair, a `none` run under
        // fio moving this row's bytes at this run's pace (see run_under_io).
        const path_traffic traffic = traffic_of(o);
        const bool measure_tax = !gpt2_124m && ranks == 1 && !r.on_shm && !r.two_paths && !r.sync_update &&
                                 mode != offload_mode::none && spillway::bench::fio_available();
        std::vector<double> taxed_s, tax_ratios, vs_taxed, fio_read_bps, fio_write_bps;
        try {
            for (int k = 0; k < pairs; ++k) {
                if (mode != offload_mode::none) {
                    mini_gpt::run_report reference_rep;
                    const series_run reference = run_once(none_o, ranks, &reference_rep);
                    none_s.push_back(cycle_median(reference.step_ms) / 1e3);
                    if (!reference_rep.forward_ms.empty())
                        none_forward_ms.push_back(median(after_first(reference_rep.forward_ms)));
                }
                mini_gpt::run_report this_rep;
                series_run this_run = run_once(o, ranks, &this_rep);
                row_s.push_back(cycle_median(this_run.step_ms) / 1e3);
                if (!none_s.empty()) ratios.push_back(row_s.back() / none_s.back());
                if (measure_tax && !none_s.empty()) {
                    const taxed_run t = run_under_io(none_o, path, traffic.each_way() / row_s.back());
                    taxed_s.push_back(t.step_s);
                    tax_ratios.push_back(t.step_s / none_s.back());
                    vs_taxed.push_back(row_s.back() / t.step_s);
                    fio_read_bps.push_back(t.moved.read_bytes_per_second);
                    fio_write_bps.push_back(t.moved.write_bytes_per_second);
                }
                if (k == 0) {  // the series and the per-step counters come from the first run
                    run = std::move(this_run);
                    rep = std::move(this_rep);
                }
            }
        } catch (const std::exception& e) {
            state.SkipWithError(e.what());
            return;
        }
        limit = std::max(limit, sgemm_flops_per_s());
        run.config = config;
        run.offload = offload_name(mode);
        run.ranks = ranks;
        const double step_s = median(row_s);
        state.SetIterationTime(step_s);
        // Model FLOPs per step: the global batch's tokens (the same for 1 and 2 ranks).
        const double flops = mini_gpt::flops_per_token(model_config(o), o.seq) * o.batch * o.seq / step_s;
        state.counters["ms_per_step"] = step_s * 1e3;
        state.counters["model_flops_per_s"] = flops;
        state.counters["sgemm_flops_per_s"] = limit;
        state.counters["vs_limit"] = flops / limit;
        state.counters["tokens_per_s"] = o.batch * o.seq / step_s;
        state.counters["act_peak_bytes"] = static_cast<double>(run.act_peak_bytes);
        state.counters["loss_first"] = run.loss.front();
        state.counters["loss_last"] = run.loss.back();
        if (ranks == 1) {
            state.counters["act_peak_vs_all_kept"] =
                static_cast<double>(run.act_peak_bytes) / static_cast<double>(rep.all_kept_bytes);
            state.counters["cpu_ms_per_step"] = cycle_median(rep.cpu_ms);
            state.counters["update_ms"] = cycle_median(rep.update_ms);
            state.counters["io_wait_ms"] = cycle_median(rep.io_wait_ms);
            state.counters["param_wait_ms"] = cycle_median(rep.param_wait_ms);
            state.counters["updates_deferred"] =
                static_cast<double>(std::count(rep.update_deferred.begin(), rep.update_deferred.end(), true));
        }
        if (!ratios.empty()) {
            state.counters["vs_none"] = median(ratios);
            state.counters["vs_none_pairs"] = static_cast<double>(ratios.size());
            state.counters["vs_none_min"] = *std::min_element(ratios.begin(), ratios.end());
            state.counters["vs_none_max"] = *std::max_element(ratios.begin(), ratios.end());
        }
        if (!taxed_s.empty()) {
            state.counters["io_load_bytes_per_step"] = 2 * traffic.each_way();
            state.counters["none_under_io_ms"] = median(taxed_s) * 1e3;
            state.counters["io_tax"] = median(tax_ratios);
            state.counters["vs_none_under_io"] = median(vs_taxed);
            state.counters["io_load_read_bytes_per_s"] = median(fio_read_bps);
            state.counters["io_load_write_bytes_per_s"] = median(fio_write_bps);
        }
        if ((mode == offload_mode::optimizer || mode == offload_mode::all) && path.read_bps > 0 && ranks == 1) {
            // The bytes the step moves through the path, each way (traffic_of).
            const double state_bytes = traffic.state_bytes, act_bytes = traffic.act_bytes;
            const double bytes = state_bytes + act_bytes;
            const double opt_floor_ms = (state_bytes / opt_read_bps + state_bytes / opt_write_bps) * 1e3;
            const double floor_ms = opt_floor_ms + (act_bytes / path.read_bps + act_bytes / path.write_bps) * 1e3;
            state.counters["opt_io_floor_ms"] = opt_floor_ms;
            state.counters["path_bytes_per_step"] = 2 * bytes;
            state.counters["path_floor_ms"] = floor_ms;
            // The goal's premise, two conditions:
            //   1. the path moves the step's bytes within the `none` step time (of the paired
            //      runs);
            //   2. with activations, the path writes the forward's offloaded activations within
            //      the `none` forward time (TBA's rule: a layer is offloaded only when the
            //      bandwidth keeps up with the forward that produces it; otherwise saves wait).
            const double none_ms = median(none_s) * 1e3;
            state.counters["path_needed_bytes_per_s"] = 2 * bytes / (none_ms / 1e3);
            bool suffices = floor_ms <= none_ms;
            if (act_bytes > 0 && !none_forward_ms.empty()) {
                const double forward_write_ms = act_bytes / path.write_bps * 1e3;
                const double forward_ms = median(none_forward_ms);
                state.counters["forward_write_floor_ms"] = forward_write_ms;
                state.counters["forward_ms_none"] = forward_ms;
                suffices = suffices && forward_write_ms <= forward_ms;
            }
            state.counters["bandwidth_suffices"] = suffices ? 1 : 0;
        }
        series.push_back(std::move(run));
    }
}

void register_all() {
    const bool smoke = spillway::bench::smoke();
    benchmark::RegisterBenchmark("sgemm_limit", sgemm_limit)->UseManualTime()->Iterations(smoke ? 2 : 5)->Unit(benchmark::kMillisecond);
    disk_path.dir = spillway::bench::scratch_dir();
    shm_path.dir = shm_dir();
    benchmark::RegisterBenchmark("path_bandwidth", path_bandwidth, &disk_path)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    if (!smoke)
        benchmark::RegisterBenchmark("path_bandwidth/shm", path_bandwidth, &shm_path)
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMillisecond);
    const offload_mode modes[] = {offload_mode::none, offload_mode::optimizer, offload_mode::activations, offload_mode::all};
    std::vector<row> rows;
    for (offload_mode m : modes) rows.push_back({false, m, 1});
    rows.push_back({false, offload_mode::none, 2});
    rows.push_back({false, offload_mode::all, 2});
    if (!smoke) {
        for (int ranks : {1, 2}) {
            rows.push_back({true, offload_mode::none, ranks});
            rows.push_back({true, offload_mode::all, ranks});
            if (ranks == 1) {
                rows.push_back({true, offload_mode::all, 1, true});
                rows.push_back({true, offload_mode::all, 1, false, true});
                rows.push_back({true, offload_mode::all, 1, false, false, true});
            }
        }
        rows.push_back({false, offload_mode::all, 1, true});
    }
    for (const auto& r : rows) {
        std::string name = std::string("step/") + (r.big ? "gpt2_124M" : "default") + row_suffix(r) + "/" +
                           offload_name(r.mode) + "/ranks:" + std::to_string(r.ranks);
        benchmark::RegisterBenchmark(name.c_str(), [r](benchmark::State& s) { train_step(s, r); })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMillisecond);
    }
}

/// Writes the side file beside --benchmark_out (read from argv before Initialize removes it).
void write_series(const std::filesystem::path& path) {
    nlohmann::json doc = {{"machine", spillway::bench::machine_description()},
                          {"date", spillway::bench::utc_now()},
                          {"runs", nlohmann::json::array()}};
    for (const auto& r : series)
        doc["runs"].push_back({{"config", r.config}, {"offload", r.offload}, {"ranks", r.ranks}, {"loss", r.loss},
                               {"step_ms", r.step_ms}, {"act_peak_bytes", r.act_peak_bytes}});
    std::ofstream(path) << doc.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
    // The trainer's runs inherit the environment, so they use these kernels too.
    benchmark::AddCustomContext("matmul_kernels", mini_gpt::blas::describe());
    const auto side_file = spillway::bench::side_file(argc, argv, "mini_gpt_series.json");
    register_all();
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    write_series(side_file);
    if (!shm_path.dir.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(shm_path.dir, ec);
    }
    return 0;
}

#else  // examples/mini_gpt was not configured (no OpenBLAS): say so instead of measuring.

static void mini_gpt_unavailable(benchmark::State& state) {
    for (auto _ : state) state.SkipWithError("examples/mini_gpt is not built (OpenBLAS not found)");
}
BENCHMARK(mini_gpt_unavailable);
BENCHMARK_MAIN();

#endif
