// SPDX-License-Identifier: Apache-2.0
// bench_update_phase: the update phase of an offloaded optimizer, MLP-Offload's ablation
// reproduced in one run, each row against the storage floor measured in the same run.
//
// Set-up: AdamW state (fp32 params, m, v: 12 bytes per parameter) of >= 4 GiB in 88 subgroups
// of 2^22 parameters (48 MiB blobs), fp16 gradients and an fp16 compute copy in host memory,
// and the same host-buffer budget (32 x 48 MiB = 1.5 GiB) for every row. Two storage paths:
//   disk: a file tier (io_uring, O_DIRECT) in the scratch directory;
//   shm:  a file tier on /dev/shm behind a throttled_tier capped at half the disk's read and
//         write bandwidth, measured here with fio (so the two paths never share a device)
//         right before each call of a two-path row: the disk's speed swings 2x within
//         minutes, and a cap set once from a slow moment made the shm path the bottleneck of
//         every later call (or, from a fast one, a path twice as fast as "half the disk").
// Rows (each adds one idea to the previous one):
//   1 baseline         DeepSpeed ZeRO-3 NVMe-like: ascending order, no resident set, fp32
//                      gradients written to the tier in backward (hand-over) and read back,
//                      and DeepSpeed's pipelined swapper's three subgroups in host memory
//                      (read i+1 || update i || write i-1, one subgroup deep each way): the
//                      swapper has no use for the rest of the budget (budget_use)
//   2 +lazy_widening   fp16 gradients stay in host memory, widened inside the Adam step;
//                      backward's hand-over is only the gradient check (sum of squares,
//                      overflow), as the baseline's hand-over also checks them first
//   3 +alternating     alternating order, the 29 spare buffers keep subgroups resident
//                      (the streaming stays the three buffers of rows 1 and 2)
//   4 +second_path     virtual tier over disk and shm (placement fixed at the bandwidths
//                      measured here, 2:1: the adaptive estimate swung from call to call
//                      on the shared disk and moved most keys back and forth),
//                      thread_lock: one read and one write per path at a time
//   5 +node_lock_2proc two worker processes, each half the parameters and half the buffers,
//                      sharing both paths under node_lock (one reader and one writer per path)
//   6 baseline_read_ahead  a reference outside the ablation: the baseline with every buffer of
//                      the budget streaming, so its reads run up to the whole budget ahead
//                      (more than DeepSpeed's swapper does); every row's counter
//                      speedup_vs_read_ahead is against it, per round like `speedup`
// Noise: the disk is shared and its speed swings from call to call, so
// every row is built first (its state initialised on its own files), the disk settles after
// those writes (see the phase), and then the rows are
// called in rounds: one warm-up round (the first call reads every subgroup), then
// `timed_calls` rounds of one call per row. In a timed round fio measures the disk (3 s per job)
// before the first row and after every row, so each call is bracketed by two measurements and
// its floor uses their mean. Speedups and vs_limit are taken per round, then the median.
// Counters per row: update_s (median over the timed calls), read_wait_s, compute_s,
// write_wait_s, bytes_read, bytes_written, bytes_moved, handover_s (backward's gradient
// hand-over: hand_over_gradients(), every row), served_resident, disk_busy and shm_busy (the share of the call each path had a
// read, and a write, in flight: the mean of the two directions; the rest is idle time, which
// the floor does not allow), speedup (baseline update_s / row update_s),
// speedup_with_handover ((update + hand-over) ratio), floor_s and vs_limit = floor_s /
// update_s (1.0 = at the floor). floor_s = the row's minimum storage traffic (reads + writes,
// 12 bytes per parameter each way less the resident set, + 4 per parameter read for fp32
// gradients; or the bytes the call moved, when fewer: counter floor_bytes) over the aggregate
// bandwidth of the row's paths: the disk's bandwidth under a
// 50/50 read/write mix (the better of fio rw=rw on one file and a reader and a writer on
// separate files, at twice the slower side, see measure_disk; 1 MiB blocks, the
// engines' queue depth, O_DIRECT, io_uring; the mean of the measurements right before and
// right after the call), plus, for
// two paths, the shm path's throttle during the call (half the measurement before it).
// SPILLWAY_BENCH_SMOKE=1: tiny state, no fio (the disk is measured with the tier itself).
// SPILLWAY_UPDATE_PHASE_TRACE=DIR writes the last call of each row as Chrome trace JSON
// (DIR/<row>.json, for Perfetto; the two-process row one file per worker, <row>.w<k>.json). SPILLWAY_UPDATE_PHASE_ROWS=1,3 runs some rows; SPILLWAY_UPDATE_PHASE_THREADS (default 1)
// sets Adam's threads; SPILLWAY_UPDATE_PHASE_QD (default 32) the engines' queue depth;
// SPILLWAY_UPDATE_PHASE_PAGES=base gives the pipeline buffers and fio's base pages instead of
// the library's default huge pages (see buffer_pages); SPILLWAY_UPDATE_PHASE_STREAMING
// (default 3) the streaming buffers per process (pipeline_config::streaming_buffers).
// Rows 4 and 5 log each path's transfers: a summary line per call (durations, rates, idle
// gaps), and with SPILLWAY_UPDATE_PHASE_OPLOG=DIR every transfer as CSV
// (DIR/<row>.call<k>.<path>.csv; row 5 per worker, <row>.w<k>.call<k>.<path>.csv).
// After the rows, disk_under_adam/threads:{1,2} measures the floor's fio job alone and
// beside the update's own Adam kernel (see measure_contention): what the disk keeps of its
// bandwidth while a call computes.
#include <benchmark/benchmark.h>

#include <spillway/lock/node_lock.hpp>
#include <spillway/optim/update_pipeline.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include "support/op_log_tier.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/bench_env.hpp"
#include "support/fio.hpp"

namespace {

using namespace spillway;
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

constexpr std::size_t MiB = std::size_t{1} << 20;

struct shape {
    std::size_t subgroup_size;
    std::size_t subgroups;
    std::size_t budget_buffers;  // in lazy-path buffers (12 bytes per parameter)
    int timed_calls;
    [[nodiscard]] std::size_t params() const { return subgroup_size * subgroups; }
    [[nodiscard]] std::size_t budget_bytes() const { return budget_buffers * 12 * subgroup_size; }
};

long env_long(const char* name, long fallback) {
    const char* s = std::getenv(name);
    return s && *s ? std::strtol(s, nullptr, 10) : fallback;
}

/// SPILLWAY_UPDATE_PHASE_SUBGROUP shrinks the subgroups (parameters each, default 2^22) for a
/// run on a busy machine; the count of subgroups and buffers stays, so do the ratios.
/// Why 48 MiB subgroups: the budget is fixed in bytes, and every worker process spends three
/// buffers on streaming (read, update, write); smaller subgroups leave more of the budget to
/// the resident set (29 of 88 subgroups for one process, 2 x 13 for two, against 13 and
/// 2 x 5 of 44 with 96 MiB), while 48 MiB (three 16 MiB pieces) still keeps a path busy.
/// SPILLWAY_UPDATE_PHASE_CALLS sets the timed calls per row (default 9: the first rounds after
/// the rows were built can have slow calls, single transfers that stall, whichever row they
/// hit; nine rounds keep the median on the rest).
shape the_shape() {
    if (bench::smoke()) return {16384, 12, 6, 1};
    const long subgroup = std::max(4096L, env_long("SPILLWAY_UPDATE_PHASE_SUBGROUP", 1L << 22));
    const int calls = static_cast<int>(std::clamp(env_long("SPILLWAY_UPDATE_PHASE_CALLS", 9), 1L, 50L));
    return {static_cast<std::size_t>(subgroup), 88, 32, calls};  // 4.125 GiB of state, 1.5 GiB of buffers
}


struct bandwidths {
    double disk_read = 0, disk_write = 0;  // bytes/s under a 50/50 mix
    std::string how;
    [[nodiscard]] double disk_total() const { return disk_read + disk_write; }
};

// ---- fio ------------------------------------------------------------------------------

unsigned queue_depth();
bench::fio_memory fio_pages();

/// The disk's bandwidth under the update's pattern: half reads, half writes, for `seconds`,
/// the better of two fio jobs (a floor must be a limit: the rows read one subgroup's file
/// while writing another's, which a single mixed job on one file can be slower at; on the
/// AMD machine rows read 1.28 of its floor):
///   1. one job, reads and writes mixed 50/50 on one file (rw=rw);
///   2. a reader and a writer on separate files at once, each at the engines' queue depth,
///      reported as one group; counted as a 50/50 mix can use it: twice the slower side
///      (fio's flow control, which would hold the two at equal bytes, cost a third of the
///      bandwidth here).
/// `how` names the job that won. The files stay for the next measurement (laying them out
/// again would write 2 GiB each).
bandwidths measure_disk(const fs::path& dir, const shape& sh, int seconds = 6) {
    bandwidths bw;
    if (!bench::smoke() && bench::fio_available()) {
        const std::string qd = std::to_string(queue_depth());
        const std::string common = " --bs=1M --iodepth=" + qd + " --direct=1 --ioengine=io_uring --size=2G --runtime=" +
                                   std::to_string(seconds) + " --time_based";
        const std::string pages = fio_pages() == bench::fio_memory::huge_pages ? ", huge-page buffers" : "";
        auto mixed = bench::run_fio("--name=mix --filename=" + (dir / "fio-mix.dat").string() + " --rw=rw --rwmixread=50" +
                                        common,
                                    fio_pages());
        // The reader reads the mixed job's file (laid out by now), the writer its own.
        auto split = bench::run_fio("--group_reporting" + common + " --name=reader --filename=" +
                                        (dir / "fio-mix.dat").string() + " --rw=read --name=writer --filename=" +
                                        (dir / "fio-write.dat").string() + " --rw=write",
                                    fio_pages());
        auto usable = [](const bench::fio_result& r) {
            return r.ok() && r.read_bytes_per_second > 0 && r.write_bytes_per_second > 0;
        };
        if (usable(split)) {  // a 50/50 mix gets the slower side's rate each way
            split.read_bytes_per_second = split.write_bytes_per_second =
                std::min(split.read_bytes_per_second, split.write_bytes_per_second);
        }
        auto total = [](const bench::fio_result& r) { return r.read_bytes_per_second + r.write_bytes_per_second; };
        const bool use_split = usable(split) && (!usable(mixed) || total(split) > total(mixed));
        if (use_split || usable(mixed)) {
            const auto& r = use_split ? split : mixed;
            bw.disk_read = r.read_bytes_per_second;
            bw.disk_write = r.write_bytes_per_second;
            bw.how = (use_split ? "fio reader + writer on separate files (twice the slower side), 1MiB qd" + qd + " each"
                                : "fio rw=rw 50/50 one file, 1MiB qd" + qd) +
                     " O_DIRECT io_uring" + pages;
            return bw;
        }
    }
    // Smoke (or no fio): the file tier itself, reads and writes of subgroup blobs at once.
    file_tier<> tier(dir);
    const std::size_t nbytes = 12 * sh.subgroup_size;
    std::vector<aligned_buffer> bufs;
    for (int i = 0; i < 4; ++i) bufs.emplace_back(nbytes);
    for (int i = 0; i < 2; ++i) tier.write("probe-" + std::to_string(i), bufs[static_cast<std::size_t>(i)].bytes()).wait();
    auto t0 = clk::now();
    {
        auto r0 = tier.read("probe-0", bufs[2].bytes());
        auto r1 = tier.read("probe-1", bufs[3].bytes());
        auto w0 = tier.write("probe-2", bufs[0].bytes());
        auto w1 = tier.write("probe-3", bufs[1].bytes());
        r0.wait(), r1.wait(), w0.wait(), w1.wait();
    }
    double s = std::chrono::duration<double>(clk::now() - t0).count();
    for (int i = 0; i < 4; ++i) tier.erase("probe-" + std::to_string(i));
    bw.disk_read = bw.disk_write = 2.0 * static_cast<double>(nbytes) / s;
    bw.how = "file tier probe (smoke)";
    return bw;
}

// ---- Rows -----------------------------------------------------------------------------

struct host_data {
    std::vector<float> init;
    std::vector<float16> grads;
    std::vector<float16> copy;
};

/// Fills without a per-element RNG: a repeated 64 Ki pattern (the values do not matter to I/O).
host_data make_data(std::size_t params) {
    host_data d;
    const std::size_t period = 65536;
    std::vector<float> pat(period);
    for (std::size_t i = 0; i < period; ++i)
        pat[i] = static_cast<float>(static_cast<double>((i * 2654435761u) % 2001) / 1000.0 - 1.0);
    std::vector<float16> gpat(period);
    for (std::size_t i = 0; i < period; ++i) gpat[i] = from_float<float16>(pat[(i * 7) % period] * 1e-2f);
    d.init.resize(params);
    d.grads.resize(params);
    d.copy.resize(params);
    for (std::size_t off = 0; off < params; off += period) {
        std::size_t n = std::min(period, params - off);
        std::memcpy(d.init.data() + off, pat.data(), n * sizeof(float));
        std::memcpy(d.grads.data() + off, gpat.data(), n * sizeof(float16));
    }
    return d;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

/// One timed call of a row.
struct sample {
    double secs = 0, read_wait = 0, compute = 0, write_wait = 0, handover = 0;
    double bytes_read = 0, bytes_written = 0, served = 0;
    double disk = 0;  // the disk's mixed bandwidth around the call (bytes/s, see the round loop)
    double shm = 0;   // the shm path's throttle during the call (bytes/s; 0 for one path)
    // Busy seconds of each path's reads and writes during the call (child_io; for two worker
    // processes the sum of both: node_lock lets one of them read, and one write, at a time).
    double disk_read_busy = 0, disk_write_busy = 0, shm_read_busy = 0, shm_write_busy = 0;
    double disk_bytes_read = 0, disk_bytes_written = 0;  // what the disk path moved in the call
    /// Mean over the two directions of the disk's (the shm path's) busy time / the call.
    [[nodiscard]] double disk_busy() const { return secs > 0 ? (disk_read_busy + disk_write_busy) / (2 * secs) : 0; }
    [[nodiscard]] double shm_busy() const { return secs > 0 ? (shm_read_busy + shm_write_busy) / (2 * secs) : 0; }
};

/// MB per second of busy time (0 when the path was never busy).
double rate_mb(double bytes, double busy_seconds) { return busy_seconds > 0 ? bytes / busy_seconds / 1e6 : 0.0; }

/// Adds a call's per-path busy seconds to `x`: the first child is the disk, a second the shm path.
void add_busy(sample& x, const std::vector<child_io>& children) {
    if (!children.empty()) {
        x.disk_read_busy += children[0].read_busy_seconds;
        x.disk_bytes_read += static_cast<double>(children[0].bytes_read);
        x.disk_bytes_written += static_cast<double>(children[0].bytes_written);
        x.disk_write_busy += children[0].write_busy_seconds;
    }
    if (children.size() > 1) {
        x.shm_read_busy += children[1].read_busy_seconds;
        x.shm_write_busy += children[1].write_busy_seconds;
    }
}

/// Threads of the Adam step (SPILLWAY_UPDATE_PHASE_THREADS, default 1): the update phase is
/// I/O-bound, and on a small machine the I/O threads need a core while Adam runs.
std::size_t compute_threads() { return static_cast<std::size_t>(std::max(1L, env_long("SPILLWAY_UPDATE_PHASE_THREADS", 1))); }

/// Queue depth of the tiers' engines (SPILLWAY_UPDATE_PHASE_QD, default 32 pieces of 1 MiB):
/// deep enough that scheduling delays of the I/O threads on a busy machine do not idle the disk.
unsigned queue_depth() { return static_cast<unsigned>(std::clamp(env_long("SPILLWAY_UPDATE_PHASE_QD", 32), 1L, 256L)); }

/// The pipeline buffers' pages (SPILLWAY_UPDATE_PHASE_PAGES=huge|base, default huge: the
/// library's default, transparent huge pages), and fio's buffers get the same kind
/// (fio_pages), so the floor and the rows see the disk through the same memory. With base
/// pages on both sides fio's scattered pages cap it at a third of the disk (see
/// bench/support/fio.hpp) while the pipeline's, allocated in one piece, are less scattered:
/// the rows would then beat their fio floor, and a shm throttle at "half the disk" from such
/// fio would be far less than half of the disk the rows see.
page_size buffer_pages() {
    const char* v = std::getenv("SPILLWAY_UPDATE_PHASE_PAGES");
    return v && std::string(v) == "base" ? page_size::base : page_size::automatic;
}
bench::fio_memory fio_pages() {
    return buffer_pages() == page_size::automatic ? bench::fio_memory::huge_pages : bench::fio_memory::base_pages;
}

struct paths {
    fs::path disk, shm, locks;
};

file_tier_options disk_options(const std::string& name) {
    file_tier_options o;
    o.name = name;
    o.engine.block_size = MiB;
    o.engine.queue_depth = queue_depth();
    return o;
}

throttle_config half_of(const bandwidths& bw) {
    return throttle_config::separate(bandwidth_limit{bw.disk_read / 2, 4 * MiB}, bandwidth_limit{bw.disk_write / 2, 4 * MiB});
}

/// The two-path rows' placement: the measured 2:1, fixed (adaptive placement swings with the
/// shared disk).
void second_path_placement(virtual_tier_options& o, const bandwidths& bw) {
    o.bandwidths = {bw.disk_total(), bw.disk_total() / 2};
    o.placement = placement_mode::fixed;
}

// The two-path rows' children log every operation (bench::op_log_tier) for the per-call
// summary of each path's transfers (see log_path_ops).
using two_path_tier_thread =
    virtual_tier<thread_lock, bench::op_log_tier<file_tier<>>, bench::op_log_tier<throttled_tier<file_tier<>>>>;
using two_path_tier_node =
    virtual_tier<node_lock, bench::op_log_tier<file_tier<>>, bench::op_log_tier<throttled_tier<file_tier<>>>>;

/// One summary line per path of a two-path tier's call (`who`: the row, or the worker); with
/// SPILLWAY_UPDATE_PHASE_OPLOG=DIR also every transfer as DIR/<who>.call<k>.<path>.csv.
template <class Tier>
void log_path_ops(Tier& tier, const std::string& who, int call, clk::time_point origin) {
    const char* dir = std::getenv("SPILLWAY_UPDATE_PHASE_OPLOG");
    auto one = [&](auto& child) {
        auto ops = child.take_log();
        std::fprintf(stderr, "[update_phase]   %s %s ops: %s\n", who.c_str(), child.name().c_str(), bench::summarize_ops(ops).c_str());
        if (dir && *dir) {
            std::string path_name = child.name();  // "throttled(shm)" -> "throttled_shm_"
            for (char& c : path_name)
                if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
            bench::save_ops_csv(fs::path(dir) / (who + ".call" + std::to_string(call) + "." + path_name + ".csv"), ops, origin);
        }
    };
    one(tier.template child<0>());
    one(tier.template child<1>());
}
/// Forgets what a two-path tier's children logged so far.
template <class Tier>
void drop_path_ops(Tier& tier) {
    (void)tier.template child<0>().take_log();
    (void)tier.template child<1>().take_log();
}

/// Streaming buffers per process (SPILLWAY_UPDATE_PHASE_STREAMING, default 3, the
/// pipeline's default); the rest of a process's buffers form its resident set.
std::size_t streaming_buffers() {
    return static_cast<std::size_t>(std::clamp(env_long("SPILLWAY_UPDATE_PHASE_STREAMING", 3), 3L, 16L));
}

/// How a row spends the host-buffer budget.
enum class budget_use {
    /// DeepSpeed's pipelined swapper: three subgroups in host memory (the one being read, the
    /// one being updated, the one being written: read i+1 || update i || write i-1, one
    /// subgroup deep each way); it has no use for the rest of the budget.
    swapper_three,
    /// Every buffer the budget holds: the resident set (after the streaming buffers), or,
    /// with resident_policy::none, read-ahead as deep as the budget.
    whole_budget,
};

pipeline_config config_for(const shape& sh, std::size_t params, std::size_t buffer_bytes, const pipeline_options& opt,
                           budget_use use = budget_use::whole_budget) {
    const bool fp32 = opt.gradients == gradient_path::fp32_on_tier;
    pipeline_config cfg;
    cfg.param_count = params;
    cfg.subgroup_size = sh.subgroup_size;
    cfg.host_buffers = std::max<std::size_t>(3, buffer_bytes / ((fp32 ? 16 : 12) * sh.subgroup_size));
    if (use == budget_use::swapper_three) cfg.host_buffers = std::min(cfg.host_buffers, streaming_buffers());
    cfg.pages = buffer_pages();
    // SPILLWAY_UPDATE_PHASE_PIECE_KIB and _WINDOW (pieces in flight per direction and path)
    // override the pipeline's I/O granularity (its defaults otherwise), the same for every row.
    if (long kib = env_long("SPILLWAY_UPDATE_PHASE_PIECE_KIB", 0); kib > 0)
        cfg.piece_bytes = static_cast<std::size_t>(std::max(4L, kib) / 4) * 4096;
    if (long window = env_long("SPILLWAY_UPDATE_PHASE_WINDOW", 0); window > 0)
        cfg.pieces_in_flight = static_cast<std::size_t>(window);
    cfg.streaming_buffers = std::min(cfg.host_buffers, streaming_buffers());
    return cfg;
}

/// One row: built once (its state initialised on its tier), then called once per round, so
/// that every row sees the same disk conditions (the disk is shared and noisy).
struct runner {
    std::string name;
    std::string error;
    std::string note;
    bool two_paths = false;
    double traffic = 0;  // minimum bytes read + written by one steady-state call
    std::vector<sample> samples;
    virtual ~runner() = default;
    virtual sample call() = 0;
    /// Records the next call's timeline (reads, compute, writes) as Chrome trace JSON.
    virtual void trace_next_call(const fs::path& /*file*/) {}
    /// Sets the throttle of the second (shm) path; rows with one path ignore it.
    virtual void set_second_path_rate(const throttle_config& /*rate*/) {}
};

template <class Tier>
struct pipe_runner : runner {
    std::unique_ptr<Tier> tier;
    std::unique_ptr<update_pipeline<Tier, float16>> pipe;
    std::span<const float16> grads;
    std::span<float16> copy;
    bool fp32 = false;

    std::unique_ptr<trace::recorder> rec = std::make_unique<trace::recorder>(trace::recording::disabled);
    fs::path trace_file;

    pipe_runner(std::unique_ptr<Tier> t, host_data& data, const shape& sh, const pipeline_options& options,
                budget_use use = budget_use::whole_budget)
        : tier(std::move(t)) {
        auto opt = options;
        opt.recorder = rec.get();
        fp32 = opt.gradients == gradient_path::fp32_on_tier;
        auto cfg = config_for(sh, sh.params(), sh.budget_bytes(), opt, use);
        pipe = std::make_unique<update_pipeline<Tier, float16>>(*tier, cfg, std::span<const float>(data.init), opt);
        grads = data.grads;
        copy = data.copy;
        if constexpr (requires { tier->template child<0>().take_log(); }) drop_path_ops(*tier);  // not the initial writes
    }
    void trace_next_call(const fs::path& file) override { trace_file = file; }
    void set_second_path_rate(const throttle_config& rate) override {
        if constexpr (requires { tier->template child<1>().inner().set_rate(rate); })
            tier->template child<1>().inner().set_rate(rate);
    }
    sample call() override {
        if (!trace_file.empty()) {
            rec->clear();
            rec->enable();
        }
        sample x = timed_call();
        if (!trace_file.empty()) {
            rec->disable();
            rec->save(trace_file);
            trace_file.clear();
        }
        return x;
    }
    sample timed_call() {
        sample x;
        {  // backward's hand-over: fp32 gradients to the tier, or (lazy) the gradient check
            auto t0 = clk::now();
            pipe->hand_over_gradients(grads);
            x.handover = std::chrono::duration<double>(clk::now() - t0).count();
        }
        auto t0 = clk::now();
        if (fp32) pipe->update(copy);
        else pipe->update(grads, copy);
        x.secs = std::chrono::duration<double>(clk::now() - t0).count();
        const auto& st = pipe->last_stats();
        x.read_wait = st.read_wait_seconds;
        x.compute = st.compute_seconds;
        x.write_wait = st.write_wait_seconds;
        x.bytes_read = static_cast<double>(st.bytes_read);
        x.bytes_written = static_cast<double>(st.bytes_written);
        x.served = static_cast<double>(st.served_from_resident);
        add_busy(x, st.children);
        if (st.children.size() > 1) {  // the split over the paths, to compare with the bandwidth ratio
            std::string line = "[update_phase]   bytes per path:";
            for (const auto& c : st.children)
                line += " " + c.name + " read " + bytes_str(c.bytes_read) + " written " + bytes_str(c.bytes_written) + ";";
            std::fprintf(stderr, "%s\n", line.c_str());
        }
        log_ops(t0);
        return x;
    }
    /// For children that log their operations: see log_path_ops.
    void log_ops(clk::time_point origin) {
        if constexpr (requires { tier->template child<0>().take_log(); }) log_path_ops(*tier, name, calls_logged++, origin);
    }
    int calls_logged = 0;
};

/// The two-process row's name (its workers name their trace files after it).
constexpr const char* node_lock_row = "+node_lock_2proc";

/// Row 5: two worker processes, each half the parameters and half the buffers, sharing both
/// paths under node_lock. Protocol, one command byte at a time on a worker's pipe:
///   1. 3: backward's hand-over (the gradient check); the worker answers with its seconds;
///   2. 1: one update call; the worker answers with that call's stats (ok 1) as soon as the
///      call returns, then logs the call's transfers (and saves its trace, see 4), then
///      sends "done" (ok 2). The parent's clock stops at the answers, and it waits for both
///      "done" before it goes on: as in the other rows, logging is neither timed nor
///      overlapped with anything timed;
///   3. 2 followed by a throttle_config: the new rate of the worker's shm path (no answer);
///   4. 4: record the next call (hand-over and update) as Chrome trace JSON, saved after step
///      2 as DIR/<row>.w<k>.json, DIR from SPILLWAY_UPDATE_PHASE_TRACE (no answer). The
///      parent sends it before the last round's call (trace_next_call), as for the other rows;
///   5. 0 (or a closed pipe): the worker exits.
/// A call is step 1, then step 2, for both workers: two data-parallel ranks finish backward,
/// then step.
struct two_process_runner : runner {
    static constexpr int workers = 2;
    struct msg {
        double secs, read_wait, compute, write_wait, bytes_read, bytes_written, served;
        double disk_read_busy, disk_write_busy, shm_read_busy, shm_write_busy;
        double disk_bytes_read, disk_bytes_written;
        double handover;
        int ok;
    };
    int to_parent[2] = {-1, -1};
    int from_parent[workers][2] = {{-1, -1}, {-1, -1}};
    std::vector<pid_t> pids;
    void (*old_sigpipe)(int) = nullptr;

    two_process_runner(host_data& data, const shape& sh, const paths& p, const bandwidths& bw) {
        // A worker that dies must fail the row, not kill the benchmark with SIGPIPE.
        old_sigpipe = std::signal(SIGPIPE, SIG_IGN);
        if (::pipe(to_parent) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
        for (int w = 0; w < workers; ++w) {
            if (::pipe(from_parent[w]) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
            pid_t pid = ::fork();
            if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
            if (pid == 0) worker(w, data, sh, p, bw);  // never returns
            pids.push_back(pid);
            ::close(from_parent[w][0]);
        }
        ::close(to_parent[1]);
    }
    [[noreturn]] void worker(int w, host_data& data, const shape& sh, const paths& p, const bandwidths& bw) {
        ::close(to_parent[0]);
        auto send = [&](const msg& m) {
            if (::write(to_parent[1], &m, sizeof m) != static_cast<ssize_t>(sizeof m)) std::_Exit(4);
        };
        try {
            auto disk = p.disk / ("w" + std::to_string(w));
            auto shm = p.shm / ("w" + std::to_string(w));
            fs::create_directories(disk);
            fs::create_directories(shm);
            virtual_tier_options o;
            o.name = "vt";
            second_path_placement(o, bw);
            o.locks.directory = p.locks;
            o.lock_names = {"disk", "shm"};
            two_path_tier_node vt(o, child_args(std::in_place, disk, disk_options("disk")),
                                  child_args(std::in_place, half_of(bw), std::in_place, shm, disk_options("shm")));
            // The parent's shared thread pool has no threads in this forked child: own one.
            thread_pool pool(compute_threads() - 1);
            // SPILLWAY_UPDATE_PHASE_TRACE=DIR: each worker records the call the parent asks
            // for (command 4: the last round's) in DIR/<row>.w<k>.json (the parent cannot see
            // a worker's calls).
            const char* trace_dir = std::getenv("SPILLWAY_UPDATE_PHASE_TRACE");
            const bool tracing = trace_dir && *trace_dir;
            trace::recorder rec(trace::recording::disabled, "worker " + std::to_string(w));
            bool trace_this_call = false;
            pipeline_options opt;
            opt.pool = &pool;
            opt.recorder = &rec;
            opt.key_prefix = "w" + std::to_string(w);
            const std::size_t params = sh.subgroups / workers * sh.subgroup_size;
            const std::size_t offset = static_cast<std::size_t>(w) * params;
            auto cfg = config_for(sh, params, sh.budget_bytes() / workers, opt);
            update_pipeline<two_path_tier_node, float16> pipe(
                vt, cfg, std::span<const float>(data.init).subspan(offset, params), opt);
            auto grads = std::span<const float16>(data.grads).subspan(offset, params);
            auto copy = std::span<float16>(data.copy).subspan(offset, params);
            drop_path_ops(vt);  // not the initial writes
            int calls = 0;
            for (;;) {
                char cmd = 0;
                if (::read(from_parent[w][0], &cmd, 1) != 1 || cmd == 0) break;
                if (cmd == 2) {
                    throttle_config rate;
                    if (::read(from_parent[w][0], &rate, sizeof rate) != static_cast<ssize_t>(sizeof rate)) break;
                    vt.child<1>().inner().set_rate(rate);
                    continue;
                }
                if (cmd == 4) {
                    if (tracing) {
                        rec.clear();
                        rec.enable();
                        trace_this_call = true;
                    }
                    continue;
                }
                if (cmd == 3) {
                    auto t0 = clk::now();
                    pipe.hand_over_gradients(grads);
                    msg m{};
                    m.handover = std::chrono::duration<double>(clk::now() - t0).count();
                    m.ok = 1;
                    send(m);
                    continue;
                }
                auto t0 = clk::now();
                pipe.update(grads, copy);
                const double secs = std::chrono::duration<double>(clk::now() - t0).count();
                if (trace_this_call) rec.disable();
                const auto& st = pipe.last_stats();
                sample busy;
                add_busy(busy, st.children);
                // The answer first (the parent's clock stops at it), then the untimed logging.
                send({secs, st.read_wait_seconds, st.compute_seconds,
                      st.write_wait_seconds, static_cast<double>(st.bytes_read), static_cast<double>(st.bytes_written),
                      static_cast<double>(st.served_from_resident), busy.disk_read_busy, busy.disk_write_busy,
                      busy.shm_read_busy, busy.shm_write_busy, busy.disk_bytes_read, busy.disk_bytes_written, 0, 1});
                const std::string who = std::string(node_lock_row) + ".w" + std::to_string(w);
                if (trace_this_call) {
                    rec.save(fs::path(trace_dir) / (who + ".json"));
                    trace_this_call = false;
                }
                log_path_ops(vt, who, calls++, t0);
                msg done{};
                done.ok = 2;
                send(done);
            }
        } catch (const std::exception& e) {
            std::fprintf(stderr, "worker %d: %s\n", w, e.what());
            send({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1});
            std::_Exit(1);
        }
        std::_Exit(0);
    }
    void set_second_path_rate(const throttle_config& rate) override {
        static_assert(std::is_trivially_copyable_v<throttle_config>);
        char buf[1 + sizeof rate];
        buf[0] = 2;
        std::memcpy(buf + 1, &rate, sizeof rate);
        for (int w = 0; w < workers; ++w)
            if (::write(from_parent[w][1], buf, sizeof buf) != static_cast<ssize_t>(sizeof buf))
                throw std::runtime_error("a node_lock worker is gone");
    }
    /// Asks both workers to record their next call (protocol step 4).
    void trace_next_call(const fs::path& /*file*/) override { send_all(4); }
    void send_all(char cmd) {
        for (int w = 0; w < workers; ++w)
            if (::write(from_parent[w][1], &cmd, 1) != 1) throw std::runtime_error("a node_lock worker is gone");
    }
    /// The next message from either worker: an answer (ok 1) or "done" (ok 2).
    msg receive() {
        msg m{};
        if (::read(to_parent[0], &m, sizeof m) != static_cast<ssize_t>(sizeof m) || (m.ok != 1 && m.ok != 2))
            throw std::runtime_error("a node_lock worker process failed (see stderr)");
        return m;
    }
    sample call() override {
        // Sends `cmd` to every worker and returns their answers (protocol above); a worker's
        // "done" that arrives before the other's answer is counted in `done`.
        auto both = [&](char cmd, int& done) {
            send_all(cmd);
            std::vector<msg> answers;
            while (answers.size() < static_cast<std::size_t>(workers)) {
                msg m = receive();
                if (m.ok == 2) ++done;
                else answers.push_back(m);
            }
            return answers;
        };
        sample x;
        int done = 0;
        auto h0 = clk::now();
        (void)both(3, done);
        x.handover = std::chrono::duration<double>(clk::now() - h0).count();
        auto t0 = clk::now();
        const auto answers = both(1, done);
        x.secs = std::chrono::duration<double>(clk::now() - t0).count();
        // The workers log (and trace) after answering: wait for them, outside the clock, so
        // that nothing timed next overlaps it.
        while (done < workers)
            if (receive().ok == 2) ++done;
        for (const msg& m : answers) {
            x.read_wait = std::max(x.read_wait, m.read_wait);
            x.compute = std::max(x.compute, m.compute);
            x.write_wait = std::max(x.write_wait, m.write_wait);
            x.bytes_read += m.bytes_read;
            x.bytes_written += m.bytes_written;
            x.served += m.served;
            x.disk_read_busy += m.disk_read_busy;
            x.disk_write_busy += m.disk_write_busy;
            x.shm_read_busy += m.shm_read_busy;
            x.shm_write_busy += m.shm_write_busy;
            x.disk_bytes_read += m.disk_bytes_read;
            x.disk_bytes_written += m.disk_bytes_written;
        }
        return x;
    }
    ~two_process_runner() override {
        for (int w = 0; w < workers; ++w) {
            if (from_parent[w][1] >= 0) {
                char stop = 0;
                (void)!::write(from_parent[w][1], &stop, 1);
                ::close(from_parent[w][1]);
            }
        }
        for (auto pid : pids) {
            int st = 0;
            ::waitpid(pid, &st, 0);
        }
        if (to_parent[0] >= 0) ::close(to_parent[0]);
        if (old_sigpipe) std::signal(SIGPIPE, old_sigpipe);
    }
};

// ---- The run ----------------------------------------------------------------------------

struct row_summary {
    std::string name, error, note;
    double update_s = 0, read_wait_s = 0, compute_s = 0, write_wait_s = 0, handover_s = 0;
    double bytes_read = 0, bytes_written = 0, served = 0;
    double floor_s = 0, vs_limit = 0, speedup = 0, speedup_with_handover = 0;
    double floor_bytes = 0;  // the floor's traffic (median over the calls; see the floor loop)
    double speedup_vs_read_ahead = 0;  // against row 6 (the baseline reading ahead through the whole budget)
    double disk_busy = 0, shm_busy = 0;  // medians of sample::disk_busy() and shm_busy()
};

struct results {
    shape sh;
    bandwidths bw;                    // the first measurement (its method names the limit)
    std::vector<double> disk_totals;  // every measurement of the timed rounds
    std::vector<double> shm_throttles;  // the throttle of every timed two-path call
    std::vector<row_summary> rows;
    std::string error;
};

results& the_results() {
    static results res = [] {
        results out;
        out.sh = the_shape();
        const auto& sh = out.sh;
        paths p;
        p.disk = bench::scratch_dir() / ("update_phase-" + std::to_string(::getpid()));
        fs::path shm_root = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : bench::scratch_dir();
        p.shm = shm_root / ("spillway-update-phase-" + std::to_string(::getpid()));
        p.locks = p.shm / "locks";
        struct cleanup {
            paths p;
            ~cleanup() {
                std::error_code ec;
                fs::remove_all(p.disk, ec);
                fs::remove_all(p.shm, ec);
            }
        } guard{p};
        try {
            fs::create_directories(p.disk);
            fs::create_directories(p.locks);
            out.bw = measure_disk(p.disk, sh);
            const auto bw = out.bw;
            auto data = make_data(sh.params());
            const double blob = 12.0 * static_cast<double>(sh.subgroup_size);
            const double n = static_cast<double>(sh.subgroups);
            const std::size_t streaming = streaming_buffers();
            const double resident = static_cast<double>(std::min(sh.budget_buffers - std::min(sh.budget_buffers, streaming), sh.subgroups));
            const double worker_resident = static_cast<double>(
                std::min(sh.budget_buffers / 2 - std::min(sh.budget_buffers / 2, streaming), sh.subgroups / 2));
            thread_pool pool(compute_threads() - 1);

            // SPILLWAY_UPDATE_PHASE_ROWS (e.g. "1,5") picks rows (1-based) for debugging.
            const char* pick = std::getenv("SPILLWAY_UPDATE_PHASE_ROWS");
            auto wanted = [&](int row) {
                return !pick || !*pick ||
                       (std::string(",") + pick + ",").find("," + std::to_string(row) + ",") != std::string::npos;
            };
            auto build = [&](int row, const char* name, double traffic, bool two, auto&& make) {
                std::unique_ptr<runner> r;
                std::string error;
                auto t0 = clk::now();
                if (wanted(row)) {
                    try {
                        r = make();
                    } catch (const std::exception& e) {
                        error = e.what();
                    }
                } else {
                    error = "not selected (SPILLWAY_UPDATE_PHASE_ROWS)";
                }
                if (!r) {
                    struct failed : runner {
                        sample call() override { return {}; }
                    };
                    r = std::make_unique<failed>();
                    r->error = error;
                }
                r->name = name;
                r->traffic = traffic;
                r->two_paths = two;
                std::fprintf(stderr, "[update_phase] row %d %s initialised: %s (%.1f s)\n", row, name,
                             r->error.empty() ? "ok" : r->error.c_str(), std::chrono::duration<double>(clk::now() - t0).count());
                return r;
            };
            pipeline_options base;
            base.pool = &pool;
            base.order = subgroup_order::ascending;
            base.resident = resident_policy::none;
            base.gradients = gradient_path::fp32_on_tier;
            base.key_prefix = "baseline";
            pipeline_options lazy = base;
            lazy.gradients = gradient_path::lazy_widening;
            lazy.key_prefix = "lazy";
            pipeline_options full = lazy;
            full.order = subgroup_order::alternating;
            full.resident = resident_policy::keep_last_updated;
            full.key_prefix = "alternating";
            auto disk_tier = [&](const char* sub) {
                fs::create_directories(p.disk / sub);
                return std::make_unique<file_tier<>>(p.disk / sub, disk_options("disk"));
            };
            auto make_row = [&](int id) -> std::unique_ptr<runner> {
                switch (id) {
                    case 1:
                        return build(1, "baseline", 2 * n * blob + n * 4.0 * static_cast<double>(sh.subgroup_size), false, [&] {
                            return std::make_unique<pipe_runner<file_tier<>>>(disk_tier("baseline"), data, sh, base,
                                                                              budget_use::swapper_three);
                        });
                    case 2:
                        return build(2, "+lazy_widening", 2 * n * blob, false, [&] {
                            return std::make_unique<pipe_runner<file_tier<>>>(disk_tier("lazy"), data, sh, lazy,
                                                                              budget_use::swapper_three);
                        });
                    case 3:
                        return build(3, "+alternating_resident", 2 * (n - resident) * blob, false, [&] {
                            return std::make_unique<pipe_runner<file_tier<>>>(disk_tier("alternating"), data, sh, full);
                        });
                    case 4:
                        return build(4, "+second_path", 2 * (n - resident) * blob, true, [&] {
                            virtual_tier_options o;
                            o.name = "vt";
                            second_path_placement(o, bw);
                            fs::create_directories(p.disk / "second");
                            fs::create_directories(p.shm / "second");
                            auto vt = std::make_unique<two_path_tier_thread>(
                                o, child_args(std::in_place, p.disk / "second", disk_options("disk")),
                                child_args(std::in_place, half_of(bw), std::in_place, p.shm / "second", disk_options("shm")));
                            auto opt = full;
                            opt.key_prefix = "second";
                            return std::make_unique<pipe_runner<two_path_tier_thread>>(std::move(vt), data, sh, opt);
                        });
                    case 6:
                        return build(6, "baseline_read_ahead", 2 * n * blob + n * 4.0 * static_cast<double>(sh.subgroup_size), false, [&] {
                            auto opt = base;
                            opt.key_prefix = "read_ahead";
                            return std::make_unique<pipe_runner<file_tier<>>>(disk_tier("read_ahead"), data, sh, opt,
                                                                              budget_use::whole_budget);
                        });
                    default: {
                        auto r = build(5, node_lock_row, 2 * (n - 2 * worker_resident) * blob, true,
                                       [&] { return std::make_unique<two_process_runner>(data, sh, p, bw); });
                        r->note = "wall time of both workers; waits are the slower worker's, bytes the sum";
                        return r;
                    }
                }
            };
            // A phase builds its rows (the baseline first), then runs rounds: call 0 warms up
            // (it reads every subgroup); then each timed round calls every row once, between
            // measurements of the disk.
            out.rows.resize(6);
            // `ids`: the rows the phase builds and calls (the baseline first; the read-ahead
            // baseline, row 6, where present, is the second reference).
            auto phase = [&](std::vector<int> ids) {
            // Row 5 forks its worker processes: build it first, before this process allocates
            // the other rows' pipeline buffers. Memory allocated before a fork() is shared
            // copy-on-write with the children, and the first write to a shared huge page (a
            // read from the disk into a buffer) splits it into base pages (and O_DIRECT from
            // base pages is far slower on this disk, see buffer_pages). aligned_buffer keeps
            // its large buffers out of fork() children (MADV_DONTFORK) for that reason; the
            // order stays so that the children do not inherit the other rows' tiers and
            // threads either.
            std::vector<std::unique_ptr<runner>> rows(ids.size());
            for (std::size_t pass = 0; pass < 2; ++pass)
                for (std::size_t i = 0; i < ids.size(); ++i)
                    if ((ids[i] == 5) == (pass == 0)) rows[i] = make_row(ids[i]);
            std::vector<double> disk_totals;
            // One round, each row in turn (the protocol that ties every call to its limit):
            //   1. fio measures the disk for 3 s (the first row of a round), or the measurement
            //      after the previous row stands for it;
            //   2. a two-path row's shm throttle is set to half of that measurement;
            //   3. the row's call runs;
            //   4. fio measures the disk again; the call's floor uses the mean of 1 and 4.
            auto mark = [&] { return bench::smoke() ? bw : measure_disk(p.disk, sh, 3); };
            // Before round 0 the disk settles: building the rows writes their whole state (GBs
            // at once), and this virtual disk then runs at a fraction of its speed for a while,
            // which would slow the first calls. Wait 2 s and measure, until
            // fio reaches 0.85 of the run's first measurement (taken before any write), at most
            // 8 times.
            for (int k = 0; k < 8 && !bench::smoke(); ++k) {
                std::this_thread::sleep_for(std::chrono::seconds(2));
                const double now = mark().disk_total();
                std::fprintf(stderr, "[update_phase] settling after building the rows: disk %.0f MB/s (%.2f of the first measurement)\n",
                             now / 1e6, now / std::max(1.0, bw.disk_total()));
                if (now >= 0.85 * bw.disk_total()) break;
            }
            for (int round = 0; round <= sh.timed_calls; ++round) {
                bandwidths before = mark();
                if (round > 0) disk_totals.push_back(before.disk_total());
                for (auto& r : rows) {
                    if (!r->error.empty()) continue;
                    try {
                        double shm = 0;
                        if (r->two_paths) {
                            shm = before.disk_total() / 2;
                            r->set_second_path_rate(half_of(before));
                        }
                        // SPILLWAY_UPDATE_PHASE_TRACE=DIR: the last round's timeline per row.
                        const char* trace_dir = std::getenv("SPILLWAY_UPDATE_PHASE_TRACE");
                        if (trace_dir && *trace_dir && round == sh.timed_calls)
                            r->trace_next_call(fs::path(trace_dir) / (r->name + ".json"));
                        auto x = r->call();
                        std::fprintf(stderr,
                                     "[update_phase] round %d %-22s update %.3f s  read-wait %.3f  compute %.3f  "
                                     "write-wait %.3f  hand-over %.3f  disk %.0f MB/s%s  busy: disk %.0f%%%s  "
                                     "disk while busy: read %.0f MB/s, write %.0f MB/s\n",
                                     round, r->name.c_str(), x.secs, x.read_wait, x.compute, x.write_wait, x.handover,
                                     before.disk_total() / 1e6, r->two_paths ? " (shm throttle: half)" : "",
                                     100 * x.disk_busy(),
                                     r->two_paths ? (" shm " + std::to_string(static_cast<int>(100 * x.shm_busy() + 0.5)) + "%").c_str() : "",
                                     rate_mb(x.disk_bytes_read, x.disk_read_busy), rate_mb(x.disk_bytes_written, x.disk_write_busy));
                        const bandwidths after = mark();
                        if (round > 0) {
                            disk_totals.push_back(after.disk_total());
                            x.disk = (before.disk_total() + after.disk_total()) / 2;
                            x.shm = shm;
                            if (r->two_paths) out.shm_throttles.push_back(shm);
                            r->samples.push_back(x);
                        }
                        before = after;
                    } catch (const std::exception& e) {
                        r->error = e.what();
                    }
                }
                std::fprintf(stderr, "[update_phase] round %d done\n", round);
            }
            const auto& b = *rows[0];
            const auto six = std::find(ids.begin(), ids.end(), 6);
            const runner* ahead = six == ids.end() ? nullptr : rows[static_cast<std::size_t>(six - ids.begin())].get();
            out.disk_totals.insert(out.disk_totals.end(), disk_totals.begin(), disk_totals.end());
            for (std::size_t ri = 0; ri < rows.size(); ++ri) {
                auto& r = rows[ri];
                row_summary s;
                s.name = r->name;
                s.error = r->error;
                s.note = r->note;
                if (s.error.empty() && !r->samples.empty()) {
                    auto med = [&](auto field) {
                        std::vector<double> v;
                        for (auto& x : r->samples) v.push_back(field(x));
                        return median(v);
                    };
                    s.update_s = med([](const sample& x) { return x.secs; });
                    s.read_wait_s = med([](const sample& x) { return x.read_wait; });
                    s.compute_s = med([](const sample& x) { return x.compute; });
                    s.write_wait_s = med([](const sample& x) { return x.write_wait; });
                    s.handover_s = med([](const sample& x) { return x.handover; });
                    s.bytes_read = med([](const sample& x) { return x.bytes_read; });
                    s.bytes_written = med([](const sample& x) { return x.bytes_written; });
                    s.served = med([](const sample& x) { return x.served; });
                    s.disk_busy = med([](const sample& x) { return x.disk_busy(); });
                    s.shm_busy = med([](const sample& x) { return x.shm_busy(); });
                    std::vector<double> floors, floor_bytes, vs, sp, sph, spa;
                    for (std::size_t k = 0; k < r->samples.size(); ++k) {
                        double agg = r->samples[k].disk + r->samples[k].shm;
                        // The floor's bytes: the row's least traffic by its formula, or what
                        // the call moved (bytes read + written during the update, as counted
                        // by the pipeline over every path) when that was less: a call that
                        // avoids traffic the formula counts (a subgroup served from a buffer
                        // the formula does not count as resident) must not beat its floor on
                        // bytes it never moved. Hand-over traffic lies outside both.
                        const double moved = r->samples[k].bytes_read + r->samples[k].bytes_written;
                        const double traffic = moved > 0 ? std::min(r->traffic, moved) : r->traffic;
                        double fl = traffic / agg;
                        floors.push_back(fl);
                        floor_bytes.push_back(traffic);
                        vs.push_back(fl / r->samples[k].secs);
                        if (b.error.empty() && k < b.samples.size()) {
                            sp.push_back(b.samples[k].secs / r->samples[k].secs);
                            sph.push_back((b.samples[k].secs + b.samples[k].handover) /
                                          (r->samples[k].secs + r->samples[k].handover));
                        }
                        if (ahead && ahead->error.empty() && k < ahead->samples.size())
                            spa.push_back(ahead->samples[k].secs / r->samples[k].secs);
                    }
                    s.floor_s = median(floors);
                    s.floor_bytes = median(floor_bytes);
                    s.vs_limit = median(vs);
                    s.speedup = median(sp);
                    s.speedup_with_handover = median(sph);
                    if (!spa.empty()) s.speedup_vs_read_ahead = median(spa);
                }
                out.rows[static_cast<std::size_t>(ids[ri] - 1)] = s;
            }
            };
            // One phase: every row's files lie on the disk together, so each row runs under
            // the same footprint as the baseline it is divided by (a virtual disk's host caches
            // more of a smaller footprint, so rows under different footprints do not compare).
            // The DeepSpeed-like rows take three buffers, so all six fit in memory.
            phase({1, 6, 2, 3, 4, 5});
        } catch (const std::exception& e) {
            out.error = e.what();
        }
        return out;
    }();
    return res;
}

// ---- The disk while the Adam step runs ---------------------------------------------------

/// What the disk moves while the update's own kernel runs beside it (see measure_contention).
struct contention {
    double idle_Bps = 0;    // fio's 50/50 mix alone (median of the rounds)
    double loaded_Bps = 0;  // the same fio job while the kernel runs (median)
    double ratio = 0;       // median over the rounds of loaded / the idle measurement before it
    double adam_Bps = 0;    // the kernel's memory traffic meanwhile (26 bytes per parameter)
    std::string how;        // how the disk was measured (bandwidths::how)
    std::string error;
};

/// The rows overlap the Adam step with the paths' transfers; on a small machine both use the
/// same cores and the same memory. This measures what that costs the disk, in the same run,
/// as protocol steps repeated `rounds` times:
///   1. fio runs the floor's job (the 50/50 mix) for 3 s with the machine otherwise idle;
///   2. `threads` threads start the update's kernel (adamw_step, fp16 gradients widened in the
///      step, as the lazy rows run it) over 64 Mi parameters (768 MiB of state, far beyond
///      the caches) in a loop;
///   3. the same fio job runs for 3 s beside them; then they stop and report their steps.
/// One thread is what each row's process computes with (SPILLWAY_UPDATE_PHASE_THREADS), two
/// what the two-process row runs at once. Without fio (and in smoke mode) measure_disk's
/// file-tier probe stands in for fio, as it does for the rows' floor.
contention measure_contention(std::size_t threads, int rounds = 3) {
    contention c;
    if (bench::smoke()) rounds = 1;
    const fs::path dir = bench::scratch_dir() / ("update_phase-contention-" + std::to_string(::getpid()));
    struct cleanup {
        fs::path d;
        ~cleanup() {
            std::error_code ec;
            fs::remove_all(d, ec);
        }
    } guard{dir};
    try {
        fs::create_directories(dir);
        const shape sh = the_shape();
        const std::size_t n = bench::smoke() ? std::size_t{1} << 20 : std::size_t{64} << 20;
        std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
        std::vector<float16> g(n, from_float<float16>(1e-3f));
        thread_pool pool(threads - 1);
        std::vector<double> idle, loaded, ratio, adam;
        for (int round = 0; round < rounds; ++round) {
            const bandwidths before = measure_disk(dir, sh, 3);
            std::atomic<bool> stop{false};
            std::atomic<std::int64_t> steps{0};
            const auto t0 = clk::now();
            std::thread load([&] {
                adamw_step_args args;
                args.check = grad_check::caller_verified;
                do {  // at least one step, however short the measurement
                    (void)adamw_step<float16>(adamw_config{}, args, p, m, v, g, std::span<float16>{}, &pool);
                    ++args.step;
                    steps.fetch_add(1, std::memory_order_relaxed);
                } while (!stop.load(std::memory_order_relaxed));
            });
            bandwidths during;
            try {
                during = measure_disk(dir, sh, 3);
            } catch (...) {
                stop = true;
                load.join();
                throw;
            }
            stop = true;
            load.join();
            const double secs = std::chrono::duration<double>(clk::now() - t0).count();
            c.how = before.how;
            idle.push_back(before.disk_total());
            loaded.push_back(during.disk_total());
            if (before.disk_total() > 0) ratio.push_back(during.disk_total() / before.disk_total());
            adam.push_back(26.0 * static_cast<double>(n) * static_cast<double>(steps.load()) / secs);
            std::fprintf(stderr, "[update_phase] disk under Adam, %zu thread(s), round %d: idle %.0f MB/s, beside the kernel %.0f MB/s (%.2f); kernel %.1f GB/s\n",
                         threads, round, before.disk_total() / 1e6, during.disk_total() / 1e6,
                         ratio.empty() ? 0.0 : ratio.back(), adam.back() / 1e9);
        }
        c.idle_Bps = median(idle);
        c.loaded_Bps = median(loaded);
        c.ratio = median(ratio);
        c.adam_Bps = median(adam);
    } catch (const std::exception& e) {
        c.error = e.what();
    }
    return c;
}

void report_contention(benchmark::State& state, std::size_t threads) {
    const contention c = measure_contention(threads);
    if (!c.error.empty()) {
        state.SkipWithError(c.error.c_str());
        for (auto _ : state) {
        }
        return;
    }
    for (auto _ : state) state.SetIterationTime(1.0 / std::max(1.0, c.loaded_Bps));
    state.counters["idle_Bps"] = c.idle_Bps;
    state.counters["loaded_Bps"] = c.loaded_Bps;
    state.counters["loaded_vs_idle"] = c.ratio;
    state.counters["adam_Bps"] = c.adam_Bps;
    state.counters["threads"] = static_cast<double>(threads);
    state.SetLabel(c.how + ", alone and beside adamw_step (fp16 grads)");
}

void report_row(benchmark::State& state, std::size_t index) {
    auto& res = the_results();
    std::string error = !res.error.empty() ? res.error : index >= res.rows.size() ? "row did not run" : res.rows[index].error;
    if (!error.empty()) {
        state.SkipWithError(error.c_str());
        for (auto _ : state) {
        }
        return;
    }
    const auto& r = res.rows[index];
    for (auto _ : state) state.SetIterationTime(r.update_s);
    state.counters["update_s"] = r.update_s;
    state.counters["read_wait_s"] = r.read_wait_s;
    state.counters["compute_s"] = r.compute_s;
    state.counters["write_wait_s"] = r.write_wait_s;
    state.counters["handover_s"] = r.handover_s;
    state.counters["bytes_read"] = r.bytes_read;
    state.counters["bytes_written"] = r.bytes_written;
    // The two baselines also write fp32 gradients to the tier (backward's hand-over).
    const bool fp32_grads = index == 0 || index == 5;
    state.counters["bytes_moved"] = r.bytes_read + r.bytes_written + (fp32_grads ? 4.0 * static_cast<double>(res.sh.params()) : 0.0);
    state.counters["served_resident"] = r.served;
    state.counters["disk_busy"] = r.disk_busy;
    if (r.shm_busy > 0) state.counters["shm_busy"] = r.shm_busy;
    if (res.rows[0].error.empty()) {
        state.counters["speedup"] = r.speedup;
        state.counters["speedup_with_handover"] = r.speedup_with_handover;
    }
    if (r.speedup_vs_read_ahead > 0) state.counters["speedup_vs_read_ahead"] = r.speedup_vs_read_ahead;
    state.counters["floor_s"] = r.floor_s;
    state.counters["floor_bytes"] = r.floor_bytes;
    state.counters["vs_limit"] = r.vs_limit;
    state.counters["state_GiB"] = 12.0 * static_cast<double>(res.sh.params()) / static_cast<double>(1u << 30);
    state.counters["buffer_GiB"] = static_cast<double>(res.sh.budget_bytes()) / static_cast<double>(1u << 30);
    state.counters["disk_mixed_Bps"] = median(res.disk_totals);
    if (!res.shm_throttles.empty()) state.counters["shm_throttle_Bps"] = median(res.shm_throttles);
    std::string label = "limit: " + res.bw.how;
    if (!r.note.empty()) label += "; " + r.note;
    state.SetLabel(label);
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    const char* names[] = {"baseline",     "+lazy_widening",   "+alternating_resident",
                           "+second_path", "+node_lock_2proc", "baseline_read_ahead"};
    for (std::size_t i = 0; i < std::size(names); ++i)
        benchmark::RegisterBenchmark((std::string("update_phase/") + names[i]).c_str(),
                                     [i](benchmark::State& st) { report_row(st, i); })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kSecond);
    for (std::size_t threads : {1, 2})
        benchmark::RegisterBenchmark("disk_under_adam", [threads](benchmark::State& st) { report_contention(st, threads); })
            ->Arg(static_cast<int64_t>(threads))
            ->ArgName("threads")
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kSecond);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
