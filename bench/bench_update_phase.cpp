// bench_update_phase: the update phase of an offloaded optimizer, MLP-Offload's ablation
// reproduced in one run, each row against the storage floor measured in the same run.
//
// Set-up: AdamW state (fp32 params, m, v: 12 bytes per parameter) of >= 4 GiB in subgroups of
// 2^23 parameters (96 MiB blobs), fp16 gradients and an fp16 compute copy in host memory,
// and the same host-buffer budget (16 x 96 MiB) for every row. Two storage paths:
//   disk: a file tier (io_uring, O_DIRECT) in the scratch directory;
//   shm:  a file tier on /dev/shm behind a throttled_tier capped at half the disk's read and
//         write bandwidth, measured here with fio (so the two paths never share a device).
// Rows (each adds one idea to the previous one):
//   1 baseline         DeepSpeed ZeRO-3 NVMe-like: ascending order, no resident set, fp32
//                      gradients written to the tier in backward (hand-over) and read back
//   2 +lazy_widening   fp16 gradients stay in host memory, widened inside the Adam step
//   3 +alternating     alternating order, the 13 spare buffers keep subgroups resident
//   4 +second_path     virtual tier over disk and shm (placement by measured bandwidth)
//   5 +node_lock_2proc two worker processes, each half the parameters and half the buffers,
//                      sharing both paths under node_lock (one reader and one writer per path)
// Counters per row: update_s (median over the timed calls), read_wait_s, compute_s,
// write_wait_s, bytes_read, bytes_written, bytes_moved, handover_s (backward's gradient
// hand-over), served_resident, speedup (baseline update_s / row update_s),
// speedup_with_handover ((update + hand-over) ratio), floor_s and vs_limit = floor_s /
// update_s (1.0 = at the floor). floor_s = the row's minimum storage traffic (reads + writes,
// 12 bytes per parameter each way less the resident set, + 4 per parameter read for fp32
// gradients) over the aggregate bandwidth of the row's paths: the disk's bandwidth under a
// 50/50 read/write mix (fio rw=rw, 1 MiB blocks, queue depth 8, O_DIRECT, io_uring), plus,
// for two paths, the shm path's throttle (half of it).
// SPILLWAY_BENCH_SMOKE=1: tiny state, no fio (the disk is measured with the tier itself).
#include <benchmark/benchmark.h>

#include <spillway/lock/node_lock.hpp>
#include <spillway/optim/update_pipeline.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support/bench_env.hpp"

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

shape the_shape() {
    if (bench::smoke()) return {16384, 12, 6, 1};
    return {std::size_t{1} << 23, 44, 16, 3};  // 4.125 GiB of state, 1.5 GiB of buffers
}

struct row_result {
    std::string name;
    double update_s = 0, read_wait_s = 0, compute_s = 0, write_wait_s = 0, handover_s = 0;
    double bytes_read = 0, bytes_written = 0, served = 0, floor_s = 0;
    std::string note;
    std::string error;  // non-empty: the row failed
};

struct bandwidths {
    double disk_read = 0, disk_write = 0;  // bytes/s under a 50/50 mix
    std::string how;
    [[nodiscard]] double disk_total() const { return disk_read + disk_write; }
};

// ---- fio ------------------------------------------------------------------------------

std::string run_command(const std::string& cmd, int& status) {
    std::string out;
    status = -1;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
        char buf[4096];
        std::size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
        status = ::pclose(p);
    }
    return out;
}

double json_bw(const std::string& out, const char* dir) {
    std::size_t jobs = out.find("\"jobs\"");
    if (jobs == std::string::npos) return -1;
    std::size_t p = out.find(std::string("\"") + dir + "\"", jobs);
    if (p == std::string::npos) return -1;
    p = out.find("\"bw_bytes\"", p);
    if (p == std::string::npos) return -1;
    p = out.find(':', p);
    return p == std::string::npos ? -1 : std::strtod(out.c_str() + p + 1, nullptr);
}

/// The disk's bandwidth under the update's pattern: half reads, half writes.
bandwidths measure_disk(const fs::path& dir, const shape& sh) {
    bandwidths bw;
    if (!bench::smoke() && std::system("fio --version >/dev/null 2>&1") == 0) {
        auto file = dir / "fio-mix.dat";
        int status = 0;
        std::string out = run_command("fio --name=mix --filename=" + file.string() +
                                          " --rw=rw --rwmixread=50 --bs=1M --iodepth=8 --direct=1 --ioengine=io_uring"
                                          " --size=2G --runtime=6 --time_based --output-format=json 2>/dev/null",
                                      status);
        fs::remove(file);
        bw.disk_read = json_bw(out, "read");
        bw.disk_write = json_bw(out, "write");
        if (status == 0 && bw.disk_read > 0 && bw.disk_write > 0) {
            bw.how = "fio rw=rw 50/50 1MiB qd8 O_DIRECT";
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

struct run_spec {
    pipeline_options opt;
    std::size_t params = 0;
    std::size_t offset = 0;       // first parameter of this worker
    std::size_t buffer_bytes = 0; // host budget for this pipeline
    int timed_calls = 1;
};

/// Runs warm-up + timed calls of one pipeline over `tier`; per-call hooks for the 2-process row.
template <class Tier, class Before, class After>
row_result run_pipeline(Tier& tier, host_data& data, const shape& sh, const run_spec& spec, Before before, After after) {
    const bool fp32 = spec.opt.gradients == gradient_path::fp32_on_tier;
    pipeline_config cfg;
    cfg.param_count = spec.params;
    cfg.subgroup_size = sh.subgroup_size;
    cfg.host_buffers = std::max<std::size_t>(3, spec.buffer_bytes / ((fp32 ? 16 : 12) * sh.subgroup_size));
    cfg.adam = adamw_config{};
    update_pipeline<Tier, float16> pipe(tier, cfg, std::span<const float>(data.init).subspan(spec.offset, spec.params),
                                        spec.opt);
    auto grads = std::span<const float16>(data.grads).subspan(spec.offset, spec.params);
    auto copy = std::span<float16>(data.copy).subspan(spec.offset, spec.params);
    std::vector<double> upd, rw, cp, ww, ho, br, bw, sv;
    for (int call = 0; call < 1 + spec.timed_calls; ++call) {  // call 0 warms up (reads all)
        before(call);
        double handover = 0;
        if (fp32) {
            auto t0 = clk::now();
            pipe.hand_over_gradients(grads);
            handover = std::chrono::duration<double>(clk::now() - t0).count();
        }
        auto t0 = clk::now();
        if (fp32) pipe.update(copy);
        else pipe.update(grads, copy);
        double secs = std::chrono::duration<double>(clk::now() - t0).count();
        after(call, secs);
        if (call == 0) continue;
        const auto& st = pipe.last_stats();
        upd.push_back(secs);
        rw.push_back(st.read_wait_seconds);
        cp.push_back(st.compute_seconds);
        ww.push_back(st.write_wait_seconds);
        ho.push_back(handover);
        br.push_back(static_cast<double>(st.bytes_read));
        bw.push_back(static_cast<double>(st.bytes_written));
        sv.push_back(static_cast<double>(st.served_from_resident));
    }
    row_result r;
    r.update_s = median(upd);
    r.read_wait_s = median(rw);
    r.compute_s = median(cp);
    r.write_wait_s = median(ww);
    r.handover_s = median(ho);
    r.bytes_read = median(br);
    r.bytes_written = median(bw);
    r.served = median(sv);
    return r;
}

template <class Tier>
row_result run_in_process(Tier& tier, host_data& data, const shape& sh, const run_spec& spec) {
    return run_pipeline(tier, data, sh, spec, [](int) {}, [](int, double) {});
}

struct paths {
    fs::path disk, shm;
    bool shm_is_tmpfs = true;
};

file_tier_options disk_options(const std::string& name) {
    file_tier_options o;
    o.name = name;
    o.engine.block_size = MiB;
    o.engine.queue_depth = 8;
    return o;
}

throttle_config half_of(const bandwidths& bw) {
    return throttle_config::separate(bandwidth_limit{bw.disk_read / 2, 4 * MiB}, bandwidth_limit{bw.disk_write / 2, 4 * MiB});
}

using two_path_tier_null = virtual_tier<null_lock, file_tier<>, throttled_tier<file_tier<>>>;
using two_path_tier_node = virtual_tier<node_lock, file_tier<>, throttled_tier<file_tier<>>>;

/// Row 5: two worker processes, each with half the parameters and half the buffers.
row_result run_two_processes(host_data& data, const shape& sh, const paths& p, const bandwidths& bw,
                             const fs::path& lock_dir) {
    const int workers = 2;
    const std::size_t half_subgroups = sh.subgroups / 2;
    struct msg {
        double secs, read_wait, compute, write_wait, bytes_read, bytes_written, served;
        int ok;
    };
    // A worker that dies must fail the row, not kill the benchmark with SIGPIPE.
    struct sigpipe_guard {
        void (*old)(int) = std::signal(SIGPIPE, SIG_IGN);
        ~sigpipe_guard() { std::signal(SIGPIPE, old); }
    } no_sigpipe;
    int to_parent[2], from_parent[workers][2];
    if (::pipe(to_parent) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    std::vector<pid_t> pids;
    for (int w = 0; w < workers; ++w) {
        if (::pipe(from_parent[w]) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
        pid_t pid = ::fork();
        if (pid == 0) {
            ::close(to_parent[0]);
            msg m{};
            try {
                auto disk = p.disk / ("w" + std::to_string(w));
                auto shm = p.shm / ("w" + std::to_string(w));
                fs::create_directories(disk);
                fs::create_directories(shm);
                virtual_tier_options o;
                o.name = "vt";
                o.bandwidths = {bw.disk_total(), bw.disk_total() / 2};
                o.locks.directory = lock_dir;
                o.lock_names = {"disk", "shm"};
                two_path_tier_node vt(o, child_args(disk, disk_options("disk")),
                                      child_args(half_of(bw), std::in_place, shm, disk_options("shm")));
                // The parent's shared thread pool has no threads in this forked child: own one.
                detail::thread_pool pool(1);
                run_spec spec;
                spec.opt.order = subgroup_order::alternating;
                spec.opt.pool = &pool;
                spec.opt.key_prefix = "w" + std::to_string(w);
                spec.params = half_subgroups * sh.subgroup_size;
                spec.offset = static_cast<std::size_t>(w) * spec.params;
                spec.buffer_bytes = sh.budget_bytes() / workers;
                spec.timed_calls = sh.timed_calls;
                auto before = [&](int) {
                    char go = 0;
                    if (::read(from_parent[w][0], &go, 1) != 1) std::_Exit(3);
                };
                auto after = [&](int, double secs) {
                    msg mm{};
                    mm.secs = secs;
                    mm.ok = 1;
                    if (::write(to_parent[1], &mm, sizeof mm) != static_cast<ssize_t>(sizeof mm)) std::_Exit(4);
                };
                auto r = run_pipeline(vt, data, sh, spec, before, after);
                m = {r.update_s, r.read_wait_s, r.compute_s, r.write_wait_s, r.bytes_read, r.bytes_written, r.served, 2};
            } catch (const std::exception& e) {
                std::fprintf(stderr, "worker %d: %s\n", w, e.what());
                m.ok = -1;
            }
            // The summary goes out only when the parent asks, so it never interleaves with
            // another worker's per-call message.
            char ask = 0;
            if (m.ok > 0 && ::read(from_parent[w][0], &ask, 1) != 1) std::_Exit(6);
            if (::write(to_parent[1], &m, sizeof m) != static_cast<ssize_t>(sizeof m)) std::_Exit(5);
            std::_Exit(m.ok > 0 ? 0 : 1);
        }
        pids.push_back(pid);
        ::close(from_parent[w][0]);
    }
    ::close(to_parent[1]);
    std::vector<double> walls;
    row_result r;
    bool failed = false;
    for (int call = 0; call < 1 + sh.timed_calls && !failed; ++call) {
        auto t0 = clk::now();
        for (int w = 0; w < workers; ++w) {
            char go = 1;
            if (::write(from_parent[w][1], &go, 1) != 1) failed = true;
        }
        for (int w = 0; w < workers; ++w) {
            msg m{};
            if (::read(to_parent[0], &m, sizeof m) != static_cast<ssize_t>(sizeof m) || m.ok != 1) failed = true;
        }
        if (call > 0) walls.push_back(std::chrono::duration<double>(clk::now() - t0).count());
    }
    for (int w = 0; w < workers && !failed; ++w) {
        char ask = 2;
        if (::write(from_parent[w][1], &ask, 1) != 1) failed = true;
        msg m{};
        if (::read(to_parent[0], &m, sizeof m) != static_cast<ssize_t>(sizeof m) || m.ok != 2) {
            failed = true;
            break;
        }
        r.read_wait_s = std::max(r.read_wait_s, m.read_wait);
        r.compute_s = std::max(r.compute_s, m.compute);
        r.write_wait_s = std::max(r.write_wait_s, m.write_wait);
        r.bytes_read += m.bytes_read;
        r.bytes_written += m.bytes_written;
        r.served += m.served;
    }
    for (int w = 0; w < workers; ++w) ::close(from_parent[w][1]);
    ::close(to_parent[0]);
    std::string why;
    for (auto pid : pids) {
        int st = 0;
        ::waitpid(pid, &st, 0);
        if (WIFSIGNALED(st)) why += " worker killed by signal " + std::to_string(WTERMSIG(st)) + ";";
        else if (WIFEXITED(st) && WEXITSTATUS(st) != 0) why += " worker exit status " + std::to_string(WEXITSTATUS(st)) + ";";
    }
    if (failed || !why.empty()) throw std::runtime_error("a node_lock worker process failed:" + why + " (see stderr)");
    r.update_s = median(walls);
    r.note = "wall time of both workers; waits are the slower worker's";
    return r;
}

// ---- The run ----------------------------------------------------------------------------

struct results {
    shape sh;
    bandwidths bw;
    std::vector<row_result> rows;
    std::string error;
};

results& the_results() {
    static results res = [] {
        results out;
        out.sh = the_shape();
        const auto& sh = out.sh;
        try {
            paths p;
            p.disk = bench::scratch_dir() / ("update_phase-" + std::to_string(::getpid()));
            fs::path shm_root = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : bench::scratch_dir();
            p.shm_is_tmpfs = shm_root == "/dev/shm";
            p.shm = shm_root / ("spillway-update-phase-" + std::to_string(::getpid()));
            fs::path locks = p.shm / "locks";
            fs::create_directories(p.disk);
            fs::create_directories(p.shm);
            fs::create_directories(locks);
            struct cleanup {
                paths p;
                ~cleanup() {
                    std::error_code ec;
                    fs::remove_all(p.disk, ec);
                    fs::remove_all(p.shm, ec);
                }
            } guard{p};
            out.bw = measure_disk(p.disk, sh);
            const auto& bw = out.bw;
            auto data = make_data(sh.params());
            const double blob = 12.0 * static_cast<double>(sh.subgroup_size);
            const double n = static_cast<double>(sh.subgroups);

            // Each row runs on its own; a failing row is reported and the others still run.
            // SPILLWAY_UPDATE_PHASE_ROWS (e.g. "1,5") picks rows (1-based) for debugging.
            const char* pick = std::getenv("SPILLWAY_UPDATE_PHASE_ROWS");
            auto wanted = [&](int row) {
                return !pick || !*pick || std::string(",") .append(pick).append(",").find("," + std::to_string(row) + ",") != std::string::npos;
            };
            auto guarded = [&](int row, const char* name, auto&& fn) {
                row_result r;
                if (wanted(row)) {
                    auto t0 = clk::now();
                    try {
                        r = fn();
                    } catch (const std::exception& e) {
                        r.error = e.what();
                    }
                    std::fprintf(stderr, "[update_phase] row %d %s: %s (%.1f s)\n", row, name,
                                 r.error.empty() ? "done" : r.error.c_str(),
                                 std::chrono::duration<double>(clk::now() - t0).count());
                } else {
                    r.error = "not selected (SPILLWAY_UPDATE_PHASE_ROWS)";
                }
                r.name = name;
                out.rows.push_back(r);
            };
            auto single = [&](pipeline_options opt) {
                file_tier<> disk(p.disk, disk_options("disk"));
                run_spec spec{opt, sh.params(), 0, sh.budget_bytes(), sh.timed_calls};
                return run_in_process(disk, data, sh, spec);
            };
            pipeline_options base;
            base.order = subgroup_order::ascending;
            base.resident = resident_policy::none;
            base.gradients = gradient_path::fp32_on_tier;
            pipeline_options lazy = base;
            lazy.gradients = gradient_path::lazy_widening;
            pipeline_options full = lazy;
            full.order = subgroup_order::alternating;
            full.resident = resident_policy::keep_last_updated;
            const double resident = static_cast<double>(std::min(sh.budget_buffers - 3, sh.subgroups));

            guarded(1, "baseline", [&] {
                auto r = single(base);
                r.floor_s = (n * blob + n * 4.0 * static_cast<double>(sh.subgroup_size) + n * blob) / bw.disk_total();
                return r;
            });
            guarded(2, "+lazy_widening", [&] {
                auto r = single(lazy);
                r.floor_s = 2 * n * blob / bw.disk_total();
                return r;
            });
            guarded(3, "+alternating_resident", [&] {
                auto r = single(full);
                r.floor_s = 2 * (n - resident) * blob / bw.disk_total();
                return r;
            });
            guarded(4, "+second_path", [&] {
                virtual_tier_options o;
                o.name = "vt";
                o.bandwidths = {bw.disk_total(), bw.disk_total() / 2};
                two_path_tier_null vt(o, child_args(p.disk, disk_options("disk")),
                                      child_args(half_of(bw), std::in_place, p.shm, disk_options("shm")));
                run_spec spec{full, sh.params(), 0, sh.budget_bytes(), sh.timed_calls};
                auto r = run_in_process(vt, data, sh, spec);
                r.floor_s = 2 * (n - resident) * blob / (1.5 * bw.disk_total());
                return r;
            });
            guarded(5, "+node_lock_2proc", [&] {
                auto r = run_two_processes(data, sh, p, bw, locks);
                const double per_worker_resident =
                    static_cast<double>(std::min(sh.budget_buffers / 2 - 3, sh.subgroups / 2));
                r.floor_s = 2 * (n - 2 * per_worker_resident) * blob / (1.5 * bw.disk_total());
                return r;
            });
        } catch (const std::exception& e) {
            out.error = e.what();
        }
        return out;
    }();
    return res;
}

void report_row(benchmark::State& state, std::size_t index) {
    auto& res = the_results();
    if (!res.error.empty()) {
        state.SkipWithError(res.error.c_str());
        for (auto _ : state) {
        }
        return;
    }
    if (index >= res.rows.size()) {
        state.SkipWithError("row did not run");
        for (auto _ : state) {
        }
        return;
    }
    const auto& r = res.rows[index];
    const auto& b = res.rows[0];
    if (!r.error.empty()) {
        state.SkipWithError(r.error.c_str());
        for (auto _ : state) {
        }
        return;
    }
    for (auto _ : state) state.SetIterationTime(r.update_s);
    state.counters["update_s"] = r.update_s;
    state.counters["read_wait_s"] = r.read_wait_s;
    state.counters["compute_s"] = r.compute_s;
    state.counters["write_wait_s"] = r.write_wait_s;
    state.counters["handover_s"] = r.handover_s;
    state.counters["bytes_read"] = r.bytes_read;
    state.counters["bytes_written"] = r.bytes_written;
    state.counters["bytes_moved"] = r.bytes_read + r.bytes_written + (index == 0 ? 4.0 * static_cast<double>(res.sh.params()) : 0.0);
    state.counters["served_resident"] = r.served;
    if (b.error.empty()) {  // the baseline ran
        state.counters["speedup"] = b.update_s / r.update_s;
        state.counters["speedup_with_handover"] = (b.update_s + b.handover_s) / (r.update_s + r.handover_s);
    }
    state.counters["floor_s"] = r.floor_s;
    state.counters["vs_limit"] = r.floor_s / r.update_s;
    state.counters["state_GiB"] = 12.0 * static_cast<double>(res.sh.params()) / static_cast<double>(1u << 30);
    state.counters["buffer_GiB"] = static_cast<double>(res.sh.budget_bytes()) / static_cast<double>(1u << 30);
    state.counters["disk_read_Bps"] = res.bw.disk_read;
    state.counters["disk_write_Bps"] = res.bw.disk_write;
    std::string label = "limit: " + res.bw.how;
    if (!r.note.empty()) label += "; " + r.note;
    state.SetLabel(label);
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    const char* names[] = {"baseline", "+lazy_widening", "+alternating_resident", "+second_path", "+node_lock_2proc"};
    for (std::size_t i = 0; i < std::size(names); ++i)
        benchmark::RegisterBenchmark((std::string("update_phase/") + names[i]).c_str(),
                                     [i](benchmark::State& st) { report_row(st, i); })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kSecond);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
